"""Embedding tables from Python against real ps_server processes: the
client's pull_rows / push_rows / push_pull_rows round trips, and
nn.EmbeddingBag(sparse=True) trained through pstrain.torch's
DistributedOptimizer by two SYNC workers, which must match plain PyTorch
SGD on the combined batch; a model of embedding tables alone trains its
rows. The torch tests skip where torch is not installed."""

import os
import sys
import tempfile
import threading
import unittest

import numpy as np

import pstrain
from ps_cluster import PsCluster

try:
    import torch
    import pstrain.torch
except ImportError:
    torch = None

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
IDS = np.array([3, 10**12 + 7, 42, 2**63 + 5, 17, 99, 123456789, 8], dtype=np.uint64)


class ClientRowsTest(unittest.TestCase):
    def test_rows_round_trip_over_two_shards(self):
        with PsCluster(BIN_DIR, workers=1, shards=2, mode="ASYNC",
                       optimizer="sgd { learning_rate: 0.5 }") as cluster:
            client = pstrain.Client(cluster.config_path, "worker:0")
            client.declare_tables({"emb": 4, "wide": 1})
            self.assertEqual(client.tables, {"emb": 4, "wide": 1})
            client.init({"w": np.ones(3, np.float32)})
            before = client.pull_rows("emb", IDS)
            self.assertEqual(before.shape, (len(IDS), 4))
            self.assertEqual(before.dtype, np.float32)
            # Deterministic initial values, the same whatever the order asked in.
            np.testing.assert_array_equal(client.pull_rows("emb", IDS[::-1]), before[::-1])

            grads = np.arange(len(IDS) * 4, dtype=np.float32).reshape(len(IDS), 4) / 8
            client.push_rows("emb", IDS, grads)
            np.testing.assert_allclose(client.pull_rows("emb", IDS), before - 0.5 * grads,
                                       rtol=1e-6)

            # The combined step: dense and rows pushed, the next ids' rows answered.
            values, rows = client.push_pull_rows(
                {"w": np.ones(3, np.float32)}, rows={"emb": (IDS[:2], np.ones((2, 4), np.float32))},
                next_ids={"emb": IDS[:3], "wide": [5, 6]})
            np.testing.assert_allclose(values["w"], np.full(3, 0.5, np.float32))
            np.testing.assert_allclose(rows["emb"][:2], before[:2] - 0.5 * grads[:2] - 0.5,
                                       rtol=1e-6)
            np.testing.assert_allclose(rows["emb"][2], before[2] - 0.5 * grads[2], rtol=1e-6)
            self.assertEqual(rows["wide"].shape, (2, 1))
            self.assertEqual(sum(client.stats(s)["embeddings"][0]["rows"] for s in range(2)),
                             len(IDS))

            with self.assertRaises(pstrain.InvalidArgumentError) as twice:
                client.push_rows("emb", [1, 2, 1], np.zeros((3, 4), np.float32))
            self.assertIn("appears twice", str(twice.exception))
            with self.assertRaises(pstrain.InvalidArgumentError):
                client.push_rows("emb", [1, 2], np.zeros((2, 3), np.float32))
            with self.assertRaises(KeyError):
                client.pull_rows("nope", [1])
            with self.assertRaises(TypeError):
                client.pull_rows("emb", [1.5])
            client.done()

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_torch_tensors_are_ids_and_rows(self):
        with PsCluster(BIN_DIR, workers=1, mode="ASYNC",
                       optimizer="sgd { learning_rate: 1.0 }") as cluster:
            client = pstrain.Client(cluster.config_path, "worker:0")
            client.declare_tables({"emb": 2})
            client.init({"w": np.ones(1, np.float32)})
            ids = torch.tensor([7, 1, 5])
            before = client.pull_rows("emb", ids)
            client.push_rows("emb", ids, torch.ones(3, 2))
            np.testing.assert_allclose(client.pull_rows("emb", ids), before - 1, rtol=1e-6)
            client.done()


@unittest.skipIf(torch is None, "torch is not installed")
class SparseEmbeddingTest(unittest.TestCase):
    STEPS = 4
    LR = 0.5

    @staticmethod
    def model():
        torch.manual_seed(5)
        return torch.nn.ModuleDict({
            "bag": torch.nn.EmbeddingBag(1000, 4, mode="sum", sparse=True),
            "out": torch.nn.Linear(4, 1),
        })

    @staticmethod
    def forward(model, ids, offsets):
        return model["out"](model["bag"](ids, offsets)).squeeze(1)

    @staticmethod
    def batches(worker):
        """Step k's batch of worker w: 4 bags of ids (some shared across
        workers and bags), and targets."""
        rng = np.random.default_rng(100 + worker)
        for _ in range(SparseEmbeddingTest.STEPS):
            ids = rng.integers(0, 30, size=12) * 1_000_003  # ids far past num_embeddings
            offsets = np.array([0, 3, 6, 9])
            yield torch.from_numpy(ids), torch.from_numpy(offsets), torch.from_numpy(
                rng.standard_normal(4).astype(np.float32))

    def train(self, prefetch):
        """Two SYNC workers' run: the rows before and after, the models, the
        dense initial values and each worker's lookups (pulls of its own)."""
        with PsCluster(BIN_DIR, workers=2, shards=2, mode="SYNC",
                       optimizer=f"sgd {{ learning_rate: {self.LR} }}") as cluster:
            models = [self.model(), self.model()]
            dense0 = {n: p.detach().clone() for n, p in models[0]["out"].named_parameters()}
            opts = [pstrain.torch.DistributedOptimizer(
                models[w], pstrain.Client(cluster.config_path, f"worker:{w}")) for w in range(2)]
            # The table is not a dense variable, and is not pulled whole.
            self.assertEqual(opts[0].client.names, ["out.weight", "out.bias"])
            self.assertEqual(opts[0].client.tables, {"bag.weight": 4})
            every_id = np.unique(np.concatenate(
                [b[0].numpy() for w in range(2) for b in self.batches(w)]))
            initial_rows = opts[0].client.pull_rows("bag.weight", every_id)
            lookups = [0, 0]
            for w, opt in enumerate(opts):
                def counted(*args, pull=opt.client.pull_rows, w=w, **kwargs):
                    lookups[w] += 1
                    return pull(*args, **kwargs)
                opt.client.pull_rows = counted

            errors = []

            def train(w):
                try:
                    batches = list(self.batches(w))
                    for k, (ids, offsets, y) in enumerate(batches):
                        opts[w].zero_grad()
                        loss = torch.mean((self.forward(models[w], ids, offsets) - y) ** 2)
                        loss.backward()
                        if prefetch and k + 1 < len(batches):
                            opts[w].next_batch({models[w]["bag"]: batches[k + 1][0]})
                        opts[w].step()
                except Exception as error:  # noqa: BLE001 (reported below)
                    errors.append(error)

            threads = [threading.Thread(target=train, args=(w,)) for w in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            self.assertFalse(any(t.is_alive() for t in threads))
            self.assertEqual(errors, [])
            trained_lookups = list(lookups)  # the training's, not the check's below
            # A pushed row gradient is gone: the next batch looks up its own rows.
            self.assertIsNone(models[0]["bag"].weight.grad)
            final_rows = opts[0].client.pull_rows("bag.weight", every_id)
            for opt in reversed(opts):  # the chief waits for the others
                opt.finish()
            return every_id, initial_rows, final_rows, dense0, models, trained_lookups

    def test_two_sync_workers_train_as_sgd_on_the_combined_batch(self):
        for prefetch in (False, True):
            with self.subTest(prefetch=prefetch):
                every_id, initial_rows, final_rows, dense0, models, lookups = \
                    self.train(prefetch)
                # With the next batch named, the step's exchange brings its
                # rows: only the first batch is looked up by the forward pass.
                self.assertEqual(lookups, [1, 1] if prefetch else [self.STEPS, self.STEPS])
                self.check_against_sgd(every_id, initial_rows, final_rows, dense0, models)

    def check_against_sgd(self, every_id, initial_rows, final_rows, dense0, models):
        # Plain PyTorch: the same initial values, SGD on each step's
        # combined batch (the mean of the two workers' losses).
        reference = torch.nn.ModuleDict({
            "bag": torch.nn.EmbeddingBag(len(every_id), 4, mode="sum", sparse=True),
            "out": torch.nn.Linear(4, 1),
        })
        with torch.no_grad():
            reference["bag"].weight.copy_(torch.from_numpy(initial_rows))
            for n, p in reference["out"].named_parameters():
                p.copy_(dense0[n])
        sgd = torch.optim.SGD(reference.parameters(), lr=self.LR)
        index = {int(i): k for k, i in enumerate(every_id)}
        for step in zip(*(self.batches(w) for w in range(2))):
            sgd.zero_grad()
            losses = []
            for ids, offsets, y in step:
                local = torch.tensor([index[int(i)] for i in ids])
                losses.append(torch.mean((self.forward(reference, local, offsets) - y) ** 2))
            (sum(losses) / 2).backward()
            sgd.step()
        self.assertFalse(np.allclose(final_rows, initial_rows))  # the rows trained
        np.testing.assert_allclose(final_rows, reference["bag"].weight.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
        for model in models:
            for n, p in model["out"].named_parameters():
                np.testing.assert_allclose(p.detach().numpy(),
                                           dict(reference["out"].named_parameters())[n]
                                           .detach().numpy(), rtol=1e-5, atol=1e-6)


@unittest.skipIf(torch is None, "torch is not installed")
class EmbeddingsAloneTest(unittest.TestCase):
    LR = 0.1

    def test_a_model_of_sparse_embeddings_alone_trains_its_rows(self):
        for mode in ("SYNC", "ASYNC"):
            with self.subTest(mode=mode), PsCluster(
                    BIN_DIR, workers=1, shards=2, mode=mode,
                    optimizer=f"sgd {{ learning_rate: {self.LR} }}") as cluster:
                torch.manual_seed(2)
                model = torch.nn.ModuleDict({
                    "emb": torch.nn.Embedding(100, 3, sparse=True),
                    "bag": torch.nn.EmbeddingBag(100, 2, mode="sum", sparse=True),
                })
                client = pstrain.Client(cluster.config_path, "worker:0")
                opt = pstrain.torch.DistributedOptimizer(model, client)
                self.assertEqual(client.names, [])  # no dense variable
                self.assertEqual(client.tables, {"emb.weight": 3, "bag.weight": 2})
                ids = torch.tensor([5, 7, 5, 10 ** 9])
                unique, counts = np.unique(ids.numpy(), return_counts=True)
                rows = {t: client.pull_rows(t, unique) for t in client.tables}
                initial = {t: r.copy() for t, r in rows.items()}
                for _ in range(3):
                    opt.zero_grad()
                    # Each looked-up row pulled towards 1: no dense weight.
                    loss = ((model["emb"](ids) - 1) ** 2).sum() + \
                        ((model["bag"](ids, torch.tensor([0, 2])) - 1) ** 2).sum()
                    loss.backward()
                    opt.step()
                    # SGD on the rows (ids 5, 7, 10**9; the bags {5, 7} and {5, 10**9}):
                    # an id looked up k times has k times the gradient.
                    emb, bag = rows["emb.weight"], rows["bag.weight"]
                    rows["emb.weight"] = emb - self.LR * 2 * counts[:, None] * (emb - 1)
                    d0, d1 = 2 * (bag[0] + bag[1] - 1), 2 * (bag[0] + bag[2] - 1)
                    rows["bag.weight"] = bag - self.LR * np.stack([d0 + d1, d0, d1])
                for table, expected in rows.items():
                    trained = client.pull_rows(table, unique)
                    self.assertFalse(np.allclose(trained, initial[table]))
                    np.testing.assert_allclose(trained, expected, rtol=1e-5, atol=1e-6)
                self.assertEqual(client.steps, 3)
                opt.finish()


class SavedModelTest(unittest.TestCase):
    """After finish() the model's own state dict holds the whole trained
    tables: saved and loaded into a fresh model, it computes what the
    trained model computes, and each table's rows are the shards'."""

    def test_a_model_with_sparse_embeddings_saves_and_loads_whole(self):
        with PsCluster(BIN_DIR, workers=1, shards=2, mode="ASYNC",
                       optimizer="sgd { learning_rate: 0.1 }") as cluster:
            def make():
                torch.manual_seed(3)
                return torch.nn.ModuleDict({
                    "user": torch.nn.Embedding(1000, 4, sparse=True),
                    "head": torch.nn.Linear(4, 1),
                })
            model = make()
            client = pstrain.Client(cluster.config_path, "worker:0")
            opt = pstrain.torch.DistributedOptimizer(model, client)
            generator = torch.Generator().manual_seed(5)
            for _ in range(20):
                ids = torch.randint(0, 1000, (127,), generator=generator)
                opt.zero_grad()
                loss = (model["head"](model["user"](ids)) ** 2).mean()
                loss.backward()
                opt.step()
            opt.finish()
            state = model.state_dict()
            self.assertEqual(tuple(state["user.weight"].shape), (1000, 4))
            np.testing.assert_array_equal(
                state["user.weight"].numpy(),
                client.pull_rows("user.weight", np.arange(1000, dtype=np.int64)))
            with tempfile.TemporaryDirectory() as scratch:
                path = os.path.join(scratch, "model.pt")
                torch.save(state, path)
                fresh = make()
                fresh.load_state_dict(torch.load(path))
            probe = torch.arange(0, 1000, 7)
            with torch.no_grad():
                trained = model["head"](model["user"](probe))
                loaded = fresh["head"](fresh["user"](probe))
            torch.testing.assert_close(loaded, trained, rtol=0, atol=0)


if __name__ == "__main__":
    unittest.main()
