"""examples/pytorch_cnn.py under pslaunch, as its README section runs it: two
Python workers in a SYNC job (cluster.worker_command) train the CNN on a
subset of Fashion-MNIST to at least 0.80 test accuracy, and pslaunch's
summary line carries what the chief reported; with --logdir the chief
writes TensorBoard events, as a C++ chief does. Skipped (code 77) without
torch."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401
except ImportError:
    print("pytorch_cnn_test: skipped: torch is not installed (python3-torch; "
          "scripts/install_deps.sh)")
    sys.exit(77)

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = """cluster {{ ps: "127.0.0.1:0" workers: 2 max_restarts: 0
  worker_command: "{python} {repo}/examples/pytorch_cnn.py --log_every=50 --eval_every_epoch=0" }}
training {{
  mode: SYNC
  optimizer {{ adam {{ learning_rate: 0.002 }} }}
  batch_size: 32
  epochs: 2
  seed: 1
  dataset {{ fashion_mnist {{ train_limit: 8000 }} }}
}}
"""


class PytorchCnnTest(unittest.TestCase):
    def test_two_python_workers_train_the_cnn_under_pslaunch(self):
        with tempfile.TemporaryDirectory(prefix="pstrain-cnn-") as scratch:
            config = os.path.join(scratch, "cnn.textproto")
            with open(config, "w") as f:
                f.write(CONFIG.format(python=sys.executable, repo=REPO))
            run = subprocess.run(
                [os.path.join(BIN_DIR, "pslaunch"), f"--config={config}",
                 f"--result_dir={scratch}/run", f"--logdir={scratch}/tb"],
                capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
            self.assertEqual(run.returncode, 0, run.stderr[-4000:])
            summary = json.loads(run.stdout.strip().splitlines()[-1])
            print(run.stdout.strip().splitlines()[-1])
            self.assertEqual(summary["mode"], "sync")
            self.assertEqual(summary["workers"], 2)
            # 8000 images, 2 workers of 32: 125 steps per epoch, each a SYNC step.
            self.assertEqual(summary["steps"], 250)
            self.assertEqual(summary["epochs"], 2)  # the script says the epochs it ran
            self.assertGreaterEqual(summary["test_accuracy"], 0.80)
            self.assertGreater(summary["train_samples_per_sec"], 0)
            self.assertEqual(summary["devices"], "cpu")
            self.assertIn("[worker:1]", run.stdout + run.stderr)
            events = os.listdir(os.path.join(scratch, "tb"))
            self.assertEqual(len(events), 1, events)  # the chief's
            self.assertTrue(events[0].startswith("events.out.tfevents."))
            with open(os.path.join(scratch, "tb", events[0]), "rb") as f:
                data = f.read()
            for tag in (b"train/loss", b"train/samples_per_sec", b"test/accuracy"):
                self.assertIn(tag, data)
            with open(os.path.join(scratch, "run", "worker-0.json")) as f:
                chief = json.load(f)
            self.assertEqual([int(p["step"]) for p in chief["curve"]], [50, 100, 125, 150, 200, 250])


if __name__ == "__main__":
    unittest.main(verbosity=2)
