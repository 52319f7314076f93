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
gradient with the dense ones.
"""

import sys
import time

import torch

import pstrain
from pstrain.sparse import EmbeddingTables
from pstrain.staging import HostStaging

__all__ = ["DistributedOptimizer"]


class DistributedOptimizer:
    """Trains ``model`` with the PS optimizer of the job ``client`` belongs
    to (default: ``pstrain.Client()``, from pslaunch's environment).

    ``resume_step``: the steps this worker had made before a restart (0 on
    a first start), where its loop may resume."""

    def __init__(self, model, client=None):
        self.client = client if client is not None else pstrain.Client()
        self._tables = EmbeddingTables(model)
        self.parameters = [(name, p) for name, p in model.named_parameters()
                           if p.requires_grad and not self._tables.holds(p)]
        if not self.parameters:
            raise ValueError("the model has no trainable parameters")
        devices = {p.device.type for _, p in self.parameters}
        if len(devices) != 1:
            raise ValueError(f"the model's parameters are on several devices ({devices})")
        self.device = next(iter(devices))
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
        else:
            self._staging = HostStaging([values[n] for n, _ in self.parameters],
                                        [gradients[n] for n, _ in self.parameters])
        self._pull()

    @property
    def devices(self):
        """Where the model computes, as a worker result names it."""
        return "cpu" if self.device == "cpu" else str(self.parameters[0][1].device)

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in place (they are views the push reads; they
        are never set to None)."""
        for _, p in self.parameters:
            if p.grad is not None:
                p.grad.zero_()
        self._tables.zero_grad()

    def step(self):
        """Pushes the gradients and loads the next values. A shard that went
        away or refused for now is waited for (with backoff, up to
        training.pull_timeout_seconds); the step's gradient is then dropped
        and the model takes what the shards hold."""
        try:
            self._exchange()
        except pstrain.Error as error:
            if not error.transient:
                raise
            self._rejoin(error)

    def finish(self):
        """Tells the shards this worker is done; the chief then waits for the
        other workers and loads the final values into the model. Returns the
        workers the chief gave up on (none for the others)."""
        self.client.done()
        if not self.client.is_chief:
            return []
        stats = self.client.wait_for_workers()
        self._pull()
        return stats["missing_workers"]

    # ---- internals ------------------------------------------------------
    def _exchange(self):
        if self._staging is None:
            gradients = self.client.gradients
            for name, p in self.parameters:
                if p.grad is None or p.grad.data_ptr() != gradients[name].ctypes.data:
                    self._adopt_gradient(name, p)
            self._push_pull(gradients)
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

    def _rejoin(self, cause):
        print(f"{self.client.task}: lost a parameter server ({cause}); rejoining",
              file=sys.stderr, flush=True)
        patience = float(self.client.config["training"]["pull_timeout_seconds"])
        deadline = time.monotonic() + patience
        while True:
            self.client.register()  # waits out transient refusals, or raises
            try:
                self._pull()
                return
            except pstrain.Error as error:
                if not error.transient or time.monotonic() > deadline:
                    raise
