"""A LightningModule trained with ``Trainer(strategy=malletrain.lightning.ElasticStrategy)``,
as a test script run under ``malletrain local`` (tests/python/test_lightning.py).

The model and data are exact_job.py's: the digits with random augmentation in
``__getitem__`` (torch, NumPy, Python's random), a model with BatchNorm, dropout and a module
with its own buffers. AdamW with two LR schedulers (a per-step StepLR and a per-epoch
ExponentialLR), gradient clipping by the Trainer, a validation loop each epoch, ``self.log``.
1400 samples, 4 logical workers of 32: 10 steps an epoch, 3 epochs.

``--die RANK@STEP:PHASE`` as in exact_job.py (``forward``: after the first micro-batch's
training_step; ``backward``: after the last micro-batch's backward). ``--join-at STEP``: the
joiner (a process that is not one of the job's first members) calls ``fit`` once the job has
committed STEP steps, and the members wait after step STEP-1 until its fit loop has started,
so that it joins at step STEP or the next one, however long it took to start. ``--out DIR``: every member still in the job writes ``final-<member>.pt``
(module state_dict, optimizer, schedulers, global step, epoch) when training ends; every
member ``trace-<member>.jsonl`` (one line per micro-batch) and ``result-<member>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

import lightning.pytorch as pl

import malletrain
import malletrain.elastic
from malletrain.lightning import ElasticCallback, ElasticStrategy
from exact_job import Digits, build_model


class DigitsModule(pl.LightningModule):
    def __init__(self, args, record) -> None:
        super().__init__()
        self.args = args
        self.record = record
        self.net = build_model()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(Digits(augment=True), batch_size=32, shuffle=True)

    def val_dataloader(self):
        from sklearn.datasets import load_digits
        d = load_digits()
        x = torch.tensor(d.data[1400:], dtype=torch.float32) / 16.0
        y = torch.tensor(d.target[1400:], dtype=torch.int64)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=512)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=2e-3, weight_decay=0.01)
        return [opt], [
            {"scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.8),
             "interval": "step"},
            {"scheduler": torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5),
             "interval": "epoch"},
        ]

    @property
    def job(self):
        return self.trainer.strategy.job

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        job = self.job
        self.record.trace(job, idx, batch_idx, self.trainer.current_epoch)
        loss = F.cross_entropy(self.net(x), y)
        if job.micro_batch == 0:
            self.record.maybe_die(job, "forward")
        self.log("train_loss", loss)
        return loss

    def on_after_backward(self):
        job = self.job
        if job.micro_batch == len(job.workers) - 1:
            self.record.maybe_die(job, "backward")

    def validation_step(self, batch, batch_idx):
        x, y = batch
        acc = (self.net(x).argmax(1) == y).float().mean()
        self.log("val_acc", acc)

    def on_train_start(self):
        if self.args.join_at >= 0 and is_joiner():  # next: its first step, where it joins
            open(os.path.join(self.args.out, "joiner-ready"), "w").close()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.record.batches.append([batch.step, batch_idx, self.trainer.current_epoch,
                                    self.trainer.global_step])
        if batch.step + 1 == self.args.join_at:  # the joiner joins at this boundary or the next
            wait_for(os.path.join(self.args.out, "joiner-ready"))
        if self.args.step_sleep:
            time.sleep(self.args.step_sleep)

    def on_train_epoch_end(self):
        self.record.epochs.append(self.trainer.current_epoch)

    def on_train_end(self):
        if not self.job.left:  # every member: a rank whose state diverged would show
            opt = self.trainer.optimizers[0]
            torch.save({"model": self.state_dict(), "optimizer": opt.state_dict(),
                        "schedulers": [c.scheduler.state_dict()
                                       for c in self.trainer.lr_scheduler_configs],
                        "global_step": self.trainer.global_step,
                        "epoch": self.trainer.current_epoch},
                       os.path.join(self.args.out, f"final-{self.job.member_id}.pt"))


class Record(ElasticCallback):
    """The trace, the resize events and what the loop counted, per member."""

    def __init__(self, args) -> None:
        self.args = args
        self.batches, self.epochs, self.resizes = [], [], []
        self.file = None
        die_rank, die_step, die_phase = -1, -1, ""
        if args.die:
            who, _, rest = args.die.partition("@")
            s, _, die_phase = rest.partition(":")
            die_rank, die_step = int(who), int(s)
        self.die = (die_rank, die_step, die_phase)

    def on_resize(self, trainer, pl_module, event):
        self.resizes.append([event.kind, event.size, event.resume_step])

    def trace(self, job, idx, batch_idx, epoch) -> None:
        if self.file is None:
            self.file = open(os.path.join(self.args.out, f"trace-{job.member_id}.jsonl"), "w",
                             buffering=1)
        self.file.write(json.dumps({
            "step": job.step, "micro": job.micro_batch, "worker": job.workers[job.micro_batch],
            "size": job.size, "indices": idx.tolist(), "batch_idx": batch_idx,
            "epoch": epoch}) + "\n")

    def maybe_die(self, job, phase: str) -> None:
        rank, step, die_phase = self.die
        if job.step == step and phase == die_phase and job.rank == rank:
            try:  # once per run
                os.close(os.open(os.path.join(self.args.out, "died"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
            os.kill(os.getpid(), signal.SIGKILL)


def is_joiner() -> bool:
    """Not one of the job's first MALLE_BOOTSTRAP_SIZE members (the launcher names them
    node0, node1, ...)."""
    member = os.environ.get("MALLE_MEMBER_ID", "")
    first = int(os.environ.get("MALLE_BOOTSTRAP_SIZE", "0"))
    return member.startswith("node") and int(member[4:]) >= first


def wait_for_progress(step: int, timeout: float = 180.0) -> None:
    """Until the job has committed ``step`` steps (rank 0 publishes the count)."""
    host, _, port = os.environ["MALLE_STORE"].rpartition(":")
    store = malletrain._C.ControlStore.connect(host, int(port))
    key = malletrain.elastic.progress_key(os.environ["MALLE_JOB_ID"])
    deadline = time.monotonic() + timeout
    while True:
        v = store.try_get(key)
        if v is not None and int(v) >= step:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the job did not reach step {step} in {timeout:g} s")
        time.sleep(0.05)


def wait_for(path: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout:g} s")
        time.sleep(0.05)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--die", default="")
    p.add_argument("--join-at", type=int, default=-1)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)

    record = Record(args)
    module = DigitsModule(args, record)
    strategy = ElasticStrategy(logical_workers=4, seed=11, deterministic=args.deterministic)
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=1,
                         max_epochs=args.epochs, gradient_clip_val=0.5, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[record])
    if args.join_at >= 0 and is_joiner():
        wait_for_progress(args.join_at)  # started with the others: everything is built
    trainer.fit(module)
    job = strategy.job
    if record.file is not None:
        record.file.close()
    with open(os.path.join(args.out, f"result-{job.member_id}.json"), "w") as f:
        json.dump({"redone_steps": job.redone_steps, "left": job.left, "steps": job.step,
                   "global_step": trainer.global_step, "epoch": trainer.current_epoch,
                   "batches": record.batches, "epochs": record.epochs,
                   "resizes": record.resizes,
                   "history": [[ev.kind, ev.size] for ev in job.history]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
