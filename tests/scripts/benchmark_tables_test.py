#!/usr/bin/env python3
"""scripts/benchmark_tables.py and docs/benchmarks.md.

--update replaces only the text between a doc's table markers, with the
tables rendered from BENCH_DIR/KIND.json; a second run changes nothing; a
missing JSON file leaves its section as it was and says so; bad input is one
line and exit code 2, with the doc untouched. Every kind renders. And the
doc quotes every command scripts/run_benchmarks.sh runs, and its tables are
those of docs/bench/.

Usage: benchmark_tables_test.py SOURCE_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = ""

# One row of every kind, as the benchmarks and drivers write them.
ROWS = {
    "machine": [{"date": "2026-11-24 06:40", "cpu": "AMD EPYC", "nproc": 2, "gpu": ""}],
    "train_vs_torch": [
        {"optimizer": "sgd", "batch_size": 64, "hidden": [256, 128], "variant": "ours 2 workers",
         "median_samples_per_sec": 39577.4, "min": 34989.5, "max": 49053.0, "runs": 5},
        {"optimizer": "sgd", "batch_size": 64, "hidden": [256, 128],
         "ratio_2_workers_vs_ddp": 1.271, "ratio_best_vs_torch_1_process": 1.606,
         "ratio_best_vs_torch_1_process_2_threads": 1.824,
         "ratio_best_vs_best_torch_1_process_same_samples_per_update": 1.102}],
    "ctr_vs_torch": [
        {"variant": "ours SYNC 2 workers", "samples_per_update": 512, "runs": 3,
         **{f"{f}{end}": v for f, v in (("samples_per_sec", 39112.0), ("test_auc", 0.806),
                                        ("test_logloss", 0.4728), ("load_1min", 8.97))
            for end in ("", "_min", "_max")}},
        {"ours": "ours SYNC 2 workers", "samples_per_update": 512,
         "best_peer": "torch 1 process 1 thread", "faster_one_process": "torch 1 process 1 thread",
         "planted_auc": 0.8139, "ratio": 3.149, "auc_difference": -0.0012}],
    "time_to_accuracy": [
        {"arm": "tcp", "config": "configs/local.textproto", "flags": "--shm=off", "target": 0.88,
         "runs": 2, "reached": 2, "epoch": 5, "epoch_min": 5, "epoch_max": 5, "seconds": 9.6,
         "seconds_min": 9.5, "seconds_max": 9.7, "final_accuracy": 0.8939,
         "final_accuracy_min": 0.8939, "final_accuracy_max": 0.8939, "samples_per_sec": 31720,
         "samples_per_sec_min": 30000, "samples_per_sec_max": 33000}],
    "train_bench": [
        {"mode": "sync", "workers": 1, "batch_size": 64, "runs": 3, "samples_per_sec": 25333,
         "samples_per_sec_min": 18858, "samples_per_sec_max": 25994},
        {"straggler_delay_ms": 20, "replicas_to_aggregate": 2, "runs": 3,
         "fast_samples_per_sec": 23835, "fast_samples_per_sec_min": 22553,
         "fast_samples_per_sec_max": 26910},
        {"push_pull_bytes": 1881168, "runs": 3, "p50_us": 2582, "p50_us_min": 2065,
         "p50_us_max": 2630, "p99_us": 15261, "p99_us_min": 13266, "p99_us_max": 15883}],
    "main_job": [
        {"config": "configs/local.textproto", "mode": "sync", "workers": 2, "epochs": 15,
         "devices": "cpu", "runs": 2, "test_accuracy": 0.8939, "test_accuracy_min": 0.8939,
         "test_accuracy_max": 0.8939, "train_samples_per_sec": 31659.2,
         "train_samples_per_sec_min": 30324.8, "train_samples_per_sec_max": 32993.6}],
    "ps_bench_shards": [
        {"size": "4MiB", "size_bytes": 4194304, "workers": 2, "shards": 4, "transport": "tcp",
         "runs": 3, "push_pull_gbps": 1.288, "push_pull_gbps_min": 1.159,
         "push_pull_gbps_max": 1.378}],
    "ps_bench_wire_dtype": [
        {"size": "4MiB", "size_bytes": 4194304, "wire_dtype": "bfloat16", "transport": "tcp",
         "runs": 3, "wire_bytes_per_round_trip": 4194304, "push_pull_gbps": 0.553,
         "push_pull_gbps_min": 0.493, "push_pull_gbps_max": 0.611}],
    "ps_bench_sizes": [
        {"size": "256MiB", "size_bytes": 268435456, "workers": 1, "transport": "tcp", "runs": 1,
         "push_pull_gbps": 1.165, "push_pull_gbps_min": 1.165, "push_pull_gbps_max": 1.165}],
    "ps_bench_pslite": [
        {"size": "4MiB", "size_bytes": 4194304, "workers": 2, "transport": "ps-lite", "runs": 3,
         "push_pull_gbps": 1.5, "push_pull_gbps_min": 1.4, "push_pull_gbps_max": 1.6,
         "cpu_us_per_round_trip": 9000, "cpu_us_per_round_trip_min": 8000,
         "cpu_us_per_round_trip_max": 9500, "p50_us": 5000, "p50_us_min": 4900,
         "p50_us_max": 5100},
        {"size": "4MiB", "size_bytes": 4194304, "workers": 2, "transport": "tcp", "runs": 3,
         "push_pull_gbps": 1.8, "push_pull_gbps_min": 1.7, "push_pull_gbps_max": 1.9,
         "vs_peer": 1.2, "vs_peer_min": 1.1, "vs_peer_max": 1.3,
         "cpu_us_per_round_trip": 8000, "cpu_us_per_round_trip_min": 7000,
         "cpu_us_per_round_trip_max": 8500, "cpu_vs_peer": 0.9, "cpu_vs_peer_min": 0.8,
         "cpu_vs_peer_max": 1.0, "p50_us": 4000, "p50_us_min": 3900, "p50_us_max": 4100}],
    "ps_bench": [
        {"size": "4KiB", "size_bytes": 4096, "workers": 1, "transport": "shm", "runs": 3,
         "push_pull_gbps": 0.109, "push_pull_gbps_min": 0.098, "push_pull_gbps_max": 0.121}],
    "metrics_bench": [
        {"operation": "Counter::Increment", "registry": "prometheus-cpp", "threads": 2, "runs": 3,
         "ns_per_op": 39.1, "ns_per_op_min": 38.0, "ns_per_op_max": 41.5},
        {"operation": "Counter::Increment", "registry": "lock-free", "threads": 2, "runs": 3,
         "ns_per_op": 29.0, "ns_per_op_min": 25.7, "ns_per_op_max": 31.8}],
    "gpu_bench": [
        {"model": "784-1024-1024-10", "batch": 256, "runs": 3, "step_ms": 0.5, "step_ms_min": 0.4,
         "step_ms_max": 0.6, "ratio": 1.2, "ratio_min": 1.1, "ratio_max": 1.3}],
    "netns_cluster": [
        {"kind": "bench", "rate": "200mbit", "size": "4MiB", "shards": 2, "workers": 4,
         "role": "held_out", "step_ms": 538.86, "predicted_step_ms": 500.0, "error_pct": -7.2,
         "gbytes_per_s": 0.062, "cpu_cores_ps": 0.1, "cpu_cores_workers": 0.08,
         "cpu_cores_machine": 2.0},
        {"kind": "train", "rate": "200mbit", "shards": 2, "workers": 4, "role": "held_out",
         "test_accuracy": 0.81, "samples_per_s": 2500.0, "step_ms": 100.0, "compute_ms": 6.0,
         "predicted_step_ms": 95.0, "error_pct": -5.0, "cpu_cores_ps": 0.1,
         "cpu_cores_workers": 0.3, "cpu_cores_machine": 2.0},
        {"constants": {"alpha": 0.002, "beta": 0.001, "eta_w": 1.1, "fill": 0.9, "eta_s": 1.6,
                       "gamma": 2e-9, "eta_y": 1.2},
         "fit": {"rows": 40, "mean_abs_error_pct": 5.0, "max_abs_error_pct": 12.0},
         "held_out": {"rows": 20, "mean_abs_error_pct": 6.0, "max_abs_error_pct": 14.0},
         "cpu_bound": {"rows": 0, "mean_abs_error_pct": None, "max_abs_error_pct": None},
         "cpu_ns_per_byte_ps": 0.8, "cpu_ns_per_byte_workers": 0.7}],
    "cost_model": [
        {"part": "dense", "link_gbit": 25, "model_bytes": 1e9, "workers": 64, "ring_ms": 630.0,
         "ps_best_case_ms": 320.0, "ours_k_eq_n_ms": 1400.0, "crossing_k": None,
         "ours_fed_k_eq_n_ms": 520.0, "fed_crossing_k": 52},
        {"part": "embedding", "link_gbit": 25, "workers": 8, "ids_per_batch": 4096, "dim": 64,
         "table_bytes": 25.6e9, "bytes_per_step": 1081344, "shards": 1, "ours_ms": 5.0,
         "ring_dense_table_ms": 14336.0, "allgather_rows_ms": 2.4}],
    "python_client": [
        {"transport": "shm", "size": "4MiB", "size_bytes": 4194304, "runs": 3,
         **{f"{f}{end}": v for f, v in (("cpp_p50_us", 900.0), ("python_p50_us", 950.0),
                                        ("python_over_cpp", 1.05), ("cpu_python_over_cpp", 1.02),
                                        ("cpp_push_pull_gbps", 4.0),
                                        ("python_push_pull_gbps", 3.9))
            for end in ("", "_min", "_max")}}],
    "table_bench": [
        {"part": "scale", "rows": 10000000, "dim": 16, "shards": 2, "optimizer": "adagrad",
         "fill_rows_per_second": 690000, "rss_bytes_per_row": 177.4,
         "table_bytes_per_row": 172.5, "raw_bytes_per_row": 128, "batch_rows": 16384,
         "steps_per_second": 32.2, "steps_per_second_min": 25.2, "steps_per_second_max": 41.4,
         "rows_per_second": 527565, "rows_per_second_min": 412877,
         "rows_per_second_max": 678298, "load": 8.9},
        {"part": "bound", "ids_sent": 10000000, "max_rows": 1000000, "rows": 1000000,
         "rows_admitted": 1000000, "rows_refused": 9000000, "rss_before_bytes": 22020096,
         "rss_at_limit_bytes": 241696768, "rss_peak_bytes": 252342272,
         "rss_growth_bytes": 230322176, "bound_bytes": 259112960, "load": 8.8},
        {"part": "stall", "variant": "table", "rows": 5000000, "dim": 16, "rounds": 3,
         **{f"{f}{end}": v for f, v in (("longest_ms", 12.5), ("median_ms", 0.4),
                                        ("quiet_median_ms", 0.3), ("checkpoint_s", 14.0))
            for end in ("", "_min", "_max")}, "load": 12.0}],
    "row_step_bench": [
        {"ranks": 2, "batch": 256, "fields": 26, "distinct": 100000, "dims": "8,1",
         "optimizer": "adagrad", "rounds": 3, "ids_per_step": 9400, "rows_held": 1500000,
         **{f"{f}{end}": v for f, v in (("land_us", 300.0), ("stage_us", 2600.0),
                                        ("commit_us", 800.0), ("answer_us", 1700.0),
                                        ("step_us", 5400.0))
            for end in ("", "_min", "_max")}, "rows_per_second": 3481481, "load": 2.2}],
    "ctr_scale": [
        {"rows": 10000000, "distinct_per_field": 384616, "train_examples": 1500000,
         "workers": 2, "shards": 2, "mode": "SYNC", "batch_size": 256, "dim": 8, "runs": 1,
         "cpus": 2,
         "planted_auc": 0.7012,
         **{f"{f}{end}": v for f, v in (("samples_per_sec", 21000.0),
                                        ("rows_created", 9300000), ("rows_refused", 0),
                                        ("ps_peak_rss_mib", 1900.4),
                                        ("test_auc", 0.6801), ("load_1min", 7.5))
            for end in ("", "_min", "_max")}}],
    "replication_cost": [
        {"job": "ctr", "mode": "sync", "runs": 3, "cpus": 2, "load_1min": 1.02,
         "metric": "test AUC",
         "without_metric": 0.7758, "with_metric": 0.7758,
         "forwarded_bytes_per_version": 437348, "forwarded_mib_per_sec": 21.8,
         **{f"{f}{end}": v for f, v in (("without_samples_per_sec", 71367.0),
                                        ("with_samples_per_sec", 33047.0), ("ratio", 0.46))
            for end in ("", "_min", "_max")}},
        {"job": "default", "mode": "sync", "cluster": "netns 10gbit", "runs": 3, "cpus": 16,
         "load_1min": 2.5,
         "metric": "test accuracy", "without_metric": 0.8432, "with_metric": 0.8432,
         "without_ps_cores": 0.6, "with_ps_cores": 0.93, "same_model": True,
         **{f"{f}{end}": v for f, v in (("without_samples_per_sec", 23970.0),
                                        ("with_samples_per_sec", 13245.0), ("ratio", 0.57))
            for end in ("", "_min", "_max")}}],
    "failover_chaos": [
        {"job": "ctr", "mode": "sync", "lease_seconds": 1, "kills": 10, "shards": 2,
         "failover_p50_s": 1.12, "failover_max_s": 1.41, "metric": "test_auc",
         "quiet_metric": 0.8014, "chaos_metric": 0.8014, "steps": 3906, "load_1min": 3.1,
         "model_equal": True, "metric_equal": True}],
}

ROWS["netns_link"] = [
    {"rate": "2gbit", "size": "64MiB", "size_bytes": 67108864, "runs": 3,
     **{f"{k}{s}": v for k, v in (("ours_gbps", 0.45), ("iperf3_gbps", 0.47),
                                   ("of_iperf3", 0.95), ("ps_cpu_ns_per_byte", 0.68),
                                   ("worker_cpu_ns_per_byte", 0.61),
                                   ("iperf3_cpu_ns_per_byte", 0.82),
                                   ("cpu_cores_machine", 0.57)) for s in ("", "_min", "_max")}},
    {"rate": "10gbit", "size": "4MiB", "size_bytes": 4194304, "runs": 3,
     **{f"{k}{s}": v for k, v in (("ours_gbps", 1.0), ("iperf3_gbps", 1.29),
                                   ("of_iperf3", 0.8), ("ps_cpu_ns_per_byte", 0.76),
                                   ("worker_cpu_ns_per_byte", 0.55),
                                   ("iperf3_cpu_ns_per_byte", 1.11),
                                   ("cpu_cores_machine", 1.42)) for s in ("", "_min", "_max")}}]

# What each kind's table shows of ROWS.
ROWS["cnn_vs_ddp"] = [
    {"batch": 64, "steps": 200, "threads": 1, "blas_threads": "threads", "rounds": 5,
     "ours_samples_per_sec": [3857.8, 3677.1, 3950.9],
     "ddp_samples_per_sec": [3590.1, 3494.8, 3642.5], "ours_over_ddp": [1.068, 1.052, 1.129]}]
ROWS["cnn_time_to_accuracy"] = [
    {"target": 0.91, "epochs": 15, "batch": 64, "threads": 1, "ours_epoch": 11,
     "ours_seconds": 200.4, "ours_final_accuracy": 0.915, "ddp_epoch": None,
     "ddp_seconds": None, "ddp_final_accuracy": 0.9032}]

EXPECTED = {
    "machine": "| GPU | none |",
    "train_vs_torch": "| 784-256-128-10 | 64 | sgd | 1.27 | 1.61 | 1.82 | 1.10 |",
    "ctr_vs_torch": "| ours SYNC 2 workers | 512 | torch 1 process 1 thread "
                    "| torch 1 process 1 thread | 3.15 | -0.0012 | 0.8139 |",
    "time_to_accuracy": "| tcp | `configs/local.textproto --shm=off` | 5 (5-5) | 9.6 (9.5-9.7) |",
    "train_bench": "| 1881168 | 2582 (2065-2630) | 15261 (13266-15883) | 3 |",
    "main_job": "| 31659 (30325-32994) |",
    "ps_bench_shards": "| 4 | 4MiB | 2 | tcp | 1.288 (1.159-1.378) |",
    "ps_bench_wire_dtype": "| 4MiB | bfloat16 | tcp | 4194304 | 0.553 (0.493-0.611) |",
    "ps_bench_sizes": "| 256MiB | 1 | tcp | 1.165 (1.165-1.165) | n/a |",
    "ps_bench_pslite": "| 4MiB | 2 | 1.800 (1.700-1.900) | 1.500 (1.400-1.600) | 1.20 (1.10-1.30) "
                       "| 8000 (7000-8500) | 9000 (8000-9500) | 0.90 (0.80-1.00) |",
    "ps_bench": "| 4KiB | 1 | shm | 0.109 (0.098-0.121) |",
    "metrics_bench": "| `Counter::Increment` | 2 | 39.1 (38.0-41.5) | 29.0 (25.7-31.8) | ns | 3 |",
    "gpu_bench": "| 784-1024-1024-10 | 256 | 0.500 (0.400-0.600) |",
    "netns_cluster": "| 2.00 | 1.00 | 1.10 | 0.90 | 1.60 | 2.000 | 1.20 |",
    "cost_model": "| 25 | 1000 MB | 64 | 630 | 320 | 1.4e+03 | none | 520 | 52 |",
    "python_client": "| shm | 4MiB | 900 (900-900) | 950 (950-950) | 1.050 (1.050-1.050) |",
    "table_bench": "| table | 5000000 rows x 16 | 12.5 (12.5-12.5) | 0.40 (0.40-0.40) |",
    "row_step_bench": "| 2 | 256 | 26 | 100000 | 8,1 | adagrad | all in RAM | 9400 | 1500000 | - "
                      "| 300 (300-300) "
                      "| 2600 (2600-2600) | 800 (800-800) | 1700 (1700-1700) "
                      "| 5400 (5400-5400) | 3481481 | 3 | 2.2 |",
    "ctr_scale": "| 2 | 10000000 | 0.5 | 8 | all | 9300000 | 0 | 1500000 "
                 "| SYNC, 2 workers x 256, 2 shards | 21000 (21000-21000) | - | 1900 (1900-1900) "
                 "| - | - | 0.6801 (0.6801-0.6801) "
                 "| 0.7012 |",
    "netns_link": "| 2gbit | 64MiB | 0.450 (0.450-0.450) | 0.470 (0.470-0.470) | 0.95 (0.95-0.95) "
                  "| 0.68 (0.68-0.68) | 0.61 (0.61-0.61) | 0.82 (0.82-0.82) | 0.57 (0.57-0.57) | 3 |\n"
                  "| 10gbit | 4MiB |",
    "replication_cost": "| ctr | sync | one host, loopback | 2 | 71367 (71367-71367) "
                        "| 33047 (33047-33047) | 0.46 (0.46-0.46) | test AUC 0.7758 | 0.7758 | 427 "
                        "| 21.8 | n/a | 1.02 | 3 |\n"
                        "| default | sync | namespaces, 10gbit links | 16 "
                        "| 23970 (23970-23970) | 13245 (13245-13245) | 0.57 (0.57-0.57) "
                        "| test accuracy 0.8432 | 0.8432 | n/a | n/a | 0.60 / 0.93 | 2.50 | 3 |",
    "failover_chaos": "| ctr | sync | 1 | 10 (2) | 1.12 | 1.41 | model bitwise equal, test_auc 0.8014 "
                      "(equal) | 3.10 |",
    "cnn_vs_ddp": "| 64 | 200 | 3858 (3677-3951) | 3590 (3495-3642) | 1.07 (1.05-1.13) | 5 |",
    "cnn_time_to_accuracy": "| 0.91 | 15 | 11 (200.4 s) | not reached | 0.9150 | 0.9032 |",
}

DOC = """# Benchmarks

Prose before, kept as it is.

<!-- table: train_bench/backup_workers -->
an old table
<!-- /table -->

Reading between, kept.

<!-- table: metrics_bench -->
a hand-written table
<!-- /table -->

<!-- table: train_bench -->
<!-- /table -->
Prose after.
"""


def write_rows(path, kind, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(dict(benchmark=kind, **row)) + "\n")


class BenchmarkTablesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="benchmark_tables_test.")
        self.doc = os.path.join(self.dir.name, "benchmarks.md")
        self.bench = os.path.join(self.dir.name, "bench")
        os.mkdir(self.bench)
        with open(self.doc, "w") as f:
            f.write(DOC)
        write_rows(os.path.join(self.bench, "train_bench.json"), "train_bench",
                   ROWS["train_bench"])

    def tearDown(self):
        self.dir.cleanup()

    def tables(self, *args):
        return subprocess.run(
            [sys.executable, os.path.join(SOURCE_DIR, "scripts", "benchmark_tables.py"), *args],
            capture_output=True, text=True)

    def read_doc(self):
        with open(self.doc) as f:
            return f.read()

    def test_update_renders_between_markers_and_keeps_the_rest(self):
        out = self.tables("--update", self.doc)
        self.assertEqual(out.returncode, 0, out.stderr)
        text = self.read_doc()
        for kept in ["Prose before, kept as it is.", "Reading between, kept.", "Prose after.",
                     "<!-- table: metrics_bench -->\na hand-written table\n<!-- /table -->"]:
            self.assertIn(kept, text)
        self.assertNotIn("an old table", text)
        self.assertIn("<!-- table: train_bench/backup_workers -->\n"
                      "| replicas_to_aggregate |", text)
        self.assertIn("| 2 | 20 | 23835 (22553-26910) | 3 |\n<!-- /table -->", text)
        # The whole kind: its three tables.
        whole = text[text.index("<!-- table: train_bench -->"):]
        for header in ["| mode |", "| bytes moved (both ways) |", "| replicas_to_aggregate |"]:
            self.assertIn(header, whole)
        self.assertIn("metrics_bench.json does not exist; left the table \"metrics_bench\"",
                      out.stderr)

    def test_a_second_update_changes_nothing(self):
        self.assertEqual(self.tables("--update", self.doc).returncode, 0)
        once = self.read_doc()
        out = self.tables("--update", self.doc, f"--bench_dir={self.bench}")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(self.read_doc(), once)

    def test_every_kind_renders(self):
        for kind, rows in ROWS.items():
            with self.subTest(kind=kind):
                path = os.path.join(self.bench, kind + ".json")
                write_rows(path, kind, rows)
                out = self.tables(path)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertIn(EXPECTED[kind], out.stdout)

    def test_bad_input_is_one_line_and_leaves_the_doc(self):
        broken = os.path.join(self.bench, "broken.json")
        with open(broken, "w") as f:
            f.write("{not json\n")
        cases = [
            # (doc text, train_bench.json text (None: valid rows), arguments, message)
            (DOC, "{not json\n", ["--update", self.doc], "not one JSON object a line"),
            (DOC, '{"benchmark": "train_bench", "mode": "sync"}\n', ["--update", self.doc],
             "a train_bench row fits none of its tables"),
            (DOC, '{"benchmark": "train_bench", "mode": "sync", "samples_per_sec": 1}\n',
             ["--update", self.doc], "a train_bench row lacks or mangles"),
            (DOC, '{"benchmark": "main_job"}\n', ["--update", self.doc],
             "no rows with \"benchmark\": \"train_bench\""),
            ("<!-- table: nothing -->\n<!-- /table -->\n", None, ["--update", self.doc],
             "no renderer for the table \"nothing\""),
            ("<!-- table: train_bench/nothing -->\n<!-- /table -->\n", None,
             ["--update", self.doc], "train_bench has no table \"nothing\""),
            (DOC, None, [broken], "not one JSON object a line"),
            (DOC, None, [os.path.join(self.bench, "missing.json")], "No such file"),
            (DOC, None, [], "give FILE.json or --update DOC"),
        ]
        for doc, rows, args, message in cases:
            with self.subTest(message=message):
                with open(self.doc, "w") as f:
                    f.write(doc)
                if rows is None:
                    write_rows(os.path.join(self.bench, "train_bench.json"), "train_bench",
                               ROWS["train_bench"])
                else:
                    with open(os.path.join(self.bench, "train_bench.json"), "w") as f:
                        f.write(rows)
                out = self.tables(*args)
                self.assertEqual(out.returncode, 2, out.stderr)
                self.assertIn(message, out.stderr)
                self.assertEqual(self.read_doc(), doc)
                errors = [l for l in out.stderr.splitlines() if "error" in l]
                self.assertEqual(len(errors), 1, out.stderr)


class BenchmarksDocTest(unittest.TestCase):
    def test_the_doc_quotes_every_command_run_benchmarks_runs(self):
        out = subprocess.run([os.path.join(SOURCE_DIR, "scripts", "run_benchmarks.sh")],
                             env=dict(os.environ, DRY_RUN="1", ROUNDS="", ONLY=""),
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        commands = out.stdout.splitlines()
        self.assertGreater(len(commands), 10)
        with open(os.path.join(SOURCE_DIR, "docs", "benchmarks.md")) as f:
            lines = set(f.read().splitlines())
        for command in commands:
            self.assertIn(command, lines)

    def test_the_doc_shows_the_tables_of_docs_bench(self):
        with tempfile.TemporaryDirectory(prefix="benchmarks_doc_test.") as d:
            doc = os.path.join(d, "benchmarks.md")
            shutil.copy(os.path.join(SOURCE_DIR, "docs", "benchmarks.md"), doc)
            out = subprocess.run(
                [sys.executable, os.path.join(SOURCE_DIR, "scripts", "benchmark_tables.py"),
                 "--update", doc, "--bench_dir=" + os.path.join(SOURCE_DIR, "docs", "bench")],
                capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            with open(doc) as rendered, open(os.path.join(SOURCE_DIR, "docs",
                                                          "benchmarks.md")) as committed:
                self.assertEqual(rendered.read(), committed.read(),
                                 "run scripts/benchmark_tables.py --update docs/benchmarks.md")


if __name__ == "__main__":
    SOURCE_DIR = sys.argv[1]
    unittest.main(argv=sys.argv[:1], verbosity=2)
