"""Elastic data-parallel training: a job that changes size in place while it trains.

A few lines turn an ordinary PyTorch training loop into an elastic one::

    import malletrain

    job = malletrain.init(logical_workers=4, seed=0)     # joins the job (env from `malletrain local`)
    model = job.wrap_model(model)                        # DDP engine, elastic comm hook
    optimizer = job.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
    loader = job.loader(dataset, batch_size=16, epochs=3)
    for x, y in loader:                                  # this rank's micro-batches
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    job.close()

Semantics (docs/elastic.md has the long version):

* **Logical workers.** The job declares ``L`` logical workers. Every step trains one
  global batch of ``L x batch_size`` samples; each physical rank runs the logical
  workers assigned to it one after the other (gradient accumulation), and the
  gradients are averaged over the ``L`` workers. The sequence of updates is therefore
  that of an ``L``-way data-parallel run whatever the physical size; results agree
  with a fixed-size run up to floating-point summation order, and bitwise with
  ``deterministic=True`` (each logical worker's gradient is reduced separately and
  summed in worker order; costs ``L`` times the gradient traffic and memory).
* **Exactly-once data.** Logical worker ``k`` at step ``s`` reads the samples the
  :class:`~malletrain.sampler.ElasticSampler` assigns to ``(seed, s, k)``; its RNG
  (torch, ``random``, NumPy) is reseeded from ``(seed, s, k)`` before each of its
  micro-batches, so dropout and augmentation do not depend on placement either.
* **Resizes happen at step boundaries.** Planned joins and leaves take effect between
  steps. A failure (a peer killed, a hang) makes the in-flight step's gradient sync
  fail; the optimizer does not step, the survivors form the next generation and the
  step is redone — at most one step is lost per failure.
* **State sync.** Joiners (and survivors that missed the last commit) receive the
  model's parameters and buffers, the optimizer state, the step, the data position
  and every object registered with :meth:`ElasticJob.track` (an LR scheduler, ...)
  from the member with the newest committed step, packed into one flat buffer per
  dtype (:mod:`malletrain.state`).

The alternative to a constant global batch is ``logical_workers=None`` with
``lr_scaling="linear"`` or ``"sqrt"``: every rank is one worker, the global batch
follows the world size and the learning rate of every parameter group is rescaled
at each resize by ``f(n_new) / f(n_old)`` with ``f(n) = n`` or ``sqrt(n)``.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import random
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from malletrain import _C
from malletrain import state as _state
from malletrain.errors import (
    MalleError,
    MalleTimeoutError,
    MalleValueError,
    MembershipChangedError,
    RankFailureError,
)
from malletrain.sampler import ElasticSampler, assign_workers, mix_seed

__all__ = [
    "ElasticJob",
    "ElasticLoader",
    "ElasticModel",
    "ElasticOptimizer",
    "ResizeEvent",
    "init",
    "progress_key",
]

log = logging.getLogger("malletrain")

_STATE_VERSION = 2  # 2: segments (flat buffers sent as they are) instead of one buffer per dtype

# A logical worker has two random streams per step: the data stream (what the dataset's
# __getitem__, a collate_fn and DataLoader worker processes draw while its micro-batch is
# fetched) is mix_seed(seed, step, worker, _DATA_STREAM); the model stream (dropout and
# anything else drawn between the fetch and optimizer.step()) is mix_seed(seed, step,
# worker). Two streams, so that augmentation noise and dropout masks are not the same
# numbers.
_DATA_STREAM = 0x64617461  # "data"


def _seed_all(seed: int) -> None:
    """Seeds the RNGs user code draws from: torch (CPU and CUDA), Python's, NumPy's."""
    torch.manual_seed(seed)
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % (2**32))


def progress_key(job_id: str) -> str:
    """Store key where rank 0 publishes the number of committed steps (ASCII)."""
    return f"malle/job/{job_id}/progress"


def state_layout_key(job_id: str) -> str:
    """Store key where rank 0 publishes the segments of the job state (JSON, state.py's
    ``encode_layout``), so that a joiner can fault in its receive buffers while it warms up."""
    return f"malle/job/{job_id}/state_layout"


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


@dataclass
class _StepState:
    workers: range = range(0)
    micro: int = 0            # micro-batches handed out in the current step
    failed: bool = False      # this step's gradient sync failed
    grads_pending: bool = False
    stepped: bool = True      # the optimizer stepped (or the step was given up) for the last step


class _StepProfile:
    """Timestamps of the step in flight, for the advisor (docs/advisor.md)."""

    def __init__(self) -> None:
        self.steps_in_process = 0
        self.prev_end: Optional[float] = None  # when the last committed step ended
        self.reset()

    def reset(self) -> None:
        self.start: Optional[float] = None
        self.data_wait = 0.0
        self.last_hook: Optional[float] = None
        self.resize_pause = 0.0
        self.boundary = 0.0  # the step boundary before this step, when it changed nothing
        self.after_resize = False
        self.after_failure = False


class _Reporter:
    """Sends rank 0's advisor report to the allocator every ``interval`` seconds (a thread,
    so fitting never delays a step)."""

    def __init__(self, job: "ElasticJob", interval: float) -> None:
        self._job = job
        self._interval = max(0.5, interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="malletrain-advisor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._job._send_report()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _device_of(device_type: str) -> torch.device:
    if device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device_type)


def _dummy_process_group() -> "dist.ProcessGroup":
    # The Reducer is bound to this one-rank group for its whole life; it never
    # communicates through it (the comm hook does, over the current generation).
    store = dist.HashStore()
    pg = dist.ProcessGroup(store, 0, 1)
    backend = dist.ProcessGroupGloo(store, 0, 1)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    if torch.cuda.is_available():
        # Fixing the bucket layout broadcasts it on the parameters' device.
        pg._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.GLOO, backend)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    return pg


class ElasticModel(torch.nn.Module):
    """The user's module behind LibTorch's DDP engine with an elastic comm hook.

    Call it like the module. ``.module`` is the wrapped module (save its
    ``state_dict()``). Created by :meth:`ElasticJob.wrap_model`.
    """

    def __init__(self, job: "ElasticJob", module: torch.nn.Module, bucket_cap_mb: float) -> None:
        super().__init__()
        self.module = module
        self._job = job
        self._reducer: Optional[Any] = None  # torch.distributed.Reducer
        # Parameters and buffers live in one flat buffer per dtype and device, which
        # a state sync sends as it is (malletrain/state.py).
        _state.flatten_module(module)
        if not job.deterministic:
            params = [p for p in module.parameters() if p.requires_grad]
            self._reducer = _fixed_layout_reducer(params, bucket_cap_mb)
            # The elastic comm hook is C++ (libmalle/elastic/bucket_sync.h): no Python runs
            # per bucket, and no Python thread waits on the buckets' sums.
            job._bucket_sync = _C.BucketSync()
            job._bucket_sync.register(self._reducer)
            # Each gradient is divided by L right after autograd accumulated it, while it
            # is still in cache, as DDP does with gradient_as_bucket_view; dividing whole
            # buckets when they are handed over reads them from memory again.
            for p in params:
                p.register_post_accumulate_grad_hook(job._divide_grad)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        job = self._job
        grad = torch.is_grad_enabled()
        if grad:
            job._st.grads_pending = True
        # What DDP's forward does around the module when find_unused_parameters is off:
        # arm the Reducer's autograd hooks for the micro-batch whose backward syncs (the
        # last of this rank's share); the others accumulate locally (DDP's no_sync).
        sync = grad and self._reducer is not None and job._is_last_micro()
        if sync:
            job._arm_bucket_sync()
            self._reducer.prepare_for_forward()
        out = self.module(*args, **kwargs)
        if sync:
            self._reducer.prepare_for_backward([])
        return out


def _fixed_layout_reducer(params: List[torch.nn.Parameter], bucket_cap_mb: float) -> Any:
    """LibTorch's DDP engine (``torch.distributed.Reducer``) with a bucket layout that is the
    same on every rank from the first step on, and overlaps communication with backward.

    DDP itself starts with one bucket and, after this rank's first backward, rebuilds its
    buckets once in the order gradients became ready. A joiner's first step would then use
    another layout than the survivors' (wrong sums), so the layout is fixed here instead, in
    the order DDP would approximate: reverse parameter order (the last layers' gradients are
    ready first, and buckets are launched in index order), a small first bucket, then
    ``bucket_cap_mb``. The Reducer takes its parameters in reverse order so that its one
    allowed rebuild, forced now from its parameter order, yields that layout; it is never
    asked to rebuild again. libmalle/elastic/grad_reducer.cc does the same for C++.
    """
    if not params:
        raise MalleValueError("wrap_model: the model has no parameter that requires a gradient")
    cap = max(1, int(bucket_cap_mb * 1024 * 1024))
    first_cap = min(cap, dist._DEFAULT_FIRST_BUCKET_BYTES)
    rev = list(reversed(params))
    sparse = [False] * len(rev)
    indices, limits = dist._compute_bucket_assignment_by_size(rev, [first_cap, cap], sparse)
    reducer = dist.Reducer(rev, indices, limits, _dummy_process_group(), sparse, cap,
                           False,  # find_unused_parameters
                           # The gradients become views of the buckets: the reduced
                           # bucket is the gradient, with no copy back after the
                           # backward (DDP's default copies each bucket into .grad).
                           True,  # gradient_as_bucket_view
                           {}, first_cap, False, False, [])
    reducer._push_all_rebuilt_params()
    if not reducer._rebuild_buckets():
        raise MalleError("ElasticModel: the Reducer refused to fix its bucket layout")
    return reducer


class ElasticOptimizer:
    """Wraps a ``torch.optim`` optimizer so the training loop stays a plain DDP loop.

    ``step()`` and ``zero_grad()`` act once per step: ``step()`` after the last
    micro-batch of this rank (and only if the gradient sync succeeded, then the step
    is committed), ``zero_grad()`` before the first backward and after the step.
    Other attributes are the optimizer's.
    """

    def __init__(self, job: "ElasticJob", optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._job = job

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._job._st.grads_pending:
            return  # accumulating over this rank's logical workers
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        if closure is not None:
            raise MalleValueError("ElasticOptimizer.step: closures are not supported")
        return self._job._optimizer_step()

    def state_dict(self) -> Dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        self.optimizer.load_state_dict(sd)


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise MalleValueError(f"environment: {name}={v!r} is not an integer") from None


class ElasticJob:
    """This process's membership in an elastic job, and the training state it keeps.

    Use :func:`init` to create one.
    """

    def __init__(self, *, logical_workers: Optional[int], seed: int = 0,
                 deterministic: bool = False, lr_scaling: Optional[str] = None,
                 store: Optional[str] = None, job_id: Optional[str] = None,
                 member_id: Optional[str] = None, bootstrap_size: Optional[int] = None,
                 heartbeat_timeout: float = 2.0, recovery_grace: float = 0.5,
                 heartbeat_interval: float = 0.1,
                 rendezvous_timeout: float = 60.0, op_timeout: float = 60.0,
                 bucket_cap_mb: float = 25.0, print_scaling: bool = False,
                 max_recoveries_without_commit: int = 16,
                 backend: Optional[str] = None) -> None:
        if logical_workers is not None:
            if not isinstance(logical_workers, int) or logical_workers < 1:
                raise MalleValueError(
                    f"logical_workers: must be a positive integer or None, got {logical_workers!r}")
            if lr_scaling is not None:
                raise MalleValueError(
                    "lr_scaling: only with logical_workers=None (a global batch that follows the "
                    "world size); with logical workers the global batch is constant")
        elif lr_scaling not in ("linear", "sqrt"):
            raise MalleValueError(
                f"lr_scaling: must be 'linear' or 'sqrt' when logical_workers is None, got "
                f"{lr_scaling!r}")
        if deterministic and logical_workers is None:
            raise MalleValueError("deterministic: needs logical_workers (a constant global batch)")
        backend = backend if backend is not None else os.environ.get("MALLE_BACKEND", "gloo")
        if backend not in ("gloo", "nccl"):
            raise MalleValueError(f"backend: must be 'gloo' or 'nccl', got {backend!r}")
        self.backend = backend
        self.logical_workers = logical_workers
        self.seed = int(seed)
        self.deterministic = bool(deterministic)
        self.lr_scaling = lr_scaling
        self.bucket_cap_mb = bucket_cap_mb

        addr = store if store is not None else os.environ.get("MALLE_STORE", "")
        if not addr:
            raise MalleValueError(
                "store: no control store given; pass store='host:port' or run under "
                "`malletrain local` (which sets MALLE_STORE)")
        host, sep, port = addr.rpartition(":")
        if not sep or not port.isdigit():
            raise MalleValueError(f"store: expected 'host:port', got {addr!r}")
        self.job_id = job_id if job_id is not None else os.environ.get("MALLE_JOB_ID", "local")
        member = member_id if member_id is not None else os.environ.get("MALLE_MEMBER_ID", "")
        if not member:
            host_name = "".join(c for c in socket.gethostname() if c.isalnum() or c == "-")[:40]
            member = f"{host_name or 'host'}-{os.getpid()}-{secrets.token_hex(4)}"
        boot = bootstrap_size if bootstrap_size is not None else _env_int("MALLE_BOOTSTRAP_SIZE", 0)
        if logical_workers is not None and boot > logical_workers:
            raise MalleValueError(
                f"logical_workers: {logical_workers} is smaller than the job's starting size "
                f"{boot}; every rank needs at least one logical worker")
        max_size = logical_workers if logical_workers is not None else 1024

        self._store = _C.ControlStore.connect(host, int(port), timeout=rendezvous_timeout)
        self._member_id = member
        # Joining is deferred to the first step boundary (or join()): a joiner
        # builds its model, optimizer and data first, so the running members'
        # pause covers only agreement, group build and state transfer.
        self._join_args = dict(member_id=member, bootstrap_size=boot, max_size=max_size,
                               rendezvous_timeout=rendezvous_timeout, op_timeout=op_timeout,
                               heartbeat_interval=heartbeat_interval,
                               heartbeat_timeout=heartbeat_timeout,
                               recovery_grace=recovery_grace,
                               max_recoveries_without_commit=max_recoveries_without_commit)
        self._group: Any = None
        self._data_backend_name = "gloo"
        self._pending: Any = None  # the join's transition, handled at the first boundary
        self._model: Optional[ElasticModel] = None
        self._optimizer: Optional[ElasticOptimizer] = None
        self._extras: Dict[str, Any] = {}
        # Receive buffers faulted in during the warm-up, for the first state sync (a
        # joiner's optimizer state); the last layout this rank published as the leader.
        self._landing: List[torch.Tensor] = []
        self._published_layout: Optional[bytes] = None
        self._bucket_sync: Optional[Any] = None  # _C.BucketSync: the comm hook's engine
        self._grad_divisor: Optional[float] = None  # set while the reducing backward runs
        self._grad_views: Dict[torch.Tensor, torch.Tensor] = {}  # parameter -> its bucket view
        self._st = _StepState()
        self._step = 0                    # next step to run
        self._position = 0                # follow mode: stream position at the start of _step
        self._lr_factor: Optional[float] = None
        self._size_for_lr = 0
        self._rows: Optional[torch.Tensor] = None  # deterministic mode: per-worker gradients
        self._buffers0: Optional[List[torch.Tensor]] = None
        self._buffers_w0: Optional[List[torch.Tensor]] = None
        self.history: List[ResizeEvent] = []
        self.closed = False
        self.left = False
        # Steps this rank started again (a failed attempt redone, or a step it had run and
        # whose result was lost): counted when an attempt starts.
        self.redone_steps = 0
        self._max_started = -1
        self._attempt: Optional[int] = None  # the step of an attempt not committed yet
        self._extras0: Dict[str, Any] = {}   # tracked objects' state when it started
        self._groups0: List[Dict[str, Any]] = []  # the optimizer's hyperparameters then
        # Job profiling advisor (docs/advisor.md): one sample per committed step.
        self._advisor: Any = None
        self._profile = _StepProfile()
        self._completed = False
        # Under the allocator (a node agent started this rank): advisor reports and the
        # job's completion go to the allocator, signed with the deployment's secret.
        self.control_job = os.environ.get("MALLE_CONTROL_JOB") or None
        self._outbox: Any = None
        secret_path = os.environ.get("MALLE_CONTROL_SECRET")
        if self.control_job and secret_path:
            sender = f"rank.{member}"[:128]
            self._outbox = _C.Outbox(self._store, _C.load_secret(secret_path), sender)
        self._reporter: Optional[_Reporter] = None
        self.report_interval = float(os.environ.get("MALLE_REPORT_INTERVAL", "5"))
        self.print_scaling = bool(print_scaling) or os.environ.get("MALLE_PRINT_SCALING") == "1"

    def join(self) -> None:
        """Joins the job now (the loader does it at its first step; call this only to
        know rank and size earlier)."""
        if self._group is None:
            self._data_backend_name = self._data_backend()
            self._group = _C.ElasticGroup.join(self._store, self.job_id, **self._join_args,
                                               data_backend=self._data_backend_name)
            self._pending = self._group.last_transition
            self._member_id = self._group.member_id

    def _data_backend(self) -> str:
        """What reduces this job's device tensors (CPU tensors always go through Gloo)."""
        if self._model is not None:
            cuda = any(p.is_cuda for p in self._model.module.parameters())
        else:
            cuda = torch.cuda.is_available()
        if self.backend == "nccl":
            if not cuda:
                raise MalleValueError(
                    "backend='nccl' reduces CUDA tensors and this job's model is not on a CUDA "
                    "device; use backend='gloo' for CPU training")
            return "nccl"
        return "gloo-cuda" if cuda else "gloo"

    # --- public accessors (-1 / 0 before joining) --------------------------------
    @property
    def rank(self) -> int:
        return -1 if self._group is None else self._group.rank

    @property
    def size(self) -> int:
        return 0 if self._group is None else self._group.size

    @property
    def generation(self) -> int:
        return -1 if self._group is None else self._group.generation

    @property
    def member_id(self) -> str:
        """This process's member id (generated at join() when none was given)."""
        return self._member_id

    @property
    def step(self) -> int:
        """The step being run (or next to run)."""
        return self._step

    @property
    def workers(self) -> range:
        """The logical workers this rank runs in the current generation."""
        return self._st.workers

    @property
    def micro_batch(self) -> int:
        """Index of the current micro-batch within this rank's share of the step."""
        return self._st.micro - 1

    # --- wrapping -------------------------------------------------------------
    def wrap_model(self, model: torch.nn.Module) -> ElasticModel:
        """Wraps ``model`` (once per job). Parameters must be dense, on one device."""
        if self._model is not None:
            raise MalleValueError("wrap_model: this job already has a model")
        self._model = ElasticModel(self, model, self.bucket_cap_mb)
        return self._model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> ElasticOptimizer:
        """Wraps ``optimizer`` (once per job, after :meth:`wrap_model`)."""
        if self._model is None:
            raise MalleValueError("wrap_optimizer: call wrap_model first")
        if self._optimizer is not None:
            raise MalleValueError("wrap_optimizer: this job already has an optimizer")
        model_params = {id(p) for p in self._model.module.parameters()}
        for g in optimizer.param_groups:
            for p in g["params"]:
                if id(p) not in model_params:
                    raise MalleValueError(
                        "wrap_optimizer: the optimizer has a parameter that is not in the model")
        self._optimizer = ElasticOptimizer(self, optimizer)
        _state.flatten_optimizer(optimizer)  # a state loaded before wrapping, if any
        self._opt_state_count = len(optimizer.state)
        self._prepare_landing()
        return self._optimizer

    def _prepare_landing(self) -> None:
        """Faults in, now (part of a joiner's warm-up: nobody waits for it), the memory
        that the state the job's leader published will be received into (state.py's
        ``landing_buffers``). Nothing when no layout is published (a new job)."""
        self._landing = []
        try:
            data = self._store.try_get(state_layout_key(self.job_id))
        except MalleError as e:  # the hint is optional; the sync works without it
            log.warning("state layout not read (%s); receiving into fresh memory", e)
            return
        if data is None:
            return
        try:
            expected = _state.decode_layout(data)
        except ValueError as e:
            log.warning("ignoring the published %s; receiving into fresh memory", e)
            return
        own = _state.segments_of(self.job_state(), direct_min_bytes=self._direct_min_bytes())
        self._landing = _state.landing_buffers(expected, own,
                                               min_bytes=self._direct_min_bytes())

    def _publish_state_layout(self) -> None:
        """Rank 0: publishes the segments of its state when they changed (after the
        optimizer's state appeared and was flattened, i.e. once in most jobs)."""
        data = _state.encode_layout(
            _state.segments_of(self.job_state(), direct_min_bytes=self._direct_min_bytes()))
        if data == self._published_layout:
            return
        try:
            self._store.set(state_layout_key(self.job_id), data)
            self._published_layout = data
        except MalleError as e:  # advisory, like the progress key
            log.warning("state layout not published (%s)", e)

    @staticmethod
    def _direct_min_bytes() -> int:
        return _env_int("MALLE_STATE_DIRECT_MIN_BYTES", _state.DIRECT_MIN_BYTES)

    def track(self, name: str, obj: Any) -> None:
        """Adds ``obj`` (anything with ``state_dict()``/``load_state_dict()``, e.g. an LR
        scheduler) to the state that joiners receive."""
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise MalleValueError(f"track({name!r}): object has no state_dict/load_state_dict")
        if name in self._extras:
            raise MalleValueError(f"track: name {name!r} is already tracked")
        self._extras[name] = obj

    def loader(self, dataset: Any, batch_size: int, *, steps: Optional[int] = None,
               epochs: Optional[float] = None, shuffle: bool = True, num_workers: int = 0,
               collate_fn: Optional[Callable[[List[Any]], Any]] = None,
               pin_memory: bool = False) -> "ElasticLoader":
        """This rank's micro-batches of a map-style dataset, step after step.

        ``batch_size`` is per logical worker. Give ``steps`` or ``epochs`` (whole
        steps that fit; the tail of the last epoch is not trained).
        """
        return ElasticLoader(self, dataset, batch_size, steps=steps, epochs=epochs,
                             shuffle=shuffle, num_workers=num_workers, collate_fn=collate_fn,
                             pin_memory=pin_memory)

    # --- state ----------------------------------------------------------------
    def _require_wrapped(self) -> None:
        if self._model is None or self._optimizer is None:
            raise MalleValueError("ElasticJob: wrap_model and wrap_optimizer before training")

    def _model_tensors(self) -> Dict[str, torch.Tensor]:
        assert self._model is not None
        m = self._model.module
        out = {f"p:{n}": p for n, p in m.named_parameters()}
        out.update({f"b:{n}": b for n, b in m.named_buffers()})
        return out

    def job_state(self) -> Dict[str, Any]:
        """Everything a joiner needs, as a nested structure of tensors and values."""
        self._require_wrapped()
        assert self._optimizer is not None
        return {
            "version": _STATE_VERSION,
            "model": {k: t.detach() for k, t in self._model_tensors().items()},
            "optimizer": self._optimizer.optimizer.state_dict(),
            "extras": {k: v.state_dict() for k, v in self._extras.items()},
            "job": {"position": self._position, "lr_factor": self._lr_factor,
                    "seed": self.seed, "logical_workers": self.logical_workers},
        }

    def state_digest(self) -> str:
        """SHA-256 of parameters, buffers and optimizer state (equal on every replica)."""
        st = self.job_state()
        return _state.digest({"model": st["model"], "optimizer": st["optimizer"]})

    def _load_state(self, st: Dict[str, Any]) -> None:
        assert self._optimizer is not None
        if st.get("version") != _STATE_VERSION:
            raise MalleValueError(f"state: version {st.get('version')} is not {_STATE_VERSION}")
        mine = self._model_tensors()
        theirs = st["model"]
        if list(mine) != list(theirs) or any(
                tuple(mine[k].shape) != tuple(theirs[k].shape) or mine[k].dtype != theirs[k].dtype
                for k in mine):
            diff = [k for k in sorted(set(mine) | set(theirs))
                    if k not in mine or k not in theirs
                    or tuple(mine[k].shape) != tuple(theirs[k].shape)
                    or mine[k].dtype != theirs[k].dtype][:5]
            raise MalleValueError(
                f"model mismatch: this rank's model differs from the state source's "
                f"(first differences: {diff}); every rank must build the same model")
        job = st["job"]
        if job["logical_workers"] != self.logical_workers or job["seed"] != self.seed:
            raise MalleValueError(
                f"job mismatch: state source has logical_workers={job['logical_workers']}, "
                f"seed={job['seed']}; this rank has {self.logical_workers}, {self.seed}")
        with torch.no_grad():
            for k, t in mine.items():
                if t.data_ptr() != theirs[k].data_ptr():  # not received in place
                    t.copy_(theirs[k])
        self._optimizer.optimizer.load_state_dict(st["optimizer"])
        # The loaded state is views of the received segments; keep it flat.
        _state.flatten_optimizer(self._optimizer.optimizer)
        self._opt_state_count = len(self._optimizer.optimizer.state)
        for k, obj in self._extras.items():
            if k not in st["extras"]:
                raise MalleValueError(f"state: tracked object {k!r} is missing at the source")
            obj.load_state_dict(st["extras"][k])
        self._position = int(job["position"])
        self._lr_factor = job["lr_factor"]

    @staticmethod
    def _state_receivers(t: Any) -> List[int]:
        """The ranks that need the job state from ``t.state_source_rank``.

        Every other rank at a bootstrap; otherwise the joiners and the ranks whose
        committed step differs from the source's. The same on every rank: it only
        reads the transition, which every member of the generation shares.
        """
        source = t.state_source_rank
        if t.kind == "bootstrap":
            return [r for r in range(t.size) if r != source]
        joined = set(t.joined)
        committed = list(t.committed_by_rank)
        return [r for r in range(t.size) if r != source
                and (t.members[r] in joined or committed[r] != committed[source])]

    def _sync_state(self, source: int, receivers: List[int], *, in_place: bool = False) -> int:
        """Sends the job state from rank ``source`` to ``receivers``; returns the bytes moved.

        One broadcast per message when every other rank receives; otherwise the
        source sends to each receiver point to point, so the survivors that already
        hold the state neither receive nor unpack it (a grow moves the state to the
        joiner only). The source sends its flat buffers as they are (no copy); a
        receiver with ``in_place`` (it holds no committed state: a joiner) receives
        the segments that match its own buffers straight into them.
        """
        g = self._group
        self._last_in_place = 0
        self._last_landed = 0
        everyone = len(receivers) == g.size - 1
        if not receivers or (g.rank != source and g.rank not in receivers):
            return 0

        # Gloo reduces and broadcasts CUDA tensors but sends point to point only from host
        # memory: such a send goes through a CPU copy.
        stage = self._data_backend_name == "gloo-cuda"

        def out(tensor: torch.Tensor, tag: int) -> None:
            if everyone:
                g.broadcast([tensor], source)
            else:
                if stage and tensor.is_cuda:
                    tensor = tensor.cpu()
                for r in receivers:
                    g.send(tensor, r, tag)

        def into(tensor: torch.Tensor, tag: int) -> None:
            if everyone:
                g.broadcast([tensor], source)
            elif stage and tensor.is_cuda:
                host = torch.empty(tensor.shape, dtype=tensor.dtype)
                g.recv(host, source, tag)
                tensor.copy_(host)
            else:
                g.recv(tensor, source, tag)

        min_direct = self._direct_min_bytes()
        if g.rank == source:
            skeleton, segments = _state.pack(self.job_state(), direct_min_bytes=min_direct)
            header = torch.tensor([len(skeleton), _STATE_VERSION], dtype=torch.int64)
            out(header, 0)
            out(torch.frombuffer(bytearray(skeleton), dtype=torch.uint8), 1)
            for i, seg in enumerate(segments):  # one message per flat segment
                out(seg, 2 + i)
            return len(skeleton) + sum(s.numel() * s.element_size() for s in segments)
        header = torch.zeros(2, dtype=torch.int64)
        into(header, 0)
        if os.environ.get("MALLE_FAULT_EXIT_IN_STATE_SYNC") == self.member_id:
            os._exit(137)  # fault injection for tests: die like kill -9 in the middle of a sync
        if int(header[1]) != _STATE_VERSION or int(header[0]) <= 0:
            raise MalleValueError(f"state: bad state header {header.tolist()} from rank {source}")
        raw = torch.empty(int(header[0]), dtype=torch.uint8)
        into(raw, 1)
        skeleton, specs = _state.read_skeleton(raw.numpy().tobytes())
        targets: List[Optional[torch.Tensor]] = [None] * len(specs)
        if in_place:
            targets = _state.in_place_targets(self.job_state(), skeleton, specs,
                                              direct_min_bytes=min_direct)
        # The rest lands in the buffers this rank faulted in while it warmed up, if one
        # fits, else in fresh memory.
        bufs = []
        for s, t in zip(specs, targets):
            if t is None:
                t = _state.take_landing(self._landing, s)
                if t is not None:
                    self._last_landed += t.numel() * t.element_size()
            if t is None:
                t = torch.empty(s.numel, dtype=_state._dtype(s.dtype),
                                device=_device_of(s.device_type))
            bufs.append(t)
        for i, b in enumerate(bufs):
            into(b, 2 + i)
        self._load_state(_state.unpack(skeleton, bufs))
        self._last_in_place = sum(b.numel() * b.element_size()
                                  for b, t in zip(bufs, targets) if t is not None)
        return raw.numel() + sum(b.numel() * b.element_size() for b in bufs)

    # --- step boundary ----------------------------------------------------------
    def _boundary(self) -> bool:
        """Runs the step boundary; False when this member has left the job."""
        self._require_wrapped()
        self.join()
        while True:
            t0 = time.perf_counter()
            if self._pending is not None:
                t, self._pending = self._pending, None
            else:
                t = self._group.at_step_boundary()
            if t.kind == "left":
                self.left = True
                return False
            if t.kind == "excluded":
                raise MembershipChangedError(
                    f"member {self.member_id} was declared failed by job {self.job_id}: "
                    f"{t.reason}")
            if not t.changed:
                return True
            try:
                self._on_change(t, t0)
                return True
            except (RankFailureError, MalleTimeoutError) as e:
                # A member died during state sync: the next boundary recovers.
                log.warning("state sync in generation %d failed (%s); recovering", t.generation, e)

    def _on_change(self, t: Any, t0: float) -> None:
        s0 = time.perf_counter()
        # Nobody receives after a planned shrink or a recovery in which every survivor
        # committed the same step: then no transfer at all.
        moved = self._sync_state(t.state_source_rank, self._state_receivers(t),
                                 in_place=list(t.committed_by_rank)[t.rank] < 0)
        state_s = time.perf_counter() - s0
        self._landing = []  # what the first sync did not use is not needed any more
        self._step = t.resume_step
        if self.logical_workers is not None:
            self._st.workers = assign_workers(self.logical_workers, t.size, t.rank)
        else:
            self._st.workers = range(t.rank, t.rank + 1)
            self._apply_lr_scaling(t.size)
        self._st.micro = 0
        self._take_bucket_errors(quiet=True)  # the failed step's buckets: handled by now
        self._st.failed = False
        self._st.grads_pending = False
        self._st.stepped = True
        phases = dict(t.phases)
        phases["state"] = state_s
        phases["total"] = phases.get("total", 0.0) + state_s
        ev = ResizeEvent(kind=t.kind, generation=t.generation, size=t.size, rank=t.rank,
                         resume_step=t.resume_step, joined=list(t.joined),
                         removed=list(t.removed), state_bytes=moved, phases=phases,
                         reason=t.reason, state_in_place=self._last_in_place,
                         state_landed=self._last_landed)
        self.history.append(ev)
        log.info("generation %d: %s, size %d, rank %d, resume at step %d, state %d B in %.3f s",
                 t.generation, t.kind, t.size, t.rank, t.resume_step, moved, state_s)

    def _apply_lr_scaling(self, size: int) -> None:
        assert self._optimizer is not None
        f = float(size) if self.lr_scaling == "linear" else math.sqrt(size)
        if self._lr_factor is None:
            self._lr_factor = f  # the learning rate the user set is for this size
            return
        if f != self._lr_factor:
            for g in self._optimizer.optimizer.param_groups:
                g["lr"] = g["lr"] * f / self._lr_factor
            self._lr_factor = f

    # --- per micro-batch / per step ----------------------------------------------
    def _is_last_micro(self) -> bool:
        return self._st.micro >= len(self._st.workers)

    def _begin_micro(self, worker: int, index: int) -> None:
        """Before micro-batch ``index`` (logical worker ``worker``) of this rank's share."""
        _seed_all(mix_seed(self.seed, self._step, worker))
        if index == 0:
            # A new attempt at this step: everything it changes besides parameters and
            # optimizer state (which change only when it commits) is snapshotted, so that a
            # failed attempt leaves no trace (_roll_back_failed_step).
            if self._step <= self._max_started:
                self.redone_steps += 1
            self._max_started = max(self._max_started, self._step)
            self._attempt = self._step
            self._extras0 = {k: copy.deepcopy(v.state_dict()) for k, v in self._extras.items()}
            # The optimizer's state changes only when a step commits; its hyperparameters
            # (a scheduler sets the learning rate) may change after any step.
            assert self._optimizer is not None
            self._groups0 = [copy.deepcopy({k: v for k, v in g.items() if k != "params"})
                             for g in self._optimizer.optimizer.param_groups]
        bufs = self._buffer_list()
        if bufs:
            if index == 0:
                self._buffers0 = [b.detach().clone() for b in bufs]
                self._buffers_w0 = None
            else:
                if self._st.workers[index - 1] == 0:  # the previous one was logical worker 0
                    self._buffers_w0 = [b.detach().clone() for b in bufs]
                with torch.no_grad():
                    for b, b0 in zip(bufs, self._buffers0 or []):
                        b.copy_(b0)

    def _roll_back_failed_step(self) -> None:
        """Before a step boundary: if the last attempt at a step did not commit, undo what it
        changed (buffers such as BatchNorm's running statistics and counter, tracked objects,
        the optimizer's hyperparameters), so the redo, or a state sync from this rank, starts
        from the committed state."""
        if self._attempt is None:
            return
        self._attempt = None
        if self._buffers0 is not None:
            with torch.no_grad():
                for b, b0 in zip(self._buffer_list(), self._buffers0):
                    b.copy_(b0)
        for k, sd in self._extras0.items():
            self._extras[k].load_state_dict(sd)
        assert self._optimizer is not None
        for g, g0 in zip(self._optimizer.optimizer.param_groups, self._groups0):
            g.update(g0)
        self._buffers_w0 = None

    def _buffer_list(self) -> List[torch.Tensor]:
        assert self._model is not None
        return [b for b in self._model.module.buffers()]

    def _arm_bucket_sync(self) -> None:
        """Arms the comm hook for the backward that reduces: sum over the current generation
        and divide by L (after a failure in this step: neither, the step is redone)."""
        assert self._bucket_sync is not None
        self._grad_divisor = None
        try:
            self._bucket_sync.arm(None if self._st.failed else self._group)
        except MalleError as e:  # no longer a member of a generation
            self._mark_failed(e)
            self._bucket_sync.arm(None)
        if not self._st.failed:
            n = self.logical_workers if self.logical_workers is not None else self.size
            self._grad_divisor = float(n) if n != 1 else None

    def _divide_grad(self, p: torch.Tensor) -> None:
        # A post-accumulate-grad hook of every trained parameter (autograd thread), run
        # before the Reducer takes the gradient into its bucket.
        d = self._grad_divisor
        g = p.grad
        if d is None or g is None:
            return
        view = self._grad_views.get(p)
        if view is not None and g.data_ptr() != view.data_ptr():
            # A new gradient tensor (zero_grad(set_to_none=True) dropped the bucket view):
            # scale it straight into its place in the bucket, one pass instead of a
            # division and the Reducer's copy (DDP does the same without a comm hook).
            torch.mul(g, 1.0 / d, out=view)
            p.grad = view
        else:
            g.mul_(1.0 / d)

    def _remember_grad_views(self) -> None:
        # After the first reducing backward every gradient is a view of its bucket
        # (gradient_as_bucket_view); the Reducer keeps its buckets for life.
        assert self._model is not None
        for p in self._model.module.parameters():
            if p.requires_grad and p.grad is not None and p.grad._base is not None:
                self._grad_views[p] = p.grad

    def _take_bucket_errors(self, quiet: bool = False) -> None:
        """After the backward that reduced: disarms the comm hook, notes when its last bucket
        was launched and marks the step failed if a bucket's sum failed (``quiet``: only
        clears the tally, at a new step)."""
        if self._bucket_sync is None:
            return
        self._grad_divisor = None
        self._bucket_sync.arm(None)
        try:
            launched, _, last = self._bucket_sync.take()
            if last is not None and not quiet:
                self._profile.last_hook = last
            if launched and not quiet and not self._grad_views:
                self._remember_grad_views()
        except MalleError as e:
            if not quiet:
                self._mark_failed(e)

    def _mark_failed(self, err: BaseException) -> None:
        if not self._st.failed:
            log.warning("step %d: gradient sync failed (%s); the step will be redone",
                        self._step, err)
        self._st.failed = True

    def _params(self) -> List[torch.nn.Parameter]:
        assert self._model is not None
        return [p for p in self._model.module.parameters() if p.requires_grad]

    def _capture_grads(self) -> None:
        """Deterministic mode: this micro-batch's gradient into its logical worker's row."""
        params = self._params()
        numel = sum(p.numel() for p in params)
        assert self.logical_workers is not None
        if self._rows is None or self._rows.shape != (self.logical_workers, numel):
            self._rows = torch.zeros(self.logical_workers, numel, dtype=params[0].dtype,
                                     device=params[0].device)
        worker = self._st.workers[self._st.micro - 1]
        row = self._rows[worker]
        off = 0
        for p in params:
            k = p.numel()
            if p.grad is None:
                row[off:off + k].zero_()
            else:
                row[off:off + k].copy_(p.grad.reshape(-1))
                p.grad = None
            off += k

    def _reduce_rows(self) -> bool:
        assert self._rows is not None
        mine = set(self._st.workers)
        for k in range(self._rows.shape[0]):
            if k not in mine:
                self._rows[k].zero_()
        try:
            self._group.allreduce([self._rows])
        except MalleError as e:
            self._mark_failed(e)
            return False
        total = self._rows[0].clone()
        for k in range(1, self._rows.shape[0]):
            total += self._rows[k]
        total /= float(self._rows.shape[0])
        off = 0
        for p in self._params():
            k = p.numel()
            p.grad = total[off:off + k].view_as(p).clone()
            off += k
        return True

    def _sync_buffers(self) -> bool:
        bufs = self._buffer_list()
        if not bufs:
            return True
        if 0 in self._st.workers and self._buffers_w0 is not None:
            with torch.no_grad():
                for b, w0 in zip(bufs, self._buffers_w0):
                    b.copy_(w0)
        try:
            by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
            for b in bufs:
                by_dtype.setdefault(b.dtype, []).append(b)
            for group in by_dtype.values():  # one flat broadcast per dtype
                flat = torch.cat([b.detach().reshape(-1) for b in group])
                self._group.broadcast([flat], 0)
                if self.rank != 0:
                    off = 0
                    with torch.no_grad():
                        for b in group:
                            b.copy_(flat[off:off + b.numel()].view_as(b))
                            off += b.numel()
        except MalleError as e:
            self._mark_failed(e)
            return False
        return True

    def _optimizer_step(self) -> Optional[float]:
        assert self._optimizer is not None
        st = self._st
        if st.micro == 0:
            raise MalleValueError("optimizer.step(): called before any micro-batch of this step")
        if self.deterministic:
            self._capture_grads()
        if not self._is_last_micro():
            return None
        prof = self._profile
        t_opt = time.perf_counter()
        self._take_bucket_errors()
        ok = not st.failed
        if ok and self.deterministic:
            ok = self._reduce_rows()
        t_reduced = time.perf_counter()
        if ok:
            ok = self._sync_buffers()
        st.grads_pending = False
        st.stepped = True
        if not ok:
            self._optimizer.optimizer.zero_grad(set_to_none=True)
            self._profile.prev_end = None  # the redone step's time is not a step time
            return None  # not committed: the next boundary recovers and redoes the step
        # The gradients are reduced: the next boundary's vote goes now and completes
        # while the optimizer runs, so the ranks synchronise once per step, not twice.
        self._group.begin_step_boundary()
        self._optimizer.optimizer.step()
        if len(self._optimizer.optimizer.state) != self._opt_state_count:
            # New state tensors (Adam's moments after its first step): into one flat
            # buffer, so a state sync sends them without packing.
            _state.flatten_optimizer(self._optimizer.optimizer)
            self._opt_state_count = len(self._optimizer.optimizer.state)
            if self.rank == 0:
                self._publish_state_layout()
        self._group.commit(self._step)
        self._attempt = None
        self._record_step(prof, t_opt, t_reduced)
        self._step += 1
        if self.logical_workers is None:
            self._position += self.size * self._batch_size_for_position
        if self.rank == 0:
            try:
                self._store.set(progress_key(self.job_id), str(self._step).encode())
            except MalleError as e:  # progress is advisory (the launcher's step triggers)
                log.debug("progress key not written: %s", e)
        return None

    _batch_size_for_position = 0
    _opt_state_count = 0
    _last_in_place = 0
    _last_landed = 0

    # --- profiling advisor ------------------------------------------------------------
    def _record_step(self, prof: "_StepProfile", t_opt: float, t_reduced: float) -> None:
        """One advisor sample for the step just committed (cheap: no fitting here)."""
        if prof.start is None:
            return
        now = time.perf_counter()
        size = self.size  # a property of the C++ group: read once (this runs every step)
        if self._advisor is None:
            lw = self.logical_workers if self.logical_workers is not None else None
            lo = max(1, _env_int("MALLE_MIN_NODES", 1))
            hi = _env_int("MALLE_MAX_NODES", lw if lw is not None else max(8, size))
            if lw is not None:
                hi = min(hi, lw)
            self._advisor = _C.Advisor(self.control_job or self.job_id, min(lo, hi), max(hi, 1))
        if self.deterministic:
            comm = t_reduced - t_opt
        elif prof.last_hook is not None and prof.last_hook >= prof.start:
            comm = max(0.0, t_opt - prof.last_hook)  # backward waited this long for the buckets
        else:
            comm = 0.0
        total = now - prof.start
        if prof.prev_end is not None:
            # What the training loop does between two steps (logging, evaluation, a
            # sleep) and the step boundary belong to the step's time; a resize pause
            # is measured separately.
            total += max(0.0, prof.start - prof.prev_end - prof.resize_pause)
        else:
            total += prof.boundary
        compute = max(0.0, (t_opt - prof.start) - prof.data_wait - comm)
        if size > 1:
            # The step boundary is a collective (one small allreduce that waits for the
            # slowest rank): exposed communication, which the network term models. Left in
            # the untimed rest, it would land in the model's constant term and make the
            # fit underestimate large sizes (docs/advisor.md). At size 1 it waits for no
            # peer and stays in the rest.
            comm += prof.boundary
        optimizer = max(0.0, now - t_reduced)
        bs = self._batch_size_for_position or 1
        workers = self.logical_workers if self.logical_workers is not None else size
        try:
            # Positional: pybind11's keyword matching costs more than the recording itself.
            # Order: step, world_size, logical_workers, local_batch, global_batch, data_wait_s,
            # compute_s, comm_s, optimizer_s, resize_pause_s, total_s, after_resize,
            # after_failure, warmup.
            self._advisor.record(
                self._step, size, workers, len(self._st.workers) * bs, workers * bs,
                prof.data_wait, compute, comm, optimizer, prof.resize_pause, total,
                prof.after_resize, prof.after_failure, prof.steps_in_process < 1)
        except ValueError as e:  # a sample the advisor finds implausible is dropped, loudly
            log.debug("advisor sample of step %d not recorded: %s", self._step, e)
        prof.steps_in_process += 1
        prof.reset()
        prof.prev_end = now
        if self._outbox is not None and self._reporter is None and self.rank == 0:
            self._reporter = _Reporter(self, self.report_interval)

    def scaling_report(self) -> Optional[Dict[str, Any]]:
        """The advisor's report (docs/advisor.md): predicted samples/s with bands for every
        size in the job's range, resize costs, marginal gains; None before the first step."""
        if self._advisor is None:
            return None
        import json
        return json.loads(self._advisor.report_json())

    def scaling_table(self) -> str:
        """The advisor's report as a human-readable table ('' before the first step)."""
        if self._advisor is None:
            return ""
        return _C.advisor_report_table(self._advisor.report_json())

    def _send_report(self) -> None:
        if self._outbox is None or self._advisor is None or self.rank != 0:
            return
        try:
            self._outbox.send_advisor_report(self.control_job, self._advisor.report_json())
        except (MalleError, ValueError) as e:  # advisory: never stop training for it
            log.warning("advisor report not sent: %s", e)

    def _complete(self, total_steps: int) -> None:
        """All steps are done: rank 0 tells the allocator and prints the scaling table."""
        if self._completed or self.rank != 0:
            return
        self._completed = True
        if self._reporter is not None:
            self._reporter.stop()
        self._send_report()
        if self._outbox is not None:
            bs = self._batch_size_for_position or 1
            workers = self.logical_workers if self.logical_workers is not None else self.size
            try:
                self._outbox.send_job_complete(self.control_job, "succeeded", total_steps,
                                               total_steps * workers * bs, "")
            except MalleError as e:
                log.warning("job completion not sent to the allocator: %s", e)
        if self.print_scaling and self._advisor is not None:
            print(self.scaling_table(), flush=True)

    # --- end --------------------------------------------------------------------
    def finish(self) -> None:
        """Waits at a last step boundary so no member exits while others still reduce; after
        it this member is done with the job together with the others, so closing it does not
        fail the generation for a slower member."""
        if self.closed or self.left or self._group is None or not self._group.active:
            return
        try:
            self._boundary()  # a member arriving now still gets the final state
        except MalleError as e:
            log.warning("final step boundary failed: %s", e)
            return
        if self._group is not None and getattr(self._group, "active", False):
            self._group.finish()

    def leave(self) -> None:
        """Asks to leave the job at the next step boundary (the loader then stops)."""
        self.join()
        self._group.request_leave()

    def close(self) -> None:
        """Releases the group (a member still in it makes the others recover at once)."""
        if self.closed:
            return
        self.closed = True
        if self._reporter is not None:
            self._reporter.stop()
        if self._bucket_sync is not None:
            self._bucket_sync.close()
            self._bucket_sync = None
        if self._group is not None:
            self._group = _ClosedGroup(self._group)


class _ClosedGroup:
    """Keeps the last rank/size/generation readable after close()."""

    def __init__(self, g: Any) -> None:
        self.rank, self.size, self.generation = g.rank, g.size, g.generation
        self.member_id = g.member_id
        self.active = False


class ElasticLoader:
    """Yields this rank's micro-batches, step after step, across resizes.

    Each step it first runs the step boundary (joins, leaves and failures take
    effect there, and a failed step is redone), then yields one micro-batch per
    logical worker of this rank. Iterate it once. Created by :meth:`ElasticJob.loader`.
    """

    def __init__(self, job: ElasticJob, dataset: Any, batch_size: int, *, steps: Optional[int],
                 epochs: Optional[float], shuffle: bool, num_workers: int,
                 collate_fn: Optional[Callable[[List[Any]], Any]], pin_memory: bool) -> None:
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise MalleValueError("dataset: must be map-style (len() and [index])")
        if (steps is None) == (epochs is None):
            raise MalleValueError("loader: give exactly one of steps= or epochs=")
        n = len(dataset)
        workers = job.logical_workers if job.logical_workers is not None else 1
        if job.logical_workers is None and job.size * batch_size > n:
            raise MalleValueError(
                f"dataset: has {n} samples, fewer than one global batch "
                f"({job.size} ranks x batch_size {batch_size})")
        self.sampler = ElasticSampler(n, workers, batch_size, seed=job.seed, shuffle=shuffle)
        if steps is not None:
            if not isinstance(steps, int) or steps < 0:
                raise MalleValueError(f"steps: must be a non-negative integer, got {steps!r}")
            self.total_steps = steps
        else:
            if not epochs or epochs <= 0:
                raise MalleValueError(f"epochs: must be positive, got {epochs!r}")
            if job.logical_workers is None:
                raise MalleValueError("epochs: needs logical_workers (a constant global batch); "
                                      "give steps= instead")
            self.total_steps = self.sampler.steps_for_epochs(float(epochs))
        if num_workers < 0:
            raise MalleValueError(f"num_workers: must be >= 0, got {num_workers}")
        self.job = job
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.pin_memory = pin_memory
        job._batch_size_for_position = batch_size
        self._it: Optional[Iterator[Any]] = None
        self._it_key: Optional[tuple] = None  # (step, workers, position, size) served next
        self._started = False

    def __len__(self) -> int:
        return self.total_steps

    def __iter__(self) -> "ElasticLoader":
        if self._started:
            raise MalleValueError("ElasticLoader: iterate it only once")
        self._started = True
        return self

    def _index_lists(self, first_step: int, workers: range, position: int,
                     size: int) -> Iterator[Tuple[int, List[int]]]:
        """(data seed, index list) of this rank's micro-batches from ``first_step`` on, for
        a membership of ``size`` ranks (bound now: the iterator must not follow later
        changes)."""
        job = self.job
        s = first_step
        while s < self.total_steps:
            for k in workers:
                seed = mix_seed(job.seed, s, k, _DATA_STREAM)
                if job.logical_workers is not None:
                    yield seed, self.sampler.indices(s, k)
                else:
                    pos = position + (s - first_step) * size * self.batch_size
                    yield seed, self.sampler.stream(pos + k * self.batch_size, self.batch_size)
            s += 1

    def _restart(self) -> None:
        """Makes the iterator serve ``job.step`` with this rank's current workers."""
        job = self.job
        key = (job._step, job._st.workers, job._position, job.size)
        if self._it is not None and self._it_key == key:
            return  # the running iterator already serves this step
        # One item per micro-batch: the DataLoader (or its worker process) fetches and
        # collates the whole micro-batch under its logical worker's data stream.
        self._it = iter(torch.utils.data.DataLoader(
            _MicroBatches(self.dataset, self.collate_fn),
            sampler=_LazyKeys(self._index_lists(*key)), batch_size=None,
            num_workers=self.num_workers, collate_fn=_as_fetched,
            pin_memory=self.pin_memory))
        self._it_key = key

    def __next__(self) -> Any:
        job = self.job
        st = job._st
        if self._it is None or st.micro >= len(st.workers):
            # A new step: the previous one must have been stepped (or given up).
            if self._it is not None and not st.stepped:
                raise MalleValueError(
                    f"optimizer.step() was not called after the last micro-batch of step "
                    f"{job._step}")
            if job._step >= self.total_steps:
                job.finish()
                job._complete(self.total_steps)
                raise StopIteration
            events = len(job.history)
            t_boundary = time.perf_counter()
            job._roll_back_failed_step()
            if not job._boundary():
                raise StopIteration  # this member left the job
            if job._step >= self.total_steps:
                job.finish()
                job._complete(self.total_steps)
                raise StopIteration
            self._restart()
            st.micro = 0
            job._take_bucket_errors(quiet=True)  # a step left without optimizer.step()
            st.failed = False
            st.stepped = False
            prof = job._profile
            prof.reset()
            prof.start = time.perf_counter()
            if len(job.history) > events:  # the boundary changed the membership
                prof.after_resize = True
                prof.resize_pause = prof.start - t_boundary
                prof.after_failure = job.history[-1].kind == "recovered"
            else:
                prof.boundary = prof.start - t_boundary
        assert self._it is not None
        t_data = time.perf_counter()
        batch = next(self._it)
        job._profile.data_wait += time.perf_counter() - t_data
        worker = st.workers[st.micro]
        st.micro += 1
        if st.micro == len(st.workers):  # the iterator moves on to the next step
            nxt = job._position + job.size * self.batch_size if job.logical_workers is None \
                else job._position
            self._it_key = (job._step + 1, st.workers, nxt, job.size)
        job._begin_micro(worker, st.micro - 1)
        return batch


class _LazyKeys:
    """A sampler over a generator of (data seed, indices) keys (no upfront list)."""

    def __init__(self, gen: Iterator[Tuple[int, List[int]]]) -> None:
        self._gen = gen

    def __iter__(self) -> Iterator[Tuple[int, List[int]]]:
        return self._gen


class _MicroBatches(torch.utils.data.Dataset):
    """The user's dataset seen one micro-batch at a time: ``[(seed, indices)]`` seeds
    torch, ``random`` and NumPy with the logical worker's data stream, then fetches the
    samples and collates them, in the process that fetches (the loop's, or a DataLoader
    worker's). So every random draw of ``__getitem__`` and ``collate_fn`` belongs to the
    logical worker whatever the physical size and ``num_workers``."""

    def __init__(self, dataset: Any, collate_fn: Optional[Callable[[List[Any]], Any]]) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn if collate_fn is not None \
            else torch.utils.data.default_collate

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Tuple[int, List[int]]) -> Any:
        seed, indices = key
        _seed_all(seed)
        getitems = getattr(self.dataset, "__getitems__", None)
        samples = getitems(indices) if getitems is not None else [self.dataset[i] for i in indices]
        return self.collate_fn(samples)


def _as_fetched(batch: Any) -> Any:
    # _MicroBatches already collated it (a module-level function: picklable for workers).
    return batch


def init(logical_workers: Optional[int] = None, *, seed: int = 0, deterministic: bool = False,
         lr_scaling: Optional[str] = None, **kwargs: Any) -> ElasticJob:
    """Joins this process to its elastic job and returns the :class:`ElasticJob`.

    Args:
        logical_workers: ``L``, the job's fixed number of logical workers (constant
            global batch; the job never has more ranks than this). ``None`` needs
            ``lr_scaling``.
        seed: seeds the data order and every logical worker's RNG stream.
        deterministic: bitwise-reproducible results whatever the schedule (costs ``L``
            times the gradient traffic and memory; needs the same torch thread count on
            every rank).
        lr_scaling: ``"linear"`` or ``"sqrt"``: the global batch follows the world size
            and the learning rate is rescaled at each resize.
        **kwargs: ``store`` ('host:port'), ``job_id``, ``member_id``, ``bootstrap_size``
            (default from ``MALLE_STORE``, ``MALLE_JOB_ID``, ``MALLE_MEMBER_ID``,
            ``MALLE_BOOTSTRAP_SIZE``, which ``malletrain local`` sets), and the timeouts
            ``heartbeat_interval``, ``heartbeat_timeout``, ``recovery_grace`` (at least
            ``heartbeat_interval``), ``rendezvous_timeout``,
            ``op_timeout`` (seconds), ``bucket_cap_mb``, ``print_scaling`` (rank 0
            prints the profiling advisor's scalability table when the job completes; also
            ``MALLE_PRINT_SCALING=1``), and ``max_recoveries_without_commit`` (default 16:
            a rank raises :class:`RankFailureError` rather than recover again after that
            many recoveries in a row without a committed step, e.g. when the same failure
            repeats at every attempt), and ``backend`` (default ``MALLE_BACKEND`` or
            ``"gloo"``): what reduces the gradients of a CUDA model, ``"nccl"`` (one GPU
            per rank, the fast path) or ``"gloo"`` (through host memory; works with several
            ranks on one GPU). CPU tensors always go through Gloo.

    Raises:
        MalleValueError: bad arguments (e.g. fewer logical workers than the starting size).
        StoreError / MalleTimeoutError: the control store or the rendezvous failed.
    """
    return ElasticJob(logical_workers=logical_workers, seed=seed, deterministic=deterministic,
                      lr_scaling=lr_scaling, **kwargs)
