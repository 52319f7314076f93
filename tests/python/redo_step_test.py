"""A step that a transient error interrupted is redone, not dropped: the
parameter server is stopped (writing its final checkpoint) before a step
and started again once the step's session says it is reconnecting; the
session under the client rejoins and pushes the step's gradient again, so
every step's gradient lands. Over TCP and through shared memory (whose
region the restarted shard no longer holds). The session's own tests
(tests/worker/session/training_session_test.cc) cover each class of
refusal and the budget. Skipped when torch is not installed."""

import os
import sys
import threading
import unittest

try:
    import torch
except ImportError:
    print("redo_step_test: skipped: torch is not installed (python3-torch; scripts/install_deps.sh)")
    sys.exit(77)  # ctest: skipped (SKIP_RETURN_CODE)

import pstrain
import pstrain.torch
from ps_cluster import PsCluster

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
STEPS_BEFORE, STEPS_AFTER = 3, 2


class LogLines:
    """This process's standard output (where the C++ session logs) through a
    pipe while open: a thread reads it line by line, passes it on, and
    signals the first line that holds what a waiter looks for."""

    def __init__(self, text):
        self.text = text
        self.seen = threading.Event()

    def __enter__(self):
        sys.stdout.flush()
        self.saved = os.dup(1)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 1)
        os.close(write_end)
        self.reader = threading.Thread(target=self._read, args=(read_end,))
        self.reader.start()
        return self

    def _read(self, read_end):
        with os.fdopen(read_end) as lines:
            for line in lines:
                os.write(self.saved, line.encode())
                if self.text in line:
                    self.seen.set()

    def __exit__(self, *exc):
        os.dup2(self.saved, 1)  # the pipe's last writer closes: the reader ends
        self.reader.join()
        os.close(self.saved)


class RedoStepTest(unittest.TestCase):
    def run_with_a_restart(self, shm):
        # w starts at 0; the loss w.sum() has gradient 1 on every step, and
        # plain SGD at rate 1 subtracts it: w = -steps when none is lost.
        model = torch.nn.Linear(4, 1, bias=False)
        with torch.no_grad():
            model.weight.zero_()
        with PsCluster(BIN_DIR, workers=1, mode="ASYNC", optimizer="sgd { learning_rate: 1.0 }",
                       cluster=f"shm: {shm}", checkpoints=True) as cluster:
            client = pstrain.Client(cluster.config_path, "worker:0")
            opt = pstrain.torch.DistributedOptimizer(model, client)

            def compute():
                opt.zero_grad()
                loss = model.weight.sum()
                loss.backward()
                return loss

            for _ in range(STEPS_BEFORE):
                compute()
                opt.step()
            self.assertEqual(client.versions, [STEPS_BEFORE])
            self.assertEqual(cluster.stop_shard(), 0)

            # The shard comes back once the step, having failed, is rejoining.
            with LogLines("reconnecting") as log:
                restarter = threading.Thread(
                    target=lambda: log.seen.wait(60) and cluster.start_shard())
                restarter.start()
                try:
                    compute()
                    opt.step()
                finally:
                    restarter.join()
            self.assertEqual(opt.redone_steps, 1)
            for _ in range(STEPS_AFTER):
                compute()
                opt.step()
            steps = STEPS_BEFORE + 1 + STEPS_AFTER
            torch.testing.assert_close(model.weight.detach(), torch.full((1, 4), -float(steps)),
                                       rtol=0, atol=0)
            self.assertEqual(client.versions, [steps])
            self.assertEqual(client.shares_memory(0), shm == "SHM_AUTO")
            opt.finish()

    def test_a_step_is_pushed_again_once_its_shard_is_back(self):
        for shm in ("SHM_OFF", "SHM_AUTO"):
            with self.subTest(shm=shm):
                self.run_with_a_restart(shm)


if __name__ == "__main__":
    unittest.main(verbosity=2)
