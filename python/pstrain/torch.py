"""PyTorch on pstrain: the optimizer runs on the parameter servers.

``DistributedOptimizer(model)`` makes the model's parameters PS variables
(named as ``model.named_parameters()`` names them), offers the model's
values as their initial values (the first worker to arrive wins) and pulls
them into the model. Each ``step()`` pushes the gradients and loads the
values the PS optimizer (the config's ``training.optimizer``) computed, as
the job's mode says: SYNC averages every worker's gradient per step, ASYNC
applies each on arrival, SSP bounds the staleness. A loop changes by three
lines::

    import pstrain.torch                                       # 1
    opt = pstrain.torch.DistributedOptimizer(model)            # 2 (was torch.optim.SGD(...))
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    opt.finish()                                               # 3

On the CPU the parameters and their gradients become views of the client's
own arrays (in the shard's shared region when it is co-located): backward
accumulates into the memory the push reads, and the exchange writes the new
values where the forward pass reads them; nothing is copied on this side.
A model on a GPU exchanges through page-locked host buffers
(``pstrain.staging``).

``nn.Embedding(sparse=True)`` and ``nn.EmbeddingBag(sparse=True)`` modules
become embedding tables of the PS (``pstrain.sparse``): each forward pass
pulls only the rows its batch looks up, and ``step()`` pushes their sparse
gradient with the dense ones. A model may be such tables alone.

The PS holds float32: a parameter of another dtype is refused (make the
model float32 first). The parameters stay bound to the client's arrays: a
parameter whose ``.data`` is replaced afterwards is refused at the next
``step()`` (change values in place instead).
"""

import os
import random
import sys
import time

import torch

import pstrain
from pstrain.sparse import EmbeddingTables
from pstrain.staging import HostStaging

__all__ = ["DistributedOptimizer", "DistributedSampler"]


class DistributedSampler(torch.utils.data.distributed.DistributedSampler):
    """``torch.utils.data.distributed.DistributedSampler`` for the workers of
    a pstrain job: each worker gets its own part of every epoch, the parts
    disjoint and together the whole data set (padded to equal parts unless
    ``drop_last``), with no process group. The worker and the number of
    workers come from ``client`` (a ``pstrain.Client``), else from the
    environment pslaunch (and torchrun) sets: ``RANK`` and ``WORLD_SIZE``.
    As torch's, call ``set_epoch(epoch)`` at each epoch's start to shuffle
    each epoch anew."""

    def __init__(self, dataset, client=None, shuffle=True, seed=0, drop_last=False):
        if client is not None:
            rank, workers = client.worker, client.num_workers
        elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            rank, workers = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        else:
            raise ValueError(
                "DistributedSampler: no worker to sample for; pass the client "
                "(opt.client), or run under pslaunch, which sets RANK and WORLD_SIZE")
        super().__init__(dataset, num_replicas=workers, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)


class DistributedOptimizer:
    """Trains ``model`` with the PS optimizer of the job ``client`` belongs
    to (default: ``pstrain.Client()``, from pslaunch's environment).

    ``resume_step``: the steps this worker had made before a restart (0 on
    a first start), where its loop may resume."""

    def __init__(self, model, client=None):
        for name, p in model.named_parameters():
            if p.requires_grad and p.dtype != torch.float32:
                raise ValueError(
                    f"parameter {name} is {p.dtype}, but the parameter servers hold float32 "
                    "and would not keep it exactly; make the model float32 (model.float()) "
                    "before DistributedOptimizer")
        self._tables = EmbeddingTables(model)
        self.parameters = [(name, p) for name, p in model.named_parameters()
                           if p.requires_grad and not self._tables.holds(p)]
        # Where the model computes: its dense parameters', else its tables'.
        placed = [p for _, p in self.parameters] or [t.weight for t in self._tables.tables]
        if not placed:
            raise ValueError("the model has no trainable parameters")
        devices = {p.device.type for p in placed}
        if len(devices) != 1:
            raise ValueError(f"the model's parameters are on several devices ({devices})")
        self.device = next(iter(devices))
        self._device_name = str(placed[0].device)
        self.client = client if client is not None else pstrain.Client()
        self.redone_steps = 0  # steps redone after a transient error
        self._finished = False
        view = self.client.register()
        self.resume_step = int(view["worker_clock"])
        self._tables.declare(self.client)
        self.client.declare({name: p.shape for name, p in self.parameters})
        self.client.init({name: p.detach().cpu() for name, p in self.parameters})
        values, gradients = self.client.values, self.client.gradients
        if self.device == "cpu":
            self._staging = None
            with torch.no_grad():
                for name, p in self.parameters:
                    p.data = torch.from_numpy(values[name]).view(p.shape)
                    p.grad = torch.from_numpy(gradients[name]).view(p.shape)
                    p.grad.zero_()
            # Where each parameter's values and pushed gradient lie, to check
            # every step that the model still reads the one and autograd
            # still accumulates into the other.
            self._value_addresses = [values[n].ctypes.data for n, _ in self.parameters]
            self._gradient_addresses = [gradients[n].ctypes.data for n, _ in self.parameters]
        else:
            self._staging = HostStaging([values[n] for n, _ in self.parameters],
                                        [gradients[n] for n, _ in self.parameters])
        self._pull()

    @property
    def devices(self):
        """Where the model computes, as a worker result names it."""
        return "cpu" if self.device == "cpu" else self._device_name

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in place (they are views the push reads; they
        are never set to None)."""
        for _, p in self.parameters:
            if p.grad is not None:
                p.grad.zero_()
        self._tables.zero_grad()

    def step(self, closure=None):
        """Pushes the gradients and loads the next values. ``closure`` (as
        torch.optim takes it): a function that computes the loss and its
        gradients again; its loss is returned.

        A shard that went away or refused for now (``Error.transient``) is
        waited for and rejoined, with backoff, and the step is redone: on the
        values the shards then hold, its gradient computed again by
        ``closure``, or without one pushed again as it was. One budget,
        training.pull_timeout_seconds, covers the refusals in a row; once it
        is spent the last error is raised (a launcher restarts the worker).
        A step is never dropped without an error."""
        if self._finished:
            raise pstrain.FailedPreconditionError(
                "step() after finish(): the session has ended; make a new Client and "
                "DistributedOptimizer to train again")
        self._check_bound()
        loss = self._evaluate(closure)
        patience = float(self.client.config["training"]["pull_timeout_seconds"])
        deadline, backoff = None, 0.1
        while True:
            try:
                self._exchange()
                return loss
            except pstrain.Error as error:
                if not error.transient:
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + patience
                elif now > deadline:
                    raise pstrain.UnavailableError(
                        "gave up redoing a step after training.pull_timeout_seconds "
                        f"({patience:g} s): {error}", "UNAVAILABLE", True) from error
                else:
                    # A shard that answers but keeps refusing: back off, with
                    # full jitter, as the worker binary does.
                    time.sleep(backoff * (0.5 + 0.5 * random.random()))
                    backoff = min(backoff * 2, 5.0)
                self._rejoin(error, deadline)
                self.redone_steps += 1
                if closure is not None:
                    self.zero_grad()
                    loss = self._evaluate(closure)

    def finish(self):
        """Tells the shards this worker is done; the chief then waits for the
        other workers and loads the final values into the model. Returns the
        workers the chief gave up on (none for the others). The optimizer
        takes no step after it. Sparse embedding modules get their whole
        tables back (``pstrain.sparse``), so ``model.state_dict()`` is the
        trained model, as a fresh model of the same shapes loads it."""
        self._check_bound()
        self.client.done()
        self._finished = True
        if not self.client.is_chief:
            self._tables.load_whole()
            return []
        stats = self.client.wait_for_workers()
        self._pull()
        self._tables.load_whole()
        return stats["missing_workers"]

    # ---- internals ------------------------------------------------------
    def _check_bound(self):
        # A parameter whose .data was replaced (p.data = ..., model.double(),
        # a load that assigns) is no longer what the exchange writes: the
        # model would train on values the PS never sees.
        for i, (name, p) in enumerate(self.parameters):
            shape = self.client.values[name].shape
            moved = self._staging is None and p.data_ptr() != self._value_addresses[i]
            if moved or tuple(p.shape) != shape:
                raise RuntimeError(
                    f"parameter {name}: its .data was replaced after DistributedOptimizer "
                    "bound it to the values the PS sends; change it in place instead "
                    "(with torch.no_grad(): p.copy_(new)), or make a new optimizer")

    def _exchange(self):
        if self._staging is None:
            for (name, p), address in zip(self.parameters, self._gradient_addresses):
                if p.grad is None or p.grad.data_ptr() != address:
                    self._adopt_gradient(name, p)
            self._push_pull(self.client.gradients)
        else:
            self._staging.gradients_to_host([p.grad for _, p in self.parameters])
            self._push_pull(self.client.gradients)
            self._staging.values_to_device([p for _, p in self.parameters])

    def next_batch(self, ids_by_module):
        """Names the next batch's ids before ``step()``: a dict from each
        sparse embedding module (``nn.Embedding``/``nn.EmbeddingBag`` with
        ``sparse=True``) to the ids it will be called with. The step's
        exchange then brings their rows back with the dense values, and the
        next forward pass makes no lookup of its own."""
        self._tables.name_next(ids_by_module)

    def _push_pull(self, gradients):
        if self._tables.tables:
            next_ids = self._tables.named_next()
            _, rows = self.client.push_pull_rows(gradients, rows=self._tables.gradients(),
                                                 next_ids=next_ids)
            self._tables.keep_fetched(next_ids, rows)
            # Pushed: the next forward pass looks up rows anew.
            self._tables.zero_grad()
        else:
            self.client.push_pull(gradients)

    def _adopt_gradient(self, name, p):
        # A gradient autograd made anew (after zero_grad(set_to_none=True)
        # elsewhere): copied into the pushed memory, which it then becomes.
        view = torch.from_numpy(self.client.gradients[name]).view(p.shape)
        with torch.no_grad():
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad)
        p.grad = view

    def _pull(self):
        self.client.pull()
        if self._staging is not None:
            self._staging.values_to_device([p for _, p in self.parameters])

    @staticmethod
    def _evaluate(closure):
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def _rejoin(self, cause, deadline):
        what = "lost a parameter server" if cause.code == "UNAVAILABLE" else "refused for now"
        print(f"{self.client.task}: {what} ({cause}); rejoining to redo the step",
              file=sys.stderr, flush=True)
        while True:
            seen = self.client.versions[0] if self.client.versions else 0
            view = self.client.register(deadline)  # waits out transient refusals, or raises
            self._check_nothing_lost(seen, view)
            if not view["initialized"]:
                self.client.init({name: p.detach().cpu() for name, p in self.parameters})
            try:
                self._pull()
                return
            except pstrain.Error as error:
                if not error.transient or time.monotonic() > deadline:
                    raise

    def _check_nothing_lost(self, seen, view):
        # A shard restarted from its checkpoint goes back at most a
        # checkpoint interval; one that went back further (or came back with
        # no model) lost the run's updates, and training on would hide that.
        checkpoint = self.client.config["training"].get("checkpoint", {})
        may_lose = int(checkpoint.get("every_steps", 0)) if checkpoint.get("dir") else 0
        now_at = int(view["version"]) if view["initialized"] else 0
        if seen - now_at > may_lose:
            raise pstrain.FailedPreconditionError(
                f"ps:0 came back at version {now_at}"
                f"{'' if view['initialized'] else ' without the model'} after this worker had "
                f"seen version {seen}: {seen - now_at} updates are gone, more than a checkpoint "
                f"interval (training.checkpoint.every_steps: {may_lose}); restore its checkpoint "
                "directory, or start the job again", "FAILED_PRECONDITION", False)
