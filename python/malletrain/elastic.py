"""Elastic data-parallel training: a job that changes size in place while it trains.

A few lines turn an ordinary PyTorch training loop into an elastic one::

    import malletrain

    job = malletrain.init(logical_workers=4, seed=0)     # joins the job (env from `malletrain local`)
    model = job.wrap_model(model)                        # DDP engine, elastic comm hook
    optimizer = job.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
    for x, y in job.loader(dataset, batch_size=16, epochs=3):   # this rank's micro-batches
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    job.close()

The engine is C++ (``libmalle/elastic/engine.h``, the same one C++ programs use): membership,
step boundaries, logical workers and their random streams, the exactly-once sampler, gradient
and buffer synchronisation, rollback of a failed step, the job state and its transfer to
joiners, the profiling advisor. This module adapts PyTorch objects to it: the model's tensors,
the optimizer's ``state_dict`` and tracked objects as parts of the job state; the loaders
(:mod:`malletrain.data`) fetch each micro-batch under its logical worker's random stream.
docs/elastic.md has the semantics.
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional

import torch

from malletrain import _C
from malletrain import state as _state
from malletrain import data as _data
from malletrain.optim import ElasticModel, ElasticOptimizer
from malletrain.errors import MalleError, MalleValueError

__all__ = ["ElasticJob", "ElasticModel", "ElasticOptimizer", "ResizeEvent",
           "init", "progress_key"]

log = logging.getLogger("malletrain")


def progress_key(job_id: str) -> str:
    """Store key where rank 0 publishes the number of committed steps (ASCII)."""
    return _C.progress_key(job_id)


# One membership change as this rank saw it (the engine's, libmalle/elastic/engine.h): kind
# (bootstrap, joined, planned, recovered, ...), generation, size, rank, resume_step, joined,
# removed, reason; state_bytes received or sent, of which state_in_place (straight into this
# rank's tensors) and state_landed (into memory faulted in while warming up); across node
# boundaries state_received_remote, state_sent_remote, state_sent_local; phases: seconds of
# detect, wait, agree, build, sync, state, total.
ResizeEvent = _C.ResizeEvent


class ElasticJob:
    """This process's membership in an elastic job. Use :func:`init` to create one."""

    def __init__(self, *, logical_workers: Optional[int], seed: int = 0,
                 deterministic: bool = False, lr_scaling: Optional[str] = None,
                 store: Optional[str] = None, job_id: Optional[str] = None,
                 member_id: Optional[str] = None, bootstrap_size: Optional[int] = None,
                 heartbeat_timeout: float = 2.0, recovery_grace: float = 0.5,
                 heartbeat_interval: float = 0.1, rendezvous_timeout: float = 60.0,
                 op_timeout: float = 60.0, bucket_cap_mb: float = 25.0,
                 print_scaling: bool = False, max_recoveries_without_commit: int = 16,
                 backend: Optional[str] = None, park_dir: Optional[str] = None,
                 snapshot_every: int = 0, resume_from: Optional[str] = None,
                 handle_sigterm: bool = True) -> None:
        if logical_workers is not None and (isinstance(logical_workers, bool) or
                                            not isinstance(logical_workers, int) or
                                            logical_workers < 1):
            raise MalleValueError(
                f"logical_workers: must be a positive integer or None, got {logical_workers!r}")
        # Who started this process (libmalle/cluster/rank_env.h, docs/elastic.md): explicit
        # arguments, then MALLE_* (malletrain's launchers and agents), then torchrun's
        # variables, then srun's. Under torchrun and srun the job has a fixed size.
        environ = dict(os.environ)
        for key, value in ((_C.ENV_STORE, store), (_C.ENV_JOB_ID, job_id),
                           (_C.ENV_MEMBER_ID, member_id)):
            if value is not None:
                environ[key] = value
        if bootstrap_size is not None:
            environ[_C.ENV_BOOTSTRAP_SIZE] = str(bootstrap_size)
        launch = _C.read_launch_env(environ)  # MalleValueError naming the variable
        env = launch.rank
        self.launcher = launch.launcher
        # Under torchrun and srun no process outlives the ranks: task 0 hosts the control
        # store, and close() keeps it up until every member has closed (launch_session.h).
        self._session = _C.LaunchSession.open(launch, timeout=rendezvous_timeout)
        self._op_timeout = float(op_timeout)
        self.logical_workers = logical_workers
        self.seed = int(seed)
        self.deterministic = bool(deterministic)
        self.job_id = env.job_id
        member = env.member_id or _C.generated_member_id()
        self.local_rank = env.local_rank
        self.local_world_size = max(1, env.local_world_size)
        if park_dir is not None:
            env.park_dir = os.fspath(park_dir)
        env.member_id = member
        self.backend = backend if backend is not None else env.backend or "gloo"
        self.device: Optional[torch.device] = None
        if self.backend == "nccl":
            # One GPU per rank: a node with N slots runs LOCAL_RANK 0..N-1 on devices 0..N-1
            # of those it sees (MalleValueError naming the problem when there is none).
            index = _C.rank_cuda_device(env, torch.cuda.device_count() if torch.cuda.is_available() else 0)
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)
        # Joining is deferred to the first step: a joiner builds its model, optimizer and
        # data first, so the running members' pause covers only agreement, group build and
        # state transfer. The engine checks its options before it dials the store; its park
        # store and its reports to the allocator come from the environment (rank_engine.h).
        self._engine = _C.Engine(
            env, rendezvous_timeout=rendezvous_timeout, op_timeout=op_timeout,
            heartbeat_interval=heartbeat_interval, heartbeat_timeout=heartbeat_timeout,
            recovery_grace=recovery_grace,
            max_recoveries_without_commit=max_recoveries_without_commit, backend=self.backend,
            logical_workers=logical_workers or 0, lr_scaling=lr_scaling or "", seed=self.seed,
            deterministic=self.deterministic, bucket_bytes=max(1, int(bucket_cap_mb * 1024 * 1024)),
            snapshot_every=int(snapshot_every), resume_from=os.fspath(resume_from or ""))
        self._member_id = member
        self.control_job = env.control_job or None
        self.print_scaling = bool(print_scaling) or os.environ.get("MALLE_PRINT_SCALING") == "1"
        self._model: Optional[ElasticModel] = None
        self._optimizer: Optional[ElasticOptimizer] = None
        self._tracked: List[str] = []
        self._history: List[ResizeEvent] = []
        self._callbacks: List[Any] = []
        self._serial = 0  # micro-batches started by this process (ElasticOptimizer's clock)
        self._told = 0    # history events already given to the callbacks
        self.closed = False
        # SIGTERM (a node reclaimed with a grace period, a Slurm preemption, an allocator
        # stopping the job) becomes a leave at the next step boundary; the job's last member
        # parks the state instead of losing it.
        self._sigterm = False
        self._stopped = False  # SIGTERM before this rank joined: it just stops
        self._old_sigterm: Any = None
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        self._sigterm = True

    # --- what a rank can look at (-1 / 0 before joining) --------------------------
    rank = property(lambda self: self._engine.rank)
    size = property(lambda self: self._engine.size)
    generation = property(lambda self: self._engine.generation)
    step = property(lambda self: self._engine.step, doc="The step being run (or next to run).")
    workers = property(lambda self: self._engine.workers,
                       doc="The logical workers this rank runs in the current generation.")
    micro_batch = property(lambda self: self._engine.micro_batch,
                           doc="Index of the current micro-batch within this rank's share.")
    redone_steps = property(lambda self: self._engine.redone_steps,
                            doc="Steps this rank started again (a failed step redone).")
    left = property(lambda self: self._engine.left or self._stopped)
    parked = property(lambda self: self._engine.parked,
                      doc="This rank was the job's last, was asked to leave, and parked its state.")
    resumed_from = property(lambda self: self._engine.resumed_from,
                            doc="The parked state or checkpoint this job resumed from ('' if none).")

    @property
    def member_id(self) -> str:
        return self._member_id

    @property
    def history(self) -> List[ResizeEvent]:
        """One :class:`ResizeEvent` per membership change this rank went through."""
        while len(self._history) < self._engine.history_size:
            self._history.append(self._engine.history(len(self._history)))
        return self._history

    # --- wrapping ----------------------------------------------------------------------
    def wrap_model(self, model: torch.nn.Module) -> ElasticModel:
        """Wraps ``model`` (once per job). Parameters must be dense, on one device."""
        if self._model is not None:
            raise MalleValueError("wrap_model: this job already has a model")
        # Parameters and buffers become views of one flat buffer per dtype and device (the
        # Parameter objects stay the same): a state transfer sends it as it is.
        self._engine.set_model(list(model.named_parameters()), list(model.named_buffers()))
        self._model = ElasticModel(model)
        return self._model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> ElasticOptimizer:
        """Wraps ``optimizer`` (once per job, after :meth:`wrap_model`)."""
        if self._model is None:
            raise MalleValueError("wrap_optimizer: call wrap_model first")
        if self._optimizer is not None:
            raise MalleValueError("wrap_optimizer: this job already has an optimizer")
        model_params = {id(p) for p in self._model.module.parameters()}
        if any(id(p) not in model_params for g in optimizer.param_groups for p in g["params"]):
            raise MalleValueError(
                "wrap_optimizer: the optimizer has a parameter that is not in the model")
        self._optimizer = ElasticOptimizer(self, optimizer)

        def restore_groups(_: Any, b: bytes) -> None:
            for g, g0 in zip(optimizer.param_groups, _state.from_part([], b)):
                g.update(g0)

        # Its state changes only when a step commits; its hyperparameters (a scheduler sets
        # the learning rate) after any step: those are what a failed step gives back.
        self._engine.add_part(
            "optimizer", lambda: _state.to_part(optimizer.state_dict()),
            lambda ts, b: optimizer.load_state_dict(_state.from_part(ts, b)),
            lambda: _state.to_part([{k: v for k, v in g.items() if k != "params"}
                                    for g in optimizer.param_groups]),
            restore_groups)
        # A joiner faults in, now, the memory the state it will receive lands in.
        self._engine.prepare_landing()
        return self._optimizer

    def track(self, name: str, obj: Any) -> None:
        """Adds ``obj`` (anything with ``state_dict()``/``load_state_dict()``, e.g. an LR
        scheduler) to the job state: joiners receive it, and a step that does not commit
        gives it back the state it had when the step started."""
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise MalleValueError(f"track({name!r}): object has no state_dict/load_state_dict")
        if name in self._tracked:
            raise MalleValueError(f"track: name {name!r} is already tracked")
        load = lambda ts, b: obj.load_state_dict(_state.from_part(ts, b))  # noqa: E731
        self._engine.add_part(f"track:{name}", lambda: _state.to_part(obj.state_dict()), load,
                              lambda: _state.to_part(copy.deepcopy(obj.state_dict())), load)
        self._tracked.append(name)

    def wrap_scaler(self, scaler: Any) -> Any:
        """Wraps a ``torch.amp.GradScaler`` (CUDA or CPU) for this job and tracks its state
        (scale, growth tracker) as job state. See :class:`malletrain.amp.ElasticGradScaler`."""
        from malletrain.amp import ElasticGradScaler
        self._require_wrapped()
        wrapped = ElasticGradScaler(self, scaler)
        self.track("grad_scaler", scaler)
        return wrapped

    def add_callback(self, callback: Any) -> None:
        """Calls ``callback.on_resize(job, event)`` after each membership change this rank
        goes through (before the step that follows it) and ``callback.on_step_end(job,
        step)`` after each step that committed, on every rank (``job.rank == 0`` to act
        once). Either method may be missing. See :mod:`malletrain.callbacks`."""
        self._callbacks.append(callback)

    def _step_committed(self) -> None:
        step = self._engine.step - 1  # Commit() moved on to the next step
        for cb in self._callbacks:
            fn = getattr(cb, "on_step_end", None)
            if fn is not None:
                fn(self, step)

    def _begin_micro_batch(self, i: int) -> None:
        if i == 0 and self._optimizer is not None:
            self._optimizer.__dict__["_synced"] = None
            if self._callbacks and self._told < self._engine.history_size:
                events = self.history
                for ev in events[self._told:]:
                    for cb in self._callbacks:
                        fn = getattr(cb, "on_resize", None)
                        if fn is not None:
                            fn(self, ev)
                self._told = len(events)
        self._serial += 1
        self._engine.begin_micro_batch(i)  # torch's RNG (model stream), buffers, arms the reduction

    def loader(self, dataset: Any, batch_size: int, *, steps: Optional[int] = None,
               epochs: Optional[float] = None, shuffle: bool = True, num_workers: int = 0,
               collate_fn: Optional[Callable[[List[Any]], Any]] = None,
               pin_memory: bool = False, drop_last: bool = True,
               persistent_workers: bool = False) -> "_data.ElasticLoader":
        """This rank's micro-batches of a dataset, step after step.

        ``batch_size`` is per logical worker. Give ``steps`` or ``epochs``. With ``epochs``,
        ``drop_last=True`` trains the whole steps that fit (the tail of the last epoch is
        not trained); ``drop_last=False`` one more step when a tail is left, completed from
        the next epoch's order (as ``DistributedSampler`` pads). ``num_workers``,
        ``pin_memory`` and ``persistent_workers`` go to the ``DataLoader`` underneath (its
        worker processes then live across steps and resizes).

        A map-style dataset (``len()`` and ``[index]``) is sampled exactly once per epoch.
        An ``IterableDataset`` is one stream of samples: step ``s`` trains its samples
        ``[s*L*B, (s+1)*L*B)``, logical worker ``k`` the ``k``-th ``B`` of them; it needs
        ``steps`` and a resumable position: ``state_dict()`` / ``load_state_dict()`` on the
        dataset (torchdata's ``Stateful`` protocol; docs/elastic.md, "Data"), which becomes
        job state. Without one it is refused (``MalleValueError``).

        Iterating the loader yields micro-batches; :meth:`ElasticLoader.steps` yields steps
        (``len()`` of it is the number of steps, for progress bars).
        """
        if isinstance(dataset, torch.utils.data.IterableDataset):
            return _data.StreamLoader(self, dataset, batch_size, steps=steps, epochs=epochs,
                                     collate_fn=collate_fn, num_workers=num_workers)
        return _data.ElasticLoader(self, dataset, batch_size, steps=steps, epochs=epochs,
                                  shuffle=shuffle, num_workers=num_workers, collate_fn=collate_fn,
                                  pin_memory=pin_memory, drop_last=drop_last,
                                  persistent_workers=persistent_workers)

    def _require_wrapped(self) -> None:
        """Raises MalleValueError until the model and the optimizer are wrapped."""
        if self._model is None or self._optimizer is None:
            raise MalleValueError("ElasticJob: wrap_model and wrap_optimizer before training")

    # --- state, advisor, end ----------------------------------------------------------
    def state_digest(self) -> str:
        """A hash of parameters, buffers and optimizer state (equal on every replica)."""
        self._require_wrapped()
        return self._engine.state_digest()

    def scaling_report(self) -> Optional[Dict[str, Any]]:
        """The profiling advisor's report (docs/advisor.md): predicted samples/s with bands for
        every size in the job's range, resize costs, marginal gains; None before a step."""
        import json
        text = self._engine.report_json()
        return json.loads(text) if text else None

    def scaling_table(self) -> str:
        """The advisor's report as a human-readable table ('' before the first step)."""
        return self._engine.report_table()

    def join(self) -> None:
        """Joins the job now (the loader does it at its first step; call this only to know
        rank and size earlier)."""
        self._engine.join()

    def save(self, path: "str | os.PathLike[str]") -> None:
        """Writes the job state (model, optimizer, tracked objects, data position, step) to
        ``path`` between two steps: a checkpoint of your own, in the park store's format
        (signed with the deployment secret when there is one).
        ``malletrain.init(..., resume_from=path)`` starts a job from it."""
        self._require_wrapped()
        self._engine.save(os.fspath(path))

    def export(self, path: "str | os.PathLike[str]") -> None:
        """Writes what plain PyTorch loads: ``torch.save({"model": state_dict(), "optimizer":
        state_dict(), "step": ...})``, so a trained model leaves malletrain easily."""
        self._require_wrapped()
        assert self._model is not None and self._optimizer is not None
        torch.save({"model": self._model.module.state_dict(),
                    "optimizer": self._optimizer.optimizer.state_dict(), "step": self.step},
                   os.fspath(path))

    def leave(self) -> None:
        """Asks to leave the job at the next step boundary (the loader then stops)."""
        self._require_wrapped()
        self._engine.request_leave()

    def finish(self) -> None:
        """A last step boundary, so that no member exits while the others still need it."""
        if not self.closed:
            self._engine.finish()

    def close(self) -> None:
        """Releases the group (a member still in it makes the others recover at once)."""
        if not self.closed:
            size = self._engine.size
            self._engine.close()
            if self._old_sigterm is not None and \
                    threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._old_sigterm)
            try:
                self._session.close(size, timeout=self._op_timeout)
            except MalleError as e:  # the store is gone, or members did not close in time
                warnings.warn(f"malletrain: {e}", RuntimeWarning, stacklevel=2)
        self.closed = True


def init(logical_workers: Optional[int] = None, *, seed: int = 0, deterministic: bool = False,
         lr_scaling: Optional[str] = None, **kwargs: Any) -> ElasticJob:
    """Joins this process to its elastic job and returns the :class:`ElasticJob`.

    Args:
        logical_workers: ``L``, the job's fixed number of logical workers (constant global
            batch; the job never has more ranks than this). ``None`` needs ``lr_scaling``.
        seed: seeds the data order and every logical worker's random streams.
        deterministic: bitwise-reproducible results whatever the schedule (costs ``L`` times
            the gradient traffic and memory; needs the same torch thread count on every rank).
        lr_scaling: ``"linear"`` or ``"sqrt"``: the global batch follows the world size and
            the learning rate is rescaled at each resize.
        **kwargs: ``store`` ('host:port'), ``job_id``, ``member_id``, ``bootstrap_size``
            (default from ``MALLE_STORE``, ``MALLE_JOB_ID``, ``MALLE_MEMBER_ID``,
            ``MALLE_BOOTSTRAP_SIZE``, which ``malletrain local`` sets), the timeouts
            ``heartbeat_interval``, ``heartbeat_timeout``, ``recovery_grace``,
            ``rendezvous_timeout``, ``op_timeout`` (seconds), ``bucket_cap_mb``,
            ``print_scaling`` (rank 0 prints the advisor's scalability table at the end; also
            ``MALLE_PRINT_SCALING=1``), ``max_recoveries_without_commit`` (default 16) and
            ``backend`` (default ``MALLE_BACKEND`` or ``"gloo"``): what reduces a CUDA model's
            gradients, ``"nccl"`` (one GPU per rank) or ``"gloo"`` (through host memory).
            On NCCL the rank uses CUDA device ``LOCAL_RANK`` (``torch.cuda.set_device``; a
            node agent with ``--slots N`` starts ``LOCAL_RANK`` 0..N-1; the device is
            :attr:`ElasticJob.device`); a rank with no device for it raises MalleValueError.
            Parking (docs/elastic.md): ``park_dir`` (default ``MALLE_PARK_DIR``), the job's
            park store, where its last member parks the state and snapshots go, and what a
            new incarnation resumes from; ``snapshot_every`` (0: adaptive, under 1 % of the
            step time; < 0: none); ``resume_from``: a file written by :meth:`ElasticJob.save`;
            ``handle_sigterm`` (default True): SIGTERM leaves at the next step boundary.

    Raises:
        MalleValueError: bad arguments (e.g. fewer logical workers than the starting size).
        StoreError / MalleTimeoutError: the control store or the rendezvous failed.
    """
    return ElasticJob(logical_workers=logical_workers, seed=seed, deterministic=deterministic,
                      lr_scaling=lr_scaling, **kwargs)
