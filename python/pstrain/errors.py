"""The exceptions of pstrain: every failed call raises a pstrain.Error.

An Error carries the status code of the failure as its name in absl and
gRPC ("UNAVAILABLE", "INVALID_ARGUMENT", ...) in ``code``, the one line a
pstrain binary would print in ``message`` (also ``str(error)``), and
``transient``: whether it is a refusal a worker waits out (a shard away,
restarting or busy) rather than the end of its run. Each code has its own
subclass (``pstrain.UnavailableError``, ...), so a script may catch the
ones it can handle.
"""

__all__ = ["Error", "from_status", "EXIT_CODES"]

# The process exit code the pstrain binaries give each failure
# (common/exit.h): 2 where starting again would fail the same way, which
# pslaunch does not restart; 1 for the rest.
EXIT_CODES = {
    "INVALID_ARGUMENT": 2,
    "FAILED_PRECONDITION": 2,
    "RESOURCE_EXHAUSTED": 2,
    "NOT_FOUND": 2,
    "OUT_OF_RANGE": 2,
    "PERMISSION_DENIED": 2,
    "UNAUTHENTICATED": 2,
}

CODES = (
    "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
)


class Error(Exception):
    """A failed pstrain call: ``code``, ``message``, ``transient``."""

    code = "UNKNOWN"

    def __init__(self, message, code=None, transient=False):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.transient = transient

    @property
    def exit_code(self):
        """The exit code a pstrain binary ends with on this failure."""
        return EXIT_CODES.get(self.code, 1)


def _class_name(code):
    return "".join(part.capitalize() for part in code.split("_")) + "Error"


_CLASSES = {}
for _code in CODES:
    _CLASSES[_code] = type(_class_name(_code), (Error,), {"code": _code, "__module__": "pstrain"})
    globals()[_class_name(_code)] = _CLASSES[_code]
    __all__.append(_class_name(_code))


def from_status(code, message, transient=False):
    """The exception for a failed status: the subclass of ``code``."""
    return _CLASSES.get(code, Error)(message, code, transient)
