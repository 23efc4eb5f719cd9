"""A training script of the tests' own for state transfer to ranks that share a node.

Run as a rank (MALLE_* variables set by its starter, MALLE_NODE included). The model of
tests/python/exact_job.py (BatchNorm statistics and counter, a module with buffers of its
own) or, with ``--width W``, a wider MLP of the same kind (for the benchmark), with AdamW
and a tracked StepLR: job state beyond the parameters.

``--hold-at S --gate FILE``: rank 0 writes FILE.holding and waits inside step S until FILE
exists (at most 120 s), so that a starter can queue several joins and have them admitted at
one step boundary (run_grow below does).

``--out DIR``: every rank writes ``result-<member>.json``: its history (one entry per
membership change: kind, generation, size, rank, joined, state bytes, the bytes it
received from / sent to other nodes and its own node, phases in seconds) and, unless
``--no-digest``, the digest of its whole job state at the first micro-batch of every step
it ran (``digests``: {step: digest}).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Sequence

import torch
import torch.nn.functional as F

import malletrain

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exact_job import Digits, RunningScale, build_model  # noqa: E402


def wide_model(width: int) -> torch.nn.Module:
    torch.manual_seed(5)
    return torch.nn.Sequential(
        torch.nn.Linear(64, width, bias=False), torch.nn.BatchNorm1d(width), torch.nn.ReLU(),
        RunningScale(width), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10))


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--logical-workers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--width", type=int, default=0, help="0: exact_job's model")
    p.add_argument("--hold-at", type=int, default=-1)
    p.add_argument("--gate", default="")
    p.add_argument("--no-digest", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    job = malletrain.init(logical_workers=args.logical_workers, seed=11)
    model = job.wrap_model(build_model() if args.width == 0 else wide_model(args.width))
    opt = job.wrap_optimizer(torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01))
    sched = torch.optim.lr_scheduler.StepLR(opt.optimizer, step_size=5, gamma=0.7)
    job.track("sched", sched)
    loader = job.loader(Digits(augment=False), batch_size=args.batch_size, steps=args.steps)

    digests: dict[int, str] = {}
    for x, y, _ in loader:
        if job.micro_batch == 0:
            if not args.no_digest:
                digests[job.step] = job.state_digest()
            if job.step == args.hold_at and job.rank == 0 and args.gate:
                pathlib.Path(args.gate + ".holding").touch()
                deadline = time.monotonic() + 120
                while not os.path.exists(args.gate):
                    if time.monotonic() > deadline:
                        print(f"gate {args.gate} never opened", file=sys.stderr)
                        return 3
                    time.sleep(0.01)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if job.micro_batch == len(job.workers) - 1:
            sched.step()
    history = [{
        "kind": ev.kind, "generation": ev.generation, "size": ev.size, "rank": ev.rank,
        "joined": list(ev.joined), "state_bytes": ev.state_bytes,
        "received_remote": ev.state_received_remote, "sent_remote": ev.state_sent_remote,
        "sent_local": ev.state_sent_local, "phases": dict(ev.phases),
    } for ev in job.history]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"result-{job.member_id}.json"), "w") as f:
        json.dump({"member": job.member_id, "node": os.environ.get("MALLE_NODE", ""),
                   "steps": job.step, "history": history,
                   "digests": {str(k): v for k, v in digests.items()},
                   "final_digest": None if args.no_digest else job.state_digest()}, f)
    job.close()
    return 0


def run_grow(out: pathlib.Path, job_id: str, founders: Sequence[str], joiners: Sequence[str],
             args: Sequence[str] = (), hold_at: int = 1, timeout: float = 240.0) -> dict:
    """Starts len(founders) ranks (MALLE_NODE founders[i]) as a job, holds it inside step
    `hold_at`, starts len(joiners) ranks (MALLE_NODE joiners[i]) and, once every one of
    them has queued its join, lets the job go on: the joiners are admitted together at the
    next step boundary. Waits for every rank to exit; returns {member: result}.

    Loopback store on an ephemeral port; every process is started here and stopped here, by
    its pid (SIGKILL after `timeout`). Raises AssertionError with the ranks' logs when a rank
    fails or the run times out."""
    from malletrain import _C

    out.mkdir(parents=True, exist_ok=True)
    gate = out / "gate"
    store = _C.ControlStore.serve("127.0.0.1", 0)
    procs: dict[str, subprocess.Popen] = {}
    logs: list = []
    deadline = time.monotonic() + timeout

    def spawn(member: str, node: str, bootstrap: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLE_")}
        env.update(MALLE_STORE=f"127.0.0.1:{store.port}", MALLE_JOB_ID=job_id,
                   MALLE_MEMBER_ID=member, MALLE_BOOTSTRAP_SIZE=str(bootstrap),
                   MALLE_NODE=node, MALLE_LOG_LEVEL="warning")
        log = open(out / f"{member}.log", "w")
        logs.append(log)
        procs[member] = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--out", str(out), "--hold-at",
             str(hold_at), "--gate", str(gate), *args],
            env=env, stdout=log, stderr=subprocess.STDOUT)

    def tail() -> str:
        return "\n".join(f"--- {m}\n{(out / f'{m}.log').read_text()[-2000:]}" for m in procs)

    def wait_until(what: str, ready) -> None:
        while not ready():
            failed = {m: p.returncode for m, p in procs.items() if p.poll() not in (None, 0)}
            assert not failed, f"{failed} while waiting for {what}\n{tail()}"
            assert time.monotonic() < deadline, f"timeout waiting for {what}\n{tail()}"
            time.sleep(0.02)

    try:
        for i, node in enumerate(founders):
            spawn(f"f{i}", node, len(founders))
        wait_until("the job to hold", lambda: (out / "gate.holding").exists())
        for i, node in enumerate(joiners):
            spawn(f"j{i}", node, 0)
        # The job's change-request counter (`req/ticket` under JobPrefix, store_layout.h; c10d's
        # PrefixStore puts a '/' after the prefix): every joiner has asked in, so the leader
        # sees all of them at one boundary. A wrong key fails here at the timeout, loudly.
        queued = f"malle/job/{job_id}//req/ticket"
        wait_until("the joins to be queued", lambda: store.add(queued, 0) >= len(joiners))
        gate.touch()
        wait_until("every rank to exit", lambda: all(p.poll() is not None for p in procs.values()))
        codes = {m: p.returncode for m, p in procs.items()}
        assert all(c == 0 for c in codes.values()), f"{codes}\n{tail()}"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    return {m: json.loads((out / f"result-{m}.json").read_text()) for m in procs}


if __name__ == "__main__":
    sys.exit(main())
