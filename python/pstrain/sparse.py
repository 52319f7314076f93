"""``nn.Embedding(sparse=True)`` and ``nn.EmbeddingBag(sparse=True)`` as PS
embedding tables, for ``pstrain.torch.DistributedOptimizer``.

Each such module's weight becomes a table of the parameter servers, named
as ``named_parameters()`` names the weight and as wide as the module's
``embedding_dim``; its rows are addressed by the ids the module is called
with (any 64-bit integers: ``num_embeddings`` bounds nothing), seeded
with the module's own initial weight (rows 0 .. num_embeddings - 1, where
the table fits in one Init; a larger one's rows start from the PS's
deterministic initial values, and a warning says so), and trained row by row by the PS optimizer. The
weight is never pulled whole: before each forward pass, a hook on the
module pulls the rows of the unique ids of its input and calls the module
on them, so the module's weight is a new parameter holding only those rows; on ``step()`` its
sparse gradient (coalesced: one row per unique id) is pushed as row
gradients in the same exchange as the dense gradients.

A loop that knows its next batch names it before ``step()``
(``DistributedOptimizer.next_batch``): the step's exchange then brings the
next batch's rows back with the new dense values, and the next forward pass
looks up nothing, one round trip per step.

One forward pass per table per step: a second forward before ``step()``
would look up other rows over the gradient of the first (it raises).
``max_norm`` and ``padding_idx`` refer to local rows and are refused.

While it trains, the module's ``state_dict()`` (and so the model's) holds
the whole table as the shards hold it then (a hook pulls it), not the
batch's rows, so that a model saved mid-training loads into a fresh one.
When training is over (``DistributedOptimizer.finish()``), each module
gets its whole table back: the rows of ids ``0 .. num_embeddings - 1``,
pulled from the shards in pieces, become its weight again, of the shape
the module was made with, and the lookup hook goes. The model's own
``state_dict()`` then holds the trained tables and loads into a fresh
model; rows of ids outside ``num_embeddings`` stay on the shards only.
"""

import json

import numpy as np
import torch
from torch import nn

from pstrain import _pstrain

__all__ = ["EmbeddingTables"]


class _Table:
    def __init__(self, name, module):
        if module.max_norm is not None or getattr(module, "padding_idx", None) is not None:
            raise ValueError(f"{name}: a PS embedding table takes no max_norm or padding_idx")
        self.name = name
        self.module = module
        self.weight = module.weight
        self.dim = module.embedding_dim
        # The module's own initial rows, which the first worker's Init seeds
        # the table with (dropped once offered).
        self.initial = module.weight.detach().cpu().float().contiguous().numpy()
        self.ids = np.empty(0, np.int64)  # the rows the weight holds now
        self.client = None
        self.next_ids = None  # the next batch's unique ids, named before step()
        self.fetched = None  # (unique ids, rows) the step's exchange brought
        self._hook = None
        self._state_hook = None

    def attach(self, client):
        self.client = client
        self._rows(self.weight.data.new_empty((0, self.dim)))
        self._hook = self.module.register_forward_pre_hook(self._lookup)
        self._state_hook = self.module._register_state_dict_hook(self._whole_in_state_dict)

    def _whole_in_state_dict(self, module, state_dict, prefix, local_metadata):
        if self._hook is not None:  # still looking rows up: the weight holds a batch's
            state_dict[prefix + "weight"] = torch.from_numpy(self.whole())

    # Ids one pull of the whole table names: far under a shard's
    # --max_rows_per_pull, and a few MiB of rows.
    WHOLE_PIECE = 65536

    def whole(self):
        """The whole table as the shards hold it now: rows of ids 0 ..
        num_embeddings - 1, pulled in pieces."""
        count = self.module.num_embeddings
        whole = np.empty((count, self.dim), np.float32)
        for start in range(0, count, self.WHOLE_PIECE):
            end = min(count, start + self.WHOLE_PIECE)
            self.client.pull_rows(self.name, np.arange(start, end, dtype=np.int64),
                                  out=whole[start:end])
        return whole

    def load_whole(self):
        """Makes the module's weight the whole table again (``whole()``) and
        drops the hooks: the module is a plain embedding from here on."""
        whole = self.whole()
        for hook in (self._hook, self._state_hook):
            if hook is not None:
                hook.remove()
        self._hook = self._state_hook = None
        device = self.weight.device
        self._rows(torch.from_numpy(whole).to(device))

    def _rows(self, rows):
        # A new parameter for every batch's rows: autograd keeps the shape
        # of the one it first saw.
        self.weight = nn.Parameter(rows, requires_grad=True)
        self.module.weight = self.weight

    def _lookup(self, module, inputs):
        ids = inputs[0]
        if self.weight.grad is not None and torch.is_grad_enabled():
            raise RuntimeError(
                f"{self.name}: a second forward pass before step(); a PS embedding table "
                "looks up one batch's rows per step (call step() or zero_grad() first)")
        unique, local = torch.unique(ids, return_inverse=True)
        self.ids = unique.cpu().numpy()
        fetched, self.fetched = self.fetched, None
        if fetched is not None and np.array_equal(fetched[0], self.ids):
            rows = fetched[1]
        else:
            rows = self.client.pull_rows(self.name, self.ids)
        self._rows(torch.from_numpy(rows).to(self.weight.device))
        return (local.to(ids.device),) + tuple(inputs[1:])

    def gradient(self):
        """(ids, rows) of the weight's gradient, or None without one."""
        grad = self.weight.grad
        if grad is None:
            return None
        if grad.is_sparse:
            grad = grad.coalesce()
            local = grad.indices()[0].cpu().numpy()
            return self.ids[local], grad.values().detach().cpu().float().contiguous().numpy()
        return self.ids, grad.detach().cpu().float().contiguous().numpy()


class EmbeddingTables:
    """The sparse embedding modules of ``model``, as PS tables."""

    def __init__(self, model):
        weights = {id(p): name for name, p in model.named_parameters()}
        self.tables = []
        for module in model.modules():
            if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse \
                    and module.weight.requires_grad and id(module.weight) in weights:
                self.tables.append(_Table(weights[id(module.weight)], module))
        self._weights = {id(t.weight) for t in self.tables}

    def holds(self, parameter):
        """Whether ``parameter`` is a table's weight (not a dense variable)."""
        return id(parameter) in self._weights

    def declare(self, client, optimizers=None):
        """Declares the tables to ``client``, each with its optimizer
        (``optimizers``: table name -> an OptimizerConfig as a dict; the
        job's for a table it leaves out), and hooks their modules."""
        if not self.tables:
            return
        optimizers = optimizers or {}
        kinds = {}
        for t in self.tables:
            config = optimizers.get(t.name)
            key = None if config is None else json.dumps(config, sort_keys=True)
            kinds.setdefault(key, (config, {}))[1][t.name] = t.dim
        for config, tables in kinds.values():
            client.declare_tables(tables, config)
        for table in self.tables:
            table.attach(client)

    # A table's share of one Init: far under a shard's default request
    # limit (--max_message_bytes), beside the dense variables.
    SEED_BYTES = 16 << 20

    def seeds(self):
        """The tables' initial rows for ``Client.init``: table -> (ids,
        rows), from each module's own weight; a table larger than
        SEED_BYTES is left to the PS's initial values, with a warning."""
        seeds = {}
        for table in self.tables:
            initial, table.initial = table.initial, None
            if initial is None:
                continue
            if initial.nbytes > self.SEED_BYTES:
                _pstrain.log("warning", f"embedding {table.name} ({initial.nbytes >> 20} MiB) is "
                             "larger than one Init carries; its rows start from the parameter "
                             "servers' initial values, not the module's")
                continue
            seeds[table.name] = (np.arange(len(initial), dtype=np.int64), initial)
        return seeds

    def gradients(self):
        """The row gradients of the last backward pass: table -> (ids, rows)."""
        rows = {}
        for table in self.tables:
            gradient = table.gradient()
            if gradient is not None:
                rows[table.name] = gradient
        return rows

    def zero_grad(self):
        for table in self.tables:
            table.weight.grad = None

    def load_whole(self):
        """Gives every module its whole trained table back (_Table.load_whole)."""
        for table in self.tables:
            table.load_whole()

    def name_next(self, ids_by_module):
        """Notes the next batch's ids (dict module -> its input ids)."""
        for module, ids in ids_by_module.items():
            table = next((t for t in self.tables if t.module is module), None)
            if table is None:
                raise KeyError(f"{type(module).__name__} is not a sparse embedding of the model")
            table.next_ids = torch.unique(torch.as_tensor(ids)).cpu().numpy()

    def named_next(self):
        """The ids named for the next batch: table -> unique ids."""
        return {t.name: t.next_ids for t in self.tables if t.next_ids is not None}

    def keep_fetched(self, ids, rows):
        """Keeps the rows the step's exchange brought for the named ids
        (``ids``, as named_next gave them) for the next forward pass."""
        for table in self.tables:
            table.next_ids = None
            if table.name in rows:
                table.fetched = (ids[table.name], rows[table.name])
