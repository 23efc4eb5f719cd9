"""The model and optimizer of an elastic job, as PyTorch objects.

:meth:`malletrain.ElasticJob.wrap_model` and :meth:`~malletrain.ElasticJob.wrap_optimizer`
return these: the training loop stays a plain DDP loop (``loss.backward()``,
``optimizer.step()``), while the engine reduces the gradients once per step, after the last
of this rank's micro-batches, and commits the step when the optimizer has stepped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import torch

from malletrain.errors import MalleValueError

if TYPE_CHECKING:
    from malletrain.elastic import ElasticJob

__all__ = ["ElasticModel", "ElasticOptimizer"]


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
