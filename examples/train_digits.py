"""Elastic training of a small classifier on scikit-learn's 8x8 digits (real data, no download).

Run it under the local launcher, which hosts the control store and starts, stops and
kills the rank processes:

    malletrain local --nodes 4 --schedule "step=20 leave 2, step=40 join 1, step=60 join 1" \\
        -- python examples/train_digits.py --logical-workers 4 --epochs 8

Every rank prints its membership changes; rank 0 prints the loss and, at the end, the
test accuracy and what happened. ``--out DIR`` writes the final model and a per-step
trace (the tests compare them with a fixed-size run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import malletrain


def load_digits():
    from sklearn.datasets import load_digits as _load  # ships with scikit-learn

    d = _load()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    g = torch.Generator().manual_seed(1234)  # fixed split, independent of the job seed
    perm = torch.randperm(len(y), generator=g)
    test, train = perm[:297], perm[297:]
    return torch.utils.data.TensorDataset(x[train], y[train]), (x[test], y[test])


class IndexedDataset(torch.utils.data.Dataset):
    """Returns (x, y, index) so that the trace can record which samples were trained."""

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        return x, y, i


def build_model(hidden: int = 128, batchnorm: bool = False, arch: str = "mlp") -> torch.nn.Module:
    torch.manual_seed(0)  # replicas may start different; rank 0's initial state wins anyway
    if arch == "cnn":  # the 8x8 images as images: a small convolutional network
        return torch.nn.Sequential(
            torch.nn.Unflatten(1, (1, 8, 8)),
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, 10))
    norm = [torch.nn.BatchNorm1d(hidden)] if batchnorm else []
    # No bias before a BatchNorm: it would get a zero gradient whose rounding noise Adam
    # turns into full-size steps, i.e. a parameter that depends on summation order.
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden, bias=not batchnorm), *norm, torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(hidden, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--logical-workers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16, help="per logical worker")
    p.add_argument("--epochs", type=float, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--lr-scaling", choices=["linear", "sqrt"], default=None,
                   help="global batch follows the world size (no logical workers); the "
                   "learning rate is rescaled at each resize")
    p.add_argument("--hidden", type=int, default=128, help="hidden width (all ranks must agree)")
    p.add_argument("--arch", choices=["mlp", "cnn"], default="mlp",
                   help="mlp (default) or a small cnn over the 8x8 images")
    p.add_argument("--batchnorm", action="store_true",
                   help="add a BatchNorm1d layer (buffers: running statistics)")
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds to sleep per step (slows the demo down so resizes are visible)")
    p.add_argument("--compute-sleep", type=float, default=0.0,
                   help="seconds to sleep per micro-batch (stands in for a heavier model: it "
                   "is spread over the ranks like compute, so the job scales)")
    p.add_argument("--device", default="cpu",
                   help="where the model trains: cpu, or cuda (this rank's current CUDA device)")
    p.add_argument("--out", default=None, help="directory for final.pt (the model's, the optimizer's "
                   "and the schedule's state_dict) and trace-<member>.jsonl")
    p.add_argument("--report", default=None,
                   help="rank 0 writes the advisor's scaling report (JSON) to this file at the end")
    p.add_argument("--step-log", default=None,
                   help="rank 0 appends one JSON line per committed step: step, size, time "
                   "(monotonic seconds); for benchmarks that measure step times")
    args = p.parse_args(argv)
    if args.epochs is None and args.steps is None:
        args.epochs = 8.0
    torch.set_num_threads(1)  # one local "node" = one rank = one thread

    train, (x_test, y_test) = load_digits()
    job = malletrain.init(logical_workers=None if args.lr_scaling else args.logical_workers,
                          seed=args.seed, deterministic=args.deterministic,
                          lr_scaling=args.lr_scaling)
    # Test hook: DIGITS_HIDDEN_FOR_<member> gives one member a different model, which
    # the state sync must refuse with a clear error.
    hidden = int(os.environ.get(f"DIGITS_HIDDEN_FOR_{job.member_id}", args.hidden))
    device = torch.device(args.device)
    model = job.wrap_model(build_model(hidden, args.batchnorm, args.arch).to(device))
    opt = job.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=args.lr))
    sched = torch.optim.lr_scheduler.StepLR(opt.optimizer, step_size=50, gamma=0.5)
    job.track("lr_scheduler", sched)
    loader = job.loader(IndexedDataset(train), batch_size=args.batch_size,
                        steps=args.steps, epochs=args.epochs)

    trace = None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        trace = open(os.path.join(args.out, f"trace-{job.member_id}.jsonl"), "w",
                     buffering=1)  # line-buffered: a killed rank keeps its lines
    step_log = open(args.step_log, "a", buffering=1) if args.step_log else None
    seen_events = 0
    began = False
    t0 = time.time()
    last_loss = float("nan")
    for x, y, idx in loader:
        while seen_events < len(job.history):  # membership changes this rank went through
            ev = job.history[seen_events]
            seen_events += 1
            print(f"[{job.member_id}] step {ev.resume_step}: {ev.kind} -> generation "
                  f"{ev.generation}, {ev.size} ranks, rank {ev.rank}, workers "
                  f"{list(job.workers)}, state {ev.state_bytes} B ({ev.state_in_place} B in place, "
                  f"{ev.state_landed} B into pre-faulted memory), "
                  f"pause "
                  f"{ev.phases['total'] * 1e3:.1f} ms (" +
                  ", ".join(f"{k} {v * 1e3:.1f}" for k, v in ev.phases.items()
                            if k != "total") + ")", flush=True)
        step = job.step
        micro = job.micro_batch
        if trace is not None and not began:
            # The state this rank starts training from (a resumed incarnation's is the state
            # its predecessor parked or snapshotted): links the incarnations' traces into the
            # job's committed history (tests/python/committed_history.py).
            began = True
            trace.write(json.dumps({"type": "begin", "step": step, "digest": job.state_digest(),
                                    "job": os.environ.get("MALLE_JOB_ID", "")}) + "\n")
        if trace is not None:
            # What this micro-batch trains, written before its backward: the gradients reach
            # the other ranks during backward, so a rank killed right after it may already
            # have contributed to a step the others commit.
            trace.write(json.dumps({
                "type": "micro", "step": step, "micro": micro, "worker": job.workers[micro],
                "generation": job.generation, "size": job.size, "rank": job.rank,
                "indices": idx.tolist()}) + "\n")
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        if args.compute_sleep:
            time.sleep(args.compute_sleep)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if job.step > step:  # the step committed on this rank
            sched.step()
            if trace is not None:
                trace.write(json.dumps({
                    "type": "commit", "step": step, "size": job.size,
                    "lr": opt.param_groups[0]["lr"], "digest": job.state_digest()}) + "\n")
        if step_log is not None and job.rank == 0 and job.step > step:
            step_log.write(json.dumps({"step": step, "size": job.size,
                                       "t": time.monotonic()}) + "\n")
        last_loss = loss.item()
        if job.rank == 0 and job.step > step and job.step % 25 == 0:
            print(f"step {job.step:4d}  loss {last_loss:.4f}  ranks {job.size}", flush=True)
        if args.step_sleep and job.step > step:
            time.sleep(args.step_sleep)
    if trace is not None:
        trace.close()
    if step_log is not None:
        step_log.close()

    if job.left:
        print(f"[{job.member_id}] left the job at step {job.step}", flush=True)
        job.close()
        return 0
    with torch.no_grad():
        model.eval()
        acc = (model.module(x_test.to(device)).argmax(1) == y_test.to(device)).float().mean().item()
    if job.rank == 0:
        print(f"done: {job.step} steps in {time.time() - t0:.1f} s, final loss {last_loss:.4f}, "
              f"test accuracy {acc:.3f}, generations {job.generation + 1}, "
              f"steps redone {job.redone_steps}", flush=True)
        if args.out:
            # The whole state: parameters and buffers, the optimizer's, the schedule's.
            torch.save({"model": model.module.state_dict(), "optimizer": opt.optimizer.state_dict(),
                        "scheduler": sched.state_dict()}, os.path.join(args.out, "final.pt"))
            with open(os.path.join(args.out, "result.json"), "w") as f:
                json.dump({"steps": job.step, "accuracy": acc, "loss": last_loss}, f)
        if args.report:
            with open(args.report, "w") as f:
                json.dump(job.scaling_report(), f, indent=2)
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
