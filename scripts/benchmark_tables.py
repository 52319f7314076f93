#!/usr/bin/python3
"""Markdown tables for docs/benchmarks.md from a benchmark's JSON rows.

    scripts/benchmark_tables.py train_vs_torch.json

reads the rows benchmarks/train_vs_torch.py --json wrote (one JSON object a
line) and prints one table of medians and spreads, then the ratios, so the
docs quote exactly what the benchmark printed.
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


TABLES = {"train_vs_torch": train_vs_torch}


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
