#!/usr/bin/python3
"""Markdown tables for docs/benchmarks.md from a benchmark's JSON rows.

    scripts/benchmark_tables.py docs/bench/train_vs_torch.json
    scripts/benchmark_tables.py docs/bench/ps_bench.json

reads the rows a benchmark driver wrote with --json (one JSON object a line:
benchmarks/train_vs_torch.py, benchmarks/data_plane.py) and prints its
tables of medians and spreads, so the docs quote exactly what the benchmark
printed.
"""
import json
import sys


def model(row):
    hidden = row.get("hidden", [256, 128])
    return "784-" + "-".join(str(h) for h in hidden) + "-10"


def train_vs_torch(rows):
    lines = ["| model | batch | optimizer | variant | median samples/s | min | max | runs |",
             "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "variant" in r:
            lines.append(f"| {model(r)} | {r['batch_size']} | {r['optimizer']} | {r['variant']} "
                         f"| {r['median_samples_per_sec']:.0f} | {r['min']:.0f} | {r['max']:.0f} "
                         f"| {r['runs']} |")
    lines += ["", "| model | batch | optimizer | ours 2 workers / PyTorch DDP "
              "| best of ours / PyTorch 1 process | best of ours / PyTorch 1 process, 2 threads |",
              "| --- | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        if "ratio_2_workers_vs_ddp" in r:
            lines.append(f"| {model(r)} | {r['batch_size']} | {r['optimizer']} "
                         f"| {r['ratio_2_workers_vs_ddp']:.2f} "
                         f"| {r['ratio_best_vs_torch_1_process']:.2f} "
                         f"| {r['ratio_best_vs_torch_1_process_2_threads']:.2f} |")
    return "\n".join(lines)


def spread(row, figure, digits):
    if figure not in row:
        return "n/a"
    return (f"{row[figure]:.{digits}f} ({row[figure + '_min']:.{digits}f}-"
            f"{row[figure + '_max']:.{digits}f})")


def ps_bench(rows):
    peer = any("vs_peer" in r for r in rows)
    lines = ["| size | workers | transport | GB/s (both ways) | CPU us / round trip | p50 us "
             "| echo p50 us | of iperf3 | each way / memcpy |" + (" ours / peer |" if peer else "") +
             " runs |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |" +
             (" ---: |" if peer else "") + " ---: |"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['workers']} | {r['transport']} "
                     f"| {spread(r, 'push_pull_gbps', 3)} | {spread(r, 'cpu_us_per_round_trip', 0)} "
                     f"| {spread(r, 'p50_us', 0)} | {spread(r, 'echo_p50_us', 0)} "
                     f"| {spread(r, 'of_iperf3', 3)} "
                     f"| {spread(r, 'each_way_of_memcpy', 3)} |" +
                     (f" {spread(r, 'vs_peer', 2)} |" if peer else "") + f" {r['runs']} |")
    return "\n".join(lines)


TABLES = {"train_vs_torch": train_vs_torch, "ps_bench": ps_bench}


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1]) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        print(f"benchmark_tables.py: error: {sys.argv[1]}: {e}", file=sys.stderr)
        return 2
    kinds = {r.get("benchmark") for r in rows}
    for kind in sorted(k for k in kinds if k in TABLES):
        print(TABLES[kind]([r for r in rows if r.get("benchmark") == kind]))
    unknown = kinds - TABLES.keys()
    if unknown:
        print(f"benchmark_tables.py: error: no table for {sorted(map(str, unknown))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
