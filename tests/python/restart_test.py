"""A Python worker killed with -9 is handled as a C++ one: its lease runs
out, so the SYNC steps go on without it; pslaunch restarts it; it waits for
the shard to let go of its former process, rejoins, resumes at the steps
the shard counted, and the run finishes with every worker."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "killed_worker.py")
STEPS, KILL_AT = 40, 10

CONFIG = """cluster {{ ps: "127.0.0.1:0" workers: 2 max_restarts: 2
  worker_command: "{python} {worker} {steps} {kill_at}" }}
training {{ mode: SYNC optimizer {{ sgd {{ learning_rate: 1.0 }} }} lease_seconds: 1
  pull_timeout_seconds: 60 }}
"""


class RestartTest(unittest.TestCase):
    def test_a_killed_python_worker_rejoins_and_the_run_finishes(self):
        with tempfile.TemporaryDirectory(prefix="pstrain-restart-") as scratch:
            config = os.path.join(scratch, "job.textproto")
            with open(config, "w") as f:
                f.write(CONFIG.format(python=sys.executable, worker=WORKER, steps=STEPS,
                                      kill_at=KILL_AT))
            run = subprocess.run(
                [os.path.join(BIN_DIR, "pslaunch"), f"--config={config}",
                 f"--result_dir={scratch}/run"],
                capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
            self.assertEqual(run.returncode, 0, run.stderr[-4000:])
            self.assertIn("task worker:1 exited with code 137; restarting it (1 of 2)", run.stderr)
            # Its second start waited for the lease of the first instead of failing.
            self.assertNotIn("restarting it (2 of 2)", run.stderr)
            summary = json.loads(run.stdout.strip().splitlines()[-1])
            self.assertNotIn("missing_workers", summary)
            with open(os.path.join(scratch, "run", "worker-1.json")) as f:
                restarted = json.load(f)
            # The second life made the pushes the first did not.
            self.assertEqual(restarted["steps"], STEPS - KILL_AT)
            # Every SYNC step subtracts the averaged gradient, 1.0, once.
            self.assertEqual(summary["final_loss"], -summary["steps"])
            self.assertGreaterEqual(summary["steps"], STEPS)


if __name__ == "__main__":
    unittest.main(verbosity=2)
