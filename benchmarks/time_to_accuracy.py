#!/usr/bin/python3
"""Time to a test accuracy: pslaunch runs of several arms, alternated.

Each arm is NAME=BIN_DIR:CONFIG[:FLAGS] (a build's bin directory, a job
config and, optionally, pslaunch flags separated by spaces); every round
runs every arm once, in turn. For each run it reads the chief's result
(worker-0.json: one test-set evaluation per epoch, with the seconds since
training began) and takes the first epoch and time at which the test
accuracy reached --target, the final accuracy and samples/s; then prints
the median per arm, with the fastest and slowest run, and with --json=FILE
writes one JSON object per arm.

    /usr/bin/python3 benchmarks/time_to_accuracy.py --rounds=2 --json=tta.json \\
        tcp=build/bin:configs/local.textproto:--shm=off \\
        shm=build/bin:configs/local.textproto \\
        towers=build/bin:configs/towers.textproto
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

FIGURES = ["epoch", "seconds", "final_accuracy", "samples_per_sec"]


def run(bin_dir, config, flags, target, timeout):
    with tempfile.TemporaryDirectory(prefix="time_to_accuracy.") as d:
        out = subprocess.run([os.path.join(bin_dir, "pslaunch"), f"--config={config}",
                              f"--result_dir={d}"] + flags, capture_output=True, text=True,
                             timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"pslaunch exited {out.returncode}: {out.stderr[-2000:]}")
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        with open(os.path.join(d, "worker-0.json")) as f:
            evals = json.load(f).get("evals", [])
    reached = [e for e in evals if e.get("test_accuracy", 0) >= target]
    return {"epoch": reached[0]["epoch"] if reached else None,
            "seconds": reached[0]["seconds"] if reached else None,
            "final_accuracy": summary["test_accuracy"],
            "samples_per_sec": summary["train_samples_per_sec"]}


def parse_arm(arm):
    """NAME=BIN_DIR:CONFIG[:FLAGS] as (name, bin_dir, config, flags), or None."""
    name, sep, rest = arm.partition("=")
    bin_dir, sep2, rest = rest.partition(":")
    config, _, flags = rest.partition(":")
    if not (name and sep and sep2 and config):
        return None
    return name, bin_dir, config, shlex.split(flags)


def summarize(command, name, config, flags, target, runs):
    row = {"benchmark": "time_to_accuracy", "command": command, "arm": name, "config": config,
           "flags": shlex.join(flags), "target": target, "runs": len(runs),
           "reached": sum(x["seconds"] is not None for x in runs)}
    for figure in FIGURES:
        values = [x[figure] for x in runs if x[figure] is not None]
        if values:
            row[figure] = round(statistics.median(values), 4)
            row[figure + "_min"] = round(min(values), 4)
            row[figure + "_max"] = round(max(values), 4)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="+", help="NAME=BIN_DIR:CONFIG[:FLAGS]")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.88)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--json", default="", help="write one row per arm here too")
    args = parser.parse_args()
    arms = []
    for arm in args.arms:
        parsed = parse_arm(arm)
        if not (parsed and os.path.exists(os.path.join(parsed[1], "pslaunch"))):
            print(f"time_to_accuracy.py: error: arm \"{arm}\" is not NAME=BIN_DIR:CONFIG[:FLAGS] "
                  "with a pslaunch in BIN_DIR", file=sys.stderr)
            return 2
        arms.append(parsed)
    results = {name: [] for name, _, _, _ in arms}
    for r in range(args.rounds):
        for name, bin_dir, config, flags in arms:
            result = run(bin_dir, config, flags, args.target, args.timeout)
            results[name].append(result)
            print(f"# round {r + 1}: {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
    command = shlex.join(["/usr/bin/python3"] + sys.argv)
    rows = [summarize(command, name, config, flags, args.target, results[name])
            for name, _, config, flags in arms]
    print(f"{'arm':10} {'epoch':>6} {'seconds to ' + str(args.target):>16} {'final accuracy':>15} "
          f"{'samples/s':>10}")
    for row in rows:
        print(f"{row['arm']:10} {row.get('epoch', '-'):>6} "
              f"{row.get('seconds', float('nan')):16.1f} {row['final_accuracy']:15.4f} "
              f"{row['samples_per_sec']:10.0f}")
    if args.json:
        with open(args.json, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
