"""The PyTorch user's own script on a pstrain job: examples/recommender.py
(one process: a sparse nn.Embedding and an MLP, a DataLoader, AdamW and
Adagrad, warmup then cosine decay, clipping) and
examples/recommender_pstrain.py differ in at most three lines; the second,
run as ``pslaunch --ps=1 --workers=2 -- python3 recommender_pstrain.py``,
saves a state dict that loads into a fresh model and gives the AUC its
workers printed, and whose every parameter is, to 1e-5, what one process
makes of the two workers' batches combined (SYNC)."""

import difflib
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
EPOCHS, BATCH, WORKERS = 1, 64, 2


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def combined_batches(dataset, epoch):
    """Step k's batch of one process: worker 0's k-th batch, then worker 1's,
    as pstrain.torch.DistributedSampler (seed 0) deals them."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(epoch)).tolist()
    parts = [order[w::WORKERS] for w in range(WORKERS)]
    for k in range(0, len(parts[0]), BATCH):
        yield dataset[torch.tensor([i for part in parts for i in part[k:k + BATCH]])]


def one_process(example):
    """examples/recommender.py's training, on the combined batches."""
    torch.manual_seed(0)
    train = example.make_data(8192, seed=1)
    model = example.Recommender()
    opt = torch.optim.AdamW(model.mlp.parameters(), lr=3e-3, weight_decay=0.01)
    sparse_opt = torch.optim.Adagrad(model.user.parameters(), lr=0.05)
    steps = EPOCHS * math.ceil(len(train) / WORKERS / BATCH)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: (k + 1) / warmup if k < warmup else
                                              0.5 * (1 + math.cos(math.pi * (k - warmup) /
                                                                  (steps - warmup))))
    for epoch in range(EPOCHS):
        for users, items, clicks in combined_batches(train, epoch):
            opt.zero_grad()
            sparse_opt.zero_grad()
            F.binary_cross_entropy_with_logits(model(users, items), clicks).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sparse_opt.step()
            sched.step()
    return model.state_dict()


class RecommenderTest(unittest.TestCase):
    def test_the_scripts_differ_in_three_lines(self):
        with open(os.path.join(EXAMPLES, "recommender.py")) as a, \
                open(os.path.join(EXAMPLES, "recommender_pstrain.py")) as b:
            before, after = a.read().splitlines(), b.read().splitlines()
        changed = sum(max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in
                      difflib.SequenceMatcher(None, before, after).get_opcodes() if op != "equal")
        self.assertLessEqual(changed, 3)

    def test_two_workers_give_the_one_process_model_and_its_auc(self):
        example = load("recommender")
        with tempfile.TemporaryDirectory(prefix="pstrain-recommender-") as scratch:
            out = os.path.join(scratch, "model.pt")
            run = subprocess.run(
                [os.path.join(BIN_DIR, "pslaunch"), f"--ps=1", f"--workers={WORKERS}",
                 f"--result_dir={scratch}/run", "--", sys.executable,
                 os.path.join(EXAMPLES, "recommender_pstrain.py"), f"--epochs={EPOCHS}",
                 f"--batch_size={BATCH}", f"--out={out}"],
                capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
            self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
            printed = [json.loads(line.split("] ", 1)[1]) for line in run.stdout.splitlines()
                       if "test_auc" in line and line.startswith("[worker:")]
            self.assertEqual(len(printed), WORKERS, run.stdout[-3000:])
            saved = torch.load(out)
            # The summary counts what the workers' loaders dealt, no report() needed.
            for worker in range(WORKERS):
                with open(os.path.join(scratch, "run", f"worker-{worker}.json")) as f:
                    result = json.load(f)
                self.assertEqual(result["samples"], 8192 // WORKERS)
                self.assertEqual(result["steps"], 8192 // WORKERS // BATCH)
                self.assertEqual(result["epochs"], EPOCHS)  # its loader's passes
                # The mean loss of its last epoch's steps, from their backward().
                self.assertGreater(result["final_loss"], 0.1)
                self.assertLess(result["final_loss"], 0.75)
                if worker == 0:
                    chief_loss = result["final_loss"]
            summary = json.loads(run.stdout.strip().splitlines()[-1])
            self.assertAlmostEqual(summary["final_loss"], chief_loss, places=5)
            self.assertEqual(summary["epochs"], EPOCHS)  # the script's, not the config's
            self.assertGreater(summary["train_samples_per_sec"], 0)

        fresh = example.Recommender()
        fresh.load_state_dict(saved)
        test = example.make_data(2048, seed=2)
        self.assertEqual(round(example.evaluate(fresh, test), 6), printed[0]["test_auc"])
        self.assertEqual(printed[0]["test_auc"], printed[1]["test_auc"])

        reference = one_process(example)
        self.assertEqual(saved.keys(), reference.keys())
        for name, value in reference.items():
            self.assertEqual(saved[name].shape, value.shape, name)
            torch.testing.assert_close(saved[name], value, rtol=1e-5, atol=1e-5, msg=name)


if __name__ == "__main__":
    unittest.main(verbosity=2)
