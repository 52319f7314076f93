#!/usr/bin/python3
"""Time to a test accuracy: pslaunch runs of several arms, alternated.

Each arm is NAME=BIN_DIR:CONFIG (a build's bin directory and a job config);
every round runs every arm once, in turn. For each run it reads the chief's
result (worker-0.json: one test-set evaluation per epoch, with the seconds
since training began) and prints the first epoch and time at which the test
accuracy reached --target, the final accuracy and samples/s; then the
median per arm.

    /usr/bin/python3 benchmarks/time_to_accuracy.py --rounds=2 \\
        old=../old/build/bin:configs/local.textproto \\
        new=build/bin:configs/local.textproto \\
        towers=build/bin:configs/towers.textproto
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(bin_dir, config, target, timeout):
    with tempfile.TemporaryDirectory(prefix="time_to_accuracy.") as d:
        out = subprocess.run([os.path.join(bin_dir, "pslaunch"), f"--config={config}",
                              f"--result_dir={d}"], capture_output=True, text=True,
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arms", nargs="+", help="NAME=BIN_DIR:CONFIG")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.88)
    parser.add_argument("--timeout", type=int, default=600)
    args = parser.parse_args()
    arms = []
    for arm in args.arms:
        name, sep, rest = arm.partition("=")
        bin_dir, sep2, config = rest.partition(":")
        if not (sep and sep2 and os.path.exists(os.path.join(bin_dir, "pslaunch"))):
            print(f"time_to_accuracy.py: error: arm \"{arm}\" is not NAME=BIN_DIR:CONFIG with "
                  "a pslaunch in BIN_DIR", file=sys.stderr)
            return 2
        arms.append((name, bin_dir, config))
    results = {name: [] for name, _, _ in arms}
    for r in range(args.rounds):
        for name, bin_dir, config in arms:
            result = run(bin_dir, config, args.target, args.timeout)
            results[name].append(result)
            print(f"# round {r + 1}: {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
    print(f"{'arm':10} {'epoch':>6} {'seconds to ' + str(args.target):>16} {'final accuracy':>15} "
          f"{'samples/s':>10}")
    for name, runs in results.items():
        seconds = [x["seconds"] for x in runs if x["seconds"] is not None]
        epochs = [x["epoch"] for x in runs if x["epoch"] is not None]
        print(f"{name:10} {statistics.median(epochs) if epochs else '-':>6} "
              f"{statistics.median(seconds) if seconds else float('nan'):16.1f} "
              f"{statistics.median(x['final_accuracy'] for x in runs):15.4f} "
              f"{statistics.median(x['samples_per_sec'] for x in runs):10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
