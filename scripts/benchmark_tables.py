#!/usr/bin/python3
"""Markdown tables for docs/benchmarks.md from the benchmarks' JSON rows.

    scripts/benchmark_tables.py docs/bench/train_bench.json   # print its tables
    scripts/benchmark_tables.py --update docs/benchmarks.md   # rewrite the doc's tables

Reads the rows a benchmark or its driver wrote with --json (one JSON object a
line, each with a "benchmark" field naming its kind) and renders each kind's
tables of medians and spreads, so the docs quote exactly what the benchmark
printed.

--update DOC replaces the text between each pair of markers

    <!-- table: KIND -->            every table of KIND
    <!-- table: KIND/PART -->       one of them (e.g. train_bench/backup_workers)
    ...
    <!-- /table -->

with the tables rendered from BENCH_DIR/KIND.json (BENCH_DIR: the doc's
folder's bench/), and leaves everything outside the markers alone. A kind
whose JSON file is missing keeps its section as it is, said on stderr.
Running it twice changes nothing the second time.
"""
import argparse
import json
import os
import re
import sys

PROGRAM = "benchmark_tables.py"
MARKER = re.compile(r"(<!-- table: ([\w.-]+)(?:/([\w.-]+))? -->\n)(.*?)(<!-- /table -->)", re.S)


class BadInput(Exception):
    """A JSON file or a doc that cannot be rendered; one line for the user."""


def spread(row, figure, digits):
    """`median (min-max)` of a figure, or n/a where the row lacks it."""
    if row.get(figure) is None:
        return "n/a"
    return (f"{row[figure]:.{digits}f} ({row[figure + '_min']:.{digits}f}-"
            f"{row[figure + '_max']:.{digits}f})")


def table(header, align, rows):
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def model(row):
    hidden = row.get("hidden", [256, 128])
    return "784-" + "-".join(str(h) for h in hidden) + "-10"


def machine(rows):
    r = dict(rows[-1])
    r["gpu"] = r.get("gpu") or "none"
    names = [("date", "date (UTC)"), ("cpu", "CPU"), ("cpu_features", "CPU features"),
             ("nproc", "CPUs (nproc)"),
             ("memory", "memory"), ("os", "OS"), ("kernel", "kernel (uname -r)"),
             ("load_average", "load average at the start (1, 5, 15 min)"),
             ("compiler", "compiler"), ("build_type", "build type"),
             ("openblas_coretype", "OPENBLAS_CORETYPE"), ("torch", "PyTorch"), ("gpu", "GPU")]
    return {"": table(["machine", ""], ["---", "---"],
                      [(label, r[key]) for key, label in names if r.get(key) not in (None, "")])}


def train_vs_torch(rows):
    lines = ["| model | batch | optimizer | variant | median samples/s | min | max | runs |",
             "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "variant" in r:
            lines.append(f"| {model(r)} | {r['batch_size']} | {r['optimizer']} | {r['variant']} "
                         f"| {r['median_samples_per_sec']:.0f} | {r['min']:.0f} | {r['max']:.0f} "
                         f"| {r['runs']} |")
    lines += ["", "| model | batch | optimizer | ours 2 workers / PyTorch DDP "
              "| best of ours / PyTorch 1 process | best of ours / PyTorch 1 process, 2 threads "
              "| best of ours / best PyTorch 1 process, same samples per update |",
              "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "ratio_2_workers_vs_ddp" in r:
            lines.append(f"| {model(r)} | {r['batch_size']} | {r['optimizer']} "
                         f"| {r['ratio_2_workers_vs_ddp']:.2f} "
                         f"| {r['ratio_best_vs_torch_1_process']:.2f} "
                         f"| {r['ratio_best_vs_torch_1_process_2_threads']:.2f} "
                         f"| {r['ratio_best_vs_best_torch_1_process_same_samples_per_update']:.2f} |")
    return {"": "\n".join(lines)}


def ctr_vs_torch(rows):
    variants = table(
        ["variant", "samples per update", "samples/s", "test AUC", "test log-loss",
         "load average (1 min)", "runs"],
        ["---", "---:", "---:", "---:", "---:", "---:", "---:"],
        [(r["variant"], r["samples_per_update"], spread(r, "samples_per_sec", 0),
          spread(r, "test_auc", 4), spread(r, "test_logloss", 4), spread(r, "load_1min", 2),
          r["runs"]) for r in rows if "variant" in r])
    planted = lambda r: "n/a" if r.get("planted_auc") is None else f"{r['planted_auc']:.4f}"
    ratios = table(
        ["ours", "samples per update", "faster PyTorch variant at it",
         "faster PyTorch one process at it", "ours / faster PyTorch",
         "ours' test AUC minus its", "planted model's test AUC"],
        ["---", "---:", "---", "---", "---:", "---:", "---:"],
        [(r["ours"], r["samples_per_update"], r["best_peer"], r["faster_one_process"],
          f"{r['ratio']:.2f}", f"{r['auc_difference']:+.4f}", planted(r))
         for r in rows if "best_peer" in r])
    return {"": variants + "\n\n" + ratios}


def time_to_accuracy(rows):
    target = rows[0]["target"]
    body = []
    for r in rows:
        config = r["config"] + (f" {r['flags']}" if r.get("flags") else "")
        reached = r.get("reached", r["runs"])
        body.append((r["arm"], f"`{config}`",
                     spread(r, "epoch", 0) if reached else "not reached",
                     spread(r, "seconds", 1) if reached else "not reached",
                     spread(r, "final_accuracy", 4), spread(r, "samples_per_sec", 0),
                     f"{r['runs']}" + (f" ({reached} reached)" if reached != r["runs"] else "")))
    return {"": table(["arm", "config and flags", "epoch", f"seconds to {target}",
                       "final accuracy", "samples/s", "runs"],
                      ["---", "---", "---:", "---:", "---:", "---:", "---:"], body)}


def train_bench(rows):
    figures = ("samples_per_sec", "push_pull_bytes", "fast_samples_per_sec")
    if not all(any(f in r for f in figures) for r in rows):
        raise ValueError("a train_bench row fits none of its tables")
    return {
        "throughput": table(
            ["mode", "workers", "batch per worker", "samples/s", "runs"],
            ["---", "---:", "---:", "---:", "---:"],
            [(r["mode"], r["workers"], r["batch_size"], spread(r, "samples_per_sec", 0), r["runs"])
             for r in rows if "samples_per_sec" in r]),
        "round_trip": table(
            ["bytes moved (both ways)", "p50 us", "p99 us", "runs"],
            ["---:", "---:", "---:", "---:"],
            [(r["push_pull_bytes"], spread(r, "p50_us", 0), spread(r, "p99_us", 0), r["runs"])
             for r in rows if "push_pull_bytes" in r]),
        "backup_workers": table(
            ["replicas_to_aggregate", "straggler's delay per step (ms)",
             "fast workers' samples/s", "runs"],
            ["---:", "---:", "---:", "---:"],
            [(r["replicas_to_aggregate"], r["straggler_delay_ms"],
              spread(r, "fast_samples_per_sec", 0), r["runs"])
             for r in rows if "fast_samples_per_sec" in r]),
    }


def main_job(rows):
    return {"": table(
        ["config", "mode", "workers", "devices", "epochs", "test accuracy", "final loss",
         "samples/s", "wall seconds", "runs"],
        ["---", "---", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---:"],
        [(f"`{r.get('config', '')}`", r["mode"], r["workers"], r.get("devices", ""), r["epochs"],
          spread(r, "test_accuracy", 4), spread(r, "final_loss", 4),
          spread(r, "train_samples_per_sec", 0), spread(r, "wall_seconds", 1), r["runs"])
         for r in rows])}


def ps_bench(rows):
    peer = any("vs_peer" in r for r in rows)
    lines = ["| size | workers | transport | GB/s (both ways) | CPU us / round trip | p50 us "
             "| echo p50 us | of iperf3 | each way / memcpy | of plain sockets |" +
             (" ours / peer |" if peer else "") + " runs |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" +
             (" ---: |" if peer else "") + " ---: |"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['workers']} | {r['transport']} "
                     f"| {spread(r, 'push_pull_gbps', 3)} | {spread(r, 'cpu_us_per_round_trip', 0)} "
                     f"| {spread(r, 'p50_us', 0)} | {spread(r, 'echo_p50_us', 0)} "
                     f"| {spread(r, 'of_iperf3', 3)} "
                     f"| {spread(r, 'each_way_of_memcpy', 3)} "
                     f"| {spread(r, 'of_socket', 2)} |" +
                     (f" {spread(r, 'vs_peer', 2)} |" if peer else "") + f" {r['runs']} |")
    return {"": "\n".join(lines)}


def ps_bench_pslite(rows):
    """Our TCP rows beside ps-lite's of the same size and workers (medians of
    the same rounds); the ratios are the medians of each round's ratio."""
    peers = {(r["size_bytes"], r["workers"]): r for r in rows if r["transport"] == "ps-lite"}
    ours = sorted((r for r in rows if r["transport"] != "ps-lite"),
                  key=lambda r: (r["size_bytes"], r["workers"]))
    lines = []
    for r in ours:
        p = peers[(r["size_bytes"], r["workers"])]
        lines.append((r["size"], r["workers"], spread(r, "push_pull_gbps", 3),
                      spread(p, "push_pull_gbps", 3), spread(r, "vs_peer", 2),
                      spread(r, "cpu_us_per_round_trip", 0), spread(p, "cpu_us_per_round_trip", 0),
                      spread(r, "cpu_vs_peer", 2), spread(r, "p50_us", 0), spread(p, "p50_us", 0),
                      r["runs"]))
    return {"": table(
        ["size", "workers", "ours GB/s (both ways)", "ps-lite GB/s", "ours / ps-lite",
         "ours CPU us / round trip", "ps-lite CPU us / round trip", "CPU ours / ps-lite",
         "ours p50 us", "ps-lite p50 us", "runs"],
        ["---:"] * 11, lines)}


def netns_link(rows):
    """Ours beside iperf3 on the same shaped link, by rate, then size."""
    def rate_bits(r):
        v, unit = re.fullmatch(r"([0-9]+)(kbit|mbit|gbit)", r["rate"]).groups()
        return int(v) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[unit]
    return {"": table(
        ["rate each way", "size", "ours GB/s (both ways)", "iperf3 GB/s (both ways)",
         "ours / iperf3", "CPU ns/byte: shard", "worker", "iperf3 (both ends)",
         "machine CPU cores", "runs"],
        ["---:"] * 10,
        [(r["rate"], r["size"], spread(r, "ours_gbps", 3), spread(r, "iperf3_gbps", 3),
          spread(r, "of_iperf3", 2), spread(r, "ps_cpu_ns_per_byte", 2),
          spread(r, "worker_cpu_ns_per_byte", 2), spread(r, "iperf3_cpu_ns_per_byte", 2),
          spread(r, "cpu_cores_machine", 2), r["runs"])
         for r in sorted(rows, key=lambda r: (rate_bits(r), r["size_bytes"]))])}


def ps_bench_shards(rows):
    return {"": table(
        ["shards", "size", "workers", "transport", "GB/s (both ways)", "of iperf3", "p50 us",
         "CPU us / round trip", "runs"],
        ["---:", "---:", "---:", "---", "---:", "---:", "---:", "---:", "---:"],
        [(r["shards"], r["size"], r["workers"], r["transport"], spread(r, "push_pull_gbps", 3),
          spread(r, "of_iperf3", 3), spread(r, "p50_us", 0),
          spread(r, "cpu_us_per_round_trip", 0), r["runs"])
         for r in sorted(rows, key=lambda r: (r["size_bytes"], r["shards"]))])}


def ps_bench_wire_dtype(rows):
    return {"": table(
        ["size", "wire", "transport", "wire bytes / round trip", "wire GB/s (both ways)",
         "p50 us", "CPU us / round trip", "runs"],
        ["---:", "---", "---", "---:", "---:", "---:", "---:", "---:"],
        [(r["size"], r["wire_dtype"], r["transport"], f"{r['wire_bytes_per_round_trip']:.0f}",
          spread(r, "push_pull_gbps", 3), spread(r, "p50_us", 0),
          spread(r, "cpu_us_per_round_trip", 0), r["runs"])
         for r in sorted(rows, key=lambda r: (r["size_bytes"], -r["wire_bytes_per_round_trip"]))])}


def ps_bench_sizes(rows):
    return {"": table(
        ["size", "workers", "transport", "GB/s (both ways)", "of iperf3", "p50 us", "p99 us",
         "echo p50 us", "runs"],
        ["---:", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---:"],
        [(r["size"], r["workers"], r["transport"], spread(r, "push_pull_gbps", 3),
          spread(r, "of_iperf3", 3), spread(r, "p50_us", 0), spread(r, "p99_us", 0),
          spread(r, "echo_p50_us", 0), r["runs"])
         for r in sorted(rows, key=lambda r: r["size_bytes"])])}


def metrics_bench(rows):
    """One line per operation, the two registries side by side."""
    registries = ["prometheus-cpp", "lock-free"]
    lines = {}
    for r in rows:
        unit = "ns" if "ns_per_op" in r else "us"
        line = lines.setdefault((r["operation"], r["threads"]), {"unit": unit, "runs": r["runs"]})
        line[r.get("registry", "prometheus-cpp")] = spread(r, f"{unit}_per_op", 1)
        line["runs"] = min(line["runs"], r["runs"])
    body = [(f"`{operation}`", threads, *(line.get(name, "n/a") for name in registries),
             line["unit"], line["runs"])
            for (operation, threads), line in lines.items()]
    return {"": table(["operation", "threads", *registries, "unit", "runs"],
                      ["---", "---:", "---:", "---:", "---", "---:"], body)}


def gpu_bench(rows):
    torch = any("torch_ms" in r for r in rows)
    header = ["model", "batch", "step ms", "cuBLAS alone ms", "step / cuBLAS", "step TFLOP/s",
              "copy ms"] + (["PyTorch ms", "ours / PyTorch"] if torch else []) + ["runs"]
    body = []
    for r in rows:
        cells = [r["model"], r["batch"], spread(r, "step_ms", 3), spread(r, "gemm_ms", 3),
                 spread(r, "ratio", 2), spread(r, "step_tflops", 2), spread(r, "copy_ms", 3)]
        if torch:
            cells += [spread(r, "torch_ms", 3), spread(r, "vs_torch", 2)]
        body.append(cells + [r["runs"]])
    return {"": table(header, ["---", "---:"] + ["---:"] * (len(header) - 2), body)}


def netns_cluster(rows):
    """The cost model's constants and errors, then every measured row."""
    summary = [r for r in rows if "constants" in r][-1]
    c = summary["constants"]
    constants = table(
        ["alpha ms", "beta ms/shard", "eta_w", "fill", "eta_s", "gamma ns/byte", "eta_y"],
        ["---:"] * 7,
        [(f"{c['alpha'] * 1e3:.2f}", f"{c['beta'] * 1e3:.2f}", f"{c['eta_w']:.2f}",
          f"{c['fill']:.2f}", f"{c['eta_s']:.2f}", f"{c['gamma'] * 1e9:.3f}",
          f"{c['eta_y']:.2f}")])

    def cell(role, figure):
        value = summary[role][figure]
        return "n/a" if value is None else f"{value:.1f}"
    cpu = table(["CPU per byte in + out, ns", "shards", "workers"], ["---", "---:", "---:"],
                [("median over the bench rows", f"{summary['cpu_ns_per_byte_ps']:.2f}",
                  f"{summary['cpu_ns_per_byte_workers']:.2f}")])
    errors = table(["rows", "count", "mean abs error %", "max abs error %", "within 15%"],
                   ["---", "---:", "---:", "---:", "---:"],
                   [(role, summary[role]["rows"], cell(role, "mean_abs_error_pct"),
                     cell(role, "max_abs_error_pct"), summary[role].get("within_15_pct", "n/a"))
                    for role in ("fit", "held_out", "cpu_bound")])
    measured = [r for r in rows if "step_ms" in r]
    bench = table(
        ["rate", "size", "shards", "workers", "role", "step ms", "predicted ms", "error %",
         "GB/s", "CPU ps", "CPU workers", "CPU machine"],
        ["---", "---", "---:", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:"],
        [(r["rate"], r["size"], r["shards"], r["workers"], r["role"], f"{r['step_ms']:.1f}",
          f"{r['predicted_step_ms']:.1f}", f"{r['error_pct']:+.1f}", f"{r['gbytes_per_s']:.3f}",
          f"{r['cpu_cores_ps']:.2f}", f"{r['cpu_cores_workers']:.2f}",
          f"{r['cpu_cores_machine']:.2f}")
         for r in measured if r["kind"] == "bench"])
    train = table(
        ["rate", "shards", "workers", "role", "test accuracy", "samples/s", "step ms",
         "compute ms", "predicted ms", "error %", "CPU ps", "CPU workers", "CPU machine"],
        ["---", "---:", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:",
         "---:", "---:"],
        [(r["rate"], r["shards"], r["workers"], r.get("role", "n/a"), f"{r['test_accuracy']:.4f}",
          f"{r['samples_per_s']:.0f}", f"{r['step_ms']:.1f}",
          f"{r['compute_ms']:.1f}" if "compute_ms" in r else "n/a",
          f"{r['predicted_step_ms']:.1f}" if "predicted_step_ms" in r else "n/a",
          f"{r['error_pct']:+.1f}" if "error_pct" in r else "n/a",
          f"{r['cpu_cores_ps']:.2f}", f"{r['cpu_cores_workers']:.2f}",
          f"{r['cpu_cores_machine']:.2f}")
         for r in measured if r["kind"] == "train"])
    parts = {"constants": constants + "\n\n" + errors + "\n\n" + cpu, "bench": bench,
             "train": train}
    if "plan_check" in summary:
        p = summary["plan_check"]
        parts["plan_check"] = table(
            ["workers", "rate", "compute ms", "psctl plan's K", "best measured K",
             "measured samples/s at plan's K / at best K"],
            ["---:", "---", "---:", "---:", "---:", "---:"],
            [(p["workers"], p["rate"], f"{p['worker_step_ms']:.1f}", p["recommended_k"],
              p["best_measured_k"], f"{p['measured_at_recommended_of_best']:.3f}")])
    return parts


def cost_model(rows):
    """Predictions past this machine: dense models, then embedding tables."""
    def k(value):
        return "none" if value is None else str(value)
    dense_rows = [r for r in rows if r.get("part") == "dense"]
    cores = all("shard_cores_at_line_rate" in r for r in dense_rows)
    dense = table(
        ["link Gbit/s", "model", "workers", "ring all-reduce ms", "PS best case ms",
         "ours K = N ms", "fewest K to match the ring", "ours K = N, shards keeping up ms",
         "fewest K keeping up to match the ring"]
        + (["cores a shard needs to keep up"] if cores else []),
        ["---:"] * (10 if cores else 9),
        [(r["link_gbit"], f"{r['model_bytes'] / 1e6:g} MB", r["workers"], f"{r['ring_ms']:.3g}",
          f"{r['ps_best_case_ms']:.3g}", f"{r['ours_k_eq_n_ms']:.3g}", k(r["crossing_k"]),
          f"{r['ours_fed_k_eq_n_ms']:.3g}", k(r["fed_crossing_k"]))
         + ((f"{r['shard_cores_at_line_rate']:.1f}",) if cores else ())
         for r in dense_rows])
    embedding = table(
        ["workers", "ids per batch", "dim", "table", "bytes per step", "shards", "ours ms",
         "ring all-reduce of the table ms", "all-gather of the rows ms"],
        ["---:"] * 9,
        [(r["workers"], r["ids_per_batch"], r["dim"], f"{r['table_bytes'] / 1e9:g} GB",
          f"{r['bytes_per_step'] / 1e6:.3g} MB", r["shards"], f"{r['ours_ms']:.3g}",
          f"{r['ring_dense_table_ms']:.3g}", f"{r['allgather_rows_ms']:.3g}")
         for r in rows if r.get("part") == "embedding"])
    return {"dense": dense, "embedding": embedding}


def python_client(rows):
    return {"": table(
        ["transport", "size", "C++ p50 us", "Python p50 us", "Python / C++ p50",
         "Python / C++ client CPU per round trip", "C++ GB/s", "Python GB/s", "runs"],
        ["---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:"],
        [(r["transport"], r["size"], spread(r, "cpp_p50_us", 0), spread(r, "python_p50_us", 0),
          spread(r, "python_over_cpp", 3), spread(r, "cpu_python_over_cpp", 3),
          spread(r, "cpp_push_pull_gbps", 3), spread(r, "python_push_pull_gbps", 3), r["runs"])
         for r in rows])}


def stall_size(r):
    """What a stall variant checkpoints: a table, its delta, or dense floats."""
    if r["variant"] == "table":
        return f"{r['rows']} rows x {r['dim']}"
    if r["variant"] == "delta":
        return f"a delta of {r['rows']} rows x {r['dim']}"
    if r["variant"] == "model":
        return f"{r['dense_floats']} floats (the default model)"
    return f"{r.get('dense_floats', r['rows'] * r['dim'])} floats"


def table_bench(rows):
    mib = 2 ** 20
    scale = table(
        ["rows", "dim", "shards", "optimizer", "fill rows/s", "resident B/row",
         "table's own count B/row", "raw B/row", "resident / raw", "rows/step", "steps/s",
         "rows/s pushed (= pulled)", "load"],
        ["---:", "---:", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:",
         "---:", "---:"],
        [(r["rows"], r["dim"], r["shards"], r["optimizer"], f"{r['fill_rows_per_second']:.0f}",
          f"{r['rss_bytes_per_row']:.1f}", f"{r['table_bytes_per_row']:.1f}",
          f"{r['raw_bytes_per_row']:.0f}", f"{r['rss_bytes_per_row'] / r['raw_bytes_per_row']:.2f}",
          r["batch_rows"], spread(r, "steps_per_second", 1), spread(r, "rows_per_second", 0),
          f"{r['load']:.1f}")
         for r in rows if r.get("part") == "scale"])
    bound = table(
        ["one-off ids sent", "row limit", "rows", "rows_admitted", "rows_refused",
         "RSS before MiB", "RSS at the limit MiB", "peak RSS MiB", "growth MiB", "bound MiB",
         "load"],
        ["---:"] * 11,
        [(r["ids_sent"], r["max_rows"], r["rows"], r["rows_admitted"], r["rows_refused"],
          f"{r['rss_before_bytes'] / mib:.1f}", f"{r['rss_at_limit_bytes'] / mib:.1f}",
          f"{r['rss_peak_bytes'] / mib:.1f}", f"{r['rss_growth_bytes'] / mib:.1f}",
          f"{r['bound_bytes'] / mib:.1f}", f"{r['load']:.1f}")
         for r in rows if r.get("part") == "bound"])
    stall = table(
        ["variant", "size", "longest push during the checkpoint ms", "median push during it ms",
         "median push before it ms", "longest push in as long a window before it ms",
         "shard's lock held for the capture ms", "checkpoint s", "rounds", "load"],
        ["---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:"],
        [(r["variant"],
          stall_size(r),
          spread(r, "longest_ms", 1), spread(r, "median_ms", 2), spread(r, "quiet_median_ms", 2),
          spread(r, "quiet_longest_ms", 1) if "quiet_longest_ms" in r else "-",
          spread(r, "capture_ms", 2) if "capture_ms" in r else "-",
          spread(r, "checkpoint_s", 2), r["rounds"], f"{r['load']:.1f}")
         for r in rows if r.get("part") == "stall"])
    return {"scale": scale, "bound": bound, "stall": stall}


def row_step_bench(rows):
    def tiers(r):
        if not r.get("memory_bytes"):
            return "all in RAM"
        ahead = f"{r['prefetch_rows']} rows read ahead" if r["prefetch_rows"] else "no read-ahead"
        return (f"{r['memory_bytes'] / 2**20:.0f} MiB RAM a table, rest on disk; {ahead}; "
                f"{r['worker_us']} us between steps")

    def disk(r):
        if not r.get("memory_bytes"):
            return "-"
        return f"{r['disk_reads']:.0f} ({r['disk_waits']:.0f})"
    return {"": table(
        ["ranks", "examples per rank", "fields", "ids per field", "tables (dims)", "optimizer",
         "storage", "ids a step (per table)", "rows held at the end",
         "disk reads a step (waited)", "check and land us", "stage us",
         "commit us", "answer us", "step us", "rows updated/s", "rounds", "load"],
        ["---:", "---:", "---:", "---:", "---", "---", "---", "---:", "---:", "---:", "---:",
         "---:", "---:", "---:", "---:", "---:", "---:", "---:"],
        [(r["ranks"], r["batch"], r["fields"], r["distinct"], r["dims"], r["optimizer"], tiers(r),
          f"{r['ids_per_step']:.0f}", f"{r['rows_held']:.0f}", disk(r), spread(r, "land_us", 0),
          spread(r, "stage_us", 0), spread(r, "commit_us", 0), spread(r, "answer_us", 0),
          spread(r, "step_us", 0), f"{r['rows_per_second']:.0f}", r["rounds"],
          f"{r['load']:.1f}")
         for r in rows])}


def ctr_scale(rows):
    def tiers(r, figure, digits):
        return spread(r, figure, digits) if r.get("memory_mib") else "-"

    def of_ram(r):
        return spread(r, "of_all_in_ram", 2) if "of_all_in_ram" in r else "-"
    return {"": table(
        ["cores", "id range", "Zipf exponent", "table dim",
         "RAM for the tables' rows MiB (both shards; hot set)", "rows created",
         "rows refused", "training examples", "job", "samples/s",
         "of the all-in-RAM run beside it", "PS peak RSS MiB (both shards)", "RAM hit rate",
         "disk waits per miss", "test AUC", "planted model's test AUC", "load average (1 min)",
         "runs"],
        ["---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---", "---:", "---:",
         "---:", "---:", "---:", "---:", "---:", "---:", "---:"],
        [(r["cpus"], r["rows"], r.get("zipf_exponent", 0.5), r["dim"],
          f"{r['memory_mib']} ({r.get('hot_set') or 'lru'})" if r.get("memory_mib") else "all",
          f"{r['rows_created']:.0f}",
          f"{r['rows_refused']:.0f}", r["train_examples"],
          f"{r['mode']}, {r['workers']} workers x {r['batch_size']}, {r['shards']} shards",
          spread(r, "samples_per_sec", 0), of_ram(r), spread(r, "ps_peak_rss_mib", 0),
          tiers(r, "hit_rate", 3), tiers(r, "disk_waits", 3),
          spread(r, "test_auc", 4), "n/a" if r.get("planted_auc") is None
          else f"{r['planted_auc']:.4f}", spread(r, "load_1min", 2), r["runs"])
         for r in rows])}


def replication_cost(rows):
    def metric(r, side):
        return "n/a" if r[f"{side}_metric"] is None else f"{r[side + '_metric']:.4f}"

    def cluster(r):
        where = r.get("cluster", "loopback")
        return "one host, loopback" if where == "loopback" else \
            f"namespaces, {where.split()[1]} links"

    def forwarded(r):
        if "forwarded_bytes_per_version" not in r:
            return ("n/a", "n/a")
        return (f"{r['forwarded_bytes_per_version'] / 1024:.0f}",
                f"{r['forwarded_mib_per_sec']:.1f}")

    def ps_cores(r):
        if "with_ps_cores" not in r:
            return "n/a"
        return f"{r['without_ps_cores']:.2f} / {r['with_ps_cores']:.2f}"
    return {"": table(
        ["job", "mode", "cluster", "cores", "samples/s without backups",
         "samples/s with a backup per shard",
         "with / without", "test metric without", "with", "forwarded KiB a version",
         "forwarded MiB/s", "shards' CPU cores without / with", "load average (1 min)", "rounds"],
        ["---", "---", "---", "---:", "---:", "---:", "---:", "---", "---:", "---:", "---:", "---:",
         "---:", "---:"],
        [(r["job"], r["mode"], cluster(r), r["cpus"], spread(r, "without_samples_per_sec", 0),
          spread(r, "with_samples_per_sec", 0), spread(r, "ratio", 2),
          f"{r['metric']} {metric(r, 'without')}", metric(r, "with"), *forwarded(r), ps_cores(r),
          f"{r['load_1min']:.2f}", r["runs"])
         for r in rows])}


def failover_chaos(rows):
    def outcome(r):
        if r["mode"] == "sync":
            return (f"model {'bitwise equal' if r['model_equal'] else 'DIFFERENT'}, "
                    f"{r['metric']} {r['chaos_metric']:.4f} "
                    f"({'equal' if r['metric_equal'] else 'failure-free ' + format(r['quiet_metric'], '.4f')})")
        versions = ", ".join(str(v) for v in r["versions"])
        return (f"final versions {versions} for {r['steps']} pushes: "
                f"{'each applied once' if r['pushes_applied_once'] else 'NOT each once'}")
    return {"": table(
        ["job", "mode", "lease (s)", "kills (shards)", "kill to next step p50 (s)", "max (s)",
         "outcome", "load average (1 min)"],
        ["---", "---", "---:", "---:", "---:", "---:", "---", "---:"],
        [(r["job"], r["mode"], r["lease_seconds"], f"{r['kills']} ({r['shards']})",
          f"{r['failover_p50_s']:.2f}", f"{r['failover_max_s']:.2f}", outcome(r),
          f"{r['load_1min']:.2f}") for r in rows])}


def cnn_vs_ddp(rows):
    def three(values, digits):
        return f"{values[0]:.{digits}f} ({values[1]:.{digits}f}-{values[2]:.{digits}f})"
    return {"": table(
        ["batch per process", "timed steps", "ours samples/s", "DDP samples/s",
         "ours / DDP (per round)", "rounds"],
        ["---:", "---:", "---:", "---:", "---:", "---:"],
        [(r["batch"], r["steps"], three(r["ours_samples_per_sec"], 0),
          three(r["ddp_samples_per_sec"], 0), three(r["ours_over_ddp"], 2), r["rounds"])
         for r in rows])}


def cnn_time_to_accuracy(rows):
    def reached(r, side):
        return "not reached" if r[f"{side}_epoch"] is None else \
            f"{r[side + '_epoch']} ({r[side + '_seconds']:.1f} s)"
    return {"": table(
        ["target", "epochs", "ours: first epoch at it", "DDP: first epoch at it",
         "ours: final accuracy", "DDP: final accuracy"],
        ["---:", "---:", "---:", "---:", "---:", "---:"],
        [(r["target"], r["epochs"], reached(r, "ours"), reached(r, "ddp"),
          f"{r['ours_final_accuracy']:.4f}", f"{r['ddp_final_accuracy']:.4f}") for r in rows])}


# Each kind's renderer: rows -> {part: markdown}; the part "" is the kind's only table.
TABLES = {"machine": machine, "train_vs_torch": train_vs_torch, "ctr_vs_torch": ctr_vs_torch,
          "time_to_accuracy": time_to_accuracy, "train_bench": train_bench, "main_job": main_job,
          "ps_bench": ps_bench, "ps_bench_shards": ps_bench_shards, "netns_link": netns_link,
          "ps_bench_pslite": ps_bench_pslite, "ps_bench_wire_dtype": ps_bench_wire_dtype,
          "ps_bench_sizes": ps_bench_sizes,
          "metrics_bench": metrics_bench, "gpu_bench": gpu_bench,
          "netns_cluster": netns_cluster, "cost_model": cost_model,
          "python_client": python_client, "table_bench": table_bench,
          "row_step_bench": row_step_bench, "ctr_scale": ctr_scale,
          "replication_cost": replication_cost, "failover_chaos": failover_chaos,
          "cnn_vs_ddp": cnn_vs_ddp, "cnn_time_to_accuracy": cnn_time_to_accuracy}


def read_rows(path):
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except ValueError as e:
        raise BadInput(f"{path}: not one JSON object a line: {e}")
    if not all(isinstance(r, dict) for r in rows):
        raise BadInput(f"{path}: not one JSON object a line")
    return rows


def render(kind, rows, path):
    """{part: markdown} for the rows of `kind`."""
    rows = [r for r in rows if r.get("benchmark") == kind]
    if not rows:
        raise BadInput(f"{path}: no rows with \"benchmark\": \"{kind}\"")
    try:
        return TABLES[kind](rows)
    except (KeyError, TypeError) as e:
        raise BadInput(f"{path}: a {kind} row lacks or mangles {e}")
    except ValueError as e:
        raise BadInput(f"{path}: {e}")


def section(kind, part, tables, path):
    if part is None:
        return "\n\n".join(tables.values())
    if part not in tables:
        raise BadInput(f"{path}: {kind} has no table \"{part}\" (it has {', '.join(tables)})")
    return tables[part]


def update(doc, bench_dir):
    """Rewrites doc's marked tables; returns (rendered, kept) section names."""
    with open(doc) as f:
        text = f.read()
    rendered, kept, cache = [], [], {}

    def replace(match):
        head, kind, part, old, tail = match.groups()
        name = kind + (f"/{part}" if part else "")
        if kind not in TABLES:
            raise BadInput(f"{doc}: no renderer for the table \"{name}\" (known: "
                           f"{', '.join(sorted(TABLES))})")
        path = os.path.join(bench_dir, kind + ".json")
        if not os.path.exists(path):
            kept.append(name)
            print(f"{PROGRAM}: {path} does not exist; left the table \"{name}\" as it is",
                  file=sys.stderr)
            return match.group(0)
        if path not in cache:
            cache[path] = render(kind, read_rows(path), path)
        rendered.append(name)
        return head + section(kind, part, cache[path], path) + "\n" + tail

    new_text = MARKER.sub(replace, text)
    if new_text != text:
        tmp = doc + ".tmp"
        with open(tmp, "w") as f:
            f.write(new_text)
        os.replace(tmp, doc)
    return rendered, kept


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json_files", nargs="*", metavar="FILE.json", help="print these tables")
    parser.add_argument("--update", metavar="DOC", default="",
                        help="rewrite the tables between DOC's markers")
    parser.add_argument("--bench_dir", default="",
                        help="where --update reads KIND.json (default: DOC's folder/bench)")
    args = parser.parse_args()
    if not args.json_files and not args.update:
        parser.print_usage(sys.stderr)
        print(f"{PROGRAM}: error: give FILE.json or --update DOC", file=sys.stderr)
        return 2
    try:
        for path in args.json_files:
            rows = read_rows(path)
            kinds = sorted({str(r.get("benchmark")) for r in rows})
            unknown = [k for k in kinds if k not in TABLES]
            if unknown:
                raise BadInput(f"{path}: no table for {unknown}")
            for kind in kinds:
                print("\n\n".join(render(kind, rows, path).values()))
        if args.update:
            bench_dir = args.bench_dir or os.path.join(os.path.dirname(args.update), "bench")
            rendered, kept = update(args.update, bench_dir)
            print(f"{PROGRAM}: {args.update}: {len(rendered)} tables rendered from {bench_dir}, "
                  f"{len(kept)} left as they were", file=sys.stderr)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"{PROGRAM}: error: {where}{e.strerror}", file=sys.stderr)
        return 2
    except BadInput as e:
        print(f"{PROGRAM}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
