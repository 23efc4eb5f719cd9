"""Per-step and per-resize callbacks of an elastic job (:meth:`ElasticJob.add_callback`).

    class Log(malletrain.callbacks.Callback):
        def on_step_end(self, job, step):      # after each committed step, every rank
            if job.rank == 0 and step % 100 == 0:
                print(step, job.size)
        def on_resize(self, job, event):       # after each membership change this rank saw
            print(event.kind, event.size, event.phases["total"])

    job.add_callback(Log())
    job.add_callback(malletrain.callbacks.TensorBoard("runs/job"))   # needs tensorboard

``on_step_end(job, step)`` runs right after step ``step`` committed (inside
``optimizer.step()`` / ``scaler.step()``), once per step, never for an attempt that failed;
``on_resize(job, event)`` before the first micro-batch of the step that follows a change
(``event`` is a :class:`malletrain.elastic.ResizeEvent`). Both run on the training thread of
every rank; what they change outside the job state is theirs (not rolled back, not sent to
joiners).
"""

from __future__ import annotations

import time
from typing import Any, Optional

__all__ = ["Callback", "TensorBoard"]


class Callback:
    """Base class (optional: any object with either method will do)."""

    def on_step_end(self, job: Any, step: int) -> None:
        pass

    def on_resize(self, job: Any, event: Any) -> None:
        pass


class TensorBoard(Callback):
    """Scalars for TensorBoard from whichever rank leads (rank 0 of the current
    generation): ``elastic/world_size`` and ``elastic/samples_per_s`` (over the last
    ``every`` committed steps) by step, ``elastic/resize_pause_s`` (the pause of each
    membership change). Needs the ``tensorboard`` package (``pip install
    malletrain[tensorboard]``); ``batch_size`` is per logical worker."""

    def __init__(self, log_dir: str, batch_size: int, every: int = 10,
                 writer: Optional[Any] = None) -> None:
        if writer is None:
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(log_dir)
        self.writer = writer
        self.batch_size = batch_size
        self.every = max(1, int(every))
        self._t0: Optional[float] = None
        self._n = 0

    def on_step_end(self, job: Any, step: int) -> None:
        if job.rank != 0:
            self._t0 = None
            return
        now = time.perf_counter()
        if self._t0 is None:
            self._t0, self._n = now, 0
            return
        self._n += 1
        if self._n >= self.every:
            workers = job.logical_workers or job.size
            rate = self._n * workers * self.batch_size / (now - self._t0)
            self.writer.add_scalar("elastic/samples_per_s", rate, step)
            self.writer.add_scalar("elastic/world_size", job.size, step)
            self._t0, self._n = now, 0

    def on_resize(self, job: Any, event: Any) -> None:
        self._t0 = None  # the pause is not throughput
        if job.rank == 0:
            self.writer.add_scalar("elastic/resize_pause_s", event.phases.get("total", 0.0),
                                   event.resume_step)
            self.writer.add_scalar("elastic/world_size", event.size, event.resume_step)
            self.writer.flush()
