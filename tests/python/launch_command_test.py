"""pslaunch runs a training script as torchrun does, with no config file:
``pslaunch --workers=2 --mode=async -- python3 train.py ARGS``: one PS at a
free port, the script as every worker's command with its arguments as
given, and the flags' overrides; a word before -- is still a mistake."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

import numpy as np

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
STEPS = 3

SCRIPT = """import sys, numpy as np, pstrain
client = pstrain.Client()
client.init({"w": np.zeros(4, np.float32)})
for _ in range(int(sys.argv[1])):
    client.push_pull({"w": np.ones(4, np.float32)})
print("arguments", sys.argv[1:], "mode", client.config["training"]["mode"],
      "backups", [len(b["address"]) for b in client.config["cluster"].get("ps_backups", [])])
client.done()
"""


# SYNC steps of a fixed gradient; worker 0 halts at step argv[3] until the
# test opens the FIFO argv[2] to write, so that a shard can be killed between
# two steps: once shard 0's backups, if any, are in its chain (a backup still
# catching up may not take the office; the shard's Stats tell it, polled,
# since no call waits for it).
HALTING_SCRIPT = """import os, sys, time, numpy as np, pstrain
client = pstrain.Client()
client.init({"w": np.zeros(4, np.float32)})

def backups_in_chain():
    backups = client.stats(0).get("replication", {}).get("backups", [{}])
    return all(b.get("in_chain") for b in backups)

for step in range(int(sys.argv[1])):
    if step == int(sys.argv[3]) and client.worker == 0:
        while client.config["cluster"].get("ps_backups") and not backups_in_chain():
            time.sleep(0.01)
        print("halted", flush=True)
        with open(sys.argv[2]) as go_on:  # blocks until the test opens it
            go_on.read()
    values = client.push_pull({"w": np.full(4, 0.01, np.float32)})
print("w", values["w"].tolist(), flush=True)
client.done()
"""
HALT_AT = 5


class LaunchCommandTest(unittest.TestCase):
    @staticmethod
    def write_script(scratch, text):
        script = os.path.join(scratch, "train.py")
        with open(script, "w") as f:
            f.write(text)
        return script

    def run_pslaunch(self, *args):
        return subprocess.run([os.path.join(BIN_DIR, "pslaunch"), *args], capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)

    def test_a_script_runs_as_the_workers_without_a_config(self):
        with tempfile.TemporaryDirectory(prefix="pstrain-launch-") as scratch:
            script = self.write_script(scratch, SCRIPT)
            run = self.run_pslaunch(f"--result_dir={scratch}/run", "--workers=2", "--mode=async",
                                    "--", sys.executable, script, str(STEPS), "two words")
            self.assertEqual(run.returncode, 0, run.stderr[-4000:])
            for worker in (0, 1):
                self.assertIn(f"[worker:{worker}] arguments ['{STEPS}', 'two words'] mode ASYNC "
                              "backups []", run.stdout)
            summary = json.loads(run.stdout.strip().splitlines()[-1])
            self.assertEqual(summary["mode"], "async")
            self.assertEqual(summary["workers"], 2)
            for worker in (0, 1):
                with open(os.path.join(scratch, "run", f"worker-{worker}.json")) as f:
                    self.assertEqual(json.load(f)["steps"], STEPS)

    @unittest.skipUnless(os.path.exists("/usr/bin/etcd"),
                         "no /usr/bin/etcd (Debian's etcd-server), which a job with backups runs")
    def test_a_scripts_shards_get_backups_without_a_config(self):
        with tempfile.TemporaryDirectory(prefix="pstrain-launch-") as scratch:
            script = self.write_script(scratch, SCRIPT)
            run = self.run_pslaunch(f"--result_dir={scratch}/run", "--ps=2", "--ps_backups=1",
                                    "--workers=2", "--", sys.executable, script, str(STEPS))
            self.assertEqual(run.returncode, 0, run.stderr[-4000:])
            for worker in (0, 1):
                self.assertIn(f"[worker:{worker}] arguments ['{STEPS}'] mode SYNC backups [1, 1]",
                              run.stdout)
            # pslaunch started every backup, and the job's etcd for them.
            for backup in ("ps:0:1", "ps:1:1"):
                self.assertRegex(run.stderr, backup + r" \(pid \d+\)")
            self.assertIn("membership is in etcd", run.stderr)
            self.assertEqual(json.loads(run.stdout.strip().splitlines()[-1])["steps"], STEPS)

    @unittest.skipUnless(os.path.exists("/usr/bin/etcd"),
                         "no /usr/bin/etcd (Debian's etcd-server), which a job with backups runs")
    def test_a_killed_primary_without_checkpoints_is_restarted_as_a_replica(self):
        """No checkpoint dir: a replica of a shard with backups comes back
        and takes its state from the one that took the office; the run ends
        as one without the kill does."""
        with tempfile.TemporaryDirectory(prefix="pstrain-launch-") as scratch:
            script = self.write_script(scratch, HALTING_SCRIPT)
            go_on = os.path.join(scratch, "go-on")
            os.mkfifo(go_on)

            def run(kill):
                launch = subprocess.Popen(
                    [os.path.join(BIN_DIR, "pslaunch"), "--ps=1", "--ps_backups=1",
                     "--workers=2", "--", sys.executable, script,
                     str(STEPS * 10), go_on, str(HALT_AT)],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                    stdin=subprocess.DEVNULL, start_new_session=True)
                timer = threading.Timer(120, lambda: os.killpg(launch.pid, signal.SIGKILL))
                timer.start()
                seen = []
                try:
                    for line in launch.stdout:
                        seen.append(line)
                        if "[worker:0] halted" in line:
                            pid = re.search(r"ps:0 \(pid (\d+)\)", "".join(seen))
                            self.assertIsNotNone(pid, "".join(seen))
                            if kill:
                                os.kill(int(pid.group(1)), signal.SIGKILL)
                            with open(go_on, "w") as release:  # worker 0 waits to read it
                                release.write("go\n")
                    launch.wait()
                finally:
                    timer.cancel()
                out = "".join(seen)
                self.assertEqual(launch.returncode, 0, out[-4000:])
                return out

            killed = run(kill=True)
            self.assertIn("task ps:0 exited with code 137; restarting it", killed)
            whole = run(kill=False)
            final = [line.split("] ", 1)[1] for line in killed.splitlines()
                     if line.startswith("[worker:") and "] w [" in line]
            self.assertEqual(len(final), 2, killed[-4000:])
            self.assertEqual(final, [line.split("] ", 1)[1] for line in whole.splitlines()
                                     if line.startswith("[worker:") and "] w [" in line])
            self.assertEqual(json.loads(killed.strip().splitlines()[-1])["steps"], STEPS * 10)

    def test_a_scripts_checkpoints_export_its_model_without_a_config(self):
        with tempfile.TemporaryDirectory(prefix="pstrain-launch-") as scratch:
            script = self.write_script(scratch, HALTING_SCRIPT)
            checkpoints = os.path.join(scratch, "ckpt")
            run = self.run_pslaunch("--ps=2", "--workers=2", f"--checkpoint_dir={checkpoints}",
                                    "--checkpoint_every_steps=4", "--", sys.executable, script,
                                    str(STEPS * 3), os.path.join(scratch, "unused"), "-1")
            self.assertEqual(run.returncode, 0, run.stderr[-4000:])
            final = [line.split("] w ", 1)[1] for line in run.stdout.splitlines()
                     if line.startswith("[worker:0] w ")]
            self.assertEqual(len(final), 1, run.stdout[-3000:])
            model = os.path.join(scratch, "model.npz")
            export = subprocess.run(
                [os.path.join(BIN_DIR, "psctl"), "export", f"--checkpoint={checkpoints}",
                 "--format=npz", f"--out={model}"],
                capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            self.assertEqual(export.returncode, 0, export.stderr[-3000:])
            with np.load(model) as saved:
                self.assertEqual(json.dumps(saved["w"].tolist()), final[0])

    def test_too_many_backups_are_a_mistake(self):
        run = self.run_pslaunch("--ps=1", "--ps_backups=9", "--", sys.executable, "-c", "pass")
        self.assertEqual(run.returncode, 2)
        self.assertIn("give 1 to 8 backups a shard", run.stderr)

    def test_a_word_before_the_marker_is_a_mistake(self):
        run = self.run_pslaunch("configs/local.textproto")
        self.assertEqual(run.returncode, 2)
        self.assertIn("a workers' command goes after --", run.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
