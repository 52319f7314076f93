"""A small recommender, as a PyTorch user writes it: a user embedding
(nn.Embedding, sparse gradients) and an MLP over it and the item's
features, a DataLoader, AdamW for the dense part and Adagrad for the
embedding, a learning rate that warms up and then decays on a cosine, and
gradient clipping. It saves the trained state dict and prints the test
AUC. examples/recommender.py trains in one process; the same script with
three lines changed (docs/python.md shows them),
examples/recommender_pstrain.py, trains on a pstrain job::

    python3 examples/recommender.py --out=model.pt
    pslaunch --ps=1 --workers=2 -- python3 examples/recommender_pstrain.py --out=model.pt
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

USERS, DIM, FEATURES = 1000, 16, 8


def make_data(examples, seed):
    """Clicks of (user, item features) pairs: each user's own leaning, and
    a taste for some features every user shares."""
    hidden = torch.Generator().manual_seed(7)
    leaning, taste = 2 * torch.randn(USERS, generator=hidden), torch.randn(FEATURES, generator=hidden)
    g = torch.Generator().manual_seed(seed)
    users = torch.randint(0, USERS, (examples,), generator=g)
    items = torch.randn(examples, FEATURES, generator=g)
    logits = leaning[users] + items @ taste + 0.5 * torch.randn(examples, generator=g)
    return torch.utils.data.TensorDataset(users, items, (logits > 0).float())


class Recommender(nn.Module):
    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(USERS, DIM, sparse=True)
        self.mlp = nn.Sequential(nn.Linear(DIM + FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, users, items):
        return self.mlp(torch.cat([self.user(users), items], 1)).squeeze(1)


def auc(scores, labels):
    """The probability that a click scores above a non-click."""
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores).scatter_(0, order, torch.arange(1, len(scores) + 1.0))
    positives = labels.sum()
    return float((ranks[labels > 0].sum() - positives * (positives + 1) / 2) /
                 (positives * (len(labels) - positives)))


def evaluate(model, data):
    users, items, labels = data.tensors
    with torch.no_grad():
        return auc(model(users, items), labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--out", default="recommender.pt")
    args = parser.parse_args()

    torch.manual_seed(0)
    train, test = make_data(8192, seed=1), make_data(2048, seed=2)
    model = Recommender()
    loader = torch.utils.data.DataLoader(train, batch_size=args.batch_size, shuffle=True)
    opt = torch.optim.AdamW(model.mlp.parameters(), lr=3e-3, weight_decay=0.01)
    sparse_opt = torch.optim.Adagrad(model.user.parameters(), lr=0.05)
    steps = args.epochs * len(loader)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: (k + 1) / warmup if k < warmup else
                                              0.5 * (1 + math.cos(math.pi * (k - warmup) /
                                                                  (steps - warmup))))
    for epoch in range(args.epochs):
        for users, items, clicks in loader:
            opt.zero_grad()
            sparse_opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(users, items), clicks)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sparse_opt.step()
            sched.step()
    saved = f"{args.out}.{os.getpid()}"  # then renamed: a reader never sees half a file
    torch.save(model.state_dict(), saved)
    os.replace(saved, args.out)
    print(json.dumps({"test_auc": round(evaluate(model, test), 6), "final_loss": float(loss)}))


if __name__ == "__main__":
    main()
