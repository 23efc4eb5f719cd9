"""A PyTorch Lightning strategy: a ``LightningModule`` trains elastically.

::

    import lightning.pytorch as pl
    from malletrain.lightning import ElasticStrategy

    trainer = pl.Trainer(strategy=ElasticStrategy(logical_workers=4, seed=0),
                         accelerator="cpu", max_epochs=3)
    trainer.fit(module)            # under `malletrain local` or the allocator's agents

Every process of the job runs the same script; the job grows, shrinks and survives kill -9
while ``fit`` runs, and ends with the state of the fixed-size run (docs/elastic.md,
"Lightning"). Needs ``pip install malletrain[lightning]`` (Lightning 2.6).

How it maps Lightning's loop onto the engine's steps:

- One Lightning batch is one *step* of the job: the global batch of ``L`` logical workers of
  ``batch_size`` samples each (the train ``DataLoader``'s ``batch_size`` is per logical
  worker). The strategy replaces the train ``DataLoader`` by the job's loader over the same
  dataset; what Lightning's loop fetches is a :class:`StepBatch` handle, not data, so that
  Lightning's prefetching (it fetches a batch ahead to know which one is last) cannot run
  the step boundary early. The boundary runs inside the optimizer step.
- The optimizer step runs this rank's micro-batches (one per logical worker it holds):
  ``training_step``, ``zero_grad`` (before the first only) and backward for each, then the
  gradient synchronisation, then Lightning's precision plugin's step (``on_before_optimizer_step``,
  gradient clipping, a ``GradScaler``'s unscale/step/update) once, on the synchronised
  gradient. A step that fails (a peer died) is redone inside the same Lightning batch, so
  Lightning sees each step once: ``global_step`` is the job's committed step count, and
  LR schedulers, ``on_train_batch_end`` and ``max_steps`` follow committed steps.
- A Lightning epoch is ``N // (L * batch_size)`` steps (``ceil`` with ``drop_last=False``);
  the data is the engine's stream of shuffled epochs (each sample once per pass).
- Job state: the module's parameters and buffers, the optimizer, the LR schedulers of
  ``configure_optimizers`` and the precision plugin's ``GradScaler``; anything else a joiner
  needs: ``strategy.job.track(name, obj)`` in ``setup()`` or ``configure_optimizers``. A
  joiner's loop counters (epoch, batch index, ``global_step``) are set to the job's step at
  its first step.
- Rank and size are the job's: ``trainer.global_rank``, ``trainer.world_size``,
  ``is_global_zero`` and Lightning's ``rank_zero_only`` change with the membership.

Refused with :class:`malletrain.errors.MalleValueError` (a message naming the setting):
manual optimization, several optimizers, ``accumulate_grad_batches`` > 1 (the logical
workers are the accumulation), ``limit_train_batches``/``overfit_batches``,
``reload_dataloaders_every_n_epochs``, a train ``DataLoader`` with a custom sampler, batch
sampler or ``worker_init_fn``, an iterable train dataset, ``training_step`` returning
None, a fit that stops before the job's last step (``EarlyStopping``, ``max_time``), a
second ``fit`` with one strategy. Collectives the strategy offers Lightning are local:
``self.log(..., sync_dist=True)`` logs this rank's value, ``broadcast`` returns its input,
``barrier`` returns at once; ``all_gather`` is refused.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable, Dict, Optional, Union

import torch

import lightning.pytorch as pl
from lightning.pytorch.strategies.strategy import Strategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_only as _utils_rank_zero_only

import malletrain
from malletrain.errors import MalleValueError

__all__ = ["ElasticCallback", "ElasticStrategy", "StepBatch"]


class StepBatch:
    """What Lightning's loop fetches for one step: a handle, not data. The step's
    micro-batches are fetched by the strategy at the step boundary (inside the optimizer
    step); ``training_step`` receives each of them. ``on_train_batch_start``/``_end``
    hooks receive this handle; ``step`` is the job step it ran (-1 before it ran)."""

    __slots__ = ("step",)

    def __init__(self) -> None:
        self.step = -1

    def __repr__(self) -> str:
        return f"StepBatch(step={self.step})"


class ElasticCallback(pl.Callback):
    """A Lightning callback that also hears of membership changes:
    ``on_resize(trainer, pl_module, event)`` runs on every rank before the first
    micro-batch of the step that follows a change this rank went through (``event``: a
    :class:`malletrain.elastic.ResizeEvent`: kind, size, rank, resume step, pause phases).
    Any callback in ``Trainer(callbacks=...)`` with an ``on_resize`` method of that
    signature is called the same way; so is the LightningModule's."""

    def on_resize(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                  event: Any) -> None:
        pass


class _Steps:
    """The train dataloader Lightning iterates: ``steps_per_epoch`` lazy step handles per
    epoch. It has a length, so Lightning's fetcher counts instead of prefetching."""

    def __init__(self, steps_per_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self) -> Any:
        return (StepBatch() for _ in range(self.steps_per_epoch))


class _Resizes:
    """Forwards the job's resize events to the trainer's callbacks and module."""

    def __init__(self, strategy: "ElasticStrategy") -> None:
        self._strategy = strategy

    def on_resize(self, job: Any, event: Any) -> None:  # noqa: ARG002
        trainer = self._strategy._trainer
        module = self._strategy.lightning_module
        if trainer is None or module is None:
            return
        for obj in [*trainer.callbacks, module]:
            fn = getattr(obj, "on_resize", None)
            if callable(fn):
                fn(trainer, module, event)


class ElasticStrategy(Strategy):
    """Lightning's ``Trainer(strategy=...)`` for an elastic malletrain job.

    Args:
        logical_workers: ``L``, the job's fixed number of logical workers (required:
            the global batch is ``L`` times the train DataLoader's ``batch_size``).
        seed, deterministic: as :func:`malletrain.init`.
        job: an :class:`malletrain.ElasticJob` made by the caller instead (then the other
            arguments must not be given); by default the strategy calls
            :func:`malletrain.init` when ``fit`` starts.
        **init_kwargs: the rest of :func:`malletrain.init`'s arguments (timeouts,
            ``park_dir``, ``backend``, ...).

    ``strategy.job`` is the job (after ``fit`` started): ``track`` more objects, add
    malletrain callbacks, read ``history`` or ``redone_steps``.
    """

    strategy_name = "malletrain_elastic"

    def __init__(self, logical_workers: Optional[int] = None, *, seed: int = 0,
                 deterministic: bool = False, job: Optional[Any] = None,
                 accelerator: Optional[Any] = None, checkpoint_io: Optional[Any] = None,
                 precision_plugin: Optional[Any] = None, **init_kwargs: Any) -> None:
        super().__init__(accelerator=accelerator, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        if job is not None and (logical_workers is not None or init_kwargs):
            raise MalleValueError("ElasticStrategy: give either job= or malletrain.init's "
                                  "arguments, not both")
        if job is None and logical_workers is None:
            raise MalleValueError("ElasticStrategy: logical_workers is required (the global "
                                  "batch is logical_workers x the DataLoader's batch_size)")
        if job is not None and job.logical_workers is None:
            raise MalleValueError("ElasticStrategy: the job needs logical_workers")
        self._init_args: Dict[str, Any] = dict(logical_workers=logical_workers, seed=seed,
                                               deterministic=deterministic, **init_kwargs)
        self.job: Any = job
        self._owns_job = job is None  # made here: closed here too
        self._trainer: Optional[pl.Trainer] = None
        self._loader: Any = None      # the job's ElasticLoader
        self._it: Any = None          # its iterator (micro-batches)
        self._steps: Optional[_Steps] = None
        self._micro: Any = None       # the micro-batch training_step gets next
        self._batch_idx = 0           # its Lightning batch index (the job's step in the epoch)
        self._fitted = False
        self._done = False            # the job's loader ended for this member
        self._eopt: Any = None
        self._module_hooks: Dict[str, Any] = {}

    # --- ranks: the job's -----------------------------------------------------------------
    @property
    def root_device(self) -> torch.device:
        acc = self.accelerator
        if acc is not None and type(acc).__name__ == "CUDAAccelerator":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    @property
    def global_rank(self) -> int:
        """The job rank (-1 before this process joined and after it left)."""
        if self.job is None or self.job.left:
            return -1
        return self.job.rank

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return max(self.global_rank, 0)

    @property
    def world_size(self) -> int:
        return max(self.job.size, 1) if self.job is not None else 1

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def is_distributed(self) -> bool:
        return False  # no DistributedSampler: the job's sampler serves the data

    @property
    def distributed_sampler_kwargs(self) -> None:
        return None

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    # Lightning's collectives over the job: local (docs above).
    def reduce(self, tensor: Any, group: Optional[Any] = None,
               reduce_op: Optional[Union[str, Any]] = "mean") -> Any:
        return tensor

    def barrier(self, name: Optional[str] = None) -> None:
        pass

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def all_gather(self, tensor: torch.Tensor, group: Optional[Any] = None,
                   sync_grads: bool = False) -> torch.Tensor:
        raise MalleValueError("ElasticStrategy: all_gather across an elastic job is not "
                              "supported (the membership changes between steps)")

    # --- set-up -------------------------------------------------------------------------
    def setup_environment(self) -> None:
        super().setup_environment()
        if self.job is None:
            self.job = malletrain.init(**self._init_args)

    def setup(self, trainer: "pl.Trainer") -> None:
        self._trainer = trainer
        if trainer.state.fn == TrainerFn.FITTING:
            if self._fitted:
                raise MalleValueError("ElasticStrategy: one fit per strategy (and job); the "
                                      "job closes when fit ends")
            self._check_trainer(trainer)
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        self._fitted = True
        module = self.lightning_module
        assert module is not None
        if len(self.optimizers) != 1:
            raise MalleValueError(f"ElasticStrategy: configure_optimizers must return one "
                                  f"optimizer, got {len(self.optimizers)}")
        job = self.job
        job.wrap_model(module)
        self._eopt = job.wrap_optimizer(self.optimizers[0])
        # zero_grad (in Lightning's closure) acts before a step's first micro-batch only.
        self.optimizers = [self._eopt]
        for i, config in enumerate(self.lr_scheduler_configs):
            job.track(f"lr_scheduler{i}", config.scheduler)
        scaler = getattr(self.precision_plugin, "scaler", None)
        if scaler is not None:
            job.track("grad_scaler", scaler)
        job.add_callback(_Resizes(self))
        # The loop passes the step handle to the module's on_before_batch_transfer hook;
        # the hook sees micro-batches instead (see _to_device).
        original = module._on_before_batch_transfer
        self._module_hooks["_on_before_batch_transfer"] = original
        module.__dict__["_on_before_batch_transfer"] = _passing_steps(original)

    def _check_trainer(self, trainer: "pl.Trainer") -> None:
        module = self.lightning_module
        assert module is not None
        if not module.automatic_optimization:
            raise MalleValueError("ElasticStrategy: manual optimization is not supported "
                                  "(automatic_optimization must be True)")
        if trainer.accumulate_grad_batches != 1:
            raise MalleValueError(
                f"ElasticStrategy: accumulate_grad_batches={trainer.accumulate_grad_batches} "
                f"is not supported: the logical workers are the accumulation (a step "
                f"accumulates L={self.job.logical_workers} micro-batches); raise "
                f"logical_workers instead")
        if trainer.limit_train_batches != 1.0 or trainer.overfit_batches:
            raise MalleValueError("ElasticStrategy: limit_train_batches and overfit_batches "
                                  "are not supported (use max_steps)")
        if trainer.reload_dataloaders_every_n_epochs:
            raise MalleValueError("ElasticStrategy: reload_dataloaders_every_n_epochs is not "
                                  "supported (the job's loader serves the whole fit)")
        if trainer.max_steps == -1 and trainer.max_epochs in (None, -1):
            raise MalleValueError("ElasticStrategy: give max_epochs or max_steps (the job's "
                                  "length is fixed when it starts)")

    # --- data ---------------------------------------------------------------------------
    def process_dataloader(self, dataloader: object) -> object:
        trainer = self._trainer
        if trainer is None or not trainer.training or self._steps is not None:
            return dataloader  # validation, test, predict: each rank runs them whole
        self._steps = self._make_loader(dataloader, trainer)
        return self._steps

    def _make_loader(self, dl: Any, trainer: "pl.Trainer") -> _Steps:
        if not isinstance(dl, torch.utils.data.DataLoader):
            raise MalleValueError(f"ElasticStrategy: the train dataloader must be a "
                                  f"torch.utils.data.DataLoader, got {type(dl).__name__}")
        if isinstance(dl.dataset, torch.utils.data.IterableDataset):
            raise MalleValueError("ElasticStrategy: an IterableDataset as the train dataset "
                                  "is not supported yet (a map-style dataset is)")
        if dl.batch_size is None:
            raise MalleValueError("ElasticStrategy: the train DataLoader needs batch_size "
                                  "(a batch_sampler is not supported)")
        sampler = dl.sampler
        if type(sampler) is torch.utils.data.RandomSampler:
            if sampler.replacement or sampler._num_samples is not None:
                raise MalleValueError("ElasticStrategy: a RandomSampler with replacement or "
                                      "num_samples is not supported")
            shuffle = True
        elif type(sampler) is torch.utils.data.SequentialSampler:
            shuffle = False
        else:
            raise MalleValueError(f"ElasticStrategy: the train DataLoader's sampler "
                                  f"{type(sampler).__name__} is not supported (the job's "
                                  f"sampler shuffles: shuffle=True or False)")
        if dl.worker_init_fn is not None:
            raise MalleValueError("ElasticStrategy: worker_init_fn is not supported (each "
                                  "micro-batch is fetched under its logical worker's seed)")
        job = self.job
        L, B, N = job.logical_workers, dl.batch_size, len(dl.dataset)
        per_epoch = N // (L * B) if dl.drop_last else -(-N // (L * B))
        if per_epoch < 1:
            raise MalleValueError(f"ElasticStrategy: the train dataset has {N} samples, fewer "
                                  f"than one global batch (L={L} x batch_size={B})")
        total = per_epoch * trainer.max_epochs if trainer.max_epochs not in (None, -1) else None
        if trainer.max_steps != -1:
            total = trainer.max_steps if total is None else min(total, trainer.max_steps)
        collate = dl.collate_fn
        if collate is torch.utils.data.default_collate:
            collate = None
        self._loader = job.loader(
            dl.dataset, batch_size=B, steps=total, shuffle=shuffle, num_workers=dl.num_workers,
            collate_fn=collate, pin_memory=dl.pin_memory,
            persistent_workers=dl.persistent_workers)
        self._it = iter(self._loader)
        return _Steps(per_epoch)

    def batch_to_device(self, batch: Any, device: Optional[torch.device] = None,
                        dataloader_idx: int = 0) -> Any:
        if isinstance(batch, StepBatch):
            return batch  # its micro-batches move in _to_device
        return super().batch_to_device(batch, device, dataloader_idx)

    def _to_device(self, batch: Any) -> Any:
        """What Lightning's loop does to a fetched batch, for one micro-batch."""
        trainer = self._trainer
        module = self.lightning_module
        assert trainer is not None and module is not None
        batch = trainer.precision_plugin.convert_input(batch)
        batch = self._module_hooks["_on_before_batch_transfer"](batch, dataloader_idx=0)
        batch = super().batch_to_device(batch, None, 0)
        return batch

    # --- training -----------------------------------------------------------------------
    def on_train_start(self) -> None:
        # SIGTERM leaves the job at the next step boundary (the job's handler), instead of
        # Lightning's, which would stop the fit in the middle.
        if getattr(self.job, "_old_sigterm", None) is not None and \
                threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.job._on_sigterm)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], StepBatch):
            args[0].step = self.job.step
            args = (self._micro, self._batch_idx, *args[2:]) if len(args) > 1 \
                else (self._micro,)
        out = super().training_step(*args, **kwargs)
        if out is None:
            raise MalleValueError("ElasticStrategy: training_step returned None; every "
                                  "micro-batch of an elastic step must return a loss")
        return out

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any],
                       model: Optional[Any] = None, **kwargs: Any) -> Any:
        """One job step: the boundary, this rank's micro-batches (``closure``: training_step,
        zero_grad, backward), the synchronisation, then the precision plugin's step once;
        a step that failed runs again here. Raises StopIteration when this member is done
        (it left, or the job ended at a boundary), which ends Lightning's epoch."""
        model = model or self.lightning_module
        eopt = self._eopt
        if optimizer is not eopt:
            raise MalleValueError("ElasticStrategy: optimizer_step with an optimizer that is "
                                  "not the job's")
        job = self.job
        while True:
            try:
                first = next(self._it)  # the step boundary (joins, leaves, recovery, redo)
            except StopIteration:
                self._stop()
                raise
            self._align()
            # Lightning's rank_zero_* helpers print and warn from the job's rank 0 of now.
            rank_zero_only.rank = _utils_rank_zero_only.rank = self.global_rank
            loss = None
            n = len(job.workers)
            for i in range(n):
                self._micro = self._to_device(first if i == 0 else next(self._it))
                loss = closure()
                if i < n - 1:
                    eopt.synchronize()  # ends this micro-batch's backward

            def update() -> None:
                self.precision_plugin.optimizer_step(eopt.optimizer, model=model,
                                                     closure=lambda: loss, **kwargs)

            if eopt._finish_step(update):
                return loss
            # The synchronisation failed (a peer died): the next boundary rolls the step
            # back and it runs again, within this Lightning batch.

    def _stop(self) -> None:
        trainer = self._trainer
        assert trainer is not None
        self._done = True
        # Nothing more to train here: Lightning's loop stops (min_epochs/min_steps would
        # keep it going over a loader that has ended).
        trainer.should_stop = True
        trainer.fit_loop.min_epochs = 0
        trainer.fit_loop.epoch_loop.min_steps = None

    def _align(self) -> None:
        """Lightning's loop counters follow the job's step: a joiner (or a job resumed from
        a parked state) starts its loop at batch 0 of epoch 0 and learns the job's step at
        its first boundary; then its epoch, batch index and global step are set to the
        job's, as a resumed Lightning run would have them."""
        trainer = self._trainer
        assert trainer is not None and self._steps is not None
        step = self.job.step
        per_epoch = self._steps.steps_per_epoch
        epoch, batch = divmod(step, per_epoch)
        self._batch_idx = batch
        fit = trainer.fit_loop
        ep = fit.epoch_loop
        if (trainer.current_epoch, ep.batch_idx, ep.global_step) == (epoch, batch, step):
            return
        if (trainer.current_epoch, ep.batch_idx, ep.global_step) != (0, 0, 0):
            raise MalleValueError(
                f"ElasticStrategy: Lightning's loop is at epoch {trainer.current_epoch} batch "
                f"{ep.batch_idx} (global step {ep.global_step}) but the job at step {step} "
                f"(epoch {epoch}, batch {batch}); the loop was changed from outside")
        try:
            # This batch: ready and started, not processed (the loop increments those).
            _set(fit.epoch_progress.current, epoch + 1, epoch)
            _set(fit.epoch_progress.total, epoch + 1, epoch)
            _set(ep.batch_progress.current, batch + 1, batch)
            _set(ep.batch_progress.total, step + 1, step)
            opt_step = ep.automatic_optimization.optim_progress.optimizer.step
            opt_step.total.ready, opt_step.total.completed = step + 1, step
            opt_step.current.ready, opt_step.current.completed = batch + 1, batch
            ep._batches_that_stepped = step
            fetcher = fit._data_fetcher
            fetcher.fetched = batch + 1
            fetcher.done = fetcher.length is not None and fetcher.fetched >= fetcher.length
            ep.batch_progress.is_last_batch = fetcher.done
        except AttributeError as e:  # another Lightning than the one this was written for
            raise MalleValueError(
                f"ElasticStrategy: this Lightning ({pl.__version__}) keeps its loop state "
                f"differently ({e}); malletrain[lightning] supports lightning 2.6") from e

    def on_train_end(self) -> None:
        if self._done or self.job.left:
            return
        total = self._loader.total_steps
        if self.job.step < total:
            raise MalleValueError(
                f"ElasticStrategy: fit stopped at step {self.job.step}, before the job's last "
                f"step {total} (EarlyStopping, max_time or should_stop): not supported; every "
                f"member must train the job's steps")
        try:  # the job's last boundary: nobody exits while the others still need it
            next(self._it)
        except StopIteration:
            self._done = True
            return
        raise MalleValueError("ElasticStrategy: the job has steps left after fit ended")

    def teardown(self) -> None:
        module = self.lightning_module
        if module is not None:
            for name in self._module_hooks:
                module.__dict__.pop(name, None)
        self._module_hooks = {}
        fitting = self._trainer is not None and self._trainer.state.fn == TrainerFn.FITTING
        if self.job is not None and (self._fitted or (self._owns_job and fitting)):
            self.job.close()  # also a job made here for a fit that failed before training
        super().teardown()


def _set(progress: Any, started: int, done: int) -> None:
    """A progress counter: ready and started at ``started``, processed and completed at
    ``done``."""
    progress.ready = progress.started = started
    progress.processed = progress.completed = done


def _passing_steps(hook: Callable[..., Any]) -> Callable[..., Any]:
    def hook_or_pass(batch: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(batch, StepBatch):
            return batch
        return hook(batch, *args, **kwargs)
    return hook_or_pass
