"""pstrain for Python: a training worker of a pstrain job, for any model.

A ``Client`` is one worker task of a job (``worker:<i>``), speaking to every
PS shard through the same C++ client the ``worker`` binary uses, with what
the job config says: consistency mode, staleness, backup workers, wire
dtype, shards, shared memory, TLS and token. So a Python worker and a C++
worker are interchangeable in one job::

    client = pstrain.Client()                 # $PSTRAIN_CONFIG, $PSTRAIN_TASK
    client.init({"w": w0, "b": b0})           # registers, declares, offers values
    params = client.pull()                    # name -> float32 array
    for batch in data:
        grads = compute(params, batch)        # name -> array (NumPy or torch CPU)
        params = client.push_pull(grads)      # the PS optimizer's next values
    client.done()
    client.report(test_accuracy=0.91)         # for pslaunch's summary

Arrays are float32 NumPy arrays or torch CPU tensors, read and written where
they lie (no copy on this side). ``client.values`` and ``client.gradients``
are the session's own arrays: in a co-located shard's shared region when the
tensors travel through shared memory, so a model that computes in them copies
nothing at all. Every failure raises a ``pstrain.Error`` (see
``pstrain.errors``); every wait on the network releases the GIL. A client
may be shared by several threads: its calls run one at a time.

A client reports as the worker binary does: its metrics (the same names and
labels) on a Prometheus endpoint when ``$PSTRAIN_METRICS_PORT`` (pslaunch's
--metrics_port) or ``metrics_port`` asks for one, and, for the chief,
TensorBoard events in ``$PSTRAIN_LOGDIR`` (pslaunch's --logdir) or
``logdir``. The exchanges record themselves; a training loop adds its
progress windows (``record_window``) and evaluations (``record_evaluation``).

``pstrain.torch`` wraps a ``torch.nn.Module`` in three lines.
"""

import json
import os
import tempfile
import threading
import time

# First: importing the compiled core sets the process's allocator up as the
# worker binary's (common/process_memory.h), best before other modules start
# threads.
from pstrain import _pstrain

import numpy as np
from pstrain.errors import *  # noqa: F401,F403  (the exception classes)
from pstrain.errors import Error
from pstrain.arrays import _dimension, _ids, readable, writable

__all__ = ["Client", "Error", "CONFIG_ENV", "TASK_ENV", "RESULT_FILE_ENV", "METRICS_PORT_ENV",
           "METRICS_ADDRESS_ENV", "LOGDIR_ENV"]

# What pslaunch sets for every worker task it starts from cluster.worker_command.
CONFIG_ENV = "PSTRAIN_CONFIG"
TASK_ENV = "PSTRAIN_TASK"
RESULT_FILE_ENV = "PSTRAIN_RESULT_FILE"
METRICS_PORT_ENV = "PSTRAIN_METRICS_PORT"
METRICS_ADDRESS_ENV = "PSTRAIN_METRICS_ADDRESS"
LOGDIR_ENV = "PSTRAIN_LOGDIR"


def _numbers(message):
    """A protobuf message's JSON with its 64-bit integers (which the JSON
    printer quotes) as numbers."""
    if isinstance(message, dict):
        return {k: _numbers(v) for k, v in message.items()}
    if isinstance(message, list):
        return [_numbers(v) for v in message]
    if isinstance(message, str) and message.lstrip("-").isdigit():
        return int(message)
    return message


class Client:
    """One worker task of a pstrain job.

    ``config``: the job config file (default ``$PSTRAIN_CONFIG``; neither
    set: the built-in default job). ``task``: ``"worker:<i>"`` (default
    ``$PSTRAIN_TASK``, else the launcher's: TF_CONFIG's task, or torchrun's
    and Kubeflow PyTorchJob's ``RANK``; else ``worker:0``). A cluster in
    the environment (TF_CONFIG, or torchrun's ``WORLD_SIZE`` and
    ``MASTER_ADDR`` with ``PSTRAIN_PS`` or ``PSTRAIN_NUM_PS``; docs/python.md)
    replaces the built-in config's. Connecting waits up to
    ``connect_timeout`` seconds for every shard.

    ``metrics_port``: serve the worker's metrics there (0: a free port, see
    ``metrics_port``); default ``$PSTRAIN_METRICS_PORT``, where unset or 0
    means no endpoint. ``metrics_address``: default
    ``$PSTRAIN_METRICS_ADDRESS``, else 127.0.0.1. ``logdir``: where the
    chief writes TensorBoard events; default ``$PSTRAIN_LOGDIR``, else none.

    Threads: one client may be called from several threads at once. The
    calls that exchange with the shards or change the session (register,
    declare, declare_tables, init, pull, push, push_pull, the row calls,
    done) run one at a time, each whole; the session's counters
    (``versions``, ``steps``, ...) wait for the call in flight; ``stats``
    and ``wait_for_workers`` do not wait. Each thread pulls into arrays of
    its own (``out=``): ``values`` is shared by every thread's pulls. Every
    wait, for the shards or for another thread's call, releases the GIL.

    Every exchange (pull, push, push_pull, the row calls) that a shard
    refuses for now (away, restarting, busy) is redone by the session:
    it backs off, rejoins and pushes the same gradients again, within
    training.pull_timeout_seconds (``redone_steps`` counts them); then
    ``UnavailableError``.

    After ``done()`` the session has ended: a push, init or register raises
    ``FailedPreconditionError``; pulls still read the shards' values (the
    chief reads the final model after ``wait_for_workers``).
    """

    def __init__(self, config=None, task=None, connect_timeout=60.0, metrics_port=None,
                 metrics_address=None, logdir=None):
        if config is None:
            config = os.environ.get(CONFIG_ENV, "")
        if task is None:
            # pslaunch's; else (empty) TF_CONFIG's or torchrun's (and
            # Kubeflow's PyTorchJob's) RANK, resolved with the cluster.
            task = os.environ.get(TASK_ENV, "")
        self._session = _pstrain.Session.open(str(config), task, float(connect_timeout))
        self.config = _numbers(json.loads(self._session.config_json))
        self.task = f"worker:{self._session.worker}"
        if metrics_port is None:
            metrics_port = int(os.environ.get(METRICS_PORT_ENV) or 0) or None
        if metrics_address is None:
            metrics_address = os.environ.get(METRICS_ADDRESS_ENV) or "127.0.0.1"
        if logdir is None:
            logdir = os.environ.get(LOGDIR_ENV, "")
        # As the worker binary: only the chief writes events.
        self._telemetry = _pstrain.WorkerTelemetry.start(
            self.worker, metrics_port, metrics_address, str(logdir) if self.is_chief else "",
            "tls" in self.config["cluster"])
        self._window_mark = (0, 0)  # pushes and their staleness at the last window
        self._reported = False  # a result file has been written
        self._registered = None
        self._first_pull = None
        self._last_push = None
        self._values = None
        self._gradients = None
        self._names = None  # the declared variables' names, in order
        self._own = None  # the session's arrays as lists, in that order
        # Makes "register (declare) first if not yet" one step when threads share the client.
        self._setting_up = threading.RLock()

    # ---- the job -------------------------------------------------------
    @property
    def worker(self):
        """This worker's index; worker 0 is the chief."""
        return self._session.worker

    @property
    def is_chief(self):
        return self.worker == 0

    @property
    def num_workers(self):
        return self.config["cluster"]["workers"]

    @property
    def num_shards(self):
        return self._session.num_shards

    @property
    def mode(self):
        """"SYNC", "ASYNC" or "SSP"."""
        return self.config["training"]["mode"]

    # ---- setting up ----------------------------------------------------
    def register(self):
        """Registers with every shard (again after a transient error: rejoins).

        A shard away, restarting or still holding this worker's former
        process (after a restart) is waited for by the session, with
        backoff, for up to training.pull_timeout_seconds, as the worker
        binary waits; then ``UnavailableError``. Returns shard 0's view:
        mode, workers, version, initialized, num_shards and worker_clock
        (the pushes this worker had made before a restart, where a restarted
        worker resumes)."""
        self._registered = self._session.register()
        return self._registered

    def declare(self, variables):
        """Declares the model's variables: a dict name -> shape (or array), in
        the model's order. Every worker of a job declares the same ones.
        Each dimension is at least 1, and the model holds at most 2**28
        parameters in all (InvalidArgumentError, before anything is
        allocated)."""
        specs = []
        for name, value in variables.items():
            shape = tuple(value.shape) if hasattr(value, "shape") else tuple(value)
            specs.append((str(name), [_dimension(name, shape, d) for d in shape]))
        with self._setting_up:
            if self._registered is None:
                self.register()
            self._session.declare(specs)

    @property
    def declared(self):
        return self._session.declared

    @property
    def names(self):
        if self._names is None and self.declared:
            self._names = [name for name, _ in self._session.variables]
        return self._names or []

    @property
    def values(self):
        """The session's value arrays (name -> array): where pull() leaves them."""
        if self._values is None:
            self._values = dict(zip(self.names, self._session.values()))
        return self._values

    @property
    def gradients(self):
        """The session's gradient arrays (name -> array): a gradient computed
        here is pushed from where it lies."""
        if self._gradients is None:
            self._gradients = dict(zip(self.names, self._session.gradients()))
        return self._gradients

    def shares_memory(self, shard=0):
        """Whether shard ``shard``'s tensors travel through shared memory."""
        return self._session.uses_shared_memory(shard)

    def init(self, values, rows=None):
        """Offers initial values (dict name -> array), declaring the variables
        from them first if they are not yet, and initial rows of embedding
        tables (``rows``: dict table -> (ids, rows), float32 rows of the
        table's dim; the other rows start from the PS's initial values). A
        shard that already holds values keeps them (the first worker to
        arrive wins). Returns whether shard 0 took these."""
        with self._setting_up:
            if not self.declared:
                self.declare(values)
        ordered = self._ordered(values, readable, "initial value")
        if not rows:
            return self._session.init(ordered)
        seeds = [(self._table(t), _ids(ids), readable(r))
                 for t, (ids, r) in rows.items()]
        return self._session.init_with_rows(ordered, seeds)

    # ---- training ------------------------------------------------------
    def pull(self, out=None):
        """Pulls every variable: into ``out`` (dict name -> writable array) or,
        without it, into ``values``. Waits for the step the last push belongs
        to, as the job's mode says. Returns the dict of arrays."""
        if self._first_pull is None:
            self._first_pull = time.monotonic()
        target = self.values if out is None else out
        self._session.pull(self._ordered(target, writable, "pull destination"))
        return target

    def push(self, gradients):
        """Pushes one gradient per variable (dict name -> array), computed on
        the values of the last pull."""
        self._session.push(self._ordered(gradients, readable, "gradient"))
        self._last_push = time.monotonic()

    def push_pull(self, gradients, out=None):
        """push() then pull() in one exchange per shard; returns the values."""
        if self._first_pull is None:
            self._first_pull = time.monotonic()
        target = self.values if out is None else out
        self._session.push_pull(self._ordered(gradients, readable, "gradient"),
                                self._ordered(target, writable, "pull destination"))
        self._last_push = time.monotonic()
        return target

    # ---- embedding tables ---------------------------------------------
    # Rows addressed by 64-bit ids, spread over every shard, created on
    # first update with the PS's deterministic initial values and trained
    # row by row by the PS optimizer. Ids are NumPy integer arrays, torch
    # integer tensors or lists; within one call each id appears once.
    def declare_tables(self, tables, optimizer=None):
        """Declares embedding tables (dict name -> dim) beside the config's
        training.model.embeddings, before ``declare``/``init``. They train
        with ``optimizer`` (an ``OptimizerConfig`` of the job config as a
        dict, e.g. ``{"adagrad": {"learning_rate": 0.1}}``), else the job's
        optimizer."""
        self._session.declare_tables([(str(name), int(dim)) for name, dim in tables.items()],
                                     None if optimizer is None else json.dumps(optimizer))

    def set_optimizer(self, optimizer):
        """The dense variables' optimizer, an ``OptimizerConfig`` as a dict
        (``{"adamw": {"learning_rate": 1e-3, "weight_decay": 0.01}}``), in
        place of the job's training.optimizer; before ``init``, which sends
        it (the first worker's Init decides, as for the values)."""
        self._session.set_optimizer(json.dumps(optimizer))

    def set_rates(self, learning_rates=None, weight_decays=None, clip_norm=None):
        """What every later push asks of the PS optimizer, after ``declare``:
        ``learning_rates`` and ``weight_decays`` (dicts from a variable's or
        table's name to a rate, in place of the configured ones; weight
        decay for AdamW), ``clip_norm`` (the gradient's global norm bound,
        0 for none; see OptimizerConfig.clip_norm). All None: the config's
        again. In SYNC a step applies worker 0's rates."""
        if learning_rates is None and weight_decays is None and clip_norm is None:
            self._session.set_rates(None)
            return
        rates = {"learning_rates": {str(k): float(v) for k, v in (learning_rates or {}).items()},
                 "weight_decays": {str(k): float(v) for k, v in (weight_decays or {}).items()}}
        if clip_norm is not None:
            rates["clip_norm"] = float(clip_norm)
        self._session.set_rates(json.dumps(rates))

    @property
    def tables(self):
        """The embedding tables: name -> dim."""
        return dict(self._session.tables)

    def pull_rows(self, table, ids, out=None):
        """The rows of ``ids`` in ``table``: a float32 array of shape
        (len(ids), dim), or ``out`` filled. Waits for the step the last push
        belongs to, as pull() does."""
        ids = _ids(ids)
        if out is None:
            out = np.empty((len(ids), self._dim(table)), np.float32)
        self._session.pull_rows([(self._table(table), ids, writable(out))])
        return out

    def push_rows(self, table, ids, grads):
        """Pushes the gradients of ``table``'s rows alone, no dense gradient:
        ``grads`` (len(ids), dim), each id's gradient summed over the batch.
        ASYNC and SSP take it; a SYNC push carries every dense variable (use
        push_pull's ``rows``), unless the model has none."""
        self._session.push_rows([(self._table(table), _ids(ids), readable(grads))])
        self._last_push = time.monotonic()

    def push_pull_rows(self, gradients, rows=None, next_ids=None, out=None):
        """push_pull() with embedding rows in the same exchanges: ``rows``
        (dict table -> (ids, grads)) pushed with the dense gradients, and
        the rows of ``next_ids`` (dict table -> ids: the next batch's)
        answered once this step has landed. Returns (values, dict table ->
        rows array of shape (len(ids), dim))."""
        if self._first_pull is None:
            self._first_pull = time.monotonic()
        target = self.values if out is None else out
        pushes = [(self._table(t), _ids(i), readable(g)) for t, (i, g) in (rows or {}).items()]
        pulled, pulls = {}, []
        for table, ids in (next_ids or {}).items():
            ids = _ids(ids)
            pulled[table] = np.empty((len(ids), self._dim(table)), np.float32)
            pulls.append((self._table(table), ids, pulled[table]))
        self._session.push_pull_rows(self._ordered(gradients, readable, "gradient"),
                                     self._ordered(target, writable, "pull destination"),
                                     pushes, pulls)
        self._last_push = time.monotonic()
        return target, pulled

    def _table(self, name):
        names = [n for n, _ in self._session.tables]
        try:
            return names.index(name)
        except ValueError:
            raise KeyError(f"no embedding table {name!r}; the tables are "
                           f"{', '.join(names) or 'none'} (declare_tables)") from None

    def _dim(self, name):
        return self._session.tables[self._table(name)][1]

    @property
    def versions(self):
        """Each shard's version at the last pull."""
        return list(self._session.versions)

    @property
    def steps(self):
        """Pushes this client made."""
        return self._session.pushes

    @property
    def redone_steps(self):
        """Exchanges redone after a shard's refusal for now: the session backs
        off, rejoins the shards and pushes the same gradients again, within
        training.pull_timeout_seconds."""
        return self._session.redone_steps

    @property
    def last_outcomes(self):
        """What each shard did with the last push: APPLIED, AGGREGATED, DROPPED, SKIPPED,
        UNCHANGED."""
        return list(self._session.last_outcomes)

    # ---- what it reports ----------------------------------------------
    @property
    def metrics_port(self):
        """The port of this worker's metrics endpoint (0: none)."""
        return self._telemetry.metrics_port

    @property
    def events_path(self):
        """This worker's TensorBoard event file ("" when it writes none)."""
        return self._telemetry.events_path

    def record_window(self, loss, samples, step=None, gradients=None):
        """Records a progress window, as the worker binary does every
        training.log_every_steps: the steps since the last window processed
        ``samples`` examples at mean training loss ``loss``. Sets the loss
        and throughput gauges and the gradient norms of ``gradients`` (dict
        name -> array; default this client's ``gradients``), counts the
        samples, writes the train/ scalars (with the window's mean
        staleness) and adds a curve point to ``report()``'s result.
        ``step``: the steps done (default ``steps``)."""
        pushes, staleness = self._session.pushes, self._session.staleness_total
        window = pushes - self._window_mark[0]
        mean_staleness = (staleness - self._window_mark[1]) / window if window else 0.0
        self._window_mark = (pushes, staleness)
        if gradients is None:
            gradients = self.gradients if self.declared else {}
        names = list(gradients)
        self._telemetry.record_window(
            self.steps if step is None else int(step), float(loss), int(samples),
            mean_staleness, self.versions[0] if self.versions else 0, names,
            [readable(gradients[n]).reshape(-1) for n in names])

    def record_evaluation(self, test_loss, test_accuracy=None, epochs_done=0, step=None):
        """Records an evaluation (the test/ scalars and ``report()``'s
        evaluation points) after ``epochs_done`` epochs at ``step`` (default
        ``steps``)."""
        self._telemetry.record_evaluation(
            int(epochs_done), self.steps if step is None else int(step), float(test_loss),
            None if test_accuracy is None else float(test_accuracy))

    # ---- the end -------------------------------------------------------
    def done(self):
        """Tells every shard this worker has finished, and ends the session:
        it only pulls from now on. Under pslaunch ($PSTRAIN_RESULT_FILE set)
        it also writes this worker's result, as ``report()`` with no metrics
        would, unless one was written already: a script need not report."""
        self._session.done()
        if not self._reported and os.environ.get(RESULT_FILE_ENV):
            self.report()

    def stats(self, shard=0):
        """Shard ``shard``'s statistics (psctl stats), as a dict."""
        return _numbers(json.loads(self._session.stats_json(shard)))

    def wait_for_workers(self, patience=None, poll=10.0):
        """Waits until every worker has reported done, or until the unfinished
        ones have been gone (out of the live set) for ``patience`` seconds
        (default training.pull_timeout_seconds). Returns shard 0's stats with
        ``missing_workers`` added: the workers given up on."""
        if patience is None:
            patience = float(self.config["training"]["pull_timeout_seconds"])
        deadline = time.monotonic() + patience
        known, wait = -1, 0.0
        while True:
            stats = _numbers(json.loads(self._session.await_workers_done_json(known, wait)))
            known = stats["worker_changes"]
            if stats["workers_done"] >= self.num_workers:
                stats["missing_workers"] = []
                return stats
            missing = [w["worker"] for w in stats["workers"]
                       if not w["done"] and (not w["live"] or w["seconds_since_seen"] < 0)]
            now = time.monotonic()
            if not missing:
                deadline = now + patience
            if now > deadline:
                stats["missing_workers"] = missing
                return stats
            wait = poll if not missing else min(poll, deadline - now)

    def report(self, path=None, **metrics):
        """Writes this worker's result (the JSON a C++ worker writes with
        --result_file) to ``path``, default ``$PSTRAIN_RESULT_FILE`` (set by
        pslaunch, which folds the workers' results into its summary); without
        either it only returns the result. Metrics: test_accuracy,
        test_loss, final_loss, samples, devices, and any WorkerResult field;
        steps, train_seconds and final_version default to this client's, and
        curve and evals to what record_window and record_evaluation kept."""
        result = {
            "task": self.task,
            "steps": self.steps,
            "train_seconds": (self._last_push - self._first_pull)
            if self._first_pull is not None and self._last_push is not None else 0.0,
            "final_version": self.versions[0] if self.versions else 0,
            "devices": "cpu",
        }
        recorded = _numbers(json.loads(self._telemetry.result_json))
        for points in ("curve", "evals"):
            if recorded.get(points):
                result[points] = recorded[points]
        result.update(metrics)
        if "test_accuracy" in metrics:
            result["has_test_accuracy"] = True
        if path is None:
            path = os.environ.get(RESULT_FILE_ENV)
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            with tempfile.NamedTemporaryFile("w", dir=folder, delete=False,
                                             prefix=".result-") as out:
                json.dump(result, out)
                out.write("\n")
            os.replace(out.name, path)
            self._reported = True
        return result

    # ---- helpers -------------------------------------------------------
    def _ordered(self, arrays, convert, what):
        # Every step passes through here: the session's own arrays (what
        # pstrain.torch pushes and pulls into) are taken as they are, and a
        # dict is looked up once per variable.
        if arrays is not None and (arrays is self._values or arrays is self._gradients):
            return self._own_lists[arrays is self._gradients]
        if isinstance(arrays, dict):
            names = self.names
            try:
                if len(arrays) == len(names):
                    return [convert(arrays[n]) for n in names]
            except KeyError:
                pass
            missing = [n for n in names if n not in arrays]
            if missing:
                raise KeyError(f"no {what} for variable(s) {', '.join(missing)}")
            known = set(names)
            extra = [n for n in arrays if n not in known]
            raise KeyError(f"{what} for undeclared variable(s) {', '.join(map(str, extra))}")
        return [convert(a) for a in arrays]

    @property
    def _own_lists(self):
        """The session's value and gradient arrays, in variable order."""
        if self._own is None:
            self._own = ([self.values[n] for n in self.names],
                         [self.gradients[n] for n in self.names])
        return self._own
