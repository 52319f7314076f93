"""pstrain.torch against a real ps_server: DistributedOptimizer trains a
model's parameters where the client exchanges them (no copies on the CPU),
with the PS optimizer; HostStaging's copies for models on a GPU, checked
with CPU tensors (no GPU needed). Skipped when torch is not installed."""

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


if __name__ == "__main__":
    unittest.main(verbosity=2)
