#!/usr/bin/python3
"""The click-through-rate model next to the same model in PyTorch, in one invocation.

Trains configs/ctr.textproto's model (26 categorical fields summed per field
from one embedding table of dim 8, a wide dim-1 table summed per example, 13
dense features sign(x) log(1 + |x|), MLP 64-32-1 with ReLU, sigmoid
log-loss, Adagrad lr 0.1 with eps 1e-7 and accumulators starting at 0.01
for the MLP and at 1e-4 for the tables, one epoch) on the same generated
Criteo-format files, with the same samples per update, and scores each on
the same test file (AUC, log-loss):

  ours SYNC 2 workers    pslaunch --config=<the config> (2 workers of batch_size
                         each; an update averages both: 2 x batch_size samples)
  ours ASYNC 2 workers   the same with --mode=async (an update is one worker's
                         push: batch_size samples)
  torch 1 process        torch.set_num_threads(1), then one thread per core
                         (os.cpu_count()), a batch of the samples per update
  torch 1 process 1 thread joint table
                         one thread, both tables in one nn.EmbeddingBag of dim 9
                         (the deep columns, then the wide one), as ours keeps
                         them on its shards: the same initial values and math
  torch DDP 2 processes  gloo on 127.0.0.1, half the samples per update each,
                         one thread each

Each PyTorch variant runs at both of ours' samples per update (2 x
batch_size and batch_size), and each of ours is set beside the fastest
PyTorch variant at its own.

Every variant runs once per round, in turn, so that a shared machine's drift
hits them all alike; a row is the median over the rounds with the fastest and
slowest run and the 1-minute load average at the runs' starts. samples/s is,
on both sides, the training samples of every process over the longest
process's training loop; PyTorch's batches are read, parsed and turned into
tensors before its loop starts, ours are read and parsed inside it.

PyTorch is set up for speed: nn.EmbeddingBag(mode="sum", sparse=True) for
both tables; the MLP's Adagrad with foreach=True, the tables' in a second
Adagrad (torch's foreach Adagrad falls back to its one-tensor loop for a
whole group when a gradient is sparse); glibc malloc tuned through the
environment as ours tunes itself with mallopt (MALLOC_MMAP_MAX_=0,
MALLOC_TRIM_THRESHOLD_=1 GiB, MALLOC_TOP_PAD_=64 MiB, MALLOC_ARENA_MAX=1),
and on transparent huge pages as our tables' rows are
(GLIBC_TUNABLES=glibc.malloc.hugetlb=1: its whole heap, tables included, is
advised for them, where the host grants them only on request); and on
the OpenBLAS kernels ours computes with (where OpenBLAS takes the CPU for a
Prescott, our worker sets OPENBLAS_CORETYPE to the CPU's kernels, and
PyTorch's processes, whose BLAS is OpenBLAS too, get the same).
DDP all-reduces the tables' sparse gradients itself (gloo's sparse
all-reduce). Categorical values become rows of one table by a vocabulary of
each field's values over both files (ours hashes them to 64-bit ids instead).

    /usr/bin/python3 benchmarks/ctr_vs_torch.py --rounds=3 --json=docs/bench/ctr_vs_torch.json

Needs python3-torch and python3-numpy (Debian) and a build in build/.
"""
import argparse
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import time

from openblas_kernels import coretype_from_log

PROGRAM = "ctr_vs_torch.py"
FIELDS, DENSE = 26, 13
# glibc's names for the settings common/process_memory.cc makes with mallopt,
# and huge pages for the heap, as ps_server/core/record_arena.cc asks them for
# the tables' rows.
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
              "MALLOC_TOP_PAD_": str(64 << 20), "MALLOC_ARENA_MAX": "1",
              "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
# configs/ctr.textproto's Adagrad: the MLP's accumulators from 0.01, the
# tables' from 1e-4 (main() checks the config says so).
ADAGRAD_MLP = {"lr": 0.1, "initial_accumulator_value": 0.01, "eps": 1e-7}
ADAGRAD_TABLES = {"lr": 0.1, "initial_accumulator_value": 1e-4, "eps": 1e-7}
CONFIG_ADAGRAD = [("0.1", "0.01"), ("0.1", "0.0001"), ("0.1", "0.0001")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the data

def parse_tsv(path):
    """labels [N], dense [N, 13] transformed as ours, categorical values [N, 26] (b'' = missing)."""
    import numpy as np
    with open(path, "rb") as f:
        rows = [line.rstrip(b"\n").split(b"\t") for line in f]
    table = np.array(rows, dtype="S16")
    if table.ndim != 2 or table.shape[1] != 1 + DENSE + FIELDS:
        sys.exit(f"{PROGRAM}: error: {path} is not Criteo TSV with {1 + DENSE + FIELDS} columns")
    labels = table[:, 0].astype(np.float32)
    ints = np.where(table[:, 1:1 + DENSE] == b"", b"0", table[:, 1:1 + DENSE]).astype(np.int64)
    dense = (np.sign(ints) * np.log1p(np.abs(ints))).astype(np.float32)
    return labels, dense, table[:, 1 + DENSE:]


def prepare_arrays(train_file, test_file, cache):
    """The files as arrays, categorical values as rows of one table (-1 = missing), cached."""
    import numpy as np
    stamp = [os.stat(p).st_mtime_ns for p in (train_file, test_file)]
    if os.path.exists(cache):
        with np.load(cache) as z:
            if list(z["stamp"]) == stamp:
                return {k: z[k] for k in z.files}
    (y_tr, d_tr, c_tr), (y_te, d_te, c_te) = parse_tsv(train_file), parse_tsv(test_file)
    both = np.concatenate([c_tr, c_te])
    rows = np.full(both.shape, -1, dtype=np.int64)
    base = 0
    for f in range(FIELDS):
        text, inverse = np.unique(both[:, f], return_inverse=True)
        # Ours reads each value as a hexadecimal number: equal numbers, one row.
        numbers = np.array([int(t, 16) if t else -1 for t in text], dtype=np.int64)
        values, row_of_text = np.unique(numbers, return_inverse=True)
        present = values >= 0
        index = np.cumsum(present) - 1 + base
        rows[:, f] = np.where(present[row_of_text[inverse]], index[row_of_text[inverse]], -1)
        base += int(present.sum())
    arrays = {"stamp": np.array(stamp), "rows": np.array(base),
              "train_labels": y_tr, "train_dense": d_tr, "train_cat": rows[:len(y_tr)],
              "test_labels": y_te, "test_dense": d_te, "test_cat": rows[len(y_tr):]}
    np.savez(cache, **arrays)
    return arrays


def bags(cat):
    """EmbeddingBag input of one batch: ids, one bag per (example, field), one per example."""
    import torch
    present = cat >= 0
    ids = torch.from_numpy(cat[present])
    counts = torch.from_numpy(present.reshape(-1).astype("int64"))
    offsets = torch.cumsum(counts, 0) - counts
    return ids, offsets, offsets[::FIELDS].contiguous()


def auc(scores, labels):
    """Area under the ROC curve, ties sharing their mean rank (data/auc.cc)."""
    import numpy as np
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    mean_rank = np.repeat(first + (counts + 1) / 2.0, counts)
    positive = labels[order] > 0.5
    p, n = positive.sum(), len(labels) - positive.sum()
    if p == 0 or n == 0:
        return 0.5
    return float((mean_rank[positive].sum() - p * (p + 1) / 2.0) / (p * n))


# ---------------------------------------------------------------- the PyTorch side

def build_model(rows, dim, hidden, seed, joint=False):
    """The model; `joint`: both tables in one EmbeddingBag of dim + 1 (the deep columns,
    then the wide one), the same initial values and the same math."""
    import torch
    torch.manual_seed(seed)

    class Ctr(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.deep = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
            self.wide = torch.nn.EmbeddingBag(rows, 1, mode="sum", sparse=True)
            torch.nn.init.uniform_(self.deep.weight, -0.05, 0.05)  # init_scale 0.05
            torch.nn.init.zeros_(self.wide.weight)                 # init_scale 0
            layers, width = [], FIELDS * dim + DENSE
            for h in hidden:
                layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
                width = h
            layers.append(torch.nn.Linear(width, 1))
            for layer in layers:  # as worker/model/mlp.cc: He-uniform before a ReLU, Glorot-uniform last
                if isinstance(layer, torch.nn.Linear):
                    fan = layer.in_features if layer is not layers[-1] else \
                        layer.in_features + layer.out_features
                    bound = (6.0 / fan) ** 0.5
                    torch.nn.init.uniform_(layer.weight, -bound, bound)
                    torch.nn.init.zeros_(layer.bias)
            self.mlp = torch.nn.Sequential(*layers)
            self.joint = None
            if joint:
                self.joint = torch.nn.EmbeddingBag(rows, dim + 1, mode="sum", sparse=True)
                with torch.no_grad():
                    self.joint.weight.copy_(torch.cat([self.deep.weight, self.wide.weight], 1))
                del self.deep, self.wide

        def forward(self, ids, offsets, wide_offsets, dense):
            if self.joint is not None:
                both = self.joint(ids, offsets).view(dense.shape[0], FIELDS, -1)
                pooled = both[:, :, :-1].reshape(dense.shape[0], -1)
                logits = self.mlp(torch.cat([pooled, dense], 1)).squeeze(1)
                return logits + both[:, :, -1].sum(1)
            pooled = self.deep(ids, offsets).view(dense.shape[0], -1)
            logits = self.mlp(torch.cat([pooled, dense], 1)).squeeze(1)
            return logits + self.wide(ids, wide_offsets).squeeze(1)

    return Ctr()


def peer(args):
    """One PyTorch training process; prints its JSON line."""
    import numpy as np
    import torch
    torch.set_num_threads(args.threads)
    a = prepare_arrays(args.train_file, args.test_file, args.cache)
    world, rank = args.world, args.rank
    per_update = args.per_update
    steps = len(a["train_labels"]) // per_update
    if args.max_steps:
        steps = min(steps, args.max_steps)
    # Update s reads lines [s * per_update, (s + 1) * per_update); a DDP
    # process takes every world-th of them from its rank on, as ours do.
    batches = []
    for s in range(steps):
        lines = slice(s * per_update + rank, (s + 1) * per_update, world)
        batches.append((*bags(a["train_cat"][lines]), torch.from_numpy(a["train_dense"][lines]),
                        torch.from_numpy(a["train_labels"][lines])))
    model = build_model(int(a["rows"]), args.dim, args.hidden, args.seed, args.joint)
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=rank, world_size=world)
        train_model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        train_model = model
    dense_opt = torch.optim.Adagrad(model.mlp.parameters(), foreach=True, **ADAGRAD_MLP)
    tables = [model.joint.weight] if args.joint else [model.deep.weight, model.wide.weight]
    sparse_opt = torch.optim.Adagrad(tables, **ADAGRAD_TABLES)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    for ids, offsets, wide_offsets, dense, labels in batches:
        dense_opt.zero_grad(set_to_none=True)
        sparse_opt.zero_grad(set_to_none=True)
        loss_fn(train_model(ids, offsets, wide_offsets, dense), labels).backward()
        dense_opt.step()
        sparse_opt.step()
    seconds = time.perf_counter() - start
    result = {"samples": steps * per_update // world, "seconds": seconds}
    if rank == 0:
        with torch.no_grad():
            logits = model(*bags(a["test_cat"]), torch.from_numpy(a["test_dense"]))
            p = torch.sigmoid(logits.double()).clamp(1e-7, 1 - 1e-7).numpy()
        y = a["test_labels"]
        result["test_auc"] = auc(p, y)
        result["test_logloss"] = float(-np.mean(np.where(y > 0.5, np.log(p), np.log1p(-p))))
    if world > 1:
        dist.destroy_process_group()
    print(json.dumps(result), flush=True)


def peer_command(args, world, rank, port, threads, per_update, joint=False):
    return [sys.executable, os.path.abspath(__file__), "--peer", f"--world={world}",
            f"--rank={rank}", f"--port={port}", f"--threads={threads}",
            f"--per_update={per_update}", f"--dim={args.dim}", f"--joint={int(joint)}",
            f"--hidden={','.join(map(str, args.hidden))}", f"--seed={args.seed}",
            f"--train_file={args.train_file}", f"--test_file={args.test_file}",
            f"--cache={args.cache}"]


def run_torch(args, world, threads, per_update, joint=False):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **MALLOC_ENV)
    if args.openblas_coretype:
        env["OPENBLAS_CORETYPE"] = args.openblas_coretype
    port = free_port()
    procs = [subprocess.Popen(peer_command(args, world, r, port, threads, per_update, joint),
                              env=env, stdout=subprocess.PIPE, text=True) for r in range(world)]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=args.timeout)
        if p.returncode != 0:
            raise RuntimeError(f"a PyTorch process exited with {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return {"samples_per_sec": sum(r["samples"] for r in results) /
            max(r["seconds"] for r in results),
            "test_auc": results[0]["test_auc"], "test_logloss": results[0]["test_logloss"]}


# ---------------------------------------------------------------- our side

def job_config(source, train_file, test_file):
    """The config with its data files moved and its PS on free ports."""
    with open(source) as f:
        text = f.read()
    text = re.sub(r'train_file: "[^"]*"', f'train_file: "{train_file}"', text)
    text = re.sub(r'test_file: "[^"]*"', f'test_file: "{test_file}"', text)
    return re.sub(r'ps: "[^"]*"', 'ps: "127.0.0.1:0"', text)


def run_ours(args, mode):
    out = subprocess.run([os.path.join(args.bin_dir, "pslaunch"), f"--config={args.job}",
                          f"--mode={mode}"], capture_output=True, text=True,
                         timeout=args.timeout)
    if out.returncode != 0:
        raise RuntimeError(f"pslaunch --mode={mode} exited {out.returncode}: {out.stderr[-2000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    planted = re.search(r"the planted model scores test_auc ([0-9.]+)", out.stdout + out.stderr)
    if planted:
        args.planted_auc = float(planted.group(1))
    # PyTorch's runs come after ours in a round, and get its kernels.
    args.openblas_coretype = coretype_from_log(out.stdout + out.stderr) or args.openblas_coretype
    return {"samples_per_sec": summary["train_samples_per_sec"],
            "test_auc": summary["test_auc"], "test_logloss": summary["test_logloss"]}


# ---------------------------------------------------------------- the table

# PyTorch in one process at one thread and at every core: whichever is
# faster is its best (on 2 cores, one thread is).
CORES = max(2, os.cpu_count() or 2)
EVERY_CORE = f"torch 1 process {CORES} threads"
# Both tables in one EmbeddingBag, as ours keeps them on its shards.
JOINT = "torch 1 process 1 thread joint table"
ONE_PROCESS = ["torch 1 process 1 thread", EVERY_CORE, JOINT]
PEERS = ONE_PROCESS + ["torch DDP 2 processes"]
OURS = {"sync": "ours SYNC 2 workers", "async": "ours ASYNC 2 workers"}


def variants(batch_size):
    """(name, samples per update, runner): ours, then every PyTorch variant at
    each of ours' samples per update (SYNC sums the 2 workers' batches into
    one update, ASYNC applies each worker's push alone)."""
    per_update = {"sync": 2 * batch_size, "async": batch_size}
    peers = {"torch 1 process 1 thread": (1, 1, False), EVERY_CORE: (1, CORES, False),
             JOINT: (1, 1, True), "torch DDP 2 processes": (2, 1, False)}
    out = []
    for mode, name in OURS.items():
        out.append((name, per_update[mode], lambda a, m=mode: run_ours(a, m)))
        for peer_name, (world, threads, joint) in peers.items():
            out.append((peer_name, per_update[mode],
                        lambda a, w=world, t=threads, n=per_update[mode], j=joint:
                        run_torch(a, w, t, n, j)))
    return out


FIGURES = ["samples_per_sec", "test_auc", "test_logloss", "load_1min"]


def summarize(name, per_update, runs, common):
    row = dict(common, variant=name, samples_per_update=per_update, runs=len(runs))
    for figure in FIGURES:
        values = [r[figure] for r in runs]
        digits = 1 if figure == "samples_per_sec" else 4
        row[figure] = round(statistics.median(values), digits)
        row[figure + "_min"] = round(min(values), digits)
        row[figure + "_max"] = round(max(values), digits)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--config", default="configs/ctr.textproto")
    parser.add_argument("--bin_dir", default="build/bin")
    parser.add_argument("--work_dir", default="build/bench/ctr_vs_torch",
                        help="the generated data, its arrays and the job's config")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--json", default="", help="write the rows here too")
    # The peer's own flags (one PyTorch process, run by this driver).
    parser.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    for flag, kind in (("world", int), ("rank", int), ("port", int), ("threads", int),
                       ("per_update", int), ("dim", int), ("hidden", str), ("seed", int),
                       ("train_file", str), ("test_file", str), ("cache", str), ("max_steps", int),
                       ("joint", int)):
        parser.add_argument(f"--{flag}", type=kind, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        args.hidden = [int(h) for h in args.hidden.split(",")]
        peer(args)
        return 0
    try:
        import torch  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"{PROGRAM}: error: {e}; install python3-torch python3-numpy", file=sys.stderr)
        return 2
    if not os.path.exists(os.path.join(args.bin_dir, "pslaunch")):
        print(f"{PROGRAM}: error: no pslaunch in {args.bin_dir}; build first (scripts/build.sh) "
              "or pass --bin_dir", file=sys.stderr)
        return 2
    with open(args.config) as f:
        text = f.read()
    batch = re.search(r"batch_size: (\d+)", text)
    dim = re.search(r'embeddings \{ name: "categorical" dim: (\d+)', text)
    hidden = re.findall(r"hidden: (\d+)", text)
    adagrad = re.findall(r"adagrad \{ learning_rate: ([0-9.]+) initial_accumulator: ([0-9.e-]+)",
                         text)
    if not (batch and dim and hidden) or "workers: 2" not in text or "mode: SYNC" not in text:
        print(f"{PROGRAM}: error: {args.config} is not a 2-worker SYNC CTR config like "
              "configs/ctr.textproto", file=sys.stderr)
        return 2
    if adagrad != CONFIG_ADAGRAD:
        print(f"{PROGRAM}: error: {args.config}'s optimizers are {adagrad}, not the MLP's and the "
              f"two tables' Adagrad the PyTorch side mirrors ({CONFIG_ADAGRAD})", file=sys.stderr)
        return 2
    args.batch_size, args.dim = int(batch.group(1)), int(dim.group(1))
    args.hidden, args.seed = [int(h) for h in hidden], 1
    work = os.path.abspath(args.work_dir)
    os.makedirs(work, exist_ok=True)
    args.train_file, args.test_file = f"{work}/train.tsv", f"{work}/test.tsv"
    args.cache, args.job = f"{work}/arrays.npz", f"{work}/ctr.textproto"
    with open(args.job, "w") as f:
        f.write(job_config(args.config, args.train_file, args.test_file))
    args.planted_auc, args.openblas_coretype = None, None
    if not (os.path.exists(args.train_file) and os.path.exists(args.test_file)):
        print("# generating the data with a first run of ours (not counted)", file=sys.stderr)
        run_ours(args, "sync")
    prepare_arrays(args.train_file, args.test_file, args.cache)
    command = shlex.join(["/usr/bin/python3"] + sys.argv)
    runs = variants(args.batch_size)
    samples = {(name, n): [] for name, n, _ in runs}
    for r in range(args.rounds):
        for name, n, runner in runs:
            load = os.getloadavg()[0]
            result = dict(runner(args), load_1min=load)
            samples[(name, n)].append(result)
            print(f"# round {r + 1}/{args.rounds}: {name}, {n} per update: "
                  f"{result['samples_per_sec']:.0f} samples/s, test_auc "
                  f"{result['test_auc']:.4f}, load {load:.2f}", file=sys.stderr, flush=True)
    common = {"benchmark": "ctr_vs_torch", "command": command,
              "openblas_coretype": args.openblas_coretype or ""}
    rows = [summarize(name, n, results, common) for (name, n), results in samples.items()]
    median = {(row["variant"], row["samples_per_update"]): row for row in rows}
    print(f"{'variant':28} {'per update':>10} {'samples/s':>10} {'min':>8} {'max':>8} "
          f"{'test_auc':>9} {'logloss':>8} {'load':>5}")
    for row in rows:
        print(f"{row['variant']:28} {row['samples_per_update']:10d} "
              f"{row['samples_per_sec']:10.0f} {row['samples_per_sec_min']:8.0f} "
              f"{row['samples_per_sec_max']:8.0f} {row['test_auc']:9.4f} "
              f"{row['test_logloss']:8.4f} {row['load_1min']:5.2f}")
    # Each of ours beside the fastest PyTorch variant at its samples per update.
    for name, n, _ in runs:
        if name not in OURS.values():
            continue
        ours = median[(name, n)]
        speed = lambda p: median[(p, n)]["samples_per_sec"]
        best_peer, faster_one = max(PEERS, key=speed), max(ONE_PROCESS, key=speed)
        rows.append(dict(common, ours=name, samples_per_update=n, best_peer=best_peer,
                         faster_one_process=faster_one, planted_auc=args.planted_auc,
                         ratio=round(ours["samples_per_sec"] / speed(best_peer), 3),
                         auc_difference=round(ours["test_auc"] -
                                              median[(best_peer, n)]["test_auc"], 4)))
        print(f"{name} / {best_peer} at {n} per update (of one process: {faster_one}): "
              f"{rows[-1]['ratio']:.2f}x, test_auc {rows[-1]['auc_difference']:+.4f}; "
              f"planted model's test_auc {args.planted_auc}")
    if args.json:
        with open(args.json, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
