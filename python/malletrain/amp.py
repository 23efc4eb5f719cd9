"""Mixed precision in an elastic job: ``torch.amp.GradScaler`` acting once per step.

A DDP loop with AMP keeps its shape; the scaler is wrapped by the job::

    scaler = job.wrap_scaler(torch.amp.GradScaler("cuda"))   # or "cpu"
    for x, y in job.loader(dataset, batch_size=16, steps=1000):
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):     # bf16 on CPU
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)                            # optional, before clipping
        optimizer.clip_grad_norm_(1.0)                        # optional
        scaler.step(optimizer)
        scaler.update()

Why a wrapper: a rank runs several micro-batches per step (its logical workers), and the
plain scaler would unscale, check for infs, step and update its scale after each of them,
on a gradient that is neither complete nor synchronised, so that ranks could disagree on
whether to skip. Here ``unscale_``, ``step`` and ``update`` act once per step, after the
gradient synchronisation: the inf check sees the reduced gradient, which is the same on
every rank, so every rank skips the same steps. A skipped step (an inf or NaN in the
gradient) is an ordinary step for the job: it commits without an update, the data moves on,
and the scaler backs off, exactly as in the fixed-size run. The scaler's state is job state
(:meth:`ElasticJob.wrap_scaler` tracks it): joiners receive it, and a step that does not
commit gives it back.
"""

from __future__ import annotations

from typing import Any, Optional

from malletrain.errors import MalleValueError

__all__ = ["ElasticGradScaler"]


class ElasticGradScaler:
    """A ``torch.amp.GradScaler`` whose ``unscale_``, ``step`` and ``update`` act once per
    step on the synchronised gradient. ``scale()`` and every other attribute are the
    scaler's (``.scaler``). Created by :meth:`malletrain.ElasticJob.wrap_scaler`."""

    def __init__(self, job: Any, scaler: Any) -> None:
        if not hasattr(scaler, "scale") or not hasattr(scaler, "update"):
            raise MalleValueError("wrap_scaler: expects a torch.amp.GradScaler")
        self.scaler = scaler
        self._job = job
        self._stepped = False  # scaler.step ran on this step's gradient; update() pending

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scaler, name)

    def _check(self, optimizer: Any) -> Any:
        from malletrain.optim import ElasticOptimizer
        if not isinstance(optimizer, ElasticOptimizer) or optimizer._job is not self._job:
            raise MalleValueError("scaler: give it the optimizer job.wrap_optimizer returned")
        return optimizer

    def scale(self, outputs: Any) -> Any:
        return self.scaler.scale(outputs)

    def unscale_(self, optimizer: Any) -> bool:
        """On the step's last micro-batch: synchronises the gradients, then divides them by
        the scale (once per step). True when the gradient is now the full, unscaled one
        (clip it now); False on the other micro-batches or when the synchronisation failed.
        """
        opt = self._check(optimizer)
        if not opt.synchronize():
            return False
        if not self._unscaled(opt):
            self.scaler.unscale_(opt.optimizer)
        return True

    def _unscaled(self, opt: Any) -> bool:
        if not getattr(self.scaler, "_enabled", True):
            return True
        states = getattr(self.scaler, "_per_optimizer_states", {})
        st = states.get(id(opt.optimizer))
        return st is not None and st["stage"].name == "UNSCALED"

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> bool:
        """Ends the micro-batch; after the step's last one, if the gradients synchronised,
        the scaler's step (unscale if not done, skip the update if they hold an inf or NaN)
        and the commit. True when this call committed the step (whether or not the
        optimizer updated: ``found_inf`` skips are ordinary steps)."""
        if "closure" in kwargs or args:
            raise MalleValueError("scaler.step: closures are not supported with a GradScaler "
                                  "(as in torch)")
        opt = self._check(optimizer)

        def update() -> None:
            self.scaler.step(opt.optimizer)
            self._stepped = True

        return opt._finish_step(update)

    def update(self, new_scale: Optional[Any] = None) -> None:
        """Updates the scale once per committed step (after :meth:`step`); a no-op on the
        other micro-batches."""
        if not self._stepped:
            return
        self._stepped = False
        self.scaler.update(new_scale)

    def state_dict(self) -> Any:
        return self.scaler.state_dict()

    def load_state_dict(self, sd: Any) -> None:
        self.scaler.load_state_dict(sd)
