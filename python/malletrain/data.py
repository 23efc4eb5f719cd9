"""Iterable datasets in an elastic job: one stream of samples with a resumable position.

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
import time
from typing import Any, Callable, Iterator, List, Optional

import torch

from malletrain import elastic as _elastic
from malletrain.errors import MalleValueError

__all__ = ["StreamLoader"]


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


class StreamLoader(_elastic._Boundary):
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
            seed, _ = e.batch_key(plan.step, k, 0)
            torch.manual_seed(seed)
            _elastic._seed_python(seed)
            samples = self._read(B)
            if k in mine:
                self._batches.append(self.collate_fn(samples))
        e.add_data_wait(time.perf_counter() - t0)

    def __next__(self) -> Any:
        if self._next_plan() is None:
            raise StopIteration
        i = self.job.micro_batch + 1
        batch = self._batches[i]
        self.job._begin_micro_batch(i)
        _elastic._seed_python(self._plan.workers[i].rng_seed)
        return batch
