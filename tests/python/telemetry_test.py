"""A Python worker reports as the C++ worker does: a scrape of its metrics
endpoint shows the worker's metrics with the C++ worker's names and labels
(task, worker; shard per shard; variable per variable), counting the
exchanges it made, and the chief writes a TensorBoard event file with the
train/ and test/ scalars; the recorded curve goes into its result."""

import os
import struct
import tempfile
import unittest
import urllib.request

import numpy as np

import pstrain
from ps_cluster import PsCluster

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]


def scalar_tags(path):
    """The tags of the scalars in a TFRecord file of tensorflow.Event protos
    (each record: length, its CRC, the Event, its CRC)."""
    tags = []
    with open(path, "rb") as f:
        data = f.read()
    offset = 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        event = data[offset + 12:offset + 12 + length]
        offset += 12 + length + 4
        for tag in (b"train/loss", b"train/samples_per_sec", b"train/staleness", b"test/loss",
                    b"test/accuracy"):
            if tag in event:
                tags.append(tag.decode())
    return tags


def metric(text, name, **labels):
    """The value of the series `name` whose labels include `labels`."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        label_text = line[len(name) + 1:line.index("}")]
        found = dict(part.split("=", 1) for part in label_text.split(","))
        if all(found.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} with {labels} in the scrape:\n{text}")


class TelemetryTest(unittest.TestCase):
    def test_a_scrape_and_an_event_file_show_what_the_worker_did(self):
        with PsCluster(BIN_DIR, workers=1, shards=2, optimizer="sgd { learning_rate: 0.5 }") \
                as cluster, tempfile.TemporaryDirectory(prefix="pstrain-tb-") as logdir:
            client = pstrain.Client(cluster.config_path, "worker:0", metrics_port=0,
                                    logdir=logdir)
            self.assertGreater(client.metrics_port, 0)
            client.init({"w": np.zeros(6, np.float32), "b": np.zeros(3, np.float32)})
            client.pull()
            for _ in range(3):
                client.gradients["w"][:] = 2.0
                client.gradients["b"][:] = 0.0
                client.push_pull(client.gradients)
            client.record_window(loss=1.5, samples=24)
            client.record_evaluation(test_loss=0.7, test_accuracy=0.75, epochs_done=1)

            with urllib.request.urlopen(
                    f"http://127.0.0.1:{client.metrics_port}/metrics", timeout=10) as answer:
                text = answer.read().decode()
            me = {"task": "worker:0", "worker": "0"}
            self.assertEqual(metric(text, "pst_worker_steps_total", **me), 3)
            self.assertEqual(metric(text, "pst_worker_samples_total", **me), 24)
            self.assertEqual(metric(text, "pst_worker_push_seconds_count", **me), 3)
            self.assertEqual(metric(text, "pst_worker_pull_seconds_count", **me), 1)
            self.assertEqual(metric(text, "pst_worker_step_seconds_count", **me), 3)
            self.assertEqual(metric(text, "pst_worker_loss", **me), 1.5)
            for shard in ("0", "1"):
                self.assertEqual(metric(text, "pst_worker_version", shard=shard, **me), 3)
                self.assertEqual(
                    metric(text, "pst_worker_push_staleness_count", shard=shard, **me), 3)
                self.assertEqual(
                    metric(text, "pst_worker_pushes_dropped_total", shard=shard, **me), 0)
            self.assertAlmostEqual(metric(text, "pst_worker_gradient_norm", variable="w", **me),
                                   np.sqrt(6 * 4.0), places=5)

            self.assertTrue(client.events_path.startswith(logdir))
            tags = scalar_tags(client.events_path)
            for tag in ("train/loss", "train/samples_per_sec", "train/staleness", "test/loss",
                        "test/accuracy"):
                self.assertIn(tag, tags)
            result = client.report()
            self.assertEqual([p["step"] for p in result["curve"]], [3])
            self.assertEqual(result["curve"][0]["loss"], 1.5)
            self.assertEqual(result["evals"][0]["test_accuracy"], 0.75)
            client.done()

    def test_steps_that_carry_embedding_rows_are_counted_as_steps(self):
        with PsCluster(BIN_DIR, workers=1, mode="ASYNC",
                       optimizer="sgd { learning_rate: 0.5 }") as cluster:
            client = pstrain.Client(cluster.config_path, "worker:0", metrics_port=0)
            client.declare_tables({"emb": 4})
            client.init({"w": np.zeros(6, np.float32)})
            client.pull()

            def scrape():
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{client.metrics_port}/metrics", timeout=10) as answer:
                    text = answer.read().decode()
                me = {"task": "worker:0", "worker": "0"}
                return (metric(text, "pst_worker_steps_total", **me),
                        metric(text, "pst_worker_push_seconds_count", **me))

            steps, pushes = scrape()
            ids = np.array([3, 7], np.uint64)
            for _ in range(2):
                client.gradients["w"][:] = 1.0
                client.push_pull_rows(client.gradients,
                                      rows={"emb": (ids, np.ones((2, 4), np.float32))},
                                      next_ids={"emb": ids})
            client.push_rows("emb", ids, np.ones((2, 4), np.float32))
            self.assertEqual(scrape(), (steps + 3, pushes + 3))
            client.done()

    def test_no_endpoint_and_no_events_unless_asked(self):
        with PsCluster(BIN_DIR, workers=1) as cluster:
            saved = {k: os.environ.pop(k, None) for k in
                     (pstrain.METRICS_PORT_ENV, pstrain.LOGDIR_ENV)}
            try:
                os.environ[pstrain.METRICS_PORT_ENV] = "0"  # pslaunch without --metrics_port
                client = pstrain.Client(cluster.config_path, "worker:0")
                self.assertEqual(client.metrics_port, 0)
                self.assertEqual(client.events_path, "")
            finally:
                for k, v in saved.items():
                    os.environ.pop(k, None)
                    if v is not None:
                        os.environ[k] = v

    def test_a_port_in_use_is_an_error(self):
        with PsCluster(BIN_DIR, workers=1) as cluster:
            first = pstrain.Client(cluster.config_path, "worker:0", metrics_port=0)
            with self.assertRaises(pstrain.UnavailableError):
                pstrain.Client(cluster.config_path, "worker:0", metrics_port=first.metrics_port)


if __name__ == "__main__":
    unittest.main(verbosity=2)
