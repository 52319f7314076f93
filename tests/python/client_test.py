"""pstrain.Client against real ps_server processes on loopback: the round
trip (init, pull, push, push_pull), SYNC averaging with the GIL released
while a pull waits, and every failure as a pstrain.Error with its code.

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


if __name__ == "__main__":
    unittest.main(verbosity=2)
