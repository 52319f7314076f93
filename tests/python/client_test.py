"""pstrain.Client against real ps_server processes on loopback: the round
trip (init, pull, push, push_pull), SYNC averaging with the GIL released
while a pull waits, one client called from many threads at once, shapes
refused before anything is allocated, the calls refused after done(), and
every failure as a pstrain.Error with its code.

Run by ctest with PYTHONPATH naming the built module and PSTRAIN_BIN_DIR the
binaries."""

import os
import socket
import threading
import unittest

import numpy as np

import pstrain
from ps_cluster import PsCluster

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]


def initial():
    return {"w": np.arange(150, dtype=np.float32).reshape(50, 3) / 100, "b": np.ones(3, np.float32)}


def gradient(scale):
    return {"w": np.full((50, 3), scale, np.float32), "b": np.arange(3, dtype=np.float32) * scale}


class RoundTripTest(unittest.TestCase):
    def test_pull_push_and_push_pull_apply_the_ps_optimizer(self):
        lr = np.float32(0.5)
        with PsCluster(BIN_DIR, workers=1, shards=2,
                       optimizer="sgd { learning_rate: 0.5 }") as cluster:
            client = pstrain.Client(cluster.config_path, "worker:0")
            self.assertTrue(client.init(initial()))
            self.assertEqual(client.names, ["w", "b"])
            values = client.pull()
            for name, value in initial().items():
                np.testing.assert_array_equal(values[name], value)
            # The pull wrote into the session's own arrays, which lie in the
            # co-located shards' shared regions.
            self.assertIs(values["w"], client.values["w"])
            self.assertTrue(client.shares_memory(0) and client.shares_memory(1))

            client.push(gradient(1.0))
            self.assertEqual(client.last_outcomes, ["APPLIED", "APPLIED"])
            after_push = {n: v.copy() for n, v in client.pull().items()}
            for name, value in initial().items():
                np.testing.assert_array_equal(after_push[name], value - lr * gradient(1.0)[name])

            # Into the caller's arrays, from the caller's arrays.
            out = {"w": np.zeros((50, 3), np.float32), "b": np.zeros(3, np.float32)}
            returned = client.push_pull(gradient(2.0), out=out)
            self.assertIs(returned, out)
            for name in out:
                np.testing.assert_array_equal(out[name],
                                              after_push[name] - lr * gradient(2.0)[name])
            self.assertEqual(client.versions, [2, 2])
            self.assertEqual(client.steps, 2)
            self.assertEqual(client.stats(1)["version"], 2)
            client.done()

    def test_sync_averages_two_workers_while_each_waits_without_the_gil(self):
        with PsCluster(BIN_DIR, workers=2, optimizer="sgd { learning_rate: 1.0 }") as cluster:
            first = pstrain.Client(cluster.config_path, "worker:0")
            second = pstrain.Client(cluster.config_path, "worker:1")
            first.init(initial())
            second.init(initial())
            first.pull()
            second.pull()
            answered = {}
            # worker:0's exchange waits for worker:1's gradient: the other
            # thread can push it only if the waiting one let go of the GIL.
            waiting = threading.Thread(
                target=lambda: answered.update(first.push_pull(gradient(1.0))))
            waiting.start()
            second.push_pull(gradient(3.0))
            waiting.join(timeout=60)
            self.assertFalse(waiting.is_alive())
            for name, value in initial().items():
                expected = value - (gradient(1.0)[name] + gradient(3.0)[name]) / 2
                np.testing.assert_array_equal(answered[name], expected)
                np.testing.assert_array_equal(second.values[name], expected)
            self.assertEqual(sorted(first.last_outcomes + second.last_outcomes),
                             ["AGGREGATED", "APPLIED"])


class ThreadsTest(unittest.TestCase):
    THREADS = 16
    ROUNDS = 24

    def test_sixteen_threads_share_one_client(self):
        shape = {"w": (64, 64), "b": (5,)}
        with PsCluster(BIN_DIR, workers=1, shards=2, mode="ASYNC",
                       optimizer="sgd { learning_rate: 1.0 }") as cluster:
            client = pstrain.Client(cluster.config_path, "worker:0")
            client.init({n: np.zeros(s, np.float32) for n, s in shape.items()})
            client.pull()
            self.assertTrue(client.shares_memory(0) and client.shares_memory(1))
            ones = {n: np.ones(s, np.float32) for n, s in shape.items()}
            errors, pushes = [], []
            start = threading.Barrier(self.THREADS)

            def hammer(t):
                out = {n: np.zeros(s, np.float32) for n, s in shape.items()}
                seen = 0  # the pushes the last pull of this thread saw
                try:
                    start.wait(timeout=60)
                    for r in range(self.ROUNDS):
                        kind = (t + r) % 4
                        if kind == 0:
                            client.push_pull(ones, out=out)
                            pushes.append(1)
                        elif kind == 1:
                            client.pull(out=out)
                        elif kind == 2:
                            client.push(ones)
                            pushes.append(1)
                        else:
                            client.stats(r % 2)
                            continue
                        # One pull is one state of the model: each variable
                        # took the same whole number of pushes everywhere,
                        # and never fewer than this thread saw before.
                        for name, value in out.items():
                            taken = -value.reshape(-1)
                            self.assertTrue((taken == taken[0]).all(), f"{name} torn: {value}")
                            self.assertEqual(taken[0], np.round(taken[0]))
                            self.assertGreaterEqual(taken[0], seen)
                        seen = max(seen, -out["w"].reshape(-1)[0])
                except Exception as error:  # noqa: BLE001 (reported below)
                    errors.append(f"thread {t}: {error!r}")

            threads = [threading.Thread(target=hammer, args=(t,)) for t in range(self.THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            self.assertFalse(any(t.is_alive() for t in threads))
            self.assertEqual(errors, [])
            self.assertEqual(client.steps, len(pushes))
            values = client.pull()
            for name in shape:
                np.testing.assert_array_equal(values[name], np.full(shape[name], -len(pushes)))
            self.assertEqual([client.stats(s)["version"] for s in range(2)], [len(pushes)] * 2)
            # Every exchange still goes through the shared regions.
            self.assertTrue(client.shares_memory(0) and client.shares_memory(1))
            client.done()


class ErrorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = PsCluster(BIN_DIR, workers=1)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def assertRaisesCode(self, cls, code, call, text=None):
        with self.assertRaises(cls) as raised:
            call()
        self.assertIsInstance(raised.exception, pstrain.Error)
        self.assertEqual(raised.exception.code, code)
        if text:
            self.assertIn(text, str(raised.exception))
        return raised.exception

    def config_with(self, old, new):
        with open(self.cluster.config_path) as f:
            text = f.read()
        self.assertIn(old, text)
        path = os.path.join(self.cluster.dir, f"variant-{abs(hash(new))}.textproto")
        with open(path, "w") as f:
            f.write(text.replace(old, new))
        return path

    def test_bad_input_is_a_usage_error(self):
        missing = os.path.join(self.cluster.dir, "no-such.textproto")
        error = self.assertRaisesCode(pstrain.NotFoundError, "NOT_FOUND",
                                      lambda: pstrain.Client(missing, "worker:0"), missing)
        self.assertEqual(error.exit_code, 2)
        self.assertFalse(error.transient)
        self.assertRaisesCode(pstrain.InvalidArgumentError, "INVALID_ARGUMENT",
                              lambda: pstrain.Client(self.cluster.config_path, "ps:0"), "ps:0")
        self.assertRaisesCode(pstrain.InvalidArgumentError, "INVALID_ARGUMENT",
                              lambda: pstrain.Client(self.cluster.config_path, "worker:3"))
        self.assertRaisesCode(pstrain.InvalidArgumentError, "INVALID_ARGUMENT",
                              lambda: pstrain.Client(self.config_with("mode: SYNC", "mode: FAST"),
                                                     "worker:0"))

    def test_an_unreachable_shard_is_transient(self):
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]
        config = self.config_with(self.cluster.addresses[0], f"127.0.0.1:{port}")
        error = self.assertRaisesCode(
            pstrain.UnavailableError, "UNAVAILABLE",
            lambda: pstrain.Client(config, "worker:0", connect_timeout=0.2), "cannot reach ps:0")
        self.assertTrue(error.transient)
        self.assertEqual(error.exit_code, 1)

    def test_a_config_unlike_the_shards_is_refused(self):
        client = pstrain.Client(self.config_with("mode: SYNC", "mode: ASYNC"), "worker:0")
        self.assertRaisesCode(pstrain.FailedPreconditionError, "FAILED_PRECONDITION",
                              client.register, "start every task from the same config")

    def test_calls_out_of_order_and_wrong_arrays(self):
        client = pstrain.Client(self.cluster.config_path, "worker:0")
        self.assertRaisesCode(pstrain.FailedPreconditionError, "FAILED_PRECONDITION",
                              lambda: client._session.pull([]), "not declared")
        client.declare({"w": (50, 3), "b": (3,)})
        self.assertRaisesCode(pstrain.FailedPreconditionError, "FAILED_PRECONDITION",
                              lambda: client.declare({"w": (50, 3)}), "declared already")
        with self.assertRaises(ValueError):
            client.push({"w": np.zeros((5, 3), np.float32), "b": np.zeros(3, np.float32)})
        with self.assertRaises(KeyError):
            client.push({"w": np.zeros((50, 3), np.float32)})
        with self.assertRaises(TypeError):
            client.pull(out={"w": np.zeros((50, 3), np.float64), "b": np.zeros(3, np.float32)})
        with self.assertRaises(TypeError):
            client.pull(out={"w": np.zeros((3, 50), np.float32).T, "b": np.zeros(3, np.float32)})

    def test_a_shape_that_overflows_or_is_not_positive_is_refused(self):
        limit = str(2 ** 28)
        client = pstrain.Client(self.cluster.config_path, "worker:0")
        for shape, says in [((2 ** 62, 2 ** 62), limit), ((-2, -3), "at least 1"),
                            ((4, 0), "at least 1"), ((3, -1), "at least 1"),
                            ((2 ** 31,), limit), ((2 ** 28 + 1,), limit),
                            ((2 ** 70,), limit), ((-2 ** 70, 1), "at least 1")]:
            with self.subTest(shape=shape):
                error = self.assertRaisesCode(pstrain.InvalidArgumentError, "INVALID_ARGUMENT",
                                              lambda: client.declare({"w": shape}), says)
                self.assertIn('"w"', str(error))
                self.assertFalse(client.declared)
        # The limit holds for the whole model, not only for each variable.
        error = self.assertRaisesCode(
            pstrain.InvalidArgumentError, "INVALID_ARGUMENT",
            lambda: client.declare({"a": (2 ** 27,), "b": (2 ** 14, 2 ** 13 + 1)}), limit)
        self.assertIn('"b"', str(error))
        with self.assertRaises(TypeError):
            client.declare({"w": (2.5, 2)})
        self.assertFalse(client.declared)
        client.declare({"w": (3, 4), "scalar": ()})
        self.assertEqual(client.names, ["w", "scalar"])

    def test_after_done_the_session_only_reads(self):
        with PsCluster(BIN_DIR, workers=1, mode="ASYNC",
                       optimizer="sgd { learning_rate: 0.1 }") as cluster:
            client = pstrain.Client(cluster.config_path, "worker:0")
            client.declare_tables({"emb": 2})
            client.init(initial())
            client.push_pull(gradient(1.0))
            client.done()
            ones = np.ones((1, 2), np.float32)
            for what, call in [
                    ("push", lambda: client.push(gradient(1.0))),
                    ("push_pull", lambda: client.push_pull(gradient(1.0))),
                    ("push_rows", lambda: client.push_rows("emb", [1], ones)),
                    ("push_pull_rows", lambda: client.push_pull_rows(
                        gradient(1.0), rows={"emb": ([1], ones)})),
                    ("init", lambda: client.init(initial())),
                    ("register", client._session.register),
                    ("declare", lambda: client._session.declare([("x", [2])])),
                    ("declare_tables", lambda: client.declare_tables({"more": 2}))]:
                with self.subTest(call=what):
                    self.assertRaisesCode(pstrain.FailedPreconditionError, "FAILED_PRECONDITION",
                                          call, "after done(): the session has ended")
            self.assertEqual(client.steps, 1)
            self.assertEqual(client.stats()["version"], 1)
            # The chief reads the final model after done(), as it always has.
            values = client.pull()
            for name, value in initial().items():
                np.testing.assert_allclose(values[name], value - 0.1 * gradient(1.0)[name])
            client.pull_rows("emb", [1])


if __name__ == "__main__":
    unittest.main(verbosity=2)
