"""The training loops people write (issue 24), as a test script run under ``malletrain
local``: AMP with a GradScaler, gradient clipping, an LR scheduler on the wrapped optimizer,
torch.compile, optimizer.step(closure), per-step iteration, an iterable dataset with a
resumable position, persistent DataLoader workers, drop_last=False, a resize callback.

The model and data are exact_job.py's (digits; BatchNorm, dropout, a module with its own
buffers). ``--die RANK@STEP:PHASE`` as there. ``--out DIR``: rank 0 writes ``final.pt``
(model, optimizer, scheduler, scaler, steps); every rank ``trace-<member>.jsonl`` (one line
per micro-batch: step, worker, size, sample ids) and ``result-<member>.json`` (redone steps,
steps seen by the step callback, resize events seen by the callback, history, the scale
after each committed step, the gradient norms that clipping saw).
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

import malletrain
from exact_job import Digits, build_model


class DigitsStream(torch.utils.data.IterableDataset):
    """The digits as an endless stream, epoch after epoch in a seeded order, with a
    resumable position (state_dict / load_state_dict: torchdata's Stateful protocol)."""

    def __init__(self) -> None:
        self.data = Digits(augment=False)
        self.pos = 0       # samples yielded by the current iterator
        self._start = 0    # where the next iter() starts

    def __iter__(self):
        self.pos = self._start
        n = len(self.data)
        while True:
            epoch, i = divmod(self.pos, n)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(1000 + epoch))
            self.pos += 1
            x, y, idx = self.data[int(order[i])]
            yield x + 0.05 * torch.randn(64), y, idx  # augmentation: the worker's data stream

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, sd):
        self._start = self.pos = int(sd["pos"])


class Recorder(malletrain.callbacks.Callback):
    def __init__(self) -> None:
        self.steps, self.resizes = [], []

    def on_step_end(self, job, step):
        self.steps.append(step)

    def on_resize(self, job, event):
        self.resizes.append([event.kind, event.size])


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--epochs", type=float, default=0.0, help="instead of --steps")
    p.add_argument("--logical-workers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--amp", action="store_true", help="bf16 autocast + wrapped GradScaler")
    p.add_argument("--clip", type=float, default=0.0, help="opt.clip_grad_norm_(CLIP)")
    p.add_argument("--naive-clip", action="store_true",
                   help="clip with torch.nn.utils before opt.step() (what the docs warn of)")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--closure", action="store_true")
    p.add_argument("--per-step", action="store_true", help="iterate loader.steps()")
    p.add_argument("--stream", action="store_true", help="an IterableDataset")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--persistent-workers", action="store_true")
    p.add_argument("--keep-last", action="store_true", help="drop_last=False")
    p.add_argument("--die", default="")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--device", default="cpu", help="cpu or cuda (the ranks share the GPU)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    job = malletrain.init(logical_workers=args.logical_workers, seed=11,
                          deterministic=args.deterministic)
    device = torch.device(args.device)
    module = build_model().to(device)
    emodel = job.wrap_model(module)
    model = torch.compile(emodel, backend=os.environ.get("LOOPS_COMPILE_BACKEND", "inductor")) \
        if args.compile else emodel
    opt = job.wrap_optimizer(torch.optim.AdamW(emodel.parameters(), lr=2e-3,
                                               weight_decay=0.01))
    # The scheduler takes the wrapped optimizer, as with DDP; it is job state.
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)
    job.track("sched", sched)
    scaler = None
    if args.amp:
        # A huge scale that grows fast (and a loss x1000): every few steps the gradients
        # overflow and the step is skipped.
        scaler = job.wrap_scaler(torch.amp.GradScaler(
            device.type, init_scale=2.0**103, growth_factor=2.0**8, backoff_factor=2.0**-8,
            growth_interval=2))
    rec = Recorder()
    job.add_callback(rec)

    data = DigitsStream() if args.stream else Digits(augment=False)
    length = dict(epochs=args.epochs) if args.epochs else dict(steps=args.steps)
    loader = job.loader(data, batch_size=args.batch_size, num_workers=args.num_workers,
                        persistent_workers=args.persistent_workers,
                        drop_last=not args.keep_last, **length)

    die_rank, die_step, die_phase = -1, -1, ""
    if args.die:
        who, _, rest = args.die.partition("@")
        s, _, die_phase = rest.partition(":")
        die_rank, die_step = int(who), int(s)

    def maybe_die(phase: str) -> None:
        if job.step == die_step and phase == die_phase and job.rank == die_rank:
            try:  # once per run
                os.close(os.open(os.path.join(args.out, "died"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
            os.kill(os.getpid(), signal.SIGKILL)

    os.makedirs(args.out, exist_ok=True)
    trace = open(os.path.join(args.out, f"trace-{job.member_id}.jsonl"), "w", buffering=1)
    norms = {}
    scales = {}

    def micro_batch(x, y, idx) -> None:
        step, micro = job.step, job.micro_batch
        x, y = x.to(device), y.to(device)
        last = micro == len(job.workers) - 1
        trace.write(json.dumps({"step": step, "micro": micro, "worker": job.workers[micro],
                                "size": job.size, "indices": idx.tolist()}) + "\n")

        def forward_backward():
            opt.zero_grad()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
                loss = F.cross_entropy(model(x), y)
                if args.amp:  # large gradients: the scale overflows every few steps
                    loss = 1000 * loss
            if micro == 0:
                maybe_die("forward")
            (scaler.scale(loss) if scaler else loss).backward()
            if last:
                maybe_die("backward")
            return loss

        if args.closure:
            opt.step(forward_backward)  # returns the closure's loss, as torch's
            committed = job.step > step
        else:
            forward_backward()
            if scaler is not None:
                scaler.unscale_(opt)
            if args.naive_clip:
                torch.nn.utils.clip_grad_norm_(emodel.parameters(), args.clip)
            elif args.clip:
                n = opt.clip_grad_norm_(args.clip)
                if n is not None:
                    norms[step] = float(n)
            committed = scaler.step(opt) if scaler is not None else opt.step()
            if scaler is not None:
                scaler.update()
        if last:
            maybe_die("step")
        if committed:
            sched.step()  # once per committed step
            if scaler is not None:
                scales[step] = scaler.get_scale()
            if args.step_sleep:
                time.sleep(args.step_sleep)

    if args.per_step:
        steps = loader.steps()
        n_steps = len(steps)
        for step_batches in steps:
            for x, y, idx in step_batches:
                micro_batch(x, y, idx)
    else:
        n_steps = loader.total_steps
        for x, y, idx in loader:
            micro_batch(x, y, idx)
    trace.close()
    with open(os.path.join(args.out, f"result-{job.member_id}.json"), "w") as f:
        json.dump({"redone_steps": job.redone_steps, "left": job.left, "steps": job.step,
                   "n_steps": n_steps, "callback_steps": rec.steps,
                   "callback_resizes": rec.resizes,
                   "history": [[ev.kind, ev.size] for ev in job.history],
                   "scales": scales, "norms": norms}, f)
    if not job.left and job.rank == 0:
        torch.save({"model": module.state_dict(), "optimizer": opt.optimizer.state_dict(),
                    "scheduler": sched.state_dict(),
                    "scaler": scaler.state_dict() if scaler else None, "steps": job.step},
                   os.path.join(args.out, "final.pt"))
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
