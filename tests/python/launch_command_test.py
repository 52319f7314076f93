"""pslaunch runs a training script as torchrun does, with no config file:
``pslaunch --workers=2 --mode=async -- python3 train.py ARGS``: one PS at a
free port, the script as every worker's command with its arguments as
given, and the flags' overrides; a word before -- is still a mistake."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
STEPS = 3

SCRIPT = """import sys, numpy as np, pstrain
client = pstrain.Client()
client.init({"w": np.zeros(4, np.float32)})
for _ in range(int(sys.argv[1])):
    client.push_pull({"w": np.ones(4, np.float32)})
print("arguments", sys.argv[1:], "mode", client.config["training"]["mode"])
client.done()
"""


class LaunchCommandTest(unittest.TestCase):
    def run_pslaunch(self, *args):
        return subprocess.run([os.path.join(BIN_DIR, "pslaunch"), *args], capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)

    def test_a_script_runs_as_the_workers_without_a_config(self):
        with tempfile.TemporaryDirectory(prefix="pstrain-launch-") as scratch:
            script = os.path.join(scratch, "train.py")
            with open(script, "w") as f:
                f.write(SCRIPT)
            run = self.run_pslaunch(f"--result_dir={scratch}/run", "--workers=2", "--mode=async",
                                    "--", sys.executable, script, str(STEPS), "two words")
            self.assertEqual(run.returncode, 0, run.stderr[-4000:])
            for worker in (0, 1):
                self.assertIn(f"[worker:{worker}] arguments ['{STEPS}', 'two words'] mode ASYNC",
                              run.stdout)
            summary = json.loads(run.stdout.strip().splitlines()[-1])
            self.assertEqual(summary["mode"], "async")
            self.assertEqual(summary["workers"], 2)
            for worker in (0, 1):
                with open(os.path.join(scratch, "run", f"worker-{worker}.json")) as f:
                    self.assertEqual(json.load(f)["steps"], STEPS)

    def test_a_word_before_the_marker_is_a_mistake(self):
        run = self.run_pslaunch("configs/local.textproto")
        self.assertEqual(run.returncode, 2)
        self.assertIn("a workers' command goes after --", run.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
