"""A worker command that fails by itself (a Python exception) ends the run
with its exit code, once: pslaunch does not restart it, as it restarts a
worker killed by a signal (tests/python/restart_test.py)."""

import os
import subprocess
import sys
import tempfile
import time
import unittest

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]

CONFIG = """cluster {{ ps: "127.0.0.1:0" workers: 2 max_restarts: 3
  worker_command: "{python} {script}" }}
training {{ mode: SYNC optimizer {{ sgd {{ learning_rate: 1.0 }} }} }}
"""

# A training script with a typo.
SCRIPT = """loss = 0.5
loss.backwrd()
"""


class ScriptErrorTest(unittest.TestCase):
    def test_a_python_exception_ends_the_run_once_with_its_code(self):
        with tempfile.TemporaryDirectory(prefix="pstrain-script-error-") as scratch:
            script = os.path.join(scratch, "train.py")
            with open(script, "w") as f:
                f.write(SCRIPT)
            config = os.path.join(scratch, "job.textproto")
            with open(config, "w") as f:
                f.write(CONFIG.format(python=sys.executable, script=script))
            start = time.monotonic()
            run = subprocess.run(
                [os.path.join(BIN_DIR, "pslaunch"), f"--config={config}",
                 f"--result_dir={scratch}/run"],
                capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            took = time.monotonic() - start
            self.assertEqual(run.returncode, 1, run.stderr[-4000:])
            self.assertNotIn("restarting it", run.stderr)
            self.assertIn("(the worker command) exited with code 1: the script's own error",
                          run.stderr)
            # One traceback per worker at most: the first to fail ends the run.
            self.assertLessEqual(run.stderr.count("AttributeError"), 2, run.stderr[-4000:])
            self.assertLess(took, 20, run.stderr[-4000:])


if __name__ == "__main__":
    unittest.main(verbosity=2)
