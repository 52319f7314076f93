"""pstrain.torch against a real ps_server: DistributedOptimizer trains a
model's parameters where the client exchanges them (no copies on the CPU),
with the PS optimizer, and refuses what it cannot train faithfully (a
parameter not float32, a parameter whose data was replaced, a step after
finish()); HostStaging's copies for models on a GPU, checked with CPU
tensors (no GPU needed). Skipped when torch is not installed."""

import json
import os
import sys
import unittest

try:
    import torch
except ImportError:
    print("torch_test: skipped: torch is not installed (python3-torch; scripts/install_deps.sh)")
    sys.exit(77)  # ctest: skipped (SKIP_RETURN_CODE)

import numpy as np

import pstrain
import pstrain.torch
from pstrain.staging import HostStaging
from ps_cluster import PsCluster

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]


class DistributedOptimizerTest(unittest.TestCase):
    def test_a_step_applies_the_ps_optimizer_to_the_model_in_place(self):
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        initial = {n: p.detach().clone() for n, p in model.named_parameters()}
        with PsCluster(BIN_DIR, workers=1, shards=2,
                       optimizer="sgd { learning_rate: 0.25 }") as cluster:
            client = pstrain.Client(cluster.config_path, "worker:0")
            opt = pstrain.torch.DistributedOptimizer(model, client)
            self.assertEqual(client.names, [n for n, _ in model.named_parameters()])
            self.assertEqual(opt.resume_step, 0)
            for name, p in model.named_parameters():
                torch.testing.assert_close(p.detach(), initial[name], rtol=0, atol=0)
                # The parameter and its gradient are the client's arrays.
                self.assertEqual(p.data_ptr(), client.values[name].ctypes.data)
                self.assertEqual(p.grad.data_ptr(), client.gradients[name].ctypes.data)

            x = torch.randn(8, 6)
            y = torch.randint(0, 2, (8,))
            for _ in range(2):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                grads = {n: p.grad.clone() for n, p in model.named_parameters()}
                before = {n: p.detach().clone() for n, p in model.named_parameters()}
                opt.step()
                for name, p in model.named_parameters():
                    torch.testing.assert_close(p.detach(), before[name] - 0.25 * grads[name])
            self.assertEqual(client.versions, [2, 2])
            self.assertEqual(opt.finish(), [])
            result = client.report(test_accuracy=0.5, samples=16)
            self.assertEqual(result["steps"], 2)
            self.assertEqual(result["final_version"], 2)
            self.assertTrue(result["has_test_accuracy"])

    def test_the_final_loss_is_the_mean_of_the_losses_the_steps_saw(self):
        model = torch.nn.Linear(3, 1)
        with PsCluster(BIN_DIR, workers=1, optimizer="sgd { learning_rate: 0.1 }") as cluster:
            opt = pstrain.torch.DistributedOptimizer(model, pstrain.Client(cluster.config_path))
            self.assertIsNone(opt.final_loss)
            seen = []
            for i in range(3):
                opt.zero_grad()
                loss = model(torch.full((4, 3), float(i))).pow(2).mean()
                loss.backward()  # noted by the optimizer: no report() in the script
                seen.append(loss.item())
                opt.step()

            def closure():
                opt.zero_grad()
                loss = model(torch.ones(4, 3)).pow(2).mean()
                loss.backward()
                return loss

            seen.append(opt.step(closure).item())
            self.assertAlmostEqual(opt.final_loss, sum(seen) / len(seen), places=6)
            # A backward without a step (an evaluation's) is not a step's loss.
            model(torch.ones(1, 3)).sum().backward()
            opt.finish()
            self.assertAlmostEqual(opt.final_loss, sum(seen) / len(seen), places=6)

    def test_a_gradient_autograd_made_anew_is_pushed_too(self):
        model = torch.nn.Linear(3, 1)
        with PsCluster(BIN_DIR, workers=1, optimizer="sgd { learning_rate: 1.0 }") as cluster:
            opt = pstrain.torch.DistributedOptimizer(model,
                                                     pstrain.Client(cluster.config_path))
            before = model.bias.detach().clone()
            for p in model.parameters():
                p.grad = None  # as torch.optim's zero_grad(set_to_none=True) leaves them
            model(torch.ones(1, 3)).sum().backward()
            opt.step()
            torch.testing.assert_close(model.bias.detach(), before - 1.0)
            opt.finish()


class RefusalTest(unittest.TestCase):
    def setUp(self):
        self.cluster = PsCluster(BIN_DIR, workers=1, mode="ASYNC",
                                 optimizer="sgd { learning_rate: 1.0 }")

    def tearDown(self):
        self.cluster.stop()

    def client(self):
        return pstrain.Client(self.cluster.config_path, "worker:0")

    def test_a_parameter_that_is_not_float32_is_refused(self):
        for dtype in (torch.float64, torch.float16):
            with self.subTest(dtype=dtype):
                model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
                model[1].to(dtype)
                client = self.client()
                with self.assertRaises(ValueError) as raised:
                    pstrain.torch.DistributedOptimizer(model, client)
                message = str(raised.exception)
                self.assertIn("1.weight", message)
                self.assertIn(str(dtype), message)
                self.assertIn("model.float()", message)
                # Refused before anything was declared or changed.
                self.assertFalse(client.declared)
                self.assertEqual(model[1].weight.dtype, dtype)

    def test_a_parameter_whose_data_was_replaced_is_refused_at_the_next_step(self):
        model = torch.nn.Linear(3, 1)
        opt = pstrain.torch.DistributedOptimizer(model, self.client())
        versions = opt.client.versions
        with torch.no_grad():
            model.weight.data = torch.zeros(1, 3)  # no longer the pulled values
        model(torch.ones(1, 3)).sum().backward()
        with self.assertRaises(RuntimeError) as raised:
            opt.step()
        self.assertIn("weight", str(raised.exception))
        self.assertIn(".data", str(raised.exception))
        self.assertEqual(opt.client.versions, versions)  # nothing was pushed
        # In place, the values stay where the exchange writes them.
        with torch.no_grad():
            model.weight.data = torch.from_numpy(opt.client.values["weight"])
            model.weight.zero_()
        opt.step()

    def test_a_step_after_finish_is_refused(self):
        model = torch.nn.Linear(3, 1)
        client = self.client()
        opt = pstrain.torch.DistributedOptimizer(model, client)
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        self.assertEqual(opt.finish(), [])
        final = model.weight.detach().clone()
        opt.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        with self.assertRaises(pstrain.FailedPreconditionError) as raised:
            opt.step()
        self.assertIn("after finish()", str(raised.exception))
        # The client, driven by hand, refuses too.
        with self.assertRaises(pstrain.FailedPreconditionError) as raised:
            client.push_pull(client.gradients)
        self.assertIn("after done()", str(raised.exception))
        torch.testing.assert_close(model.weight.detach(), final, rtol=0, atol=0)


class HostStagingTest(unittest.TestCase):
    def test_copies_gradients_out_and_values_in(self):
        host_values = [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)]
        host_gradients = [np.full((2, 3), 7, np.float32), np.full(4, 7, np.float32)]
        staging = HostStaging(host_values, host_gradients, pin=False)
        self.assertFalse(staging.pinned)
        device_grads = [torch.arange(6, dtype=torch.float32).reshape(2, 3), None]
        staging.gradients_to_host(device_grads)
        np.testing.assert_array_equal(host_gradients[0], np.arange(6).reshape(2, 3))
        np.testing.assert_array_equal(host_gradients[1], np.zeros(4))  # no gradient: zeros
        host_values[0][:] = 5
        host_values[1][:] = np.arange(4)
        device_values = [torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(4))]
        staging.values_to_device(device_values)
        torch.testing.assert_close(device_values[0].detach(), torch.full((2, 3), 5.0))
        torch.testing.assert_close(device_values[1].detach(), torch.arange(4, dtype=torch.float32))

    @unittest.skipUnless(torch.cuda.is_available(), "no CUDA device visible to torch")
    def test_cuda_tensors_go_through_page_locked_buffers(self):
        host_values = [np.zeros((256, 128), np.float32)]
        host_gradients = [np.full((256, 128), 7, np.float32)]
        staging = HostStaging(host_values, host_gradients)
        self.assertTrue(staging.pinned)
        staging.gradients_to_host(
            [torch.arange(256 * 128, dtype=torch.float32, device="cuda").reshape(256, 128)])
        np.testing.assert_array_equal(host_gradients[0], np.arange(256 * 128).reshape(256, 128))
        host_values[0][:] = 5
        device_values = [torch.nn.Parameter(torch.zeros(256, 128, device="cuda"))]
        staging.values_to_device(device_values)
        torch.cuda.synchronize()
        self.assertTrue(bool((device_values[0] == 5).all()))
        staging.close()


class SamplerTest(unittest.TestCase):
    """Each worker's DistributedSampler gives it its own part of every
    epoch: disjoint parts that cover the data set, from the client, from
    pslaunch's (torchrun's) RANK and WORLD_SIZE, or from TF_CONFIG."""

    def test_the_workers_parts_are_disjoint_and_cover_the_data(self):
        data = list(range(103))

        class Client:
            def __init__(self, worker):
                self.worker, self.num_workers = worker, 2

        for epoch in (0, 1):
            parts = []
            for worker in (0, 1):
                sampler = pstrain.torch.DistributedSampler(data, Client(worker), seed=4)
                sampler.set_epoch(epoch)
                parts.append(list(sampler))
            self.assertEqual(len(parts[0]), len(parts[1]))
            self.assertEqual(set(parts[0]) | set(parts[1]), set(data))
            # Padded to equal parts: only the padding repeats.
            self.assertLessEqual(len(set(parts[0]) & set(parts[1])), 1)
        saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "TF_CONFIG")}
        try:
            os.environ.update(RANK="1", WORLD_SIZE="2")
            sampler = pstrain.torch.DistributedSampler(data, seed=4)
            self.assertEqual((sampler.rank, sampler.num_replicas), (1, 2))
            del os.environ["RANK"]
            with self.assertRaisesRegex(ValueError, "RANK and WORLD_SIZE"):
                pstrain.torch.DistributedSampler(data)
            # TF_CONFIG's worker:0 after a chief is worker 1 of 3.
            os.environ["TF_CONFIG"] = json.dumps(
                {"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"]},
                 "task": {"type": "worker", "index": 0}})
            sampler = pstrain.torch.DistributedSampler(data, seed=4)
            self.assertEqual((sampler.rank, sampler.num_replicas), (1, 3))
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


if __name__ == "__main__":
    unittest.main(verbosity=2)
