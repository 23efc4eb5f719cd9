"""The loaders of an elastic job: this rank's micro-batches, step after step, across resizes.

Every loader runs the step boundary between steps (joins, leaves and failures take effect
there, and a failed step is redone) and then yields one micro-batch per logical worker of
this rank. Which samples a worker trains at a step is the engine's (the exactly-once sampler,
``libmalle/elastic/sampler.h``); a loader fetches them, each under its logical worker's data
stream, so random augmentation is the same whatever the physical size.

Map-style datasets (:class:`ElasticLoader`): a ``torch.utils.data.DataLoader`` underneath,
whose sampler serves the engine's keys (``_C.BatchKeys``) of the membership in force, so
its worker processes prefetch across steps.

Iterable datasets (:class:`StreamLoader`): one stream of samples with a resumable position.

The contract (docs/elastic.md, "Data"): a ``torch.utils.data.IterableDataset`` is one
stream; step ``s`` trains its samples ``[s*L*B, (s+1)*L*B)`` and logical worker ``k`` the
``k``-th ``B`` of them, whatever the physical size. The position in the stream is job state,
so the dataset must be able to report and restore it, with torchdata's ``Stateful``
protocol:

- ``state_dict()``: the position of the stream that the last ``iter(dataset)`` is at (what
  it has yielded so far), a small picklable value;
- ``load_state_dict(sd)``: the next ``iter(dataset)`` starts there.

With it, every sample is trained exactly once, in the same step and by the same logical
worker as in a fixed-size run, through joins, leaves and failures: joiners receive the
position, and a failed step puts it back. A dataset without it is refused
(``MalleValueError``): a stream that cannot seek cannot be restarted at a joiner, nor
rewound after a failed step. The stream must give the same samples after a
``load_state_dict`` (a seeded shuffle, files in a fixed order).

Every rank reads the whole stream (the samples of other ranks' workers are read and
dropped): simple and exact, and the cost is reading, not training. Each worker's samples
and its ``collate_fn`` run under its data stream's random seed (as for map-style data).
``num_workers`` must be 0.
"""

from __future__ import annotations

import copy
import random
import sys
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch

from malletrain.errors import MalleValueError

__all__ = ["ElasticLoader", "StreamLoader"]


def _accelerators() -> str:
    """The device types besides the CPU that torch has in this process: "" (none), "cuda"
    (CUDA alone) or "other". Asked once, in the training process: a forked DataLoader worker
    must not ask CUDA."""
    other = torch.backends.mps.is_available() or \
        torch._C._get_privateuse1_backend_name() != "privateuseone"
    for name in ("xpu", "mtia"):
        mod = getattr(torch, name, None)
        other = other or (mod is not None and mod.is_available())
    if other:
        return "other"
    return "cuda" if torch.cuda.is_available() else ""


def _seed_torch(seed: int, accelerators: str) -> None:
    """torch.manual_seed(seed), without what is pure overhead in it: it queues a lazy
    seeding, with a stack trace formatted each time, for every device type that could still
    start (~0.2 ms a micro-batch on a machine without a GPU). Only the CPU generator where
    torch has no accelerator, the CPU and the GPUs where CUDA alone is there and running;
    torch.manual_seed itself otherwise (CUDA not started yet, other device types)."""
    if accelerators == "cuda" and torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)
        torch.default_generator.manual_seed(seed)
    elif accelerators:
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def _seed_python(seed: int) -> None:
    """Python's and NumPy's global RNGs (torch's are the engine's business)."""
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % (2**32))


def _seed_data_stream(seed: int, accelerators: str) -> None:
    """A logical worker's data stream: torch's, Python's and NumPy's generators."""
    _seed_torch(seed, accelerators)
    _seed_python(seed)


class _Boundary:
    """What every loader does between steps: the step boundary and the plan (shared by the
    map-style :class:`ElasticLoader` and :class:`StreamLoader`)."""

    job: Any  # the ElasticJob
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

    def _hand_over(self, i: int, batch: Any) -> Any:
        """Micro-batch ``i`` of the step goes to the training loop, under its logical
        worker's model stream."""
        self.job._begin_micro_batch(i)
        _seed_python(self._plan.workers[i].rng_seed)
        return batch


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

    def __init__(self, job: Any, dataset: Any, batch_size: int, *, steps: Optional[int],
                 epochs: Optional[float], shuffle: bool, num_workers: int,
                 collate_fn: Optional[Callable[[List[Any]], Any]], pin_memory: bool,
                 drop_last: bool = True, persistent_workers: bool = False) -> None:
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise MalleValueError("dataset: must be map-style (len() and [index]) or a "
                                  "torch.utils.data.IterableDataset")
        if num_workers < 0:
            raise MalleValueError(f"num_workers: must be >= 0, got {num_workers}")
        if persistent_workers and num_workers == 0:
            raise MalleValueError("persistent_workers: needs num_workers > 0")
        job._engine.set_data(len(dataset), batch_size, steps, epochs, shuffle, drop_last)
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
        self._keys: Any = None  # _C.BatchKeys of the membership in force
        self._plan: Any = None
        self._started = False

    def __iter__(self) -> "ElasticLoader":
        self.job._require_wrapped()
        if self._started:
            raise MalleValueError("ElasticLoader: iterate it only once")
        self._started = True
        return self

    def _new_plan(self, plan: Any) -> None:
        e = self.job._engine
        if self._keys is None or not self._keys.follows(plan, e.position):
            # One item per micro-batch from this step on, fetched and collated under its
            # logical worker's data stream by the DataLoader (or its worker process); a
            # redone step, a resize or a restored state starts a new iterator.
            self._keys = e.keys_from(plan)
            self._sampler.gen = self._keys
            self._it = iter(self._dl)

    def __next__(self) -> Any:
        e = self.job._engine
        if self._next_plan() is None:
            raise StopIteration
        t0 = time.perf_counter()
        batch = next(self._it)
        e.add_data_wait(time.perf_counter() - t0)
        return self._hand_over(e.micro_batch + 1, batch)


class _Keys:
    """A DataLoader sampler over the (data seed, indices) keys in force."""

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
        self.accelerators = _accelerators()

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Tuple[int, List[int]]) -> Any:
        seed, indices = key
        _seed_data_stream(seed, self.accelerators)
        getitems = getattr(self.dataset, "__getitems__", None)
        samples = getitems(indices) if getitems is not None else [self.dataset[i] for i in indices]
        return self.collate_fn(samples)


def _as_fetched(batch: Any) -> Any:
    return batch  # _MicroBatches collated it (module-level: picklable for workers)


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and \
        callable(getattr(obj, "load_state_dict", None))


class _Position:
    """The stream's position as a tracked object: samples consumed and the dataset's own
    state. Loading it restarts the stream there."""

    def __init__(self, loader: "StreamLoader") -> None:
        self._loader = loader

    def state_dict(self) -> Any:
        src = self._loader._source()
        return {"consumed": self._loader.consumed,
                "dataset": copy.deepcopy(src.state_dict()) if src is not None else None}

    def load_state_dict(self, sd: Any) -> None:
        ld = self._loader
        if sd["dataset"] is not None:
            ld.dataset.load_state_dict(sd["dataset"])
        ld.consumed = int(sd["consumed"])
        ld._it = None  # the next read starts from the loaded position


class StreamLoader(_Boundary):
    """This rank's micro-batches of an ``IterableDataset``, step after step. Created by
    :meth:`malletrain.ElasticJob.loader`; iterate it once (or :meth:`steps`)."""

    def __init__(self, job: Any, dataset: Any, batch_size: int, *, steps: Optional[int],
                 epochs: Optional[float],
                 collate_fn: Optional[Callable[[List[Any]], Any]], num_workers: int) -> None:
        if not _stateful(dataset):
            raise MalleValueError(
                "dataset: an IterableDataset needs a resumable position, state_dict() and "
                "load_state_dict() (torchdata's Stateful protocol), so that joiners and a "
                "redone step start where the job is; docs/elastic.md, 'Data'")
        if job.logical_workers is None:
            raise MalleValueError("dataset: an IterableDataset needs logical_workers")
        if steps is None or epochs is not None:
            raise MalleValueError("dataset: an IterableDataset is a stream: give steps=, "
                                  "not epochs=")
        if num_workers != 0:
            raise MalleValueError("num_workers: must be 0 for an IterableDataset (the "
                                  "stream is read in order by the training process)")
        L = job.logical_workers
        # The engine's sampler is not used for a stream; it only needs one global batch.
        job._engine.set_data(L * batch_size, batch_size, steps, None, False)
        self.job = job
        self.dataset = dataset
        self.batch_size = batch_size
        self.total_steps = job._engine.total_steps
        self.collate_fn = collate_fn or torch.utils.data.default_collate
        self.accelerators = _accelerators()
        self.consumed = 0
        self._it: Optional[Iterator[Any]] = None
        self._batches: List[Any] = []
        self._plan: Any = None
        self._started = False
        job.track("data_stream", _Position(self))

    def _source(self) -> Any:
        return self.dataset

    def __iter__(self) -> "StreamLoader":
        self.job._require_wrapped()
        if self._started:
            raise MalleValueError("StreamLoader: iterate it only once")
        self._started = True
        return self

    def _read(self, n: int) -> List[Any]:
        if self._it is None:
            self._it = iter(self.dataset)
        out = []
        for _ in range(n):
            try:
                out.append(next(self._it))
            except StopIteration:
                raise MalleValueError(
                    f"dataset: the stream ended after {self.consumed + len(out)} samples; "
                    f"{self.total_steps} steps need {self.total_steps * self.job.logical_workers * self.batch_size}") from None
        self.consumed += n
        return out

    def _new_plan(self, plan: Any) -> None:
        job, e = self.job, self.job._engine
        L, B = job.logical_workers, self.batch_size
        expect = plan.step * L * B
        if self.consumed != expect:
            raise MalleValueError(f"dataset: the stream is at sample {self.consumed}, step "
                                  f"{plan.step} starts at {expect} (its state_dict does not "
                                  f"restore the position)")
        mine = {w.worker: w for w in plan.workers}
        t0 = time.perf_counter()
        self._batches = []
        for k in range(L):
            _seed_data_stream(e.data_seed(plan.step, k), self.accelerators)
            samples = self._read(B)
            if k in mine:
                self._batches.append(self.collate_fn(samples))
        e.add_data_wait(time.perf_counter() - t0)

    def __next__(self) -> Any:
        if self._next_plan() is None:
            raise StopIteration
        i = self.job.micro_batch + 1
        return self._hand_over(i, self._batches[i])
