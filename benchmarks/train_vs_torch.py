#!/usr/bin/python3
"""Training throughput of pstrain next to PyTorch, in one invocation.

Trains the same model (MLP 784-256-128-10, ReLU, softmax cross-entropy) on
the same data (Fashion-MNIST, pixels / 255), batch and learning rule, one
epoch per run, with every variant run once per round, in turn, so that a
noisy shared machine slows them all alike. Reports the median samples/s of
each variant over the rounds, its spread, and the ratios the README quotes:

  ours, 2 workers SYNC               vs  PyTorch DDP, 2 processes (gloo, 127.0.0.1)
  ours, best of {2 workers SYNC,     vs  PyTorch in one process, no distribution
        1 worker with 2 CPU towers}

samples/s is, on both sides, the training samples of every process divided
by the longest process's training loop (data loading, start-up and the
test-set evaluation excluded: pstrain's train_samples_per_sec). Every
process computes on one thread (OpenBLAS and torch.set_num_threads(1)); the
towers worker has one thread per tower, each on a slice of --batch_size rows
(so it trains like the 2-worker job), and a PyTorch single process with two
threads is reported beside it.

The PyTorch side is set up as a user who cares about speed sets it up:
glibc's allocator tuned as ours tunes its own (MALLOC_* variables with the
values of common/process_memory.cc, so no step page-faults), the optimizers'
foreach path (`foreach=True`), every batch gathered before the timed
loop, and the OpenBLAS kernels our worker computes with (OPENBLAS_CORETYPE,
where our worker sets it because OpenBLAS took the CPU for a Prescott). Ours with 2 workers and ours with 2 towers each apply 2 x --batch_size
samples per update; PyTorch in one process is also run at that batch
("torch 1 process, same samples per update", one and two threads), and the
ratio at equal samples per update is reported beside the others.

    /usr/bin/python3 benchmarks/train_vs_torch.py --rounds=5 --json=train_vs_torch.json

Needs python3-torch and python3-numpy (Debian) and a build in build/.
"""
import argparse
import gzip
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from openblas_kernels import coretype_from_log

DATA_DIR = "/usr/share/datasets/fashion-mnist"
# glibc's allocator as common/process_memory.cc sets it in our processes,
# through the variables glibc reads at start-up (inherited by the spawned
# PyTorch processes).
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
              "MALLOC_TOP_PAD_": str(64 << 20), "MALLOC_ARENA_MAX": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- PyTorch side

def load_fashion_mnist(data_dir, limit):
    import numpy as np

    def read(name, offset):
        with gzip.open(os.path.join(data_dir, name), "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)

    x = read("train-images-idx3-ubyte.gz", 16).reshape(-1, 784).astype(np.float32) / 255.0
    y = read("train-labels-idx1-ubyte.gz", 8).astype(np.int64)
    if limit:
        x, y = x[:limit], y[:limit]
    return x, y


def torch_worker(rank, world, port, args, queue):
    """One PyTorch training process; puts (samples, seconds) on `queue`."""
    import numpy as np
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x_all, y_all = load_fashion_mnist(args.data_dir, args.train_limit)
    x_all, y_all = torch.from_numpy(x_all), torch.from_numpy(y_all)
    layers, width = [], 784
    for h in args.hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model)
    if args.optimizer == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=args.adam_lr, foreach=True)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.sgd_lr, foreach=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    # Each process takes its own shard of a seeded shuffle, as pstrain's workers do.
    order = torch.from_numpy(np.random.default_rng(args.seed).permutation(len(y_all)))
    shard = order[rank::world]
    steps = len(shard) // args.batch_size
    batches = [(x_all[index], y_all[index]) for index in
               (shard[step * args.batch_size:(step + 1) * args.batch_size] for step in range(steps))]
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    if world > 1:
        dist.destroy_process_group()
    queue.put((steps * args.batch_size, seconds))


def run_torch(world, args):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=torch_worker, args=(r, world, port, args, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=args.timeout) for _ in procs]
    for p in procs:
        p.join(args.timeout)
        if p.exitcode != 0:
            raise RuntimeError(f"a PyTorch process exited with {p.exitcode}")
    return sum(r[0] for r in results) / max(r[1] for r in results)


# ---------------------------------------------------------------- pstrain side

def ours_config(args, workers, devices, batch_size):
    if args.optimizer == "adam":
        optimizer = f"adam {{ learning_rate: {args.adam_lr} }}"
    else:
        optimizer = f"sgd {{ learning_rate: {args.sgd_lr} }}"
    hidden = " ".join(f"hidden: {h}" for h in args.hidden)
    limit = f" train_limit: {args.train_limit}" if args.train_limit else ""
    return f"""
cluster {{ ps: "127.0.0.1:{free_port()}" workers: {workers} max_restarts: 0 }}
training {{
  mode: SYNC
  optimizer {{ {optimizer} }}
  batch_size: {batch_size}
  epochs: 1
  seed: {args.seed}
  log_every_steps: 1000000
  devices: "{devices}"
  model {{ mlp {{ {hidden} activation: RELU }} }}
  dataset {{ fashion_mnist {{ dir: "{args.data_dir}"{limit} }} }}
}}
"""


def run_ours(workers, devices, args, flags=()):
    # Every tower computes on a slice of batch_size rows, as every worker and
    # every PyTorch process does.
    towers = int(devices.split(":")[1]) if devices.startswith("cpu:") else 1
    with tempfile.TemporaryDirectory(prefix="train_vs_torch.") as tmp:
        path = os.path.join(tmp, "job.textproto")
        with open(path, "w") as f:
            f.write(ours_config(args, workers, devices, args.batch_size * towers))
        out = subprocess.run([os.path.join(args.bin_dir, "pslaunch"), f"--config={path}"] + list(flags),
                             capture_output=True, text=True, timeout=args.timeout)
        if out.returncode != 0:
            raise RuntimeError(f"pslaunch exited {out.returncode}: {out.stderr[-2000:]}")
        # The PyTorch processes, spawned after ours' first run, compute on
        # the same OpenBLAS kernels.
        coretype = coretype_from_log(out.stdout + out.stderr)
        if coretype:
            os.environ["OPENBLAS_CORETYPE"] = coretype
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        return summary["train_samples_per_sec"]


# ---------------------------------------------------------------- the table

LAYERWISE = ["--exchange_schedule=layerwise"]
TCP = ["--shm=off"]
VARIANTS = [
    # name, runner; ours as configured by default (whole-model exchange,
    # shared memory with the co-located PS), and with the layer-wise exchange
    # and over TCP for comparison.
    ("ours 2 workers", lambda a: run_ours(2, "cpu", a)),
    ("torch DDP 2 processes", lambda a: run_torch(2, a)),
    ("ours 1 worker 2 towers", lambda a: run_ours(1, "cpu:2", a)),
    ("torch 1 process", lambda a: run_torch(1, a)),
    ("ours 2 workers over TCP", lambda a: run_ours(2, "cpu", a, TCP)),
    ("ours 2 workers layer-wise exchange", lambda a: run_ours(2, "cpu", a, LAYERWISE)),
    ("torch 1 process 2 threads", lambda a: run_torch(1, with_threads(a, 2))),
    ("ours 1 worker 2 towers layer-wise exchange", lambda a: run_ours(1, "cpu:2", a, LAYERWISE)),
    # PyTorch at the samples per update of ours with 2 workers or 2 towers.
    ("torch 1 process, same samples per update", lambda a: run_torch(1, with_batch(a, 2))),
    ("torch 1 process 2 threads, same samples per update",
     lambda a: run_torch(1, with_threads(with_batch(a, 2), 2))),
]
# The variants the ratios are computed from.
REQUIRED = ["ours 2 workers", "torch DDP 2 processes", "ours 1 worker 2 towers",
            "torch 1 process", "torch 1 process 2 threads",
            "torch 1 process, same samples per update",
            "torch 1 process 2 threads, same samples per update"]


def with_threads(args, threads):
    copy = argparse.Namespace(**vars(args))
    copy.threads = threads
    return copy


def with_batch(args, times):
    copy = argparse.Namespace(**vars(args))
    copy.batch_size = args.batch_size * times
    return copy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--optimizers", default="sgd,adam")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--hidden", default="256,128", help="hidden layer widths")
    parser.add_argument("--sgd_lr", type=float, default=0.1)
    parser.add_argument("--adam_lr", type=float, default=0.001)
    parser.add_argument("--train_limit", type=int, default=0, help="0 = all 60000")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bin_dir", default="build/bin")
    parser.add_argument("--data_dir", default=DATA_DIR)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--json", default="", help="write the rows here too")
    parser.add_argument("--skip", default="",
                        help="comma-separated variants to leave out (not those the ratios need)")
    args = parser.parse_args()
    skipped = set(filter(None, args.skip.split(",")))
    if skipped & set(REQUIRED):
        print(f"train_vs_torch.py: error: the ratios need {', '.join(REQUIRED)}", file=sys.stderr)
        return 2
    variants = [(name, runner) for name, runner in VARIANTS if name not in skipped]
    args.threads = 1
    args.hidden = [int(h) for h in args.hidden.split(",")]
    try:
        import torch  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"train_vs_torch.py: error: {e}; install python3-torch python3-numpy",
              file=sys.stderr)
        return 2
    if not os.path.exists(os.path.join(args.bin_dir, "pslaunch")):
        print(f"train_vs_torch.py: error: no pslaunch in {args.bin_dir}; build first "
              "(scripts/build.sh) or pass --bin_dir", file=sys.stderr)
        return 2
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.update(MALLOC_ENV)
    command = shlex.join(["/usr/bin/python3"] + sys.argv)
    rows = []
    for optimizer in args.optimizers.split(","):
        args.optimizer = optimizer
        samples = {name: [] for name, _ in variants}
        for r in range(args.rounds):
            for name, runner in variants:
                value = runner(args)
                samples[name].append(value)
                print(f"# {optimizer} round {r + 1}/{args.rounds}: {name}: {value:.0f} samples/s",
                      file=sys.stderr, flush=True)
        median = {name: statistics.median(v) for name, v in samples.items()}
        for name, values in samples.items():
            rows.append({"benchmark": "train_vs_torch", "command": command, "optimizer": optimizer,
                         "batch_size": args.batch_size, "hidden": args.hidden, "variant": name,
                         "median_samples_per_sec": round(median[name], 1),
                         "min": round(min(values), 1), "max": round(max(values), 1),
                         "runs": len(values)})
        best_ours = max(median["ours 2 workers"], median["ours 1 worker 2 towers"])
        rows.append({"benchmark": "train_vs_torch", "command": command, "optimizer": optimizer,
                     "batch_size": args.batch_size, "hidden": args.hidden,
                     "ratio_2_workers_vs_ddp":
                         round(median["ours 2 workers"] / median["torch DDP 2 processes"], 3),
                     "ratio_best_vs_torch_1_process":
                         round(best_ours / median["torch 1 process"], 3),
                     "ratio_best_vs_torch_1_process_2_threads":
                         round(best_ours / median["torch 1 process 2 threads"], 3),
                     "ratio_best_vs_best_torch_1_process_same_samples_per_update":
                         round(best_ours / max(
                             median["torch 1 process, same samples per update"],
                             median["torch 1 process 2 threads, same samples per update"]), 3)})
    print(f"{'optimizer':9} {'variant':44} {'median samples/s':>16} {'min':>8} {'max':>8}")
    for row in rows:
        if "variant" in row:
            print(f"{row['optimizer']:9} {row['variant']:44} {row['median_samples_per_sec']:16.0f}"
                  f" {row['min']:8.0f} {row['max']:8.0f}")
        else:
            print(f"{row['optimizer']:9} ours 2 workers / DDP: {row['ratio_2_workers_vs_ddp']:.2f}x;"
                  f" best of ours / torch 1 process: {row['ratio_best_vs_torch_1_process']:.2f}x"
                  f" (2 threads: {row['ratio_best_vs_torch_1_process_2_threads']:.2f}x);"
                  " at the same samples per update, best of ours / best torch 1 process: "
                  f"{row['ratio_best_vs_best_torch_1_process_same_samples_per_update']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
