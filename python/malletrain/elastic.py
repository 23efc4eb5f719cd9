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
the optimizer's ``state_dict`` and tracked objects as parts of the job state, a ``DataLoader``
over the user's dataset that fetches each micro-batch under its logical worker's random
stream. docs/elastic.md has the semantics.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import random
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from malletrain import _C
from malletrain import state as _state
from malletrain.errors import MalleError, MalleValueError, StoreError

__all__ = ["ElasticJob", "ElasticLoader", "ElasticModel", "ElasticOptimizer", "ResizeEvent",
           "init", "progress_key"]

log = logging.getLogger("malletrain")


def progress_key(job_id: str) -> str:
    """Store key where rank 0 publishes the number of committed steps (ASCII)."""
    return _C.progress_key(job_id)


@dataclass
class ResizeEvent:
    """One membership change as this rank saw it."""

    kind: str                 # bootstrap, joined, planned, recovered
    generation: int
    size: int
    rank: int
    resume_step: int
    joined: List[str]
    removed: List[str]
    state_bytes: int          # bytes of job state received or sent (0: no transfer needed)
    # seconds: detect, wait (for the others to end the step in flight; every boundary pays
    # it), agree, build, sync (membership), state, total
    phases: Dict[str, float]
    reason: str = ""
    state_in_place: int = 0   # of state_bytes, received straight into this rank's own buffers
    state_landed: int = 0     # of state_bytes, received into memory faulted in while warming up
    # Across node boundaries (MALLE_NODE; an unknown node counts as another): state bytes
    # received from a rank on another node (summed over the ranks: the bytes the transfer put
    # on the network), sent to ranks on other nodes, and sent to ranks on this rank's node (a
    # node's first joiner copies what it received to the others there).
    state_received_remote: int = 0
    state_sent_remote: int = 0
    state_sent_local: int = 0


def _seed_python(seed: int) -> None:
    """Python's and NumPy's global RNGs (torch's are the engine's business)."""
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % (2**32))


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name) or default


class ElasticModel(torch.nn.Module):
    """The user's module; its gradients are reduced by the engine (c10d's Reducer with the
    elastic comm hook, armed for each step's last micro-batch). Call it like the module;
    ``.module`` is the wrapped module (save its ``state_dict()``)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class ElasticOptimizer(torch.optim.Optimizer):
    """Wraps a ``torch.optim`` optimizer so the training loop stays a plain DDP loop.

    It *is* an ``Optimizer`` (LR schedulers take it directly) whose ``param_groups``,
    ``state`` and hooks are the wrapped one's. ``step()`` and ``zero_grad()`` act once per
    step: ``zero_grad()`` before the first backward of this rank's micro-batches, ``step()``
    after the last one, and only if the gradient synchronisation succeeded: then the step
    *commits*. ``step()`` returns True on the call that committed the step, False on the
    others (more micro-batches to come, or a failed synchronisation: the step runs again);
    with a closure it returns the closure's loss (the closure runs once per micro-batch).

    The full gradient: :meth:`synchronize` (True once per step, when ``.grad`` holds the
    step's synchronised gradient, averaged over the logical workers) and
    :meth:`clip_grad_norm_`; hooks registered with ``register_step_pre_hook`` see it too,
    once per committed step. ``.optimizer`` is the torch optimizer.
    """

    # Not Optimizer.__init__: the state, param_groups and hooks are the wrapped optimizer's.
    def __init__(self, job: "ElasticJob", optimizer: torch.optim.Optimizer) -> None:
        if isinstance(optimizer, torch.optim.LBFGS):
            raise MalleValueError("wrap_optimizer: LBFGS re-evaluates its closure within one "
                                  "step, which needs a synchronised gradient per evaluation")
        self.__dict__["optimizer"] = optimizer
        self.__dict__["_job"] = job
        # The micro-batch (job serial) whose end was told to the engine, and the result of
        # this step's synchronisation (None: not synchronised yet).
        self.__dict__["_ended"] = -1
        self.__dict__["_synced"] = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["optimizer"], name)

    def __repr__(self) -> str:
        return f"ElasticOptimizer({self.optimizer!r})"

    def __getstate__(self) -> Dict[str, Any]:
        raise TypeError("ElasticOptimizer: pickle .optimizer (or its state_dict()) instead")

    @property
    def param_groups(self) -> List[Dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self) -> Dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        raise MalleValueError("ElasticOptimizer: parameter groups are fixed once wrapped")

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._job._engine.micro_batch > 0:
            return  # accumulating over this rank's logical workers
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def _last_micro_batch(self) -> bool:
        e = self._job._engine
        return e.micro_batch + 1 >= len(e.workers)

    def synchronize(self) -> bool:
        """Ends this micro-batch's backward; after the step's last one, synchronises the
        gradients (once). True: ``.grad`` now holds the step's full gradient (the average
        over the L logical workers, the same on every rank; in deterministic mode too):
        clip it, log its norm, change it, then ``step()``. False: not the last micro-batch
        (gradients are still accumulating) or the synchronisation failed (a peer died; the
        step will run again). Blocks for the collectives. Calling it again in the same
        micro-batch returns the same answer."""
        e = self._job._engine
        if e.micro_batch < 0:
            raise MalleValueError("optimizer.step(): called before any micro-batch of this step")
        serial = self._job._serial
        if self._ended != serial:
            e.end_micro_batch()
            self.__dict__["_ended"] = serial
        if not self._last_micro_batch():
            return False
        if self._synced is None:
            self.__dict__["_synced"] = bool(e.synchronize())
        return self._synced

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False,
                        foreach: Optional[bool] = None) -> Optional[torch.Tensor]:
        """``torch.nn.utils.clip_grad_norm_`` of the full synchronised gradient, once per
        step: on the step's last micro-batch, after :meth:`synchronize`, over every
        parameter of the optimizer. Returns the total norm before clipping, or None on the
        other micro-batches and when the synchronisation failed (nothing to clip)."""
        if not self.synchronize():
            return None
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type,
                                              error_if_nonfinite=error_if_nonfinite,
                                              foreach=foreach)

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        committed = self._finish_step(lambda: self.optimizer.step())
        return loss if closure is not None else committed

    def _finish_step(self, update: Callable[[], Any]) -> bool:
        """Ends the micro-batch; after the last one, if the step synchronised, runs
        ``update`` (the optimizer's step, or the scaler's) and commits. True if committed."""
        if not self.synchronize():
            return False  # not committed; the next boundary rolls back and redoes it
        update()
        self.__dict__["_opt_called"] = True  # what an LR scheduler checks (torch's step patch)
        self._job._engine.commit()
        self.__dict__["_synced"] = None
        self._job._step_committed()
        return True

    def state_dict(self) -> Dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        self.optimizer.load_state_dict(sd)


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
        self._store_server: Any = None
        if launch.host_store:
            # No process outlives the ranks here (srun, a hand-made env:// launch): task 0
            # hosts the control store for the job's life, and close() keeps it up until
            # every member has closed.
            try:
                self._store_server = _C.ControlStore.serve(launch.store_bind, env.store_port,
                                                           timeout=rendezvous_timeout)
            except MalleError as e:
                raise StoreError(f"{e} (rank 0 of this {launch.launcher} job hosts the control "
                              f"store at {env.store}, from {launch.store_from}; set "
                              f"MASTER_PORT to choose another port)") from e
        self._closed_key = (f"malle/job/{env.job_id}/closed"
                            if launch.launcher != "malletrain" else "")
        self._op_timeout = float(op_timeout)
        self.logical_workers = logical_workers
        self.seed = int(seed)
        self.deterministic = bool(deterministic)
        self.job_id = env.job_id
        member = env.member_id or _C.generated_member_id()
        self.local_rank = env.local_rank
        self.local_world_size = max(1, env.local_world_size)
        self.device: Optional[torch.device] = None
        if (backend if backend is not None else env.backend or "gloo") == "nccl":
            # One GPU per rank: a node with N slots runs LOCAL_RANK 0..N-1 on devices 0..N-1
            # of those it sees (MalleValueError naming the problem when there is none).
            env.member_id = member
            index = _C.rank_cuda_device(env, torch.cuda.device_count() if torch.cuda.is_available() else 0)
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)
        # Joining is deferred to the first step: a joiner builds its model, optimizer and
        # data first, so the running members' pause covers only agreement, group build and
        # state transfer. The engine checks its options before it dials the store.
        self._engine = _C.Engine(
            env.store_host, env.store_port, job_id=self.job_id, member_id=member, bootstrap_size=env.bootstrap_size,
            rendezvous_timeout=rendezvous_timeout, op_timeout=op_timeout,
            heartbeat_interval=heartbeat_interval, heartbeat_timeout=heartbeat_timeout,
            recovery_grace=recovery_grace,
            max_recoveries_without_commit=max_recoveries_without_commit,
            logical_workers=logical_workers or 0, lr_scaling=lr_scaling or "", seed=self.seed,
            deterministic=self.deterministic,
            bucket_bytes=max(1, int(bucket_cap_mb * 1024 * 1024)),
            state_direct_min_bytes=int(_env("MALLE_STATE_DIRECT_MIN_BYTES", str(1 << 20))),
            control_job=env.control_job, secret_path=env.control_secret,
            min_nodes=max(1, env.min_nodes), max_nodes=env.max_nodes,
            report_interval=float(_env("MALLE_REPORT_INTERVAL", "5")),
            fault_exit_in_state_sync=_env("MALLE_FAULT_EXIT_IN_STATE_SYNC"),
            backend=backend if backend is not None else env.backend or "gloo",
            park_dir=park_dir if park_dir is not None else env.park_dir,
            snapshot_every=int(snapshot_every), resume_from=os.fspath(resume_from or ""),
            ranks_per_node=self.local_world_size, node=env.node)
        self.backend = backend if backend is not None else env.backend or "gloo"
        self._engine_store = env.store
        self._member_id = member
        self.control_job = env.control_job or None
        self.print_scaling = bool(print_scaling) or _env("MALLE_PRINT_SCALING") == "1"
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
            e = self._engine.history(len(self._history))
            self._history.append(ResizeEvent(
                e.kind, e.generation, e.size, e.rank, e.resume_step, list(e.joined),
                list(e.removed), e.state_bytes, e.phases, e.reason, e.state_in_place,
                e.state_landed, e.state_received_remote, e.state_sent_remote, e.state_sent_local))
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
               persistent_workers: bool = False) -> "ElasticLoader":
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
            from malletrain.data import StreamLoader
            return StreamLoader(self, dataset, batch_size, steps=steps, epochs=epochs,
                                collate_fn=collate_fn, num_workers=num_workers)
        if not drop_last:
            if epochs is None:
                raise MalleValueError("drop_last=False: only with epochs= (steps= is exact)")
            if self.logical_workers is None:
                raise MalleValueError("drop_last=False: needs logical_workers (epochs= does)")
            n = len(dataset) if hasattr(dataset, "__len__") else 0
            steps = int(math.ceil(epochs * n / (self.logical_workers * batch_size) - 1e-9))
            epochs = None
        return ElasticLoader(self, dataset, batch_size, steps=steps, epochs=epochs,
                             shuffle=shuffle, num_workers=num_workers, collate_fn=collate_fn,
                             pin_memory=pin_memory, persistent_workers=persistent_workers)

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
            if self._closed_key:
                self._count_closed(size)
        self.closed = True

    def _count_closed(self, size: int) -> None:
        """Under torchrun and srun: says this member is done; the member that hosts the
        store waits (op_timeout at most) for the last generation's ``size`` members."""
        try:
            if self._store_server is None:
                _C.open_store(self._engine_store, timeout=self._op_timeout).add(
                    self._closed_key, 1)
                return
            closed = self._store_server.add(self._closed_key, 1)
            deadline = time.monotonic() + self._op_timeout
            while closed < size and time.monotonic() < deadline:
                time.sleep(0.05)
                closed = self._store_server.add(self._closed_key, 0)
            if closed < size:
                warnings.warn(f"malletrain: closing the control store this process hosts "
                              f"with {size - closed} of {size} members not closed after "
                              f"{self._op_timeout:g} s", RuntimeWarning, stacklevel=3)
        except MalleError as e:  # the store is gone: nothing left to wait for
            warnings.warn(f"malletrain: could not count this member as closed: {e}",
                          RuntimeWarning, stacklevel=3)
        finally:
            self._store_server = None


class _Boundary:
    """What every loader does between steps: the step boundary and the plan (shared by the
    map-style :class:`ElasticLoader` and the stream loader of malletrain.data)."""

    job: "ElasticJob"
    _plan: Any = None

    def steps(self) -> "_StepIter":
        """Iterates steps instead of micro-batches: each item is one step, itself an
        iterable of this rank's micro-batches of it; ``len()`` is the number of steps left,
        so ``tqdm(loader.steps())`` counts steps. Per-step work goes after the inner loop
        (it runs on every rank, committed step or not: track what it changes)."""
        return _StepIter(self)

    def _next_plan(self) -> Optional[Any]:
        """Runs the step boundary if the current step's micro-batches are all served; the
        plan of the step to serve (None at the end)."""
        job, e = self.job, self.job._engine
        if self._plan is not None and e.micro_batch + 1 < len(self._plan.workers):
            return self._plan
        if e.in_step:
            raise MalleValueError(f"optimizer.step() was not called after the last "
                                  f"micro-batch of step {e.step}")
        if job._sigterm and not e.left:
            job._sigterm = False
            if e.rank < 0:  # not a member yet: nothing to leave, no state to keep
                job._stopped = True
                self._plan = None
                return None
            e.request_leave()  # leaves at this boundary (the last member parks)
        plan = e.next_step()  # rolls back a failed step, runs the boundary
        if plan is None:
            self._plan = None
            if not job.left and job.print_scaling and job.rank == 0:
                print(job.scaling_table(), flush=True)
            return None
        if plan.lr_rescale != 1.0:  # the global batch follows the world size
            for g in job._optimizer.optimizer.param_groups:
                g["lr"] = g["lr"] * plan.lr_rescale
        self._plan = plan
        self._new_plan(plan)
        return plan

    def _new_plan(self, plan: Any) -> None:
        raise NotImplementedError


class _StepIter:
    def __init__(self, loader: _Boundary) -> None:
        self._loader = loader
        e = loader.job._engine
        self._len = max(0, loader.total_steps - max(0, e.step))

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> "_StepIter":
        iter(self._loader)
        return self

    def __next__(self) -> Iterator[Any]:
        first = next(self._loader)  # the boundary; StopIteration at the end
        return self._micro_batches(first)

    def _micro_batches(self, first: Any) -> Iterator[Any]:
        yield first
        job = self._loader.job
        while job.micro_batch + 1 < len(job.workers):
            yield next(self._loader)


class ElasticLoader(_Boundary):
    """Yields this rank's micro-batches, step after step, across resizes.

    Each step it first runs the step boundary (joins, leaves and failures take effect there,
    and a failed step is redone), then yields one micro-batch per logical worker of this
    rank. Iterate it once. It has no ``len()`` (this rank's micro-batches per step change
    with the size); ``total_steps`` is the number of steps and :meth:`steps` iterates them.
    Created by :meth:`ElasticJob.loader`.
    """

    def __init__(self, job: ElasticJob, dataset: Any, batch_size: int, *, steps: Optional[int],
                 epochs: Optional[float], shuffle: bool, num_workers: int,
                 collate_fn: Optional[Callable[[List[Any]], Any]], pin_memory: bool,
                 persistent_workers: bool = False) -> None:
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise MalleValueError("dataset: must be map-style (len() and [index]) or a "
                                  "torch.utils.data.IterableDataset")
        if num_workers < 0:
            raise MalleValueError(f"num_workers: must be >= 0, got {num_workers}")
        if persistent_workers and num_workers == 0:
            raise MalleValueError("persistent_workers: needs num_workers > 0")
        job._engine.set_data(len(dataset), batch_size, steps, epochs, shuffle)
        self.job = job
        self.dataset = dataset
        self.total_steps = job._engine.total_steps
        self.batch_size = batch_size
        # One DataLoader for the job: its sampler serves the keys of the plan in force, and
        # with persistent_workers its worker processes live across steps and resizes.
        self._sampler = _Keys()
        self._dl = torch.utils.data.DataLoader(
            _MicroBatches(dataset, collate_fn), sampler=self._sampler, batch_size=None,
            collate_fn=_as_fetched, num_workers=num_workers, pin_memory=pin_memory,
            persistent_workers=persistent_workers)
        self._it: Optional[Iterator[Any]] = None
        self._it_key: Optional[tuple] = None  # (step, workers, position, size) served next
        self._plan: Any = None
        self._started = False

    def __iter__(self) -> "ElasticLoader":
        self.job._require_wrapped()
        if self._started:
            raise MalleValueError("ElasticLoader: iterate it only once")
        self._started = True
        return self

    def _keys(self, first: int, workers: List[int], position: int, size: int
              ) -> Iterator[Tuple[int, List[int]]]:
        """(data seed, indices) of this rank's micro-batches from step ``first`` on, for a
        membership of ``size`` ranks (bound now: the iterator never follows later changes)."""
        e = self.job._engine
        for s in range(first, self.total_steps):
            pos = position + (s - first) * size * self.batch_size  # follow mode's stream
            for k in workers:
                yield e.batch_key(s, k, pos)

    def _new_plan(self, plan: Any) -> None:
        job, e = self.job, self.job._engine
        workers = [w.worker for w in plan.workers]
        key = (plan.step, tuple(workers), e.position, plan.size)
        if self._it is None or key != self._it_key:
            # One item per micro-batch, fetched and collated under its logical worker's
            # data stream by the DataLoader (or its worker process).
            self._sampler.gen = self._keys(*key)
            self._it = iter(self._dl)
        pos = e.position + (plan.size * self.batch_size if job.logical_workers is None else 0)
        self._it_key = (plan.step + 1, tuple(workers), pos, plan.size)  # what it serves next

    def __next__(self) -> Any:
        job, e = self.job, self.job._engine
        if self._next_plan() is None:
            raise StopIteration
        t0 = time.perf_counter()
        batch = next(self._it)
        e.add_data_wait(time.perf_counter() - t0)
        i = e.micro_batch + 1
        job._begin_micro_batch(i)
        _seed_python(self._plan.workers[i].rng_seed)
        return batch


class _Keys:
    """A DataLoader sampler over the generator of (data seed, indices) keys in force."""

    def __init__(self) -> None:
        self.gen: Iterator[Tuple[int, List[int]]] = iter(())

    def __iter__(self) -> Iterator[Tuple[int, List[int]]]:
        return self.gen


class _MicroBatches(torch.utils.data.Dataset):
    """The user's dataset one micro-batch at a time: ``[(seed, indices)]`` seeds torch,
    ``random`` and NumPy with the logical worker's data stream, then fetches and collates,
    in the process that fetches (the loop's, or a DataLoader worker's). So every draw of
    ``__getitem__`` and ``collate_fn`` belongs to the logical worker, whatever the physical
    size and ``num_workers``."""

    def __init__(self, dataset: Any, collate_fn: Optional[Callable[[List[Any]], Any]]) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn or torch.utils.data.default_collate

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Tuple[int, List[int]]) -> Any:
        seed, indices = key
        torch.manual_seed(seed)
        _seed_python(seed)
        getitems = getattr(self.dataset, "__getitems__", None)
        samples = getitems(indices) if getitems is not None else [self.dataset[i] for i in indices]
        return self.collate_fn(samples)


def _as_fetched(batch: Any) -> Any:
    return batch  # _MicroBatches collated it (module-level: picklable for workers)


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
