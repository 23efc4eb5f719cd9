"""A training script of the tests' own (not the project's examples) for the exactness tests.

Real data (scikit-learn's 8x8 digits), a model whose state is more than its parameters
(BatchNorm running statistics and counter, dropout, a custom module with its own buffers)
and random augmentation where users put it: in ``Dataset.__getitem__`` (torch, Python's
``random`` and NumPy), in a ``collate_fn``, and in DataLoader worker processes
(``--num-workers``). Run it under ``malletrain local``.

``--die RANK@STEP:PHASE`` makes the member that is rank RANK at that step SIGKILL itself
during the step, once per run (rank 0: the leader, the state source), at a chosen point: ``forward`` (after the forward of its first micro-batch: the buffers have moved, the
gradients have not been reduced), ``backward`` (after its last backward: the others may
have reduced), ``step`` (right after optimizer.step()). The fault is injected, not hoped
for, so a test knows a step really failed.

``--out DIR``: rank 0 writes ``final.pt`` ({"model": state_dict(), "optimizer":
optimizer.state_dict(), "scheduler": ..., "steps": ...}); every rank writes
``trace-<member>.jsonl`` (one line per micro-batch it started: step, worker, indices, and
the first draws of its RNG streams) and ``result-<member>.json`` (redone_steps, history).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import malletrain


class Digits(torch.utils.data.Dataset):
    """The digits training split, with optional random augmentation in __getitem__."""

    def __init__(self, augment: bool) -> None:
        from sklearn.datasets import load_digits

        d = load_digits()
        x = torch.tensor(d.data, dtype=torch.float32) / 16.0
        y = torch.tensor(d.target, dtype=torch.int64)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(99))
        self.x, self.y = x[perm[:1400]], y[perm[:1400]]
        self.augment = augment

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        x = self.x[i]
        if self.augment:
            # The three RNGs users draw from in a dataset: torch, NumPy, Python's random.
            x = x + 0.1 * torch.randn(64)
            x = x * float(np.random.uniform(0.8, 1.2))
            if random.random() < 0.5:
                x = x.view(8, 8).flip(1).reshape(64)
        return x, self.y[i], i


def noisy_collate(batch):
    """A collate_fn that draws too (a random mixing weight, torch noise)."""
    x = torch.stack([b[0] for b in batch])
    y = torch.tensor([int(b[1]) for b in batch])
    idx = torch.tensor([int(b[2]) for b in batch])
    lam = float(np.random.beta(2.0, 2.0))
    x = lam * x + (1 - lam) * x.roll(1, 0) + 0.05 * torch.rand_like(x)
    return x, y, idx


class RunningScale(torch.nn.Module):
    """A user module with buffers of its own: an exponential average of its input's scale
    and a float64 counter, both updated in training forward passes."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(n))
        self.register_buffer("seen", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.scale.mul_(0.9).add_(0.1 * x.abs().mean(0))
                self.seen += x.shape[0]
        return x / (self.scale + 1e-3)


def build_model() -> torch.nn.Module:
    torch.manual_seed(5)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 96, bias=False), torch.nn.BatchNorm1d(96), torch.nn.ReLU(),
        torch.nn.Dropout(0.2), RunningScale(96),
        torch.nn.Linear(96, 48, bias=False), torch.nn.BatchNorm1d(48), torch.nn.ReLU(),
        torch.nn.Linear(48, 10))


def build_other_model() -> torch.nn.Module:
    """Another model (a wider first layer): its state must not load into this job's."""
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--logical-workers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--aug", choices=["none", "getitem", "collate", "both"], default="none")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--die", default="", help="RANK@STEP:PHASE, PHASE in forward|backward|step")
    p.add_argument("--die-all", type=int, default=-1,
                   help="every rank SIGKILLs itself during this step (after a forward)")
    p.add_argument("--term-all", type=int, default=-1,
                   help="every rank SIGTERMs itself during this step: all leave, the last parks")
    p.add_argument("--snapshot-every", type=int, default=0)
    p.add_argument("--save-at", type=int, default=-1,
                   help="rank 0 calls job.save(OUT/ckpt.mstate) and job.export(OUT/export.pt) "
                   "once this many steps are done")
    p.add_argument("--resume-from", default=None)
    p.add_argument("--model", choices=["main", "other"], default="main")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--slow-while", default="",
                   help="--step-sleep only while this file exists (a test paces the job)")
    p.add_argument("--pace-file", default=None,
                   help="a file holding the seconds to sleep after each step, read every "
                   "step (a test slows the job while it acts and speeds it up after)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    job = malletrain.init(logical_workers=args.logical_workers, seed=11,
                          deterministic=args.deterministic, snapshot_every=args.snapshot_every,
                          resume_from=args.resume_from)
    model = job.wrap_model(build_model() if args.model == "main" else build_other_model())
    opt = job.wrap_optimizer(torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01))
    sched = torch.optim.lr_scheduler.StepLR(opt.optimizer, step_size=7, gamma=0.7)
    job.track("sched", sched)
    data = Digits(augment=args.aug in ("getitem", "both"))
    loader = job.loader(data, batch_size=args.batch_size, steps=args.steps,
                        num_workers=args.num_workers,
                        collate_fn=noisy_collate if args.aug in ("collate", "both") else None)

    die_rank, die_step, die_phase = -1, -1, ""
    if args.die:
        who, _, rest = args.die.partition("@")
        s, _, die_phase = rest.partition(":")
        die_rank, die_step = int(who), int(s)

    def maybe_die(phase: str) -> None:
        if job.step == die_step and phase == die_phase and job.rank == die_rank:
            try:  # once per run: the rank that takes its place in the redo lives on
                os.close(os.open(os.path.join(args.out, "died"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
            os.kill(os.getpid(), signal.SIGKILL)

    os.makedirs(args.out, exist_ok=True)
    trace = open(os.path.join(args.out, f"trace-{job.member_id}.jsonl"), "w", buffering=1)
    resumed_at = None
    for x, y, idx in loader:
        if resumed_at is None:
            resumed_at = job.step  # the first step this member ran
        step, micro = job.step, job.micro_batch
        trace.write(json.dumps({
            "step": step, "micro": micro, "worker": job.workers[micro], "size": job.size,
            "indices": idx.tolist(), "x0": float(x[0, 0]),
            # The model's stream for this micro-batch, drawn on a copy of the RNG state.
            "draw": float(torch.rand(1, generator=torch.Generator().set_state(
                torch.get_rng_state()))),
        }) + "\n")
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        if micro == 0:
            maybe_die("forward")
            if step == args.die_all:
                if job.rank == 0 and args.snapshot_every > 0:
                    # The snapshot due before this step is written asynchronously; on a
                    # loaded machine it can lag a few steps: die once it is durable.
                    due = step // args.snapshot_every * args.snapshot_every
                    deadline = time.monotonic() + 60
                    while job._engine.snapshot_step < due and time.monotonic() < deadline:
                        time.sleep(0.02)
                os.kill(os.getpid(), signal.SIGKILL)
            if step == args.term_all:
                os.kill(os.getpid(), signal.SIGTERM)
        loss.backward()
        if micro == len(job.workers) - 1:
            maybe_die("backward")
        opt.step()
        if micro == len(job.workers) - 1:
            maybe_die("step")
            # Unguarded on purpose, as users write it: the job must undo it if the step
            # did not commit (a tracked object is job state).
            sched.step()
            if job.step == args.save_at and job.rank == 0:
                job.save(os.path.join(args.out, "ckpt.mstate"))
                job.export(os.path.join(args.out, "export.pt"))
            if args.step_sleep and (not args.slow_while or os.path.exists(args.slow_while)):
                time.sleep(args.step_sleep)
            if args.pace_file:
                try:
                    with open(args.pace_file) as f:
                        time.sleep(max(0.0, min(5.0, float(f.read().strip() or 0))))
                except (OSError, ValueError):
                    pass  # being rewritten: no pause this step
    trace.close()
    with open(os.path.join(args.out, f"result-{job.member_id}.json"), "w") as f:
        json.dump({"redone_steps": job.redone_steps, "left": job.left, "steps": job.step,
                   "parked": job.parked, "resumed_from": job.resumed_from,
                   "resumed_at": resumed_at,
                   "history": [ev.kind for ev in job.history]}, f)
    if not job.left and job.rank == 0:
        torch.save({"model": model.module.state_dict(),
                    "optimizer": opt.optimizer.state_dict(),
                    "scheduler": sched.state_dict(), "steps": job.step},
                   os.path.join(args.out, "final.pt"))
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
