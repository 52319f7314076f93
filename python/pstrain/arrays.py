"""How arrays, row ids and shapes cross into the compiled session: what it
reads as float32 C-contiguous buffers (copied only when they are not
such), what it writes into as such buffers already (never copied), row ids
and dimensions as 64-bit integers."""

import operator

import numpy as np

from pstrain import _pstrain
from pstrain.errors import InvalidArgumentError

__all__ = ["readable", "writable"]


def _is_torch_tensor(array):
    return type(array).__module__.startswith("torch")


def readable(array):
    """``array`` as a float32 C-contiguous buffer, copied only if it is not one."""
    if _is_torch_tensor(array):
        if array.device.type != "cpu":
            raise TypeError(
                f"a tensor on {array.device} cannot be read by the client; "
                "pass CPU tensors (pstrain.torch stages CUDA tensors through pinned host memory)")
        return array.detach().contiguous().float().numpy()
    return np.ascontiguousarray(array, dtype=np.float32)


def _ids(ids):
    """Row ids as a contiguous array of 64-bit integers, copied only if needed."""
    if _is_torch_tensor(ids):
        ids = ids.detach().cpu().numpy()
    ids = np.asarray(ids).reshape(-1)
    if ids.size == 0:
        return np.empty(0, np.int64)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"row ids must be integers, not {ids.dtype}")
    return np.ascontiguousarray(ids if ids.dtype.itemsize == 8 else ids.astype(np.int64))


def _dimension(name, shape, d):
    """One dimension of variable ``name``'s ``shape`` as the session takes
    it: an integer of 64 bits (the session checks its sign and the model's
    size)."""
    try:
        d = operator.index(d)
    except TypeError:
        raise TypeError(f"variable \"{name}\" has shape {shape}: dimension {d!r} is not an "
                        "integer; give each dimension as an int") from None
    if not -2 ** 63 <= d < 2 ** 63:
        says = "a dimension must be at least 1" if d < 0 else (
            f"more than the {_pstrain.MAX_MODEL_PARAMETERS} parameters (1 GiB of float32) "
            "a worker or PS holds; declare a smaller model")
        raise InvalidArgumentError(f"variable \"{name}\" has shape {list(shape)}: {says}")
    return d


def writable(array):
    """``array`` as a buffer the client writes into: it must be one already."""
    if _is_torch_tensor(array):
        if array.device.type != "cpu" or not array.is_contiguous() or array.dtype.itemsize != 4 \
                or not array.dtype.is_floating_point:
            raise TypeError(
                f"cannot write into a {array.dtype} tensor on {array.device}"
                f"{'' if array.is_contiguous() else ' (not contiguous)'}: "
                "pass contiguous float32 CPU tensors")
        return array.detach().numpy()
    if not isinstance(array, np.ndarray) or array.dtype != np.float32 \
            or not array.flags.c_contiguous or not array.flags.writeable:
        raise TypeError("pull destinations must be writable C-contiguous float32 arrays")
    return array
