#!/usr/bin/python3
"""Kills shard primaries with SIGKILL in a loop while a job trains: what is lost, and how long each failover takes.

Runs a job through pslaunch with one backup per shard (cluster.ps_backups;
pslaunch runs the membership's etcd) twice: once without failures, and once
while this script kills the primary of shard 0, then shard 1, and so on,
every --min_gap to --max_gap seconds (at least --kills kills). Before each
kill it waits until the shard's backup is back in the chain (it acknowledged
a state of the current primary), so each kill leaves a replica that holds
the state. It reports, per mode:

  kills              the kills made, and over how many shards
  failover p50/max   from the kill to the next version of the killed shard,
                     that is the next completed step in SYNC (polled every
                     10 ms from the replicas' metrics)
  model equal        SYNC: the model exported from the final checkpoints
                     (psctl export) equals the failure-free run's bitwise,
                     and so does the test metric; ASYNC: every shard's final
                     version equals the pushes the workers made (each
                     applied exactly once)

The lease is --lease_seconds (cluster.membership.lease_seconds and
training.lease_seconds). Jobs: --job=ctr is configs/ctr.textproto (2 shards,
2 workers) on --train_examples generated examples; --job=default is
configs/local.textproto for --epochs epochs.

    /usr/bin/python3 benchmarks/failover_chaos.py --job=ctr --modes=sync,async --kills=10 --json=docs/bench/failover_chaos.json

Needs a build in build/.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from ctr_vs_torch import job_config

PROGRAM = "failover_chaos.py"
METRICS_LINE = re.compile(r"metrics on http://127\.0\.0\.1:PORT/metrics: (.*)")
CHECKPOINT = re.compile(r"^ckpt-(\d+)\.bin$")


def parse_args():
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", choices=["ctr", "default"], default="ctr")
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--min_gap", type=float, default=2.0)
    parser.add_argument("--max_gap", type=float, default=5.0)
    parser.add_argument("--lease_seconds", type=int, default=1)
    parser.add_argument("--train_examples", type=int, default=2000000)
    parser.add_argument("--epochs", type=int, default=30, help="the default job's epochs")
    parser.add_argument("--seed", type=int, default=1, help="of the kills' timing")
    parser.add_argument("--metrics_port", type=int, default=19300)
    parser.add_argument("--bin_dir", default="build/bin")
    parser.add_argument("--work_dir", default="build/bench/failover_chaos")
    parser.add_argument("--keep_logs", action="store_true",
                        help="keep the runs' logs (kept anyway when a check fails)")
    parser.add_argument("--timeout", type=int, default=3600)
    parser.add_argument("--json", default="", help="write the rows here (one JSON object a line)")
    args = parser.parse_args()
    if args.kills < 1 or args.min_gap <= 0 or args.max_gap < args.min_gap:
        parser.error("--kills must be at least 1 and 0 < --min_gap <= --max_gap")
    args.modes = args.modes.split(",")
    if any(m not in ("sync", "async") for m in args.modes):
        parser.error(f"--modes={','.join(args.modes)}: each of sync, async")
    return args


def config(args, name):
    """The job with a backup per shard, restarts enough for every kill, its
    lease and checkpoints in work_dir/name: the config file's path."""
    os.makedirs(args.work_dir, exist_ok=True)
    if args.job == "ctr":
        text = job_config("configs/ctr.textproto", os.path.join(args.work_dir, "train.tsv"),
                          os.path.join(args.work_dir, "test.tsv"))
        text = re.sub(r"train_examples: \d+", f"train_examples: {args.train_examples}", text)
    else:
        with open("configs/local.textproto") as f:
            text = re.sub(r'ps: "[^"]*"', 'ps: "127.0.0.1:0"', f.read())
        text = re.sub(r"epochs: \d+", f"epochs: {args.epochs}", text)
    shards = len(re.findall(r'^\s*ps: ', text, re.M))
    cluster = "".join('  ps_backups { address: "127.0.0.1:0" }\n' for _ in range(shards))
    cluster += f"  max_restarts: {4 * args.kills}\n"
    cluster += f"  membership {{ lease_seconds: {args.lease_seconds} }}\n"
    text = re.sub(r"(\n  workers: \d+\n)", lambda m: m.group(1) + cluster, text, count=1)
    checkpoints = os.path.join(args.work_dir, name + "-checkpoints")
    shutil.rmtree(checkpoints, ignore_errors=True)
    text = re.sub(r"(\ntraining \{\n)", lambda m: m.group(1) +
                  f'  lease_seconds: {args.lease_seconds}\n'
                  f'  checkpoint {{ dir: "{checkpoints}" }}\n', text, count=1)
    path = os.path.join(args.work_dir, f"{args.job}_{name}.textproto")
    with open(path, "w") as f:
        f.write(text)
    return path, checkpoints, shards


def metrics(port):
    """The replica's gauges by name, {} while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            text = r.read().decode()
    except OSError:
        return {}
    values = {}
    for line in text.splitlines():
        match = re.match(r"^(pst_ps_\w+)(?:\{[^}]*\})? ([-+0-9.eE]+|NaN)$", line)
        if match:
            values[match.group(1)] = float(match.group(2))
    return values


def ps_pid(config_path, shard, replica):
    """The pid of replica `replica` of shard `shard` of the job under `config_path`."""
    want = [f"--task=ps:{shard}"]
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not argv[0].endswith("/ps_server") or f"--config={config_path}" not in argv:
            continue
        if want[0] not in argv:
            continue
        has_replica = [a for a in argv if a.startswith("--replica=")]
        if (replica == 0 and not has_replica) or f"--replica={replica}" in has_replica:
            return int(pid)
    return None


def newest(directory):
    best = None
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        match = CHECKPOINT.match(name)
        if match and (best is None or int(match.group(1)) > best[0]):
            best = (int(match.group(1)), name)
    return best


def final_versions(checkpoints, shards):
    """Each shard's newest version in any of its replicas' folders."""
    versions = []
    for shard in range(shards):
        found = [newest(d) for d in (os.path.join(checkpoints, f"shard-{shard}"),
                                     os.path.join(checkpoints, "replica-1", f"shard-{shard}"))]
        found = [n for n in found if n]
        if not found:
            raise RuntimeError(f"no checkpoint of shard {shard} under {checkpoints}")
        versions.append(max(found)[0])
    return versions


def export(args, checkpoints, out):
    result = subprocess.run([os.path.join(args.bin_dir, "psctl"), "export",
                             f"--checkpoint={checkpoints}", "--format=npz", f"--out={out}"],
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"psctl export exited {result.returncode}: {result.stderr[-1000:]}")
    with open(out, "rb") as f:
        return f.read()


def summary_of(output):
    for line in reversed(output.splitlines()):
        if line.startswith('{"mode"'):
            return json.loads(line)
    raise RuntimeError(f"no summary in the run's output: {output[-2000:]}")


def launch(args, path, mode, log):
    command = [os.path.join(args.bin_dir, "pslaunch"), f"--config={path}", f"--mode={mode}",
               f"--metrics_port={args.metrics_port}"]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)


def run_quiet(args, path, mode, work):
    with open(os.path.join(work, "quiet.log"), "w") as log:
        process = launch(args, path, mode, log)
        if process.wait(timeout=args.timeout) != 0:
            raise RuntimeError(f"the failure-free run exited {process.returncode}: see {log.name}")
    with open(log.name) as f:
        return f.read()


def await_line(log_path, pattern, process, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(log_path) as f:
            match = re.search(pattern, f.read())
        if match:
            return match
        if process.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"{pattern!r} not in {log_path}")


def run_chaos(args, path, mode, shards, work):
    """Runs the job, killing primaries; (its output, the failover seconds, kills)."""
    rng = random.Random(args.seed)
    log_path = os.path.join(work, "chaos.log")
    failovers = []
    with open(log_path, "w") as log:
        process = launch(args, path, mode, log)
        try:
            ports_line = await_line(log_path, METRICS_LINE, process).group(1)
            ports = dict(item.split("=") for item in ports_line.split())
            effective = await_line(log_path, r"config (\S+): started", process).group(1)
            replicas = {s: [int(ports[f"ps:{s}"]), int(ports[f"ps:{s}:1"])] for s in range(shards)}
            shard = 0
            while process.poll() is None:
                time.sleep(rng.uniform(args.min_gap, args.max_gap))
                # Shard `shard`'s primary, once its backup is back in the chain
                # (it holds every update acknowledged to a worker).
                primary = None
                deadline = time.time() + 60
                while process.poll() is None and time.time() < deadline:
                    for k, port in enumerate(replicas[shard]):
                        m = metrics(port)
                        if (m.get("pst_ps_replica_primary") == 1 and
                                m.get("pst_ps_replica_chain_backups", 0) >= 1 and
                                m.get("pst_ps_replicated_version", -1) >= 0 and
                                m.get("pst_ps_version", 0) > 0):
                            primary = (k, m["pst_ps_version"])
                    if primary:
                        break
                    time.sleep(0.02)
                if primary is None or process.poll() is not None:
                    break
                k, _ = primary
                pid = ps_pid(effective, shard, k)
                if pid is None:
                    break
                before = metrics(replicas[shard][k]).get("pst_ps_version", primary[1])
                os.kill(pid, signal.SIGKILL)
                killed = time.time()
                other = replicas[shard][1 - k]
                while process.poll() is None:
                    if metrics(other).get("pst_ps_version", -1) > before:
                        failovers.append(time.time() - killed)
                        break
                    if time.time() - killed > 120:
                        raise RuntimeError(f"shard {shard} made no step for 120 s after a kill")
                    time.sleep(0.01)
                at = time.strftime("%H:%M:%S", time.localtime(killed)) + f".{int(killed % 1 * 1000):03d}"
                print(f"{PROGRAM}: killed shard {shard} replica {k} (pid {pid}) at {at}, version "
                      f"{before:.0f}; next step after {failovers[-1] if failovers else -1:.2f} s",
                      file=sys.stderr)
                shard = (shard + 1) % shards
            if process.wait(timeout=args.timeout) != 0:
                raise RuntimeError(f"the chaos run exited {process.returncode}: see {log_path}")
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
    with open(log_path) as f:
        return f.read(), failovers


def main():
    args = parse_args()
    rows = []
    for mode in args.modes:
        os.makedirs(args.work_dir, exist_ok=True)
        work = tempfile.mkdtemp(prefix=f"{mode}-", dir=os.path.abspath(args.work_dir))
        quiet_path, quiet_checkpoints, shards = config(args, f"{mode}-quiet")
        chaos_path, chaos_checkpoints, _ = config(args, f"{mode}-chaos")
        quiet = summary_of(run_quiet(args, quiet_path, mode, work))
        output, failovers = run_chaos(args, chaos_path, mode, shards, work)
        chaos = summary_of(output)
        if len(failovers) < args.kills:
            raise RuntimeError(f"the run ended after {len(failovers)} kills of the {args.kills} "
                               "asked: give it more --train_examples (or --epochs)")
        metric = "test_auc" if args.job == "ctr" else "test_accuracy"
        row = {"benchmark": "failover_chaos", "job": args.job, "mode": mode,
               "lease_seconds": args.lease_seconds, "kills": len(failovers), "shards": shards,
               "failover_p50_s": statistics.median(failovers), "failover_max_s": max(failovers),
               "metric": metric, "quiet_metric": quiet.get(metric),
               "chaos_metric": chaos.get(metric), "steps": chaos["steps"],
               "load_1min": os.getloadavg()[0]}
        chaos_versions = final_versions(chaos_checkpoints, shards)
        if mode == "sync":
            # psctl export takes each shard's final state from whichever
            # replica holds it.
            row["model_equal"] = (
                export(args, quiet_checkpoints, os.path.join(work, "quiet.npz")) ==
                export(args, chaos_checkpoints, os.path.join(work, "chaos.npz")))
            row["metric_equal"] = row["quiet_metric"] == row["chaos_metric"]
        else:
            # Every push carries the dense gradients: each applied moves its
            # shard's version by one, and the summary counts every worker's steps.
            row["versions"] = chaos_versions
            row["pushes_applied_once"] = all(v == chaos["steps"] for v in chaos_versions)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if (not args.keep_logs and row.get("model_equal", True) and
                row.get("pushes_applied_once", True)):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"{PROGRAM}: the runs' logs are kept in {work}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
        print(f"{PROGRAM}: error: {e}", file=sys.stderr)
        sys.exit(1)
