#!/usr/bin/python3
"""The Python client's cost over the C++ client's: the same exchange of the
same tensors against the same kind of ps_server.

    /usr/bin/python3 benchmarks/python_client_bench.py --rounds=5 \\
        --json=docs/bench/python_client.json

For every transport (tcp, shm) and size, each round measures both clients
in turn (the order alternating from round to round), each against a fresh
ps_server process (ASYNC, SGD; one shard): the C++ client is ps_bench
--ps=ADDR (PsClient::PushPull on the tensors PsClient::AllocateTensors
gave); the Python client is pstrain.Client.push_pull(client.gradients) on
the session's own arrays, as pstrain.torch uses it, in a process of its
own. Both time each round trip for --seconds after one warm-up, and count
their process's CPU time over that window. Prints a table of medians over
the rounds (min-max) and, per round, the Python client's p50 and CPU per
round trip over the C++ client's; --json writes one row per transport and
size.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

PROGRAM = "python_client_bench.py"
MiB = 1 << 20

# worker_command: the clients bring a model of their own (the benchmark's
# tensors), so the shard takes any Init rather than the MLP's share.
CONFIG = """cluster {{ ps: "{address}" workers: 1 shm: {shm} worker_command: "python_client_bench" }}
training {{ mode: ASYNC optimizer {{ sgd {{ learning_rate: 0.1 }} }} pull_timeout_seconds: 60
  model {{ mlp {{ }} }} dataset {{ quadratic {{ examples: 16 }} }} }}
"""

# The Python client's loop, run in a process of its own as ps_bench runs.
PYTHON_DRIVER = r"""
import json, sys, time
import pstrain
config, size, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
elements = size // 4
rows = 1024 if elements >= 1024 else 1
client = pstrain.Client(config, "worker:0")
client.declare({"w": (rows, elements // rows)})
values, gradients = client.values, client.gradients
values["w"][:] = 0.0
gradients["w"][:] = 1e-12
client.init(values)
client.pull()
client.push_pull(gradients)  # warm-up: connections, first-touch buffers
latencies = []
cpu_begin, begin = time.process_time(), time.perf_counter()
end = begin + seconds
now = begin
while now < end:
    start = now
    client.push_pull(gradients)
    now = time.perf_counter()
    latencies.append(now - start)
elapsed, cpu = now - begin, time.process_time() - cpu_begin
latencies.sort()
bytes_per_trip = 2 * rows * (elements // rows) * 4
print(json.dumps({"push_pull_gbps": len(latencies) * bytes_per_trip / elapsed / 1e9,
                  "p50_us": latencies[len(latencies) // 2] * 1e6,
                  "p99_us": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1e6,
                  "round_trips": len(latencies),
                  "cpu_us_per_round_trip": cpu * 1e6 / len(latencies),
                  "transport": "shm" if client.shares_memory(0) else "tcp"}))
client.done()
"""


def fail(message, code=2):
    print(f"{PROGRAM}: error: {message}", file=sys.stderr)
    sys.exit(code)


class PsServer:
    """One ps_server process on a free loopback port, stopped by its PID."""

    def __init__(self, bin_dir, shm, scratch):
        zero = os.path.join(scratch, "ps.textproto")
        with open(zero, "w") as f:
            f.write(CONFIG.format(address="127.0.0.1:0", shm=shm))
        port_file = os.path.join(scratch, "ps.port")
        if os.path.exists(port_file):
            os.remove(port_file)
        self.log = open(os.path.join(scratch, "ps.log"), "w")
        self.process = subprocess.Popen(
            [os.path.join(bin_dir, "ps_server"), f"--config={zero}", "--task=ps:0",
             f"--port_file={port_file}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                fail(f"ps_server did not start; see {self.log.name}", 1)
            time.sleep(0.02)
        self.address = f"127.0.0.1:{open(port_file).read().strip()}"
        self.config = os.path.join(scratch, "cluster.textproto")
        with open(self.config, "w") as f:
            f.write(CONFIG.format(address=self.address, shm=shm))

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def run_json(command, env=None):
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env,
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        fail(f"{command[0]} exited {out.returncode}: {out.stderr.strip()[-400:]}", 1)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if not rows:
        fail(f"{command[0]} printed no JSON row", 1)
    return rows[-1]


def measure(client, args, transport, size, scratch):
    ps = PsServer(args.bin_dir, "SHM_OFF" if transport == "tcp" else "SHM_AUTO", scratch)
    try:
        if client == "cpp":
            row = run_json([os.path.join(args.bin_dir, "ps_bench"), f"--ps={ps.address}",
                            "--shards=1", f"--sizes={size // MiB}MiB", f"--seconds={args.seconds}",
                            f"--transport={transport}", "--iperf=false", "--json"])
        else:
            row = run_json([sys.executable, "-c", PYTHON_DRIVER, ps.config, str(size),
                            str(args.seconds)],
                           env=dict(os.environ, PYTHONPATH=os.path.abspath(args.python_dir)))
    finally:
        ps.stop()
    if row["transport"] != transport:
        fail(f"the {client} client moved tensors over {row['transport']}, not {transport}", 1)
    return row


def machine():
    load = os.getloadavg()
    return {"cpu": platform.processor() or platform.machine(), "nproc": os.cpu_count(),
            "load_average": f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
            "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}


def spread(values):
    return statistics.median(values), min(values), max(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin_dir", default="build/bin", help="where ps_server and ps_bench are")
    parser.add_argument("--python_dir", default="build/python",
                        help="where the pstrain module is built")
    parser.add_argument("--sizes", default="1,4,16,64", help="MiB, comma-separated")
    parser.add_argument("--transports", default="tcp,shm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.5, help="measuring time per run")
    parser.add_argument("--json", default="", help="write the rows here")
    args = parser.parse_args()
    try:
        sizes = [int(s) * MiB for s in args.sizes.split(",")]
    except ValueError:
        fail(f"--sizes={args.sizes}: use MiB counts such as 1,4,16,64")
    transports = args.transports.split(",")
    if not set(transports) <= {"tcp", "shm"} or args.rounds < 1 or args.seconds <= 0:
        fail("--transports takes tcp and shm; --rounds and --seconds must be positive")
    for program in ("ps_server", "ps_bench"):
        if not os.access(os.path.join(args.bin_dir, program), os.X_OK):
            fail(f"{args.bin_dir}/{program} not found; build it (cmake --build build "
                 f"--target {program})")
    if not os.path.isdir(os.path.join(args.python_dir, "pstrain")):
        fail(f"no pstrain module in {args.python_dir}; build it (cmake --build build "
             "--target _pstrain)")
    started = machine()
    results = {}  # (transport, size, client) -> [rows]
    with tempfile.TemporaryDirectory(prefix="pstrain-pybench-") as scratch:
        for r in range(args.rounds):
            for transport in transports:
                for size in sizes:
                    order = ["cpp", "python"] if r % 2 == 0 else ["python", "cpp"]
                    for client in order:
                        row = measure(client, args, transport, size, scratch)
                        results.setdefault((transport, size, client), []).append(row)
                        print(f"round {r + 1} {transport} {size // MiB:>2} MiB {client:>6}: "
                              f"p50 {row['p50_us']:.0f} us, {row['push_pull_gbps']:.3f} GB/s",
                              file=sys.stderr, flush=True)
    rows = []
    print(f"{'transport':9} {'size':>7} {'C++ p50 us':>22} {'Python p50 us':>22} "
          f"{'Python/C++ p50':>22} {'Python/C++ client CPU':>22} {'C++ GB/s':>8} {'Py GB/s':>8}")
    for transport in transports:
        for size in sizes:
            cpp, py = results[(transport, size, "cpp")], results[(transport, size, "python")]
            # Per round, so that the ratio compares runs made side by side.
            ratios = [p["p50_us"] / c["p50_us"] for c, p in zip(cpp, py)]
            row = {"benchmark": "python_client", "transport": transport,
                   "size": f"{size // MiB}MiB", "size_bytes": size, "runs": len(ratios)}
            for name, runs in (("cpp", cpp), ("python", py)):
                for figure in ("p50_us", "push_pull_gbps", "cpu_us_per_round_trip"):
                    row[f"{name}_{figure}"], row[f"{name}_{figure}_min"], \
                        row[f"{name}_{figure}_max"] = spread([x[figure] for x in runs])
            row["python_over_cpp"], row["python_over_cpp_min"], row["python_over_cpp_max"] = \
                spread(ratios)
            cpu_ratios = [p["cpu_us_per_round_trip"] / c["cpu_us_per_round_trip"]
                          for c, p in zip(cpp, py)]
            row["cpu_python_over_cpp"], row["cpu_python_over_cpp_min"], \
                row["cpu_python_over_cpp_max"] = spread(cpu_ratios)
            rows.append(row)
            print(f"{transport:9} {row['size']:>7} "
                  f"{row['cpp_p50_us']:>8.0f} ({row['cpp_p50_us_min']:.0f}-{row['cpp_p50_us_max']:.0f})"
                  f" {row['python_p50_us']:>8.0f} ({row['python_p50_us_min']:.0f}-"
                  f"{row['python_p50_us_max']:.0f}) {row['python_over_cpp']:>8.3f} "
                  f"({row['python_over_cpp_min']:.3f}-{row['python_over_cpp_max']:.3f}) "
                  f"{row['cpu_python_over_cpp']:>8.3f} ({row['cpu_python_over_cpp_min']:.3f}-"
                  f"{row['cpu_python_over_cpp_max']:.3f}) "
                  f"{row['cpp_push_pull_gbps']:>8.3f} {row['python_push_pull_gbps']:>8.3f}")
    if args.json:
        with open(args.json, "w") as out:
            for row in rows:
                row.update(machine_at_start=started,
                           command=" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]))
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
