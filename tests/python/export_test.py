"""psctl export against real ps_server processes: a tiny job on two shards
(a dense variable big enough to be cut over both, small ones, an embedding
table of small ids and one of ids far apart) trains a few steps and
checkpoints; the exported model, loaded with numpy (and torch.load for
--format=pt), holds every variable whole and every row as the live shards
answer it. Bad input fails with one line and exit code 2."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import pstrain
from ps_cluster import PsCluster

try:
    import torch
except ImportError:
    torch = None

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
PSCTL = os.path.join(BIN_DIR, "psctl")
SMALL_IDS = np.array([0, 2, 5, 9], dtype=np.uint64)
FAR_IDS = np.array([7, 10**12 + 3, 2**40], dtype=np.uint64)


def psctl(*args, env=None):
    return subprocess.run([PSCTL, *args], capture_output=True, text=True, timeout=120, env=env)


class ExportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        """Trains the job once; keeps what the live shards answered and the
        checkpoint folder."""
        cls.cluster = PsCluster(BIN_DIR, workers=1, shards=2, mode="ASYNC",
                                optimizer="sgd { learning_rate: 0.5 }", checkpoints=True)
        try:
            cls.train(cls.cluster)
        except BaseException:
            cls.cluster.stop()
            raise
        cls.out = tempfile.mkdtemp(prefix="pstrain-export-")

    @classmethod
    def train(cls, cluster):
        rng = np.random.default_rng(7)
        initial = {
            "big": rng.standard_normal((200, 100)).astype(np.float32),  # 80 KB: cut over both
            "bias": rng.standard_normal(7).astype(np.float32),
            "gate": rng.standard_normal((3, 2)).astype(np.float32),
        }
        client = pstrain.Client(cluster.config_path, "worker:0")
        client.declare_tables({"emb": 4, "far": 2})
        client.init(initial)
        for step in range(3):
            client.push_pull({n: np.full(v.shape, 0.1 * (step + 1), np.float32)
                              for n, v in initial.items()})
            client.push_rows("emb", SMALL_IDS,
                             rng.standard_normal((len(SMALL_IDS), 4)).astype(np.float32))
            client.push_rows("far", FAR_IDS,
                             rng.standard_normal((len(FAR_IDS), 2)).astype(np.float32))
        cls.dense = {n: np.array(v) for n, v in client.pull().items()}
        cls.emb = client.pull_rows("emb", np.arange(10, dtype=np.uint64)).copy()
        cls.far = client.pull_rows("far", FAR_IDS).copy()
        done = psctl("checkpoint", f"--config={cluster.config_path}")
        assert done.returncode == 0, done.stderr
        client.done()
        cls.ckpt = os.path.join(cluster.dir, "ckpt")

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        shutil.rmtree(cls.out, ignore_errors=True)

    def check_model(self, model):
        self.assertEqual(set(model), {"big", "bias", "gate", "emb.ids", "emb.rows", "emb",
                                      "far.ids", "far.rows"})
        for name, value in self.dense.items():
            self.assertEqual(tuple(model[name].shape), value.shape, name)
            np.testing.assert_array_equal(np.asarray(model[name]), value, err_msg=name)
        # Trained rows by id, sorted; the dense form holds every id up to the
        # largest, those never trained at their initial values as a pull answers.
        np.testing.assert_array_equal(np.asarray(model["emb.ids"]), SMALL_IDS.astype(np.int64))
        np.testing.assert_array_equal(np.asarray(model["emb.rows"]), self.emb[SMALL_IDS])
        np.testing.assert_array_equal(np.asarray(model["emb"]), self.emb)
        self.assertEqual(np.asarray(model["emb.ids"]).dtype, np.int64)
        self.assertEqual(np.asarray(model["emb"]).dtype, np.float32)
        np.testing.assert_array_equal(np.asarray(model["far.ids"]), FAR_IDS.astype(np.int64))
        np.testing.assert_array_equal(np.asarray(model["far.rows"]), self.far)

    def test_npz_holds_the_live_model(self):
        path = os.path.join(self.out, "model.npz")
        done = psctl("export", f"--checkpoint={self.ckpt}", "--format=npz", f"--out={path}")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("from 2 shard(s)", done.stdout)
        with np.load(path) as z:
            self.check_model({k: z[k] for k in z.files})

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_pt_loads_with_torch_into_the_same_values(self):
        path = os.path.join(self.out, "model.pt")
        done = psctl("export", f"--checkpoint={self.ckpt}", "--format=pt", f"--out={path}",
                     env=dict(os.environ, PSTRAIN_PYTHON=sys.executable))
        self.assertEqual(done.returncode, 0, done.stderr)
        model = torch.load(path)
        self.assertTrue(all(isinstance(t, torch.Tensor) for t in model.values()))
        self.check_model({k: t.numpy() for k, t in model.items()})

    def test_bad_input_fails_with_one_line(self):
        empty = tempfile.mkdtemp(prefix="pstrain-empty-")
        partial = tempfile.mkdtemp(prefix="pstrain-partial-")
        self.addCleanup(shutil.rmtree, empty, ignore_errors=True)
        self.addCleanup(shutil.rmtree, partial, ignore_errors=True)
        os.symlink(os.path.join(self.ckpt, "shard-1"), os.path.join(partial, "shard-1"))
        cases = [
            (["--checkpoint=" + empty], "no checkpoint in"),
            (["--checkpoint=" + os.path.join(empty, "nope")], "no checkpoint in"),
            (["--checkpoint=" + self.ckpt, "--format=onnx"], "unknown --format=onnx"),
            (["--checkpoint=" + partial], "shard 0 has no valid checkpoint"),
            ([], "give --checkpoint"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                done = psctl("export", *args, f"--out={os.path.join(self.out, 'bad.npz')}")
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
                self.assertIn(message, done.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.out, "bad.npz")))

    def test_pt_without_torch_names_the_package(self):
        # A python3 that finds no site packages: neither numpy nor torch.
        bare = os.path.join(self.out, "bare-python3")
        with open(bare, "w") as f:
            f.write(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
        os.chmod(bare, 0o755)
        done = psctl("export", f"--checkpoint={self.ckpt}", "--format=pt",
                     f"--out={os.path.join(self.out, 'bare.pt')}",
                     env=dict(os.environ, PSTRAIN_PYTHON=bare))
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
        self.assertIn("python3-torch", done.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.out, "bare.pt")))


if __name__ == "__main__":
    unittest.main()
