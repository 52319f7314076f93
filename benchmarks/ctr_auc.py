#!/usr/bin/python3
"""The CTR model's test AUC against the planted model's own, per mode.

Runs `pslaunch --config=configs/ctr.textproto --mode=M` for each mode
(alternating, --rounds times), reads the summary line and the planted
model's AUC from the log, and prints one line per run and the medians:

  benchmarks/ctr_auc.py --build=build [--modes=sync,async] [--rounds=1]
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import time

PLANTED = re.compile(r"the planted model scores test_auc ([0-9.]+) test_logloss ([0-9.]+)")


def run(build, config, mode, extra):
    start = time.monotonic()
    done = subprocess.run([f"{build}/bin/pslaunch", f"--config={config}", f"--mode={mode}"] + extra,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"pslaunch --mode={mode} exited {done.returncode}:\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    planted = PLANTED.search(done.stdout + done.stderr)
    return {
        "mode": mode,
        "test_auc": summary["test_auc"],
        "test_logloss": summary["test_logloss"],
        "planted_auc": float(planted.group(1)) if planted else float("nan"),
        "planted_logloss": float(planted.group(2)) if planted else float("nan"),
        "samples_per_sec": summary["train_samples_per_sec"],
        "wall_seconds": time.monotonic() - start,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--config", default="configs/ctr.textproto")
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("extra", nargs="*", help="more pslaunch flags (after --)")
    args = parser.parse_args()
    results = []
    for _ in range(args.rounds):
        for mode in args.modes.split(","):
            r = run(args.build, args.config, mode, args.extra)
            results.append(r)
            print(json.dumps(r), flush=True)
    for mode in args.modes.split(","):
        mine = [r for r in results if r["mode"] == mode]
        gap = statistics.median(r["planted_auc"] - r["test_auc"] for r in mine)
        print(f"{mode}: test_auc {statistics.median(r['test_auc'] for r in mine):.4f} "
              f"planted_auc {statistics.median(r['planted_auc'] for r in mine):.4f} "
              f"gap {gap:.4f} test_logloss {statistics.median(r['test_logloss'] for r in mine):.4f} "
              f"samples/s {statistics.median(r['samples_per_sec'] for r in mine):.0f} "
              f"wall {statistics.median(r['wall_seconds'] for r in mine):.0f} s "
              f"({len(mine)} run(s), median)")


if __name__ == "__main__":
    main()
