"""PyTorch on pstrain: the optimizer runs on the parameter servers.

A one-process script becomes a worker of a job in three lines: the
script's own model, torch optimizers (their rules, hyper-parameters, param
groups and schedulers) and data loaders are made the job's by ``prepare``,
and clipping moves onto the PS::

    import pstrain.torch                                                   # 1
    model, opt, loader = pstrain.torch.prepare(model, opt, loader)        # 2
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.clip_grad_norm_(1.0)    # 3: was torch.nn.utils.clip_grad_norm_(...)
        opt.step()

``DistributedOptimizer(optimizer, model)`` makes the model's parameters PS
variables (named as ``model.named_parameters()`` names them), offers the
model's values as their initial values (the first worker to arrive wins)
and pulls them into the model. Each ``step()`` pushes the gradients, with
each param group's current rates, and loads the values the PS optimizer
computed, as the job's mode says: SYNC averages every worker's gradient
per step, ASYNC applies each on arrival, SSP bounds the staleness.
``DistributedOptimizer(model)`` trains with the config's
``training.optimizer`` instead.

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

import atexit
import json
import os
import sys

import torch
from torch import nn

import pstrain
from pstrain.sparse import EmbeddingTables
from pstrain.staging import HostStaging

__all__ = ["DistributedOptimizer", "DistributedSampler", "prepare", "state_dict"]


def prepare(*objects, client=None):
    """A one-process training script's model, optimizers and data loaders,
    made a worker's of the job (as ``accelerate``'s ``prepare``)::

        model, opt, loader = pstrain.torch.prepare(model, opt, loader)

    Returns the objects in order: the model itself (its parameters bound to
    the parameter servers' values), a ``DistributedOptimizer`` for the first
    torch optimizer (the others, e.g. a SparseAdam for the embeddings, come
    back as optimizers that step with it: whichever ``step()`` comes first
    after a forward pass exchanges for all), and each ``DataLoader`` over
    this worker's part of its data set (``DistributedSampler``, shuffled if
    the loader was, a new order each pass; the batch size stays per worker,
    as with DDP). Under a launcher (pslaunch, torchrun, TF_CONFIG) the job
    ends for this worker at exit (``finish()``, unless the script called it
    or ended with an exception)."""
    models = [o for o in objects if isinstance(o, nn.Module)]
    optimizers = [o for o in objects if isinstance(o, torch.optim.Optimizer)]
    if len(models) != 1 or not optimizers:
        raise TypeError("prepare(model, optimizer, ..., loader, ...): exactly one model and at "
                        "least one torch optimizer")
    leader = DistributedOptimizer(optimizers, models[0], client)
    # Each returned optimizer shows its own groups, as the script's did: a
    # scheduler made on the first schedules the first's rates only.
    leader.param_groups = optimizers[0].param_groups
    prepared = []
    for o in objects:
        if isinstance(o, nn.Module):
            prepared.append(o)
        elif o is optimizers[0]:
            prepared.append(leader)
        elif isinstance(o, torch.optim.Optimizer):
            prepared.append(_Follower(leader, o))
        elif isinstance(o, torch.utils.data.DataLoader):
            prepared.append(_sharded(o, leader.client))
            leader._samplers.append(prepared[-1].sampler)
        else:
            raise TypeError(f"prepare: a {type(o).__name__} is no model, optimizer or DataLoader")
    return prepared[0] if len(prepared) == 1 else tuple(prepared)


def state_dict(model):
    """``model.state_dict()``, which holds the trained model once
    ``DistributedOptimizer`` trains it: the dense parameters' current values
    and each sparse embedding's whole table (ids 0 .. num_embeddings - 1)
    from the parameter servers. It loads into a fresh model."""
    return model.state_dict()


def pstrain_learning_rate(config):
    """The learning rate of the job config's optimizer."""
    optimizer = config["training"].get("optimizer", {})
    for kind in ("sgd", "adam", "adamw", "adagrad", "ftrl"):
        if kind in optimizer:
            return float(optimizer[kind].get("learning_rate", 0.0))
    return 0.0


class _Follower(torch.optim.Optimizer):
    """One more torch optimizer of a prepared model: its param groups (for
    its scheduler) travel with the first one's pushes, and its ``step()``
    is that one's."""

    def __init__(self, leader, optimizer):
        self._leader = leader
        self._optimizer = optimizer
        leader._followers += 1
        super().__init__([p for g in optimizer.param_groups for p in g["params"]],
                         dict(optimizer.defaults))
        self.param_groups = optimizer.param_groups

    def step(self, closure=None):
        return self._leader.step(closure)

    def zero_grad(self, set_to_none=False):
        self._leader.zero_grad(set_to_none)

    def load_state_dict(self, state_dict):
        DistributedOptimizer.load_state_dict(self, state_dict)


# Optimizers whose job ends at the interpreter's exit, unless an uncaught
# exception ended the script (the launcher then reports the script's error).
# Held strongly: a script's optimizer is often a local of a function that
# has returned by then. finish() lets go of it.
_open_optimizers = set()
_script_failed = False
_excepthook = sys.excepthook


def _note_failure(kind, value, traceback):
    global _script_failed
    _script_failed = True
    _excepthook(kind, value, traceback)


def _started_by_a_launcher():
    # pslaunch names the task; torchrun and a PyTorchJob set RANK and
    # WORLD_SIZE; a TFJob, TF_CONFIG.
    env = os.environ
    return bool(env.get(pstrain.TASK_ENV) or env.get("TF_CONFIG")
                or ("RANK" in env and "WORLD_SIZE" in env))


def _finish_at_exit(optimizer):
    # Under a launcher only: a script there ends its part of the job by
    # exiting (a shard started with --exit_when_done waits for that), while
    # a notebook or a test whose shards are gone would wait out the connect
    # budget.
    if not _started_by_a_launcher():
        return
    if not _open_optimizers:
        sys.excepthook = _note_failure
        atexit.register(_finish_open_optimizers)
    _open_optimizers.add(optimizer)


def _finish_open_optimizers():
    if _script_failed:
        return
    for optimizer in list(_open_optimizers):
        if not optimizer._finished:
            try:
                optimizer.finish()
            except pstrain.Error as error:
                pstrain._pstrain.log("error", f"{optimizer.client.task}: could not finish at "
                                     f"exit: {error}")


# The loss whose backward() ran last: what a step's gradients came from,
# for the worker's result (final_loss) without a report() in the script.
# torch.Tensor.backward calls torch.autograd.backward, which is wrapped
# once, when the first DistributedOptimizer is made; it only notes the
# tensor (detached: no copy, no device sync) and calls torch's own.
_last_loss = None


def _watch_losses():
    if getattr(torch.autograd.backward, "_pstrain_watched", False):
        return
    backward = torch.autograd.backward

    def noting_backward(tensors, *args, **kwargs):
        global _last_loss
        if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
            _last_loss = tensors.detach()
        return backward(tensors, *args, **kwargs)

    noting_backward._pstrain_watched = True
    noting_backward.__doc__ = backward.__doc__
    torch.autograd.backward = noting_backward


def _sharded(loader, client):
    if not isinstance(loader.sampler, (torch.utils.data.RandomSampler,
                                       torch.utils.data.SequentialSampler)) or \
            loader.batch_size is None:
        raise TypeError("prepare: a DataLoader with its own sampler or batch_sampler; give it a "
                        "pstrain.torch.DistributedSampler yourself")
    shuffle = isinstance(loader.sampler, torch.utils.data.RandomSampler)
    return torch.utils.data.DataLoader(
        loader.dataset, batch_size=loader.batch_size, drop_last=loader.drop_last,
        sampler=DistributedSampler(loader.dataset, client, shuffle=shuffle),
        num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn, persistent_workers=loader.persistent_workers)


def _tf_config_worker(text):
    """This worker's index and the worker count TF_CONFIG gives, as the C++
    side maps it (common/tf_config.h): the chief is worker 0, worker i is
    worker i+1 after a chief."""
    tf_config = json.loads(text)
    cluster, task = tf_config.get("cluster", {}), tf_config.get("task", {})
    chiefs = len(cluster.get("chief", [])) + len(cluster.get("master", []))
    workers = chiefs + len(cluster.get("worker", []))
    kind, index = task.get("type"), int(task.get("index", 0))
    if kind in ("chief", "master"):
        return index, workers
    if kind == "worker":
        return chiefs + index, workers
    raise ValueError(f"DistributedSampler: TF_CONFIG's task is {kind}:{index}, not a worker")


class DistributedSampler(torch.utils.data.distributed.DistributedSampler):
    """``torch.utils.data.distributed.DistributedSampler`` for the workers of
    a pstrain job: each worker gets its own part of every epoch, the parts
    disjoint and together the whole data set (padded to equal parts unless
    ``drop_last``), with no process group. The worker and the number of
    workers come from ``client`` (a ``pstrain.Client``), else from the
    environment pslaunch (and torchrun) sets, ``RANK`` and ``WORLD_SIZE``,
    else from TF_CONFIG.
    Each pass over it starts the next epoch (a new order when shuffled);
    ``set_epoch(epoch)``, as torch's, sets the next pass's."""

    def __init__(self, dataset, client=None, shuffle=True, seed=0, drop_last=False):
        if client is not None:
            rank, workers = client.worker, client.num_workers
        elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            rank, workers = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        elif os.environ.get("TF_CONFIG"):
            rank, workers = _tf_config_worker(os.environ["TF_CONFIG"])
        else:
            raise ValueError(
                "DistributedSampler: no worker to sample for; pass the client "
                "(opt.client), or run under pslaunch or torchrun (RANK and WORLD_SIZE) or "
                "with TF_CONFIG")
        super().__init__(dataset, num_replicas=workers, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self._next_epoch = 0
        self.samples_dealt = 0  # indices handed out, over every pass
        self.passes = 0  # passes begun

    def set_epoch(self, epoch):
        self._next_epoch = epoch

    def __iter__(self):
        self.epoch = self._next_epoch
        self._next_epoch += 1
        self.passes += 1
        for index in super().__iter__():
            self.samples_dealt += 1
            yield index


# The torch optimizers whose update the PS applies, as OptimizerConfig
# kinds (config.proto), with the hyper-parameters a group may not vary.
_FIXED_PER_GROUP = ("momentum", "nesterov", "betas", "eps", "initial_accumulator_value")


def _ps_optimizer(optimizer):
    """The PS optimizer (an OptimizerConfig as a dict) that applies
    ``optimizer``'s update, and whether its groups' weight decay travels with
    each push (AdamW's). ValueError for what the PS cannot apply as torch
    would."""
    groups = optimizer.param_groups
    name = type(optimizer).__name__
    for key in _FIXED_PER_GROUP:
        if len({repr(g.get(key)) for g in groups}) > 1:
            raise ValueError(f"{name}: its param groups differ in {key}; the parameter servers "
                             "take one value of it per optimizer (learning rate and weight decay "
                             "may differ per group)")
    g = groups[0]
    # The configured rate is only a default: every push names each group's
    # current rate. A warmup may have set it to 0, which a config refuses.
    lr = float(g.get("initial_lr", g["lr"])) or float(optimizer.defaults.get("lr", 0)) or 1.0

    def refuse(what):
        raise ValueError(f"{name}: {what} has no parameter-server form; use SGD (momentum, "
                         "nesterov), Adam, AdamW, Adagrad or SparseAdam without it")

    def no(key, default=0):
        if any(gr.get(key, default) not in (default, None) for gr in groups):
            refuse(key)

    if isinstance(optimizer, torch.optim.AdamW):
        no("amsgrad", False)
        no("maximize", False)
        beta1, beta2 = g["betas"]
        return {"adamw": {"learning_rate": lr, "beta1": beta1, "beta2": beta2, "epsilon": g["eps"],
                          "weight_decay": float(g["weight_decay"])}}, True
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.SparseAdam)):
        no("weight_decay")
        no("amsgrad", False)
        no("maximize", False)
        beta1, beta2 = g["betas"]
        return {"adam": {"learning_rate": lr, "beta1": beta1, "beta2": beta2,
                         "epsilon": g["eps"]}}, False
    if isinstance(optimizer, torch.optim.SGD):
        no("weight_decay")
        no("dampening")
        no("maximize", False)
        return {"sgd": {"learning_rate": lr, "momentum": g.get("momentum", 0.0),
                        "nesterov": bool(g.get("nesterov", False))}}, False
    if isinstance(optimizer, torch.optim.Adagrad):
        no("weight_decay")
        no("lr_decay")
        no("maximize", False)
        return {"adagrad": {"learning_rate": lr,
                            "initial_accumulator": g.get("initial_accumulator_value", 0.0),
                            "epsilon": g["eps"]}}, False
    refuse(f"torch.optim.{name}")


class DistributedOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` whose update the parameter servers apply.

    ``DistributedOptimizer(optimizer, model)``: ``optimizer`` is the torch
    optimizer the script made for ``model`` (SGD with momentum or Nesterov,
    Adam, AdamW, Adagrad, SparseAdam; or a list of them, e.g. AdamW for the
    dense part and SparseAdam for the embeddings). The PS applies its
    update rule with its hyper-parameters; its ``param_groups`` are this
    optimizer's, the same dicts: a learning-rate scheduler made on either
    changes the rates, and each group's ``lr`` (and AdamW's
    ``weight_decay``) travels with every push. ``DistributedOptimizer(model)``
    trains with the job config's optimizer instead (its one param group's
    ``lr`` starts at the config's rate).

    ``client``: a ``pstrain.Client`` (default: ``pstrain.Client()``, from
    pslaunch's environment). ``resume_step``: the steps this worker had
    made before a restart (0 on a first start), where its loop may resume.

    ``state_dict()`` holds the param groups (rates and the scheduler's
    fields); the optimizer's moments live on the parameter servers and in
    their checkpoints."""

    def __init__(self, optimizer, model=None, client=None):
        if isinstance(optimizer, nn.Module):
            # DistributedOptimizer(model[, client]): the config's optimizer.
            if client is None and model is not None and not isinstance(model, nn.Module):
                model, client = None, model
            optimizers, model = [], optimizer
        else:
            optimizers = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
            for o in optimizers:
                if not isinstance(o, torch.optim.Optimizer):
                    raise TypeError(f"{type(o).__name__} is no torch.optim.Optimizer")
            if not isinstance(model, nn.Module):
                raise TypeError("DistributedOptimizer(optimizer, model): pass the model the "
                                "optimizer trains")
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
        self._bind_groups(optimizers)
        self._finished = False
        self._clip_norm = None  # this step's clip_grad_norm_, once one was asked for
        self._sent_rates = (None, None, None)  # the config's
        self._followers = 0  # optimizers of prepare() that step through this one
        self._samplers = []  # of prepare()'s loaders: the samples this worker took
        self._round_open = True  # no exchange since the model's last forward pass
        # The losses of this epoch's steps (a tensor sum: read once, at the
        # end), and the loaders' passes when it began.
        self._epoch_loss, self._epoch_steps, self._epoch_passes = None, 0, 0
        _watch_losses()
        view = self.client.register()
        self.resume_step = int(view["worker_clock"])
        self._tables.declare(self.client, self._table_optimizers)
        self.client.declare({name: p.shape for name, p in self.parameters})
        if self._dense_optimizer is not None:
            self.client.set_optimizer(self._dense_optimizer)
        self.client.init({name: p.detach().cpu() for name, p in self.parameters},
                         rows=self._tables.seeds())
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
        self._forward_hook = model.register_forward_pre_hook(self._open_round)
        _finish_at_exit(self)

    def _bind_groups(self, optimizers):
        # Each dense parameter's and each table's group, found by the
        # parameter objects the torch optimizers hold (the tables' weights
        # are still the modules' own: EmbeddingTables.declare replaces them).
        self._optimizers = optimizers
        self._dense_optimizer = None
        self._table_optimizers = {}
        self._decays = set()  # names whose weight decay travels (AdamW's)
        # The config's rate, while the optimizer's own (one group) keeps it.
        self._config_lr = None
        if not optimizers:
            lr = self._config_lr = pstrain_learning_rate(self.client.config)
            params = [p for _, p in self.parameters] + [t.weight for t in self._tables.tables]
            super().__init__(params, {"lr": lr})
            group = self.param_groups[0]
            self._group_of = {name: group for name, _ in self.parameters}
            self._group_of.update({t.name: group for t in self._tables.tables})
            return
        owner = {}
        for o in optimizers:
            config, decays = _ps_optimizer(o)
            for group in o.param_groups:
                for p in group["params"]:
                    owner[id(p)] = (group, config, decays)
        self._group_of = {}
        dense_configs = set()
        for name, p in self.parameters:
            if id(p) not in owner:
                raise ValueError(f"parameter {name} is trainable but in none of the optimizers' "
                                 "param groups; add it, or set requires_grad=False")
            group, config, decays = owner[id(p)]
            self._group_of[name] = group
            dense_configs.add(json.dumps(config, sort_keys=True))
            self._dense_optimizer = config
            if decays:
                self._decays.add(name)
        if len(dense_configs) > 1:
            raise ValueError("the model's dense parameters are in optimizers of different kinds or "
                             "settings; the parameter servers apply one optimizer to them")
        for table in self._tables.tables:
            if id(table.weight) not in owner:
                raise ValueError(f"embedding {table.name} is trainable but in none of the "
                                 "optimizers' param groups")
            group, config, decays = owner[id(table.weight)]
            self._group_of[table.name] = group
            self._table_optimizers[table.name] = config
            if decays:
                self._decays.add(table.name)
        params = [p for o in optimizers for g in o.param_groups for p in g["params"]]
        super().__init__(params, dict(optimizers[0].defaults))
        # The same dicts: a scheduler of either optimizer drives both.
        self.param_groups = [g for o in optimizers for g in o.param_groups]

    def load_state_dict(self, state_dict):
        """Loads the param groups' settings (rates, the scheduler's fields)
        into the groups in place, so that the wrapped optimizers see them."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError(f"the state dict has {len(saved)} param groups, this optimizer "
                             f"{len(self.param_groups)}")
        for group, loaded in zip(self.param_groups, saved):
            group.update({k: v for k, v in loaded.items() if k != "params"})

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """``torch.nn.utils.clip_grad_norm_`` of this step, applied by the
        parameter servers to the gradient they apply (in SYNC, the step's
        mean over the workers: what one process with the combined batch
        clips), over every dense parameter and embedding row a shard holds
        (with one shard, the whole model's norm). Call it between
        ``backward()`` and ``step()``, each step it should apply to.
        Returns the 2-norm of this worker's own gradient."""
        if float(norm_type) != 2.0:
            raise ValueError("the parameter servers clip by the 2-norm only")
        max_norm = float(max_norm)
        if not max_norm > 0 or max_norm == float("inf"):
            raise ValueError(f"max_norm must be a positive number, got {max_norm}")
        self._clip_norm = max_norm
        squares = [p.grad.detach().float().pow(2).sum() for _, p in self.parameters
                   if p.grad is not None]
        squares += [torch.from_numpy(rows).pow(2).sum()
                    for _, rows in self._tables.gradients().values()]
        return torch.stack(squares).sum().sqrt() if squares else torch.tensor(0.0)

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
        waited for and rejoined, with backoff, and the step's gradient pushed
        again, by the session under the client (as the worker binary redoes
        a step); one budget, training.pull_timeout_seconds, covers the
        refusals in a row, and once it is spent ``UnavailableError`` is
        raised (a launcher restarts the worker). A step is never dropped
        without an error.

        Of the optimizers ``prepare`` returns for one model, the first
        ``step()`` after a forward pass exchanges for all of them; the
        others' do nothing until the next forward pass."""
        if self._followers and not self._round_open and closure is None:
            return None
        if self._finished:
            raise pstrain.FailedPreconditionError(
                "step() after finish(): the session has ended; make a new Client and "
                "DistributedOptimizer to train again")
        self._check_bound()
        loss = self._evaluate(closure)
        self._send_rates()
        self._exchange()
        self._stepped(loss)
        return loss

    @property
    def redone_steps(self):
        """Steps redone after a shard's refusal for now."""
        return self.client.redone_steps

    def finish(self):
        """Tells the shards this worker is done; the chief then waits for the
        other workers and loads the final values into the model. Returns the
        workers the chief gave up on (none for the others). The optimizer
        takes no step after it. Sparse embedding modules get their whole
        tables back (``pstrain.sparse``), so ``model.state_dict()`` is the
        trained model, as a fresh model of the same shapes loads it."""
        self._check_bound()
        if os.environ.get(pstrain.RESULT_FILE_ENV) and not self.client._reported:
            # The worker's result (pslaunch's summary): what its loaders
            # dealt and the loss its steps saw.
            seen = {}
            if self._samplers:
                seen["samples"] = sum(s.samples_dealt for s in self._samplers)
                seen["epochs"] = max(s.passes for s in self._samplers)
            if self.final_loss is not None:
                seen["final_loss"] = self.final_loss
            self.client.report(**seen)
        self.client.done()
        self._finished = True
        _open_optimizers.discard(self)
        self._forward_hook.remove()
        if not self.client.is_chief:
            self._tables.load_whole()
            return []
        stats = self.client.wait_for_workers()
        self._pull()
        self._tables.load_whole()
        return stats["missing_workers"]

    # ---- internals ------------------------------------------------------
    def _open_round(self, module, inputs):
        self._round_open = True

    def _stepped(self, loss):
        self._round_open = False
        self._note_loss(loss)
        if self._clip_norm is not None:
            self._clip_norm = 0.0  # asked again each step it applies to
        for o in self._optimizers:
            # What a learning-rate scheduler of the torch optimizer counts
            # (it warns of a scheduler step before any optimizer step).
            o._step_count = getattr(o, "_step_count", 0) + 1

    def _note_loss(self, loss):
        global _last_loss
        if loss is None:
            loss = _last_loss
        _last_loss = None
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return
        passes = max((s.passes for s in self._samplers), default=0)
        if passes != self._epoch_passes:
            # A loader began another pass: a new epoch's mean.
            self._epoch_loss, self._epoch_steps, self._epoch_passes = None, 0, passes
        loss = loss.detach().reshape(()).double()
        self._epoch_loss = loss if self._epoch_loss is None else self._epoch_loss + loss
        self._epoch_steps += 1

    @property
    def final_loss(self):
        """The mean loss of this worker's steps in its last epoch (its
        loaders' last pass; every step where no loader of ``prepare`` deals
        the data): the loss ``step(closure)`` returned, else the one whose
        ``backward()`` ran last before the step. None before any."""
        if not self._epoch_steps:
            return None
        return float(self._epoch_loss) / self._epoch_steps

    def _send_rates(self):
        # Each group's current rates, sent when they change: the push
        # carries them until then.
        rates = ({name: float(group["lr"]) for name, group in self._group_of.items()},
                 {name: float(self._group_of[name]["weight_decay"]) for name in self._decays},
                 self._clip_norm)
        if self._config_lr is not None and self._clip_norm is None and \
                self.param_groups[0]["lr"] == self._config_lr:
            rates = (None, None, None)  # the config's, as no scheduler moved it
        if rates != self._sent_rates:
            self.client.set_rates(*rates)
            self._sent_rates = rates

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

