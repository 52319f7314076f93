#!/usr/bin/env python3
"""Offline check of deploy/grafana/pstrain.json (no Grafana, no Prometheus).

The dashboard parses as JSON and has the shape Grafana imports (panels with
a position, targets with a refId and a PromQL expression on the Prometheus
data source it asks for); it shows a run (samples/s, step time, staleness,
drops, checkpoint age); and every metric its queries name is one the
processes serve: the README's metrics table, which tests/e2e/observe_test.cc
keeps equal to what a running ps_server and worker serve. A histogram's
_bucket, _sum and _count series count as its name.

Usage: grafana_dashboard_test.py SOURCE_DIR
"""
import json
import os
import re
import sys
import unittest

SOURCE_DIR = ""

# PromQL words that are neither metrics nor functions.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expr):
    """The metric names a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)        # strings (label values)
    text = re.sub(r"\{[^}]*\}", "", text)                 # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)                # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\$\{?\w+\}?", "", text)               # Grafana variables
    names = set()
    # Not after a digit: the unit of a duration (5m) or an exponent (1e3).
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        after = text[match.end():].lstrip()
        if word.lower() in KEYWORDS or after.startswith("("):
            continue  # a keyword or a function
        names.add(word)
    return names


def readme_metrics():
    """{name: type} from the README's metrics table (first two columns)."""
    metrics = {}
    with open(os.path.join(SOURCE_DIR, "README.md")) as f:
        for line in f:
            if not line.startswith("| `pst_"):
                continue
            cells = line.split("|")
            types = [t.strip() for t in cells[2].split(";")]
            groups = cells[1].split(";")
            for i, group in enumerate(groups):
                for name in re.findall(r"`([^`]+)`", group):
                    metrics[name] = types[min(i, len(types) - 1)]
    return metrics


def load_dashboard():
    with open(os.path.join(SOURCE_DIR, "deploy", "grafana", "pstrain.json")) as f:
        return json.load(f)


def served(name, metrics):
    if name in metrics:
        return True
    for suffix in HISTOGRAM_SUFFIXES:
        base = name[: -len(suffix)]
        if name.endswith(suffix) and metrics.get(base) == "histogram":
            return True
    return False


class MetricNamesTest(unittest.TestCase):
    def test_finds_metrics_and_skips_functions_labels_and_keywords(self):
        expr = ('histogram_quantile(0.9, sum by (le, shard) (rate(pst_a_bucket{task="ps:0"}'
                '[$__rate_interval]))) / on (shard) group_left pst_b - max without (worker) '
                '(pst_c offset 5m)')
        self.assertEqual(metric_names(expr), {"pst_a_bucket", "pst_b", "pst_c"})

    def test_an_unknown_name_is_not_served(self):
        metrics = {"pst_x_seconds": "histogram", "pst_y_total": "counter"}
        self.assertTrue(served("pst_x_seconds_bucket", metrics))
        self.assertTrue(served("pst_y_total", metrics))
        self.assertFalse(served("pst_y_total_count", metrics))  # not a histogram
        self.assertFalse(served("pst_z", metrics))


class DashboardTest(unittest.TestCase):
    def setUp(self):
        self.dashboard = load_dashboard()
        self.panels = self.dashboard["panels"]
        self.targets = [(p["title"], t) for p in self.panels for t in p["targets"]]

    def test_has_the_shape_grafana_imports(self):
        self.assertTrue(self.dashboard["title"])
        self.assertTrue(self.dashboard["uid"])
        inputs = {i["name"]: i["pluginId"] for i in self.dashboard["__inputs"]}
        self.assertEqual(inputs, {"DS_PROMETHEUS": "prometheus"})
        ids = [p["id"] for p in self.panels]
        self.assertEqual(len(ids), len(set(ids)))
        for panel in self.panels:
            with self.subTest(panel=panel["title"]):
                self.assertEqual(set(panel["gridPos"]), {"h", "w", "x", "y"})
                self.assertLessEqual(panel["gridPos"]["x"] + panel["gridPos"]["w"], 24)
                self.assertEqual(panel["datasource"]["uid"], "${DS_PROMETHEUS}")
                ref_ids = [t["refId"] for t in panel["targets"]]
                self.assertTrue(ref_ids)
                self.assertEqual(len(ref_ids), len(set(ref_ids)))

    def test_shows_a_run(self):
        titles = " ".join(p["title"].lower() for p in self.panels)
        for subject in ("samples/s", "step time", "staleness", "dropped", "checkpoint age"):
            self.assertIn(subject, titles)

    def test_queries_name_only_served_metrics(self):
        metrics = readme_metrics()
        self.assertGreater(len(metrics), 30, "the README's metrics table was not found")
        named = set()
        for title, target in self.targets:
            names = metric_names(target["expr"])
            with self.subTest(panel=title, expr=target["expr"]):
                self.assertTrue(names, "names no metric")
                for name in names:
                    self.assertTrue(served(name, metrics), f"{name} is not a metric pstrain serves")
            named |= names
        # Both processes are on the dashboard.
        self.assertTrue(any(n.startswith("pst_ps_") for n in named))
        self.assertTrue(any(n.startswith("pst_worker_") for n in named))


if __name__ == "__main__":
    SOURCE_DIR = sys.argv.pop(1)
    unittest.main()
