"""DistributedOptimizer redoes a step that a transient error interrupted,
instead of dropping its gradient: its parameter server is stopped (writing
its final checkpoint) before a step and started again while the step waits
for it; the step is pushed once the shard is back, so every step's
gradient lands. Over TCP and through shared memory (whose region the
restarted shard no longer holds). A shard that refuses for now (busy) is
pushed to again, with backoff, until the step lands or the budget is
spent. Skipped when torch is not installed."""

import os
import sys
import threading
import time
import unittest

try:
    import torch
except ImportError:
    print("redo_step_test: skipped: torch is not installed (python3-torch; scripts/install_deps.sh)")
    sys.exit(77)  # ctest: skipped (SKIP_RETURN_CODE)

import numpy as np

import pstrain
import pstrain.torch
from ps_cluster import PsCluster

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
STEPS_BEFORE, STEPS_AFTER = 3, 2


class RedoStepTest(unittest.TestCase):
    def run_with_a_restart(self, shm, closure):
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

            # The shard comes back once the step, having failed, rejoins.
            rejoining = threading.Event()
            register = client.register

            def observed_register(*args):
                rejoining.set()
                return register(*args)

            client.register = observed_register
            restarter = threading.Thread(
                target=lambda: rejoining.wait(60) and cluster.start_shard())
            restarter.start()
            try:
                compute()
                loss = opt.step(compute) if closure else opt.step()
            finally:
                restarter.join()
            self.assertTrue(rejoining.is_set())
            if closure:
                self.assertEqual(float(loss), -4.0 * STEPS_BEFORE)  # computed again on w = -3
            for _ in range(STEPS_AFTER):
                compute()
                opt.step()
            steps = STEPS_BEFORE + 1 + STEPS_AFTER
            torch.testing.assert_close(model.weight.detach(), torch.full((1, 4), -float(steps)),
                                       rtol=0, atol=0)
            self.assertEqual(client.versions, [steps])
            self.assertEqual(opt.redone_steps, 1)
            self.assertEqual(client.shares_memory(0), shm == "SHM_AUTO")
            opt.finish()

    def test_a_step_is_pushed_again_once_its_shard_is_back(self):
        for shm in ("SHM_OFF", "SHM_AUTO"):
            with self.subTest(shm=shm):
                self.run_with_a_restart(shm, closure=False)

    def test_a_closure_computes_the_redone_step_on_the_values_the_shard_holds(self):
        self.run_with_a_restart("SHM_AUTO", closure=True)


class RefusingClient:
    """A client whose exchanges are refused (RESOURCE_EXHAUSTED, a shard
    busy) the first `refusals` times; it applies SGD at rate 1 itself."""

    def __init__(self, refusals, patience):
        self.refusals, self.exchanges, self.registrations = refusals, 0, 0
        self.config = {"training": {"pull_timeout_seconds": patience}}
        self.task, self.versions, self.is_chief = "worker:0", [0], True

    def register(self, deadline=None):
        self.registrations += 1
        return {"worker_clock": 0, "initialized": True, "version": self.versions[0]}

    def declare(self, shapes):
        self.values = {n: np.zeros(shape, np.float32) for n, shape in shapes.items()}
        self.gradients = {n: np.zeros(shape, np.float32) for n, shape in shapes.items()}

    def init(self, values, rows=None):
        pass

    def pull(self):
        pass

    def push_pull(self, gradients):
        self.exchanges += 1
        if self.refusals > 0:
            self.refusals -= 1
            raise pstrain.errors.from_status("RESOURCE_EXHAUSTED", "ps:0: busy; try again", True)
        for n in self.values:
            self.values[n] -= gradients[n]
        self.versions = [self.versions[0] + 1]


class RefusalTest(unittest.TestCase):
    def optimizer(self, client):
        model = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.zero_()
        return model, pstrain.torch.DistributedOptimizer(model, client)

    def test_a_refused_step_is_pushed_again_until_it_lands(self):
        client = RefusingClient(refusals=3, patience=60)
        model, opt = self.optimizer(client)
        model.weight.sum().backward()
        opt.step()
        self.assertEqual(client.exchanges, 4)
        self.assertEqual(opt.redone_steps, 3)
        torch.testing.assert_close(model.weight.detach(), torch.full((1, 2), -1.0))

    def test_refusals_past_the_budget_are_raised_as_unavailable(self):
        client = RefusingClient(refusals=10**9, patience=0.5)
        model, opt = self.optimizer(client)
        model.weight.sum().backward()
        start = time.monotonic()
        with self.assertRaises(pstrain.UnavailableError) as raised:
            opt.step()
        self.assertLess(time.monotonic() - start, 10)
        self.assertIn("gave up redoing a step", str(raised.exception))
        self.assertIn("busy", str(raised.exception))
        self.assertTrue(raised.exception.transient)  # a launcher restarts the worker
        self.assertGreater(client.exchanges, 2)  # backed off, not spun
        self.assertLess(client.exchanges, 20)


if __name__ == "__main__":
    unittest.main(verbosity=2)
