#!/usr/bin/env python3
"""benchmarks/cost_model.py: the formulas by hand, the fit recovering the
constants rows were made with, and scripts/cost_model_plot.py drawing a PNG
from the rows `beyond` writes (or saying, in one line, why it cannot).

Usage: cost_model_test.py SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = sys.argv[1] if len(sys.argv) > 1 else ""
sys.path.insert(0, os.path.join(SOURCE_DIR, "benchmarks"))
import cost_model  # noqa: E402  (after its folder is on the path)

HAND = {"alpha": 1e-3, "beta": 0.5e-3, "eta_w": 1.0, "fill": 1.0, "eta_s": 2.0, "gamma": 1e-9,
        "eta_y": 2.0}


def job(mode, workers=4):
    return {"workers": workers, "shards": 2, "wire_bytes": 4e6, "link_bytes_per_s": 1e9,
            "mode": mode, "rtt_s": 0.1e-3, "compute_s": 5e-3, "shard_share": 0.5}


class FormulaTest(unittest.TestCase):
    # The cases of tests/psctl/plan_test.cc: both sides compute the same model.
    def test_sync_adds_compute_messages_the_busiest_port_fill_and_apply(self):
        fill_ms = 2 * 1048576 / 1e6
        self.assertAlmostEqual(cost_model.step_seconds(HAND, job("sync")) * 1e3,
                               5 + 2.1 + 8 + fill_ms + 8, places=9)

    def test_async_is_the_longer_of_the_workers_path_and_the_shards_queue(self):
        self.assertAlmostEqual(cost_model.step_seconds(HAND, job("async")) * 1e3, 16, places=9)
        fill_ms = 2 * 1048576 / 1e6
        self.assertAlmostEqual(cost_model.step_seconds(HAND, job("async", workers=1)) * 1e3,
                               5 + 2.1 + 4 + fill_ms, places=9)

    def test_the_mlp_share_follows_the_placement(self):
        self.assertEqual(cost_model.mlp_share(1), 1.0)
        self.assertAlmostEqual(cost_model.mlp_share(2), 118016 / 235146, places=12)


class FitTest(unittest.TestCase):
    def test_rows_made_by_known_constants_give_them_back(self):
        truth = {"alpha": 2e-3, "beta": 0.3e-3, "eta_w": 1.2, "fill": 0.8, "eta_s": 1.7,
                 "gamma": 3e-9, "eta_y": 1.0}
        jobs = [{"workers": n, "shards": k, "wire_bytes": m, "link_bytes_per_s": b}
                for b in (25e6, 50e6) for m in (1 << 20, 4 << 20, 16 << 20)
                for k in (1, 2, 4) for n in (1, 2, 4, 8)]
        measured = [cost_model.step_seconds(truth, j) for j in jobs]
        fitted = cost_model.fit(jobs, measured)
        for name, value in truth.items():
            self.assertAlmostEqual(fitted[name] / value, 1.0, places=4, msg=name)


    def test_syncs_own_constant_is_fitted_alone(self):
        truth = dict(HAND, eta_y=1.3)
        jobs = [{"workers": 4, "shards": k, "wire_bytes": 1e6, "link_bytes_per_s": 25e6,
                 "mode": "sync", "compute_s": 0.015, "shard_share": 1 / k} for k in (1, 2, 4)]
        measured = [cost_model.step_seconds(truth, j) for j in jobs]
        fitted = cost_model.fit_from(dict(HAND, eta_y=1.0), jobs, measured, only={"eta_y"})
        self.assertAlmostEqual(fitted["eta_y"], 1.3, places=6)
        self.assertEqual({k: v for k, v in fitted.items() if k != "eta_y"},
                         {k: v for k, v in HAND.items() if k != "eta_y"})


class PlotTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="cost_model_test.")
        self.addCleanup(self.dir.cleanup)

    def plot(self, rows_path):
        out = os.path.join(self.dir.name, "plot.png")
        run = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "scripts",
                                                           "cost_model_plot.py"),
                              rows_path, "--out=" + out], capture_output=True, text=True)
        return run, out

    def test_draws_a_png_from_the_rows_beyond_writes(self):
        rows = os.path.join(self.dir.name, "cost_model.json")
        with open(rows, "w") as f:
            for row in cost_model.beyond(HAND):
                f.write(json.dumps(row) + "\n")
        run, out = self.plot(rows)
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertGreater(os.path.getsize(out), 10000)

    def test_the_committed_rows_draw(self):
        run, _ = self.plot(os.path.join(SOURCE_DIR, "docs", "bench", "cost_model.json"))
        self.assertEqual(run.returncode, 0, run.stderr)

    def test_rows_without_curves_are_one_line_and_exit_code_two(self):
        rows = os.path.join(self.dir.name, "dense_only.json")
        with open(rows, "w") as f:
            f.write(json.dumps({"benchmark": "cost_model", "part": "dense"}) + "\n")
        run, out = self.plot(rows)
        self.assertEqual(run.returncode, 2)
        self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
