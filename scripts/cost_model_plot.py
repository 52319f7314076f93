#!/usr/bin/python3
"""Draws the cost model's predictions past one machine from their JSON rows.

    scripts/cost_model_plot.py [docs/bench/cost_model.json] [--out=docs/cost_model.png]

Left: the exchange of one SYNC step of a 1 GB model over 25 Gbit/s ports, by
workers: ring all-reduce (2 (N-1)/N M/B), the PS's best case (as many CPU-only
PS machines as workers: M/B), and ours by the fitted model with K = N shards
as measured (one shard process's CPU per byte), and with shards given the
cores to keep up with their ports at K = N, N/2 and 8. Right: the fewest such
shards with which ours is no slower than the ring, for a 10 GB model, by
workers and link rate. Rows: the "curve" rows that
benchmarks/cost_model.py beyond writes.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

PROGRAM = "cost_model_plot.py"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def draw(rows, out):
    curves = sorted((r for r in rows if r.get("part") == "curve"), key=lambda r: r["workers"])
    if not curves:
        raise ValueError("no rows with \"part\": \"curve\"")
    n = [r["workers"] for r in curves]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, label, style in (("ring_ms", "ring all-reduce", "k-"),
                              ("ps_best_case_ms", "PS best case (N CPU-only PS machines)", "k--"),
                              ("ours_k_eq_n_ms", "ours, K = N, a shard's CPU as measured", "C3-v"),
                              ("ours_fed_k_eq_n_ms", "ours, K = N, shards keeping up", "C0-o"),
                              ("ours_fed_k_n_over_2_ms", "ours, K = N/2, keeping up", "C1-s"),
                              ("ours_fed_k_8_ms", "ours, K = 8, keeping up", "C2-^")):
        left.plot(n, [r[key] for r in curves], style, label=label, markersize=4)
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("workers N")
    left.set_ylabel("exchange per SYNC step (ms)")
    left.set_title(f"{curves[0]['model_bytes'] / 1e9:g} GB model, "
                   f"{curves[0]['link_gbit']} Gbit/s ports")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    for gbit, style in (("10", "C0-o"), ("25", "C1-s"), ("100", "C2-^")):
        points = [(r["workers"], r["fed_crossing_k"][gbit]) for r in curves
                  if r["fed_crossing_k"].get(gbit) is not None]
        if points:
            right.plot(*zip(*points), style, label=f"{gbit} Gbit/s", markersize=4)
    right.plot(n, n, "k:", label="K = N")
    right.set_xscale("log", base=2)
    right.set_yscale("log", base=2)
    right.set_xlabel("workers N")
    right.set_ylabel("fewest shards K (keeping up) to match the ring")
    right.set_title("10 GB model: where ours crosses the ring")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=90)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="?", default=os.path.join(REPO, "docs/bench/cost_model.json"))
    parser.add_argument("--out", default=os.path.join(REPO, "docs/cost_model.png"))
    args = parser.parse_args()
    try:
        with open(args.rows) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        draw(rows, args.out)
    except (OSError, ValueError, KeyError) as e:
        print(f"{PROGRAM}: error: {args.rows}: {e}", file=sys.stderr)
        return 2
    print(f"{PROGRAM}: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
