#!/usr/bin/python3
"""Runs a benchmark program for several rounds and writes the medians of its JSON rows.

    /usr/bin/python3 benchmarks/rounds.py --benchmark=train_bench --rounds=3 \\
        --keys=workers,batch_size,straggler_delay_ms,replicas_to_aggregate,push_pull_bytes \\
        --json=docs/bench/train_bench.json -- build/bin/train_bench --json
    /usr/bin/python3 benchmarks/rounds.py --benchmark=ps_bench_shards --rounds=3 \\
        --vary=shards=1,2,4 --keys=size_bytes,workers,shards \\
        --json=docs/bench/ps_bench_shards.json -- build/bin/ps_bench --json --sizes=4MiB,64MiB

COMMAND prints one JSON object a line on its standard output (other lines are
ignored). --vary=FLAG=A,B,... makes one variant of COMMAND per value (COMMAND
--FLAG=A, COMMAND --FLAG=B, ...). Every round runs every variant once, in
turn, so that a shared host's drift hits them all alike.

A row is matched across rounds by its variant, its text fields and the
numeric fields named in --keys; every other numeric field is a figure, and
the row written is its median over the rounds with FIELD_min and FIELD_max
beside it, "runs" the number of rounds that gave the row, "benchmark" the
name given, "command" this driver's command line and "program" the variant's.
A null figure (e.g. iperf3 not installed) is left out of its median.
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys

PROGRAM = "rounds.py"
# The fields this driver writes; a program's rows must not have them.
RESERVED = {"benchmark", "command", "program", "runs"}


def fail(message, code=2):
    print(f"{PROGRAM}: error: {message}", file=sys.stderr)
    sys.exit(code)


def variants(command, vary):
    """The commands of one round, in the order they run."""
    if not vary:
        return [(command, None)]
    flag, sep, values = vary.partition("=")
    if not (sep and flag and values):
        fail(f"--vary={vary}: use FLAG=A,B,...")
    return [(command + [f"--{flag}={v}"], (flag, v)) for v in values.split(",")]


def is_figure(name, value, keys):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and name not in keys)


def run_rows(command, timeout):
    try:
        out = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=timeout)
    except FileNotFoundError:
        fail(f"{command[0]}: not found; build first")
    except subprocess.TimeoutExpired:
        fail(f"{shlex.join(command)}: still running after {timeout} s", 1)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        fail(f"{shlex.join(command)} exited {out.returncode}: {last}", 1)
    rows = []
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            try:
                row = json.loads(line)
            except ValueError as e:
                fail(f"{shlex.join(command)}: bad JSON row ({e}): {line[:200]}", 1)
            if RESERVED & row.keys():
                fail(f"{shlex.join(command)}: a row has {sorted(RESERVED & row.keys())}, "
                     "which this driver writes", 1)
            rows.append(row)
    if not rows:
        fail(f"{shlex.join(command)} printed no JSON rows (does it need --json?)", 1)
    return rows


def identity(row, keys, variant):
    """What matches a row across rounds: the variant and every non-figure field."""
    fields = tuple((k, json.dumps(v)) for k, v in row.items()
                   if v is not None and not is_figure(k, v, keys))
    return (variant, fields)


def tidy(value):
    """Six significant digits; an integer stays one."""
    if float(value).is_integer() and abs(value) < 1e15:
        return int(value)
    return float(f"{value:.6g}")


def medians(benchmark, driver_command, groups, keys):
    rows = []
    for program, flag_value, runs in groups.values():
        row = {"benchmark": benchmark, "command": driver_command, "program": shlex.join(program)}
        for name, value in runs[0].items():
            if value is not None and not is_figure(name, value, keys):
                row[name] = value
        if flag_value and flag_value[0] not in row:
            row[flag_value[0]] = flag_value[1]
        row["runs"] = len(runs)
        figures = []
        for r in runs:
            figures += [k for k, v in r.items() if is_figure(k, v, keys) and k not in figures]
        for name in figures:
            values = [r[name] for r in runs if is_figure(name, r.get(name), keys)]
            row[name] = tidy(statistics.median(values))
            row[name + "_min"] = tidy(min(values))
            row[name + "_max"] = tidy(max(values))
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="\n".join(__doc__.splitlines()[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --benchmark=NAME [--rounds=N] [--vary=FLAG=A,B] [--keys=F,G] "
              "[--json=FILE] -- COMMAND...")
    parser.add_argument("--benchmark", required=True,
                        help="the rows' \"benchmark\" field (the table they are rendered in)")
    parser.add_argument("--rounds", type=int, default=3, help="default 3")
    parser.add_argument("--vary", default="", help="FLAG=A,B,...: one variant per value")
    parser.add_argument("--keys", default="",
                        help="numeric fields that name a row rather than measure it")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    parser.add_argument("--json", default="", help="write the rows here (default: stdout)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        fail("no COMMAND after --")
    if args.rounds < 1:
        fail(f"--rounds={args.rounds}: at least 1")
    keys = set(filter(None, args.keys.split(",")))
    driver_command = shlex.join(["/usr/bin/python3"] + sys.argv)
    groups = {}
    for r in range(args.rounds):
        for index, (program, flag_value) in enumerate(variants(command, args.vary)):
            rows = run_rows(program, args.timeout)
            for row in rows:
                group = groups.setdefault(identity(row, keys, index), (program, flag_value, []))
                group[2].append(row)
            print(f"# {args.benchmark} round {r + 1}/{args.rounds}: {shlex.join(program)}: "
                  f"{len(rows)} rows", file=sys.stderr, flush=True)
    rows = medians(args.benchmark, driver_command, groups, keys)
    text = "".join(json.dumps(row) + "\n" for row in rows)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
        print(f"# {args.benchmark}: {len(rows)} rows in {args.json}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
