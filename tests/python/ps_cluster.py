"""PS shards for the Python tests: real ps_server processes on loopback.

Each shard binds port 0 and reports the port it got (--port_file); the
workers' config then names the real ports. Every process started here is
stopped by its PID, and every wait is bounded.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time

# A job the tests' workers share; the model and data set are the built-in
# worker's and unused by the PS. The workers are the tests' own clients,
# which bring their own model (worker_command), so a shard takes the first
# Init whatever it carries.
CONFIG = """cluster {{ {ps} workers: {workers} worker_command: "python3" {cluster} }}
training {{
  mode: {mode}
  optimizer {{ {optimizer} }}
  pull_timeout_seconds: 60
  model {{ mlp {{ }} }}
  dataset {{ quadratic {{ examples: 16 }} }}
  {training}
}}
"""


class PsCluster:
    """``shards`` ps_server processes for a job of ``workers`` workers.

    ``config_path``: the workers' config (the real ports). ``checkpoints``:
    each shard checkpoints into the cluster's folder (and restarts from it)."""

    def __init__(self, bin_dir, workers=1, shards=1, mode="SYNC",
                 optimizer="sgd { learning_rate: 0.1 momentum: 0.9 }", cluster="", training="",
                 timeout=60, checkpoints=False):
        self.dir = tempfile.mkdtemp(prefix="pstrain-test-")
        self.bin_dir = bin_dir
        self.processes = []
        if checkpoints:
            training += f' checkpoint {{ dir: "{self.dir}/ckpt" }}'

        self._fields = dict(workers=workers, mode=mode, optimizer=optimizer, cluster=cluster,
                            training=training)
        # One loopback address per shard: a cluster's addresses must differ.
        zero = [f"127.0.0.{s + 1}:0" for s in range(shards)]
        ps_config = self._write("ps.textproto", zero)
        port_files = []
        for s in range(shards):
            port_files.append(os.path.join(self.dir, f"ps-{s}.port"))
            with open(os.path.join(self.dir, f"ps-{s}.log"), "w") as log:
                self.processes.append(subprocess.Popen(
                    [os.path.join(bin_dir, "ps_server"), f"--config={ps_config}",
                     f"--task=ps:{s}", f"--port_file={port_files[-1]}"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        addresses = []
        deadline = time.monotonic() + timeout
        for s, path in enumerate(port_files):
            port = self._await_port(path, self.processes[s], deadline)
            addresses.append(f"127.0.0.{s + 1}:{port}")
        self.addresses = addresses
        self.config_path = self._write("cluster.textproto", addresses)

    def _write(self, name, addresses):
        ps = " ".join(f'ps: "{a}"' for a in addresses)
        path = os.path.join(self.dir, name)
        with open(path, "w") as out:
            out.write(CONFIG.format(ps=ps, **self._fields))
        return path

    def _await_port(self, path, process, deadline):
        while time.monotonic() < deadline:
            try:
                with open(path) as f:
                    text = f.read().strip()
                if text:
                    return int(text)
            except FileNotFoundError:
                pass
            if process.poll() is not None:
                raise RuntimeError(f"ps_server exited with {process.returncode}: {self.log()}")
            time.sleep(0.05)
        raise RuntimeError(f"ps_server did not report its port: {self.log()}")

    def stop_shard(self, shard=0, timeout=60):
        """Stops shard ``shard`` (SIGTERM: it writes its final checkpoint)
        and waits for it to exit."""
        process = self.processes[shard]
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=timeout)
        return process.returncode

    def start_shard(self, shard=0, timeout=60):
        """Starts shard ``shard`` again on its address and waits until it serves."""
        port_file = os.path.join(self.dir, f"ps-{shard}.port")
        if os.path.exists(port_file):
            os.remove(port_file)
        with open(os.path.join(self.dir, f"ps-{shard}.log"), "a") as log:
            self.processes[shard] = subprocess.Popen(
                [os.path.join(self.bin_dir, "ps_server"), f"--config={self.config_path}",
                 f"--task=ps:{shard}", f"--port_file={port_file}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._await_port(port_file, self.processes[shard], time.monotonic() + timeout)

    def log(self, shard=0):
        with open(os.path.join(self.dir, f"ps-{shard}.log")) as f:
            return f.read()

    def stop(self):
        """Stops every shard (SIGTERM, then SIGKILL after 20 s) and removes
        the files of the cluster."""
        for p in self.processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.processes = []
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
