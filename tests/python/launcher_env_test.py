"""A script started by another launcher finds its cluster and task the way
the C++ programs do: torchrun's (and Kubeflow PyTorchJob's) RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT with the shards beside the master
or listed in PSTRAIN_PS, or TF_CONFIG; no config file, no PSTRAIN_TASK.
Under torchrun itself too, with a ps_server that reads the same variables."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import unittest

from ps_cluster import PsCluster

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
STEPS = 4
# What a launcher sets: a worker here starts with none but its own.
LAUNCHER_VARIABLES = ("PSTRAIN_CONFIG", "PSTRAIN_TASK", "TF_CONFIG", "RANK", "LOCAL_RANK",
                      "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "PSTRAIN_PS", "PSTRAIN_NUM_PS")

try:
    import torch  # noqa: F401
except ImportError:
    print("skipped: torch is not installed for", sys.executable)
    sys.exit(77)

# A plain torch script: the client comes from the environment alone. Its
# job ends at its exit (as the README's script's), or at an explicit
# finish() in the place of {finish}.
SCRIPT = f"""import json, os, sys, torch, pstrain.torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = pstrain.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
rank = opt.client.worker
x = torch.full((8, 4), float(rank + 1))
for _ in range({STEPS}):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
{{finish}}
result = json.dumps({{"task": opt.client.task, "workers": opt.client.num_workers,
                     "weight": model.weight.detach().flatten().tolist()}})
print(result)
# Beside the script too: processes that share one stdout (torchrun's
# ranks) may interleave what they print.
with open(os.path.join(os.path.dirname(__file__), f"result-{{rank}}.json"), "w") as out:
    out.write(result)
"""


class LauncherEnvironmentTest(unittest.TestCase):
    @staticmethod
    def write_script(scratch, finish):
        script = os.path.join(scratch, "train.py")
        with open(script, "w") as f:
            f.write(SCRIPT.replace("{finish}", "opt.finish()" if finish else ""))
        return script

    def run_workers(self, scratch, environments, finish=True):
        script = self.write_script(scratch, finish)
        base = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
        workers = [subprocess.Popen([sys.executable, script], env={**base, **env},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    stdin=subprocess.DEVNULL)
                   for env in environments]
        results = []
        try:
            for worker in workers:
                out, err = worker.communicate(timeout=120)
                self.assertEqual(worker.returncode, 0, err[-3000:])
                results.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        return results

    def check_one_sync_job(self, results):
        self.assertEqual([r["task"] for r in results], ["worker:0", "worker:1"])
        self.assertEqual([r["workers"] for r in results], [2, 2])
        # One SYNC job: both workers end on the same parameters.
        self.assertEqual(results[0]["weight"], results[1]["weight"])

    def start_shard_beside_the_master(self, env):
        """A ps_server with torchrun's variables and no config file: it
        listens at MASTER_PORT+1, serves the scripts' model, and exits once
        they are done and gone (--exit_when_done)."""
        shard = subprocess.Popen(
            [os.path.join(BIN_DIR, "ps_server"), "--task=ps:0", "--exit_when_done"],
            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True)
        self.addCleanup(lambda: shard.poll() is None and (shard.kill(), shard.wait()))
        # Its log says where it serves; a shard that dies ends the output instead.
        seen = []
        for line in shard.stdout:
            seen.append(line)
            if " serving " in line:
                break
        self.assertIn(f"serving 127.0.0.1:{int(env['MASTER_PORT']) + 1} ", seen[-1] if seen else "",
                      "".join(seen))
        # Drained meanwhile, so that a full pipe never stalls the shard.
        threading.Thread(target=shard.stdout.read, daemon=True).start()
        return shard

    @staticmethod
    def master_port():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1] - 1

    def test_torchrun_with_the_shard_beside_the_master(self):
        env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.master_port())}
        with tempfile.TemporaryDirectory(prefix="pstrain-torchrun-") as scratch:
            shard = self.start_shard_beside_the_master(env)
            torchrun = [{**env, "RANK": str(r), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2"}
                        for r in (0, 1)]
            # No finish() in the script: its exit ends its part of the job.
            self.check_one_sync_job(self.run_workers(scratch, torchrun, finish=False))
            # The job's workers are done and gone: so is its shard.
            self.assertEqual(shard.wait(timeout=30), 0)

    @unittest.skipUnless(shutil.which("torchrun"), "no torchrun on PATH (python3-torch has it)")
    def test_torchrun_itself(self):
        # Debian 12's torchrun (torch 1.13 on Python 3.11) fails at start with
        # its default --redirects=0 --tee=0 (Python 3.11's IntFlag iteration
        # skips the 0 member); 2 (stderr) is the setting that works there.
        master_port = self.master_port()
        env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port)}
        with tempfile.TemporaryDirectory(prefix="pstrain-torchrun-") as scratch:
            shard = self.start_shard_beside_the_master(env)
            script = self.write_script(scratch, finish=False)
            clean = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
            run = subprocess.run(
                ["torchrun", "--redirects=2", "--tee=2", "--nproc_per_node=2",
                 f"--master_port={master_port}", f"--log_dir={scratch}/torchrun", script],
                env=clean, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
            self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
            results = []
            for rank in (0, 1):
                with open(os.path.join(scratch, f"result-{rank}.json")) as f:
                    results.append(json.load(f))
            results.sort(key=lambda r: r["task"])
            self.check_one_sync_job(results)
            self.assertEqual(shard.wait(timeout=30), 0)

    def test_torchrun_with_the_shards_listed(self):
        with PsCluster(BIN_DIR, workers=2, shards=2) as cluster, \
                tempfile.TemporaryDirectory(prefix="pstrain-torchrun-") as scratch:
            listed = [{"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "1", "PSTRAIN_PS": ",".join(cluster.addresses)}
                      for r in (0, 1)]
            self.check_one_sync_job(self.run_workers(scratch, listed))

    def test_tf_config(self):
        with PsCluster(BIN_DIR, workers=2, shards=2) as cluster, \
                tempfile.TemporaryDirectory(prefix="pstrain-tf-config-") as scratch:
            def tf_config(task_type):
                return json.dumps({"cluster": {"chief": ["c:2222"], "worker": ["w:2222"],
                                               "ps": cluster.addresses},
                                   "task": {"type": task_type, "index": 0}})
            self.check_one_sync_job(self.run_workers(
                scratch, [{"TF_CONFIG": tf_config("chief")}, {"TF_CONFIG": tf_config("worker")}]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
