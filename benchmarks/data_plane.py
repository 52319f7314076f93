#!/usr/bin/python3
"""The data plane's table: ps_bench over TCP and through shared memory, and
the same round trip over plain sockets, alternated.

    benchmarks/data_plane.py --rounds=3 --json=docs/bench/ps_bench.json

Runs build/bin/ps_bench once per (round, workers, transport) and
build/bin/socket_bench (transport "socket": the round trip over plain TCP
sockets, what the kernel alone costs) beside them, alternating within each
round so that a shared host's drift hits all alike, and prints, per size,
workers and transport, the medians over the rounds of each program's
figures: GB/s (both directions, as ps_bench counts them), CPU per round
trip, p50 latency, the share of iperf3 measured around the same row, each
way's share of a warm memcpy, and GB/s over the plain-socket row of the
same round (`of_socket`). --peer_json passes another program's rows to
ps_bench (e.g. ps-lite's) for the ratios against them.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

FIGURES = ["push_pull_gbps", "cpu_us_per_round_trip", "p50_us", "echo_p50_us", "of_iperf3",
           "each_way_of_memcpy", "of_socket", "vs_peer"]


def run(args, workers, transport):
    common = ["--json", f"--sizes={args.sizes}", f"--workers={workers}", f"--seconds={args.seconds}"]
    if transport == "socket":
        command = [os.path.join(args.bin_dir, "socket_bench")] + common
    else:
        command = [os.path.join(args.bin_dir, "ps_bench")] + common + [f"--transport={transport}"]
    if args.peer_json and transport != "socket":
        command.append(f"--peer_json={args.peer_json}")
    out = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {out.returncode}: {out.stderr[-2000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="4KiB,4MiB,64MiB")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--transports", default="tcp,shm,socket")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--peer_json", default="")
    parser.add_argument("--bin_dir", default="build/bin")
    parser.add_argument("--json", default="", help="write the medians here too")
    args = parser.parse_args()
    for program in ["ps_bench", "socket_bench"]:
        if not os.path.exists(os.path.join(args.bin_dir, program)):
            print(f"data_plane.py: error: no {program} in {args.bin_dir}; build first",
                  file=sys.stderr)
            return 2
    samples = {}
    for r in range(args.rounds):
        for workers in [int(w) for w in args.workers.split(",")]:
            this_round = [row for transport in args.transports.split(",")
                          for row in run(args, workers, transport)]
            sockets = {row["size_bytes"]: row["push_pull_gbps"] for row in this_round
                       if row["transport"] == "socket"}
            for row in this_round:
                if row["transport"] != "socket" and sockets.get(row["size_bytes"]):
                    row["of_socket"] = row["push_pull_gbps"] / sockets[row["size_bytes"]]
                key = (row["size_bytes"], row["size"], workers, row["transport"])
                samples.setdefault(key, []).append(row)
                print(f"# round {r + 1}/{args.rounds}: {row['size']} {workers} worker(s) "
                      f"{row['transport']}: {row['push_pull_gbps']:.3f} GB/s",
                      file=sys.stderr, flush=True)
    rows = []
    command = shlex.join(["/usr/bin/python3"] + sys.argv)
    for (size_bytes, size, workers, transport), runs in sorted(samples.items()):
        row = {"benchmark": "ps_bench", "command": command, "size": size, "size_bytes": size_bytes,
               "workers": workers, "transport": transport, "runs": len(runs)}
        for figure in FIGURES:
            values = [x[figure] for x in runs if x.get(figure) is not None]
            if values:
                row[figure] = round(statistics.median(values), 3)
                row[figure + "_min"] = round(min(values), 3)
                row[figure + "_max"] = round(max(values), 3)
        rows.append(row)
    print(f"{'size':>6} {'workers':>7} {'transport':>9} {'GB/s':>8} {'cpu_us':>8} {'p50_us':>8}"
          f" {'of_iperf3':>9} {'of_memcpy':>9} {'of_socket':>9}")
    for row in rows:
        print(f"{row['size']:>6} {row['workers']:>7} {row['transport']:>9}"
              f" {row['push_pull_gbps']:8.3f} {row['cpu_us_per_round_trip']:8.0f}"
              f" {row['p50_us']:8.0f} {row.get('of_iperf3', float('nan')):9.3f}"
              f" {row.get('each_way_of_memcpy', float('nan')):9.3f}"
              f" {row.get('of_socket', float('nan')):9.3f}")
    if args.json:
        with open(args.json, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
