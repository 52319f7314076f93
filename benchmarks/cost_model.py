#!/usr/bin/python3
"""The step-time model of a parameter-server cluster, fitted to namespace rows.

    benchmarks/cost_model.py measure --out=ROWS.json      # rows on this machine (root)
    benchmarks/cost_model.py fit ROWS.json --out=docs/bench/netns_cluster.json
    benchmarks/cost_model.py beyond docs/bench/netns_cluster.json --out=docs/bench/cost_model.json

A step of one worker, for N workers, K shards, M wire bytes each way per
worker (the dense model at the wire dtype, plus the embedding rows the batch
touches), ports of B bytes/s each way, shard k holding a share f_k of those
bytes (f: the largest), and a round trip of R between two hosts:

    worker_link = M / (eta_w B) + fill min(M, K C) / B
    shard_link  = 2 N f M / (eta_s B)
    apply       = gamma N f M
    messages    = alpha + beta K + R
    SYNC:  T = compute(slowest) + messages + 2 max(M, N f M) / (eta_y B) + fill min(M, K C) / B + apply
    ASYNC: T = max(compute + messages + worker_link, shard_link + apply)

An exchange streams its tensors in chunks of C = 1 MiB (common/tensor_stream.h)
and a shard answers each chunk as it applies it, so a worker's pull runs
beside its push but for the last chunk to each shard: that is the fill term.
SYNC waits for the slowest worker and the slowest shard: every worker
pushes, then every worker pulls, so the busiest port (a shard's N f M, or a
worker's M) carries its bytes in, then its bytes out, overlapping only as
far as eta_y (above 1) says. ASYNC workers only queue behind each other at
the busiest shard, whose two directions carry different workers' pushes and
pulls at once (eta_s up to 2). apply is the busiest shard's CPU on the
gradients it receives. The constants are fitted (least squares on relative
error) to the rows marked "fit", over ports without added delay, so this
machine's own round trip is inside alpha: the six of ASYNC to ps_bench rows,
then eta_y alone to training rows; the rest are held out and predicted.
psctl plan (psctl/plan.cc) computes the same formulas.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np

PROGRAM = "cost_model.py"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def rate_bytes_per_s(rate):
    """'200mbit' -> 25e6."""
    m = re.fullmatch(r"([0-9.]+)(kbit|mbit|gbit|tbit)", rate)
    if not m:
        raise ValueError(f"rate {rate!r}: give e.g. 200mbit or 25gbit")
    return float(m.group(1)) * UNITS[m.group(2)] / 8


CHUNK_BYTES = 1 << 20
NAMES = ("alpha", "beta", "eta_w", "fill", "eta_s", "gamma", "eta_y")


def step_seconds(c, job):
    """Predicted seconds per step of one worker. c: the constants (dict);
    job: workers, shards, wire_bytes (one way, per worker), link_bytes_per_s,
    compute_s, mode ('sync' or 'async'), shard_share (default 1/shards),
    rtt_s (default 0)."""
    coefficients, rest = terms(c, job)
    return float(np.dot(coefficients, unknowns(c))) + rest


def terms(c, job):
    """(coefficients of (alpha, beta, 1/eta_w, fill, 1/eta_s, gamma, 1/eta_y),
    the rest) of the step time, in the branch of the max that binds under c."""
    n, k, m, b = job["workers"], job["shards"], job["wire_bytes"], job["link_bytes_per_s"]
    f = job.get("shard_share", 1.0 / k)
    fixed = job.get("compute_s", 0.0) + job.get("rtt_s", 0.0)
    fill = min(m, k * CHUNK_BYTES) / b
    if job.get("mode", "async") == "sync":
        return [1.0, k, 0.0, fill, 0.0, n * f * m, 2 * max(m, n * f * m) / b], fixed
    worker = [1.0, k, m / b, fill, 0.0, 0.0, 0.0]
    shard = [0.0, 0.0, 0.0, 0.0, 2 * n * f * m / b, n * f * m, 0.0]
    if fixed + float(np.dot(worker, unknowns(c))) >= float(np.dot(shard, unknowns(c))):
        return worker, fixed
    return shard, 0.0


def unknowns(c):
    return np.array([c["alpha"], c["beta"], 1 / c["eta_w"], c["fill"], 1 / c["eta_s"], c["gamma"],
                     1 / c["eta_y"]])


def constants(x):
    return {"alpha": x[0], "beta": x[1], "eta_w": 1 / max(x[2], 1e-12), "fill": x[3],
            "eta_s": 1 / max(x[4], 1e-12), "gamma": x[5], "eta_y": 1 / max(x[6], 1e-12)}


def fit_from(c, jobs, measured, only=None):
    """Least squares on relative error from constants c (non-negative
    unknowns; `only`: the names to fit, the others kept); each row's branch
    of the max is re-chosen until it settles."""
    for _ in range(100):
        rows, rhs = [], []
        for job, t in zip(jobs, measured):
            coefficients, rest = terms(c, job)
            rows.append(np.array(coefficients) / t)
            rhs.append((t - rest) / t)
        a, y = np.array(rows), np.array(rhs)
        # Unknowns no row depends on keep their value.
        used = [i for i in range(len(NAMES)) if np.abs(a[:, i]).max() > 0
                and (only is None or NAMES[i] in only)]
        # The kept unknowns' share of each row moves to the right-hand side.
        kept = [i for i in range(len(NAMES)) if i not in used]
        y = y - a[:, kept] @ unknowns(c)[kept]
        free = list(used)
        while True:
            x, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
            if (x >= 0).all() or len(free) == 1:
                break
            free.pop(int(np.argmin(x)))
        solved = unknowns(c)
        solved[used] = 0
        solved[free] = np.maximum(x, 0)
        new = constants(solved)
        if all(abs(new[key] - c[key]) <= 1e-9 * max(1.0, abs(c[key])) for key in c):
            break
        c = new
    return c


def relative_error(c, jobs, measured):
    return float(sum((step_seconds(c, j) / t - 1) ** 2 for j, t in zip(jobs, measured)))


def fit(jobs, measured):
    """The constants with the least squared relative error over `jobs`, from
    the best of several starting points (the max makes it non-linear)."""
    best = None
    for eta_w in (0.7, 1.0, 1.5):
        for eta_s in (1.0, 1.5, 2.0):
            for alpha in (1e-3, 1e-2):
                start = {"alpha": alpha, "beta": 1e-4, "eta_w": eta_w, "fill": 1.0,
                         "eta_s": eta_s, "gamma": 1e-9, "eta_y": 1.0}
                c = fit_from(start, jobs, measured)
                error = relative_error(c, jobs, measured)
                if best is None or error < best[0]:
                    best = (error, c)
    return {key: float(value) for key, value in best[1].items()}


def bench_grid():
    """The ps_bench rows `measure` runs: K = 1..4 shards, N = 1..8 workers,
    1 to 16 MiB (above the ports' 128 KB tbf burst) at two link rates, less
    the rows whose step would take over about 2 s (their window would hold
    too few steps), and a few of 64 MiB."""
    sizes = {"1MiB": 1 << 20, "4MiB": 4 << 20, "16MiB": 16 << 20}
    rows = []
    for rate in ("200mbit", "400mbit"):
        b = rate_bytes_per_s(rate)
        for size, m in sizes.items():
            for k in (1, 2, 3, 4):
                for n in (1, 2, 4, 8):
                    estimate = max(1, n / k) * 2 * m / (0.95 * b)
                    if estimate <= 2.2:
                        seconds = min(8, max(3, round(5 * estimate)))
                        rows.append({"kind": "bench", "shards": k, "workers": n, "size": size,
                                     "rate": rate, "seconds": seconds})
    # The largest model the time allows: a few 64 MiB rows of 2-4 s steps.
    rows += [{"kind": "bench", "shards": k, "workers": n, "size": "64MiB", "rate": "400mbit",
              "seconds": 12} for k, n in ((1, 1), (2, 1), (4, 1), (4, 2))]
    return rows


def train_grid():
    """Training rows (the default model, SYNC, one epoch of 15000 images),
    all held out: 4 workers against K = 1..4 shards at 200 Mbit/s (the K
    psctl plan recommends against the best K measured), 2 shards and 3
    workers at 400 Mbit/s, and the same jobs over 10 Gbit/s ports, whose
    step is the compute the model is given."""
    rows = [{"kind": "train", "shards": k, "workers": 4, "rate": rate}
            for rate in ("200mbit", "10gbit") for k in (1, 2, 3, 4)]
    rows += [{"kind": "train", "shards": 2, "workers": 3, "rate": rate}
             for rate in ("400mbit", "10gbit")]
    return rows


def train_config():
    """configs/local.textproto on the first 15000 training images, in a
    temporary file (removed at exit)."""
    import atexit
    import tempfile
    with open(os.path.join(REPO, "configs/local.textproto")) as f:
        text = f.read().replace("fashion_mnist {", "fashion_mnist { train_limit: 15000")
    handle, path = tempfile.mkstemp(suffix=".textproto")
    with os.fdopen(handle, "w") as f:
        f.write(text)
    atexit.register(os.remove, path)
    return path


def key(row):
    return tuple(str(row.get(name)) for name in ("kind", "shards", "workers", "size", "rate"))


def measure(out):
    """Runs scripts/netns_cluster.sh for every row of the grids not yet in
    `out`, appending each row as it is measured (so a stopped run resumes)."""
    done = set()
    if os.path.exists(out):
        with open(out) as f:
            done = {key(json.loads(line)) for line in f if line.strip()}
    for row in train_grid() + bench_grid():
        if key(row) in done:
            continue
        command = [os.path.join(REPO, "scripts/netns_cluster.sh"), row["kind"],
                   f"--shards={row['shards']}", f"--workers={row['workers']}", f"--rate={row['rate']}"]
        if row["kind"] == "bench":
            command += [f"--size={row['size']}", f"--seconds={row['seconds']}"]
        else:
            command += [f"--config={train_config()}"]
        run = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if run.returncode != 0:
            print(f"{PROGRAM}: {' '.join(command[1:])}: failed:\n{run.stderr}", file=sys.stderr)
            continue
        line = run.stdout.strip().splitlines()[-1]
        print(line, flush=True)
        with open(out, "a") as f:
            f.write(line + "\n")


def mlp_share(shards, layers=(784, 256, 128, 10)):
    """The busiest shard's share of the MLP's parameters, placed as
    placement/placement.cc places them: variables over 64 KiB cut by rows into
    one slice per shard, then every piece onto the lightest shard, largest
    first."""
    pieces = []
    for fan_in, fan_out in zip(layers, layers[1:]):
        for rows, size in ((fan_in, fan_in * fan_out), (fan_out, fan_out)):
            if shards > 1 and rows > 1 and size * 4 > (64 << 10):
                parts = min(shards, rows)
                pieces += [(rows // parts + (p < rows % parts)) * (size // rows)
                           for p in range(parts)]
            else:
                pieces.append(size)
    load = [0] * shards
    for size in sorted(pieces, reverse=True):
        load[load.index(min(load))] += size
    return max(load) / sum(load)


def job_of(row):
    """The model's view of a measured row."""
    job = {"workers": row["workers"], "shards": row["shards"],
           "link_bytes_per_s": rate_bytes_per_s(row["rate"])}
    if row["kind"] == "bench":
        job.update(wire_bytes=row["wire_bytes_per_step"] / 2, mode="async")
    else:
        job.update(wire_bytes=MLP_PARAMETERS * 4, mode=row["mode"],
                   shard_share=mlp_share(row["shards"]))
    return job


MLP_PARAMETERS = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10
LINK_BOUND_CPU = 0.8  # cores: our processes' CPU above which a row counts as CPU-bound


def plan_check(c, train):
    """What psctl plan recommends for the 4-worker training job at 200 Mbit/s
    (K = 1..4, compute: the median of the rows' own), against the K whose
    measured samples/s was best."""
    rows = sorted((r for r in train if r["rate"] == "200mbit" and r["workers"] == 4
                   and "compute_ms" in r), key=lambda r: r["shards"])
    if len(rows) < 2:
        return None
    compute_ms = float(np.median([r["compute_ms"] for r in rows]))
    predicted = {}
    for r in rows:
        job = dict(job_of(r), compute_s=compute_ms / 1e3)
        predicted[r["shards"]] = r["workers"] * 64 / step_seconds(c, job)
    best = max(predicted.values())
    recommended = min(k for k, v in predicted.items() if v >= 0.95 * best)
    measured = {r["shards"]: r["samples_per_s"] for r in rows}
    best_measured = max(measured, key=measured.get)
    return {"workers": 4, "rate": "200mbit", "worker_step_ms": round(compute_ms, 2),
            "recommended_k": recommended, "best_measured_k": best_measured,
            "measured_at_recommended_of_best": round(measured[recommended] /
                                                     measured[best_measured], 3)}


def fit_rows(rows):
    """Marks each row fit, held_out or cpu_bound, fits the constants on the
    fit rows and predicts every row. Returns (rows, constants row)."""
    bench = [r for r in rows if r["kind"] == "bench"]
    for r in bench:
        r["link_bound"] = r["cpu_cores_ps"] + r["cpu_cores_workers"] < LINK_BOUND_CPU
    bound = sorted((r for r in bench if r["link_bound"]),
                   key=lambda r: (r["rate"], r["size_bytes"], r["shards"], r["workers"]))
    for i, r in enumerate(bound):
        r["role"] = "held_out" if i % 3 == 1 else "fit"
    for r in bench:
        r.setdefault("role", "cpu_bound")
    fitted = [r for r in bench if r["role"] == "fit"]
    c = fit([job_of(r) for r in fitted], [r["step_ms"] / 1e3 for r in fitted])
    for r in bench:
        r["predicted_step_ms"] = round(step_seconds(c, job_of(r)) * 1e3, 2)
    # Training rows: the compute is the step over 10 Gbit/s ports less the
    # model's exchange there; SYNC's eta_y is fitted to the 200 Mbit/s rows
    # of 1 and 3 shards, and every other row is predicted.
    train = [r for r in rows if r["kind"] == "train"]
    fast = {(r["shards"], r["workers"]): r for r in train if r["rate"] == "10gbit"}
    slow = [r for r in train if r["rate"] != "10gbit" and (r["shards"], r["workers"]) in fast]
    for r in slow:
        r["role"] = ("fit" if r["rate"] == "200mbit" and r["workers"] == 4
                     and r["shards"] in (1, 3) else "held_out")
    for _ in range(10):
        for r in slow:
            base = fast[(r["shards"], r["workers"])]
            r["compute_ms"] = round(max(0.0, base["step_ms"] / 1e3 -
                                        step_seconds(c, job_of(base))) * 1e3, 2)
        fitted_train = [r for r in slow if r["role"] == "fit"]
        if fitted_train:
            c = fit_from(c, [dict(job_of(r), compute_s=r["compute_ms"] / 1e3) for r in fitted_train],
                         [r["step_ms"] / 1e3 for r in fitted_train], only={"eta_y"})
    for r in slow:
        job = dict(job_of(r), compute_s=r["compute_ms"] / 1e3)
        r["predicted_step_ms"] = round(step_seconds(c, job) * 1e3, 2)
    for r in fast.values():
        r["role"] = "compute"
    c = {key: float(value) for key, value in c.items()}
    for r in rows:
        if "predicted_step_ms" in r:
            r["error_pct"] = round(100 * (r["predicted_step_ms"] / r["step_ms"] - 1), 1)
        r["benchmark"] = "netns_cluster"

    plan = plan_check(c, train)

    def errors(role):
        return [abs(r["error_pct"]) for r in rows if r.get("role") == role and "error_pct" in r]
    summary = {"benchmark": "netns_cluster", "constants": c,
               "link_bound_cpu_cores": LINK_BOUND_CPU,
               "command": "benchmarks/cost_model.py measure, then fit"}
    # CPU per byte through the shards and through the workers (both ways,
    # the wire bytes every worker moved): what no link-bound row can show as
    # time, and what sets a PS machine's cores at a given link rate.
    for side in ("ps", "workers"):
        per_byte = [r[f"cpu_cores_{side}"] / (r["gbytes_per_s"] * 1e9) for r in bench
                    if r["gbytes_per_s"] > 0]
        summary[f"cpu_ns_per_byte_{side}"] = round(float(np.median(per_byte)) * 1e9, 3)
    if plan:
        summary["plan_check"] = plan
    for role in ("fit", "held_out", "cpu_bound"):
        e = errors(role)
        summary[role] = {"rows": len(e), "mean_abs_error_pct": round(float(np.mean(e)), 1) if e else None,
                         "max_abs_error_pct": round(max(e), 1) if e else None,
                         "within_15_pct": sum(x <= 15 for x in e)}
    return rows, summary


RTT_S = 100e-6  # beyond this machine: the round trip between two hosts


def ours(c, n, k, m, b):
    """Seconds of one SYNC step's exchange (no compute) by the fitted model."""
    return step_seconds(c, {"workers": n, "shards": k, "wire_bytes": m, "link_bytes_per_s": b,
                            "mode": "sync", "rtt_s": RTT_S})


def crossing(c, n, m, b):
    """The fewest shards K (1..n) with which our exchange is no slower than
    ring all-reduce's, or None."""
    ring = 2 * (n - 1) / n * m / b
    for k in range(1, n + 1):
        if ours(c, n, k, m, b) <= ring:
            return k
    return None


def beyond(c, ps_ns_per_byte=None):
    """Rows past this machine: dense models and embedding tables, N = 8..1024
    workers, 10/25/100 Gbit/s ports, beside ring all-reduce (2 (N-1)/N M/B)
    and the PS's best case (as many CPU-only PS machines as workers, each port
    full duplex: M/B). Ours twice: with the shard CPU per byte fitted here
    (gamma: one shard process on this machine's cores), and with shards
    given the cores to keep up with their port (gamma = 0), which
    ps_ns_per_byte (the shards' measured CPU per byte in plus out) turns into
    cores per shard."""
    fed = dict(c, gamma=0.0)
    rows = []
    for gbit in (10, 25, 100):
        b = gbit * 1e9 / 8
        for m in (1e6, 100e6, 1e9, 10e9):
            for n in (8, 64, 256, 1024):
                row = {"benchmark": "cost_model", "part": "dense", "link_gbit": gbit,
                       "model_bytes": m, "workers": n, "ring_ms": 2 * (n - 1) / n * m / b * 1e3,
                       "ps_best_case_ms": m / b * 1e3,
                       "ours_k_eq_n_ms": ours(c, n, n, m, b) * 1e3,
                       "ours_fed_k_eq_n_ms": ours(fed, n, n, m, b) * 1e3,
                       "crossing_k": crossing(c, n, m, b),
                       "fed_crossing_k": crossing(fed, n, m, b)}
                if ps_ns_per_byte is not None:
                    row["shard_cores_at_line_rate"] = ps_ns_per_byte * 1e-9 * 2 * b
                rows.append(row)
    # Embeddings: a step moves the rows its batch looks up, not the table.
    b = 25e9 / 8
    for n in (8, 64, 256, 1024):
        for ids, dim, table_rows in ((4096, 64, 100_000_000), (65536, 128, 1_000_000_000)):
            m = ids * (8 + dim * 4)
            table = table_rows * dim * 4
            k = max(1, n // 8)
            rows.append({"benchmark": "cost_model", "part": "embedding", "link_gbit": 25,
                         "workers": n, "ids_per_batch": ids, "dim": dim, "table_bytes": table,
                         "bytes_per_step": m, "shards": k,
                         "ours_ms": ours(c, n, k, m, b) * 1e3,
                         "ring_dense_table_ms": 2 * (n - 1) / n * table / b * 1e3,
                         "allgather_rows_ms": (n - 1) * m / b * 1e3})
    # The plot's curves: 1 GB at 25 Gbit/s by N; the crossing K by N per rate.
    for n in [2 ** i for i in range(3, 11)]:
        m, b = 1e9, 25e9 / 8
        rows.append({"benchmark": "cost_model", "part": "curve", "workers": n, "model_bytes": m,
                     "link_gbit": 25, "ring_ms": 2 * (n - 1) / n * m / b * 1e3,
                     "ps_best_case_ms": m / b * 1e3,
                     "ours_k_eq_n_ms": ours(c, n, n, m, b) * 1e3,
                     "ours_fed_k_eq_n_ms": ours(fed, n, n, m, b) * 1e3,
                     "ours_fed_k_n_over_2_ms": ours(fed, n, max(1, n // 2), m, b) * 1e3,
                     "ours_fed_k_8_ms": ours(fed, n, 8, m, b) * 1e3,
                     "fed_crossing_k": {str(g): crossing(fed, n, 10e9, g * 1e9 / 8)
                                        for g in (10, 25, 100)}})
    return [{key: (round(v, 4) if isinstance(v, float) else v) for key, v in r.items()}
            for r in rows]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["measure", "fit", "beyond"])
    parser.add_argument("rows", nargs="?", default="", help="measured rows (fit, beyond)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.command == "measure":
        measure(args.out)
    elif args.command == "fit":
        with open(args.rows) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        rows = [r for r in rows if "constants" not in r]
        rows, summary = fit_rows(rows)
        with open(args.out, "w") as f:
            for r in rows + [summary]:
                f.write(json.dumps(r) + "\n")
        print(json.dumps(summary))
    elif args.command == "beyond":
        with open(args.rows) as f:
            summary = [json.loads(line) for line in f if "constants" in line][-1]
        with open(args.out, "w") as f:
            for r in beyond(summary["constants"], summary.get("cpu_ns_per_byte_ps")):
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
