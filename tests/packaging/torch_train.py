"""A PyTorch worker script for an installed pstrain: a linear model fitted to
planted weights through pstrain.torch.DistributedOptimizer (the PS's
optimizer), printing where the module came from and the loss of the first
and the last step.
Run as pslaunch --ps=1 --workers=2 --learning_rate=0.1 -- python3 torch_train.py."""

import torch
import torch.nn.functional as F

import pstrain
import pstrain.torch

torch.manual_seed(0)
x = torch.randn(256, 4)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
model = torch.nn.Linear(4, 1)
opt = pstrain.torch.DistributedOptimizer(model)
losses = []
for _ in range(40):
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
opt.finish()
print(f"module {pstrain.__file__} loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
