"""pstrain.torch.DistributedOptimizer as a torch.optim.Optimizer, against
real ps_server processes: every learning-rate scheduler of
torch.optim.lr_scheduler steps the rate the PS applies; AdamW (per-group
rates and weight decay) with clip_grad_norm_ gives torch's own AdamW and
clip_grad_norm_ on the same gradients; the state dict holds the param
groups; torch optimizers the PS cannot apply are refused by name."""

import os
import sys
import unittest

import numpy as np

try:
    import torch
    from torch import nn
    import pstrain
    import pstrain.torch
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)

from ps_cluster import PsCluster

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
STEPS = 12


def fixed_gradients(shape, steps, seed):
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.standard_normal(shape).astype(np.float32)) for _ in range(steps)]


def schedulers():
    """Each scheduler class of torch.optim.lr_scheduler, made on an optimizer."""
    S = torch.optim.lr_scheduler
    made = {
        "LambdaLR": lambda o: S.LambdaLR(o, lambda k: 1.0 / (k + 1)),
        "MultiplicativeLR": lambda o: S.MultiplicativeLR(o, lambda k: 0.9),
        "StepLR": lambda o: S.StepLR(o, 3, gamma=0.5),
        "MultiStepLR": lambda o: S.MultiStepLR(o, [2, 5], gamma=0.1),
        "ConstantLR": lambda o: S.ConstantLR(o, factor=0.5, total_iters=4),
        "LinearLR": lambda o: S.LinearLR(o, start_factor=0.25, total_iters=6),
        "ExponentialLR": lambda o: S.ExponentialLR(o, 0.8),
        "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, T_max=STEPS, eta_min=0.01),
        "CosineAnnealingWarmRestarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=4),
        "CyclicLR": lambda o: S.CyclicLR(o, 0.01, 0.2, step_size_up=3, cycle_momentum=False),
        "OneCycleLR": lambda o: S.OneCycleLR(o, max_lr=0.3, total_steps=STEPS,
                                             cycle_momentum=False),
        "SequentialLR": lambda o: S.SequentialLR(
            o, [S.LinearLR(o, start_factor=0.1, total_iters=3), S.ExponentialLR(o, 0.9)],
            milestones=[3]),
        "ChainedScheduler": lambda o: S.ChainedScheduler(
            [S.ExponentialLR(o, 0.9), S.StepLR(o, 4, gamma=0.5)]),
        "ReduceLROnPlateau": lambda o: S.ReduceLROnPlateau(o, patience=1, factor=0.5),
    }
    if hasattr(S, "PolynomialLR"):
        made["PolynomialLR"] = lambda o: S.PolynomialLR(o, total_iters=STEPS, power=2.0)
    return made


class SchedulerTest(unittest.TestCase):
    def test_every_scheduler_steps_the_rate_the_ps_applies(self):
        grads = fixed_gradients((3,), STEPS, seed=1)
        for name, make in schedulers().items():
            with self.subTest(scheduler=name), \
                    PsCluster(BIN_DIR, workers=1, mode="ASYNC",
                              optimizer="sgd { learning_rate: 1 }") as cluster:
                reference = nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
                ref_opt = torch.optim.SGD([reference], lr=0.1)
                ref_sched = make(ref_opt)

                model = nn.Linear(3, 1, bias=False)
                with torch.no_grad():
                    model.weight.copy_(reference.detach().view(1, 3))
                opt = pstrain.torch.DistributedOptimizer(
                    torch.optim.SGD(model.parameters(), lr=0.1), model,
                    pstrain.Client(cluster.config_path, "worker:0"))
                self.assertIsInstance(opt, torch.optim.Optimizer)
                sched = make(opt)
                for k, g in enumerate(grads):
                    reference.grad = g.clone()
                    ref_opt.step()
                    opt.zero_grad()
                    model.weight.grad.copy_(g.view(1, 3))
                    opt.step()
                    metric = float(10 - k % 3)  # for ReduceLROnPlateau: a plateau now and then
                    for s in (ref_sched, sched):
                        s.step(metric) if name == "ReduceLROnPlateau" else s.step()
                    np.testing.assert_allclose(model.weight.detach().view(3).numpy(),
                                               reference.detach().numpy(), rtol=1e-6, atol=1e-7,
                                               err_msg=f"{name}, step {k}")
                opt.finish()


class AdamWTest(unittest.TestCase):
    def test_adamw_with_groups_warmup_cosine_and_clipping_is_torchs(self):
        # Shared memory, and the socket (where the push is rebuilt from its stream).
        for cluster in ("", "shm: SHM_OFF"):
            with self.subTest(cluster=cluster or "shm"):
                self.check_adamw(cluster)

    def check_adamw(self, cluster_fields):
        grads = [fixed_gradients((4, 3), 20, seed=2), fixed_gradients((4,), 20, seed=3)]

        def groups(weight, bias):
            return [{"params": [weight]}, {"params": [bias], "weight_decay": 0.0, "lr": 0.05}]

        def warmup_cosine(optimizer):
            return torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda k: (k + 1) / 5 if k < 5 else 0.5 * (1 + np.cos(np.pi * k / 20)))

        with PsCluster(BIN_DIR, workers=1, mode="ASYNC", cluster=cluster_fields,
                       optimizer="sgd { learning_rate: 1 }") as cluster:
            torch.manual_seed(0)
            reference = nn.Linear(3, 4)
            model = nn.Linear(3, 4)
            model.load_state_dict(reference.state_dict())
            ref_opt = torch.optim.AdamW(groups(reference.weight, reference.bias), lr=0.02,
                                        weight_decay=0.1)
            ref_sched = warmup_cosine(ref_opt)
            torch_opt = torch.optim.AdamW(groups(model.weight, model.bias), lr=0.02,
                                          weight_decay=0.1)
            sched = warmup_cosine(torch_opt)  # on the torch optimizer, before wrapping
            opt = pstrain.torch.DistributedOptimizer(
                torch_opt, model, pstrain.Client(cluster.config_path, "worker:0"))
            for k in range(20):
                gw, gb = grads[0][k] * (1 + k % 4), grads[1][k]  # some steps past the bound
                reference.weight.grad, reference.bias.grad = gw.clone(), gb.clone()
                norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.5)
                ref_opt.step()
                ref_sched.step()
                opt.zero_grad()
                model.weight.grad.copy_(gw)
                model.bias.grad.copy_(gb)
                self.assertAlmostEqual(float(opt.clip_grad_norm_(1.5)), float(norm), places=4)
                opt.step()
                sched.step()
                for mine, theirs in ((model.weight, reference.weight), (model.bias, reference.bias)):
                    np.testing.assert_allclose(mine.detach().numpy(), theirs.detach().numpy(),
                                               rtol=1e-5, atol=1e-6, err_msg=f"step {k}")
            opt.finish()


class StateDictTest(unittest.TestCase):
    def test_the_state_dict_holds_the_groups_and_loads_into_them(self):
        with PsCluster(BIN_DIR, workers=1, mode="ASYNC",
                       optimizer="sgd { learning_rate: 1 }") as cluster:
            model = nn.Linear(2, 1)
            inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            opt = pstrain.torch.DistributedOptimizer(
                inner, model, pstrain.Client(cluster.config_path, "worker:0"))
            sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
            for _ in range(2):
                opt.zero_grad()
                model(torch.ones(1, 2)).sum().backward()
                opt.step()
                sched.step()
            saved = opt.state_dict()
            self.assertAlmostEqual(saved["param_groups"][0]["lr"], 0.025)
            opt.param_groups[0]["lr"] = 7.0
            opt.load_state_dict(saved)
            # In place: the wrapped optimizer and the scheduler see it.
            self.assertAlmostEqual(inner.param_groups[0]["lr"], 0.025)
            self.assertIs(opt.param_groups[0], inner.param_groups[0])
            opt.finish()

    def test_optimizers_the_ps_cannot_apply_are_refused_by_name(self):
        with PsCluster(BIN_DIR, workers=1, mode="ASYNC",
                       optimizer="sgd { learning_rate: 1 }") as cluster:
            model = nn.Linear(2, 1)
            client = pstrain.Client(cluster.config_path, "worker:0")
            for bad, what in ((torch.optim.RMSprop(model.parameters()), "RMSprop"),
                              (torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.1),
                               "weight_decay"),
                              (torch.optim.Adam(model.parameters(), amsgrad=True), "amsgrad")):
                with self.assertRaisesRegex(ValueError, what):
                    pstrain.torch.DistributedOptimizer(bad, model, client)


if __name__ == "__main__":
    unittest.main(verbosity=2)
