"""Under pslaunch a worker script need not call report(): done() writes
the worker's result, and the run ends with its summary line."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
STEPS = 5

CONFIG = """cluster {{ ps: "127.0.0.1:0" workers: 2 worker_command: "{python} {script}" }}
training {{ mode: SYNC optimizer {{ sgd {{ learning_rate: 1.0 }} }} }}
"""

# A worker that trains and says it is done, and reports nothing.
SCRIPT = """import numpy as np, pstrain
client = pstrain.Client()
client.init({{"w": np.zeros(4, np.float32)}})
for _ in range({steps}):
    client.push_pull({{"w": np.ones(4, np.float32)}})
client.done()
"""


class NoReportTest(unittest.TestCase):
    def test_a_worker_that_does_not_report_still_ends_the_run_well(self):
        with tempfile.TemporaryDirectory(prefix="pstrain-no-report-") as scratch:
            script = os.path.join(scratch, "train.py")
            with open(script, "w") as f:
                f.write(SCRIPT.format(steps=STEPS))
            config = os.path.join(scratch, "job.textproto")
            with open(config, "w") as f:
                f.write(CONFIG.format(python=sys.executable, script=script))
            env = dict(os.environ)
            run = subprocess.run(
                [os.path.join(BIN_DIR, "pslaunch"), f"--config={config}",
                 f"--result_dir={scratch}/run"],
                capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env)
            self.assertEqual(run.returncode, 0, run.stderr[-4000:])
            summary = json.loads(run.stdout.strip().splitlines()[-1])
            self.assertEqual(summary["steps"], STEPS)
            # Its own loop, no loader of pstrain's: the epochs are unknown.
            self.assertIsNone(summary["epochs"])
            for worker in (0, 1):
                with open(os.path.join(scratch, "run", f"worker-{worker}.json")) as f:
                    self.assertEqual(json.load(f)["steps"], STEPS)


if __name__ == "__main__":
    unittest.main(verbosity=2)
