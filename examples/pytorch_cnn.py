"""A two-convolution CNN on Fashion-MNIST, trained by pstrain's parameter
servers: one worker task of a job that pslaunch starts with
examples/pytorch_cnn.textproto (cluster.worker_command runs this script for
every worker):

    build/bin/pslaunch --config=examples/pytorch_cnn.textproto

The job config gives the mode, the PS optimizer, batch_size, epochs and seed
(pslaunch's --mode, --epochs, --batch_size, ... override them), and may name
the data (training.dataset.fashion_mnist: dir, train_limit). Each worker
trains on its own share of every epoch's shuffled examples; the chief
(worker:0) evaluates the model on the 10,000 test images after every epoch
and at the end, and reports it, which pslaunch's summary line shows. The IDX files are read with NumPy
(no torchvision): Debian's dataset-fashion-mnist package installs them.
"""

import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import pstrain
import pstrain.torch

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (gzip or not) as a NumPy array of its shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    values = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims)
    if values.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {values.size} values for the shape {shape}")
    return values.reshape(shape)


def load(data_dir, split, limit=0):
    """Images as float32 [N, 1, 28, 28] in [0, 1] and labels as int64 [N]."""
    prefix = "train" if split == "train" else "t10k"

    def find(name):
        for candidate in (name + ".gz", name):
            path = os.path.join(data_dir, candidate)
            if os.path.exists(path):
                return path
        raise FileNotFoundError(
            f"{os.path.join(data_dir, name)}(.gz) not found; install dataset-fashion-mnist or "
            "set training.dataset.fashion_mnist.dir")

    images = read_idx(find(f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find(f"{prefix}-labels-idx1-ubyte"))
    if limit > 0:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return x, torch.from_numpy(labels.astype(np.int64))


class Cnn(torch.nn.Module):
    """conv 3x3 (32) - pool - conv 3x3 (64) - pool - dense 128 - dense 10."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3)
        self.conv2 = torch.nn.Conv2d(32, 64, 3)
        self.fc1 = torch.nn.Linear(64 * 5 * 5, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def evaluate(model, x, y, batch=1000):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(x), batch):
            out = model(x[start:start + batch])
            loss += F.cross_entropy(out, y[start:start + batch], reduction="sum").item()
            correct += (out.argmax(1) == y[start:start + batch]).sum().item()
    model.train()
    return loss / len(x), correct / len(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per worker (default 1: one core each)")
    parser.add_argument("--log_every", type=int, default=100, help="progress line every N steps")
    parser.add_argument("--eval_every_epoch", type=int, default=1,
                        help="the chief evaluates the model after every epoch (1) or at the end "
                             "only (0); the other workers wait for it meanwhile in SYNC")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    client = pstrain.Client()  # PSTRAIN_CONFIG and PSTRAIN_TASK, as pslaunch sets them
    training = client.config["training"]
    batch, epochs = training["batch_size"], training["epochs"]
    seed = int(training["seed"])
    data = training.get("dataset", {}).get("fashion_mnist", {})
    data_dir = data.get("dir") or DEFAULT_DATA_DIR
    train_x, train_y = load(data_dir, "train", int(data.get("train_limit", 0)))
    test_x, test_y = load(data_dir, "test") if client.is_chief else (None, None)
    workers, rank = client.num_workers, client.worker
    steps_per_epoch = len(train_x) // workers // batch
    if steps_per_epoch == 0:
        raise ValueError(f"{len(train_x)} training images are fewer than workers x batch_size")

    torch.manual_seed(seed)  # every worker offers the same initial values
    model = Cnn()
    opt = pstrain.torch.DistributedOptimizer(model, client)
    print(f"{client.task}: {client.mode} with {workers} worker(s), {client.num_shards} shard(s), "
          f"{sum(p.numel() for p in model.parameters())} parameters, shared memory "
          f"{'on' if client.shares_memory(0) else 'off'}, {steps_per_epoch} steps per epoch",
          flush=True)

    samples, loss_sum, window_start, seen, final_loss = 0, 0.0, time.monotonic(), 0, 0.0
    start = time.monotonic()
    step = opt.resume_step  # where a restarted worker resumes
    for epoch in range(step // steps_per_epoch, epochs):
        # The same permutation on every worker; each takes its own share.
        order = torch.from_numpy(np.random.default_rng(seed + epoch).permutation(len(train_x)))
        share = order[rank * steps_per_epoch * batch:(rank + 1) * steps_per_epoch * batch]
        for s in range(step - epoch * steps_per_epoch, steps_per_epoch):
            idx = share[s * batch:(s + 1) * batch]
            x, y = train_x[idx], train_y[idx]
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            step, samples, seen = step + 1, samples + batch, seen + 1
            loss_sum += loss.item()
            if step % args.log_every == 0 or s + 1 == steps_per_epoch:
                # The metrics, TensorBoard scalars and curve point of the window.
                client.record_window(loss_sum / seen, seen * batch, step=step)
                now = time.monotonic()
                print(f"{client.task}: epoch {epoch + 1}/{epochs} step {step} "
                      f"loss {loss_sum / seen:.4f} {seen * batch / (now - window_start):.0f} "
                      "samples/s", flush=True)
                final_loss, loss_sum, seen, window_start = loss_sum / seen, 0.0, 0, now
        if client.is_chief and args.eval_every_epoch and epoch + 1 < epochs:
            test_loss, accuracy = evaluate(model, test_x, test_y)
            client.record_evaluation(test_loss, accuracy, epochs_done=epoch + 1, step=step)
            print(f"{client.task}: epoch {epoch + 1}/{epochs} done: test_accuracy {accuracy:.4f} "
                  f"test_loss {test_loss:.4f} ({time.monotonic() - start:.1f} s)", flush=True)
    train_seconds = time.monotonic() - start
    missing = opt.finish()
    result = {"samples": samples, "train_seconds": train_seconds, "final_loss": final_loss,
              "devices": opt.devices, "epochs": epochs}
    if client.is_chief:
        test_loss, accuracy = evaluate(model, test_x, test_y)
        print(f"final: version {client.versions[0]} test_accuracy {accuracy:.4f} "
              f"test_loss {test_loss:.4f} ({time.monotonic() - start:.1f} s)", flush=True)
        client.record_evaluation(test_loss, accuracy, epochs_done=epochs, step=step)
        result.update(test_accuracy=accuracy, test_loss=test_loss, missing_workers=missing)
    client.report(**result)


if __name__ == "__main__":
    try:
        main()
    except pstrain.Error as error:
        # As the worker binary: one line, 2 where a restart would fail alike.
        print(f"pytorch_cnn.py: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    except (FileNotFoundError, ValueError) as error:
        print(f"pytorch_cnn.py: error: {error}", file=sys.stderr)
        sys.exit(2)
