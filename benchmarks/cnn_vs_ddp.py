#!/usr/bin/python3
"""The CNN of examples/pytorch_cnn.py: pstrain's Python workers next to PyTorch DDP.

Both sides train the same model (examples/pytorch_cnn.py's Cnn) with Adam
on the same Fashion-MNIST batches, 2 processes of one torch thread each:

  ours   2 Python workers under pslaunch, SYNC, Adam on the PS (1 shard),
         pstrain.torch.DistributedOptimizer
  DDP    2 processes, gloo on 127.0.0.1, DistributedDataParallel, Adam with
         foreach=True

as a PyTorch user who cares about speed would set DDP up: every batch is
gathered before the timed loop (on both sides), the gradients are zeroed with
set_to_none, and both sides run under the same glibc malloc settings
(ps_server's, common/process_memory.cc, given to every Python process
through MALLOC_* variables) and the same threads: --threads for torch and,
through OMP_NUM_THREADS and OPENBLAS_NUM_THREADS, for the BLAS library
(torch.set_num_threads does not reach Debian's OpenBLAS, which otherwise
adds a thread per core to every process; --blas_threads=default leaves it
so). samples/s is every process's samples over the longest process's timed
loop (after --warmup steps). Each round runs both, the order alternating
from round to round; prints each run, then one JSON object with the medians
(min-max) and the median of the rounds' ratios.

    /usr/bin/python3 benchmarks/cnn_vs_ddp.py --steps=200 --rounds=5 --json=docs/bench/cnn_vs_ddp.json

With --to_accuracy=A both sides instead train examples/pytorch_cnn.py's job
(examples/pytorch_cnn.textproto: 2 workers, SYNC, Adam, batch 64 each) for
--epochs epochs, the chief (rank 0) evaluating on the 10 000 test images
after every epoch while the other waits, and each prints its curve and the
first epoch, and the seconds since its training began, at which the test
accuracy reached A:

    /usr/bin/python3 benchmarks/cnn_vs_ddp.py --to_accuracy=0.91 --epochs=15 \
        --json=docs/bench/cnn_time_to_accuracy.json

(PYTHONPATH defaults to build/python, where the build puts pstrain.)
"""

import argparse
import importlib.util
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# KeepLargeBuffersWarm's settings (common/process_memory.cc), as environment.
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
              "MALLOC_TOP_PAD_": str(64 << 20), "MALLOC_ARENA_MAX": "1"}


def thread_env(args):
    """What every process of both sides gets besides MALLOC_ENV."""
    if args.blas_threads == "default":
        return {}
    return {"OMP_NUM_THREADS": str(args.threads), "OPENBLAS_NUM_THREADS": str(args.threads)}


def example():
    spec = importlib.util.spec_from_file_location(
        "pytorch_cnn", os.path.join(REPO, "examples", "pytorch_cnn.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def batches(cnn, rank, world, args):
    """This process's batches, gathered before any timing."""
    import numpy as np
    x, y = cnn.load(cnn.DEFAULT_DATA_DIR, "train")
    order = np.random.default_rng(args.seed).permutation(len(x))[rank::world]
    total = args.warmup + args.steps
    return [(x[order[i * args.batch:(i + 1) * args.batch]].contiguous(),
             y[order[i * args.batch:(i + 1) * args.batch]].contiguous()) for i in range(total)]


def timed(step, data, warmup):
    for x, y in data[:warmup]:
        step(x, y)
    start = time.perf_counter()
    for x, y in data[warmup:]:
        step(x, y)
    return time.perf_counter() - start


# ---------------------------------------------------------------- ours

def ours_worker(args):
    """Run by pslaunch (cluster.worker_command) for each worker task."""
    import torch
    import torch.nn.functional as F
    import pstrain
    import pstrain.torch
    torch.set_num_threads(args.threads)
    cnn = example()
    client = pstrain.Client()
    data = batches(cnn, client.worker, client.num_workers, args)
    torch.manual_seed(args.seed)
    model = cnn.Cnn()
    opt = pstrain.torch.DistributedOptimizer(model, client)

    def step(x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    seconds = timed(step, data, args.warmup)
    opt.finish()
    client.report(samples=args.steps * args.batch, train_seconds=seconds)


def run_ours(args):
    with tempfile.TemporaryDirectory(prefix="cnn_vs_ddp.") as tmp:
        config = os.path.join(tmp, "job.textproto")
        command = (f"{sys.executable} {os.path.abspath(__file__)} --role=worker "
                   f"--steps={args.steps} --warmup={args.warmup} --batch={args.batch} "
                   f"--threads={args.threads} --seed={args.seed}")
        with open(config, "w") as f:
            f.write(f"""cluster {{ ps: "127.0.0.1:0" workers: 2 max_restarts: 0
  worker_command: "{command}" }}
training {{ mode: SYNC optimizer {{ adam {{ learning_rate: {args.lr} }} }}
  batch_size: {args.batch} seed: {args.seed} }}
""")
        run = subprocess.run([os.path.join(args.bin_dir, "pslaunch"), f"--config={config}"],
                             capture_output=True, text=True, timeout=args.timeout,
                             env=dict(os.environ, **MALLOC_ENV, **thread_env(args)))
        if run.returncode != 0:
            raise RuntimeError(f"pslaunch exited {run.returncode}: {run.stderr[-3000:]}")
        return json.loads(run.stdout.strip().splitlines()[-1])["train_samples_per_sec"]


# ---------------------------------------------------------------- DDP

def ddp_worker(rank, port, args, queue):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    cnn = example()
    data = batches(cnn, rank, 2, args)
    torch.manual_seed(args.seed)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(cnn.Cnn())
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, foreach=True)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    dist.barrier()
    seconds = timed(step, data, args.warmup)
    dist.destroy_process_group()
    queue.put(seconds)


def spawn_ddp(target, args):
    """Runs target(rank, port, args, queue) in 2 spawned processes; what each put in the queue."""
    import torch.multiprocessing as mp
    saved = dict(os.environ)
    os.environ.update(MALLOC_ENV, **thread_env(args))  # inherited by the spawned processes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, port, args, queue)) for r in range(2)]
    for p in procs:
        p.start()
    os.environ.clear()
    os.environ.update(saved)
    results = [queue.get(timeout=args.timeout) for _ in procs]
    for p in procs:
        p.join(args.timeout)
        if p.exitcode != 0:
            raise RuntimeError(f"a DDP process exited with {p.exitcode}")
    return results


def run_ddp(args):
    seconds = spawn_ddp(ddp_worker, args)
    return 2 * args.steps * args.batch / max(seconds)


# ---------------------------------------------------------------- time to accuracy

EPOCH_LINE = re.compile(r"epoch (\d+)/\d+ done: test_accuracy ([0-9.]+) .*\(([0-9.]+) s\)")
FINAL_LINE = re.compile(r"final: version \d+ test_accuracy ([0-9.]+) .*\(([0-9.]+) s\)")


def ours_curve(args):
    """examples/pytorch_cnn.py's job under pslaunch: [(epoch, accuracy, seconds)]."""
    run = subprocess.run([os.path.join(args.bin_dir, "pslaunch"),
                          f"--config={os.path.join(REPO, 'examples', 'pytorch_cnn.textproto')}",
                          f"--epochs={args.epochs}", f"--learning_rate={args.lr}"],
                         capture_output=True, text=True, timeout=args.timeout, cwd=REPO,
                         env=dict(os.environ, **MALLOC_ENV, **thread_env(args)))
    if run.returncode != 0:
        raise RuntimeError(f"pslaunch exited {run.returncode}: {run.stderr[-3000:]}")
    curve = []
    for line in run.stdout.splitlines():
        if m := EPOCH_LINE.search(line):
            curve.append((int(m[1]), float(m[2]), float(m[3])))
        elif m := FINAL_LINE.search(line):
            curve.append((args.epochs, float(m[1]), float(m[2])))
    if len(curve) != args.epochs:
        raise RuntimeError(f"expected {args.epochs} evaluations from the chief, got {curve}")
    return curve


def ddp_curve_worker(rank, port, args, queue):
    """examples/pytorch_cnn.py's loop, under DDP: the same shares, order and evaluation."""
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    cnn = example()
    train_x, train_y = cnn.load(cnn.DEFAULT_DATA_DIR, "train")
    test_x, test_y = cnn.load(cnn.DEFAULT_DATA_DIR, "test") if rank == 0 else (None, None)
    torch.manual_seed(args.seed)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(cnn.Cnn())
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, foreach=True)
    steps_per_epoch = len(train_x) // 2 // args.batch
    curve = []
    dist.barrier()
    start = time.monotonic()
    for epoch in range(args.epochs):
        order = torch.from_numpy(np.random.default_rng(args.seed + epoch).permutation(len(train_x)))
        share = order[rank * steps_per_epoch * args.batch:(rank + 1) * steps_per_epoch * args.batch]
        for s in range(steps_per_epoch):
            idx = share[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(train_x[idx]), train_y[idx]).backward()
            opt.step()
        if rank == 0:
            _, accuracy = cnn.evaluate(model.module, test_x, test_y)
            curve.append((epoch + 1, accuracy, time.monotonic() - start))
    dist.destroy_process_group()
    queue.put(curve if rank == 0 else None)


def ddp_curve(args):
    return next(curve for curve in spawn_ddp(ddp_curve_worker, args) if curve is not None)


def time_to_accuracy(args):
    result = {"benchmark": "cnn_time_to_accuracy", "target": args.to_accuracy,
              "epochs": args.epochs, "batch": args.batch, "threads": args.threads}
    for side, run in (("ours", ours_curve), ("ddp", ddp_curve)):
        curve = run(args)
        for epoch, accuracy, seconds in curve:
            print(f"{side} epoch {epoch}: test_accuracy {accuracy:.4f} at {seconds:.1f} s "
                  f"(load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
        reached = next(((e, s) for e, a, s in curve if a >= args.to_accuracy), None)
        result[f"{side}_epoch"] = reached[0] if reached else None
        result[f"{side}_seconds"] = round(reached[1], 1) if reached else None
        result[f"{side}_final_accuracy"] = curve[-1][1]
    emit(result, args)
    return 0


def emit(row, args):
    """Prints the result row, and writes it to --json too."""
    print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(dict(row, command=shlex.join(["/usr/bin/python3"] + sys.argv)))
                    + "\n")


def spread(values):
    return [round(statistics.median(values), 3), round(min(values), 3), round(max(values), 3)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", default="bench", choices=["bench", "worker"])
    parser.add_argument("--bin_dir", default=os.path.join(REPO, "build", "bin"))
    parser.add_argument("--steps", type=int, default=200, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64, help="per process")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--blas_threads", default="threads", choices=["threads", "default"],
                        help="BLAS threads per process: --threads (default), or the "
                             "library's default")
    parser.add_argument("--to_accuracy", type=float, default=0,
                        help="instead: train --epochs epochs on both sides and report when the "
                             "test accuracy first reached this")
    parser.add_argument("--epochs", type=int, default=15, help="with --to_accuracy")
    parser.add_argument("--json", default="", help="write the result row here too")
    args = parser.parse_args()
    # The workers pslaunch starts import pstrain from the build unless told otherwise.
    os.environ.setdefault("PYTHONPATH", os.path.join(REPO, "build", "python"))
    if args.to_accuracy > 0:
        return time_to_accuracy(args)
    if args.role == "worker":
        ours_worker(args)
        return 0
    runs = {"ours": [], "ddp": []}
    for r in range(args.rounds):
        order = ["ours", "ddp"] if r % 2 == 0 else ["ddp", "ours"]
        for side in order:
            runs[side].append(run_ours(args) if side == "ours" else run_ddp(args))
            print(f"round {r + 1} {side}: {runs[side][-1]:.1f} samples/s (load average "
                  f"{os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    ratios = [o / d for o, d in zip(runs["ours"], runs["ddp"])]
    emit({"benchmark": "cnn_vs_ddp", "batch": args.batch, "steps": args.steps,
          "threads": args.threads, "blas_threads": args.blas_threads, "rounds": args.rounds,
          "ours_samples_per_sec": spread(runs["ours"]), "ddp_samples_per_sec": spread(runs["ddp"]),
          "ours_over_ddp": spread(ratios)}, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
