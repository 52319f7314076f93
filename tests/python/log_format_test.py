"""A Python worker logs as the C++ programs do ("12:34:56.789 info ..."), on
the same stream: the session's own C++ lines (waiting for a shard) and
pstrain's Python ones (the module's warnings, through pstrain's log)."""

import os
import re
import socket
import subprocess
import sys
import tempfile
import unittest

LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d\d\d (info|warning|error) ")

# A PS address where nothing listens (a port just bound and let go).
CONFIG = """cluster {{ ps: "127.0.0.1:{port}" workers: 1 worker_command: "python3" }}
training {{ mode: SYNC optimizer {{ sgd {{ learning_rate: 0.1 }} }}
  model {{ mlp {{ }} }} dataset {{ quadratic {{ examples: 16 }} }} }}
"""

# A line of pstrain's Python side, then a real session that finds no shard
# within 1 s: its C++ code logs the wait.
SCRIPT = """import sys, pstrain
pstrain._pstrain.log("warning", "worker:0: a line of the Python side")
try:
    pstrain.Client(config=sys.argv[1], task="worker:0", connect_timeout=1)
except pstrain.UnavailableError:
    sys.exit(3)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LogFormatTest(unittest.TestCase):
    def test_python_and_cpp_lines_share_the_programs_format(self):
        with tempfile.TemporaryDirectory(prefix="pstrain-log-") as scratch:
            config = os.path.join(scratch, "job.textproto")
            with open(config, "w") as f:
                f.write(CONFIG.format(port=free_port()))
            run = subprocess.run([sys.executable, "-c", SCRIPT, config], capture_output=True,
                                 text=True, timeout=60, stdin=subprocess.DEVNULL)
        self.assertEqual(run.returncode, 3, run.stdout + run.stderr)
        lines = [line for line in run.stdout.splitlines() if line]
        self.assertTrue(any(" warning worker:0: a line of the Python side" in line
                            for line in lines), lines)
        self.assertTrue(any(" info waiting for ps:0 at 127.0.0.1:" in line for line in lines), lines)
        for line in lines:
            self.assertRegex(line, LINE)
        self.assertEqual(run.stderr, "")


if __name__ == "__main__":
    unittest.main(verbosity=2)
