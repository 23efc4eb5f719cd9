"""Steady-state step time with AMP and with torch.compile: malletrain vs DDP (issue 24).

    .venv/bin/python tests/bench/loops_bench.py [--ranks 2] [--blocks 6] [--block 8]

Each of the ``--ranks`` processes (started by malletrain's local launcher, loopback) holds a
``DistributedDataParallel`` replica on a torch.distributed Gloo group and a malletrain job
(L = ranks, one micro-batch per rank per step), the same MLP and AdamW, and runs both in
rotating blocks of steps (A-B, B-A, ...), so that the load of other programs on the machine
hits both about equally. Modes: ``amp`` (bf16 autocast, a GradScaler: malletrain's wrapped
one) and ``compile`` (torch.compile of the model, inductor). Prints the median step time
per system and mode (block 0 is the warm-up, and compilation) and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


def build_model():
    import torch
    torch.manual_seed(0)
    layers, width = [], 1024
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def rank_main(args) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import malletrain

    torch.set_num_threads(1)
    rank = int(os.environ["MALLE_MEMBER_ID"].removeprefix("node"))
    n = args.ranks
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(n))
    dist.init_process_group("gloo")
    g = torch.Generator().manual_seed(rank)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 1024, generator=g),
                                          torch.randint(0, 10, (4096,), generator=g))
    ddp = DDP(build_model())
    dopt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    dscaler = torch.amp.GradScaler("cpu", enabled=args.mode == "amp")
    job = malletrain.init(logical_workers=n, seed=0)
    model = job.wrap_model(build_model())
    mopt = job.wrap_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-4))
    mscaler = job.wrap_scaler(torch.amp.GradScaler("cpu", enabled=args.mode == "amp"))
    if args.mode == "compile":
        ddp_fwd, m_fwd = torch.compile(ddp), torch.compile(model)
    else:
        ddp_fwd, m_fwd = ddp, model
    amp = args.mode == "amp"
    it = iter(job.loader(data, batch_size=args.batch, steps=args.blocks * args.block))

    def ddp_step(step: int) -> None:
        base = (step * n + rank) * args.batch % (len(data) - args.batch)
        x, y = data[base:base + args.batch]
        dopt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(ddp_fwd(x), y)
        dscaler.scale(loss).backward()
        dscaler.step(dopt)
        dscaler.update()

    def malle_step(step: int) -> None:
        x, y = next(it)
        mopt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(m_fwd(x), y)
        mscaler.scale(loss).backward()
        if not mscaler.step(mopt):
            raise RuntimeError(f"malletrain step {step} was not committed")
        mscaler.update()

    systems = ["ddp", "malletrain"]
    steps = {s: 0 for s in systems}
    times = {s: {} for s in systems}
    for b in range(args.blocks):
        for j in range(2):
            s = systems[(b + j) % 2]
            last = None
            for _ in range(args.block):
                (malle_step if s == "malletrain" else ddp_step)(steps[s])
                steps[s] += 1
                now = time.perf_counter()
                if last is not None:
                    times[s].setdefault(b, []).append(now - last)
                last = now
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(times, f)
    job.finish()
    job.close()
    dist.destroy_process_group()
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--modes", default="amp,compile")
    p.add_argument("--role", default="driver")
    p.add_argument("--mode", default="amp")
    p.add_argument("--out", default="")
    args = p.parse_args()
    if args.role == "rank":
        return rank_main(args)
    from malletrain import launcher
    rows = []
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "times.json")
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            cmd = [sys.executable, HERE, "--role", "rank", "--mode", mode, "--out", out,
                   "--ranks", str(args.ranks), "--blocks", str(args.blocks),
                   "--block", str(args.block), "--batch", str(args.batch)]
            res = launcher.run_local(cmd, nodes=args.ranks, job_id=f"loops-{mode}",
                                     timeout=900, log_dir=d, quiet=True, env=env)
            if not res.ok:
                for f in sorted(os.listdir(d)):
                    if f.endswith(".log"):
                        print(open(os.path.join(d, f)).read()[-3000:], file=sys.stderr)
                raise SystemExit(f"{mode}: run failed: {res.exit_codes}")
            times = json.load(open(out))
        med = {}
        for s, per_block in times.items():
            steady = [t for b, ts in per_block.items() if int(b) > 0 for t in ts]
            med[s] = statistics.median(steady)
        blocks = {s: [statistics.median(ts) for b, ts in sorted(per_block.items(), key=lambda kv: int(kv[0])) if int(b) > 0]
                  for s, per_block in times.items()}
        rows.append((mode, med["ddp"], med["malletrain"], blocks))
    print(f"{'mode':<10}{'DDP ms/step':>14}{'malletrain ms/step':>20}{'ratio':>8}   per-block medians (ddp | malletrain)")
    for mode, d_, m_, blocks in rows:
        print(f"{mode:<10}{d_ * 1e3:>14.1f}{m_ * 1e3:>20.1f}{m_ / d_:>8.3f}   "
              f"{' '.join(f'{x * 1e3:.0f}' for x in blocks['ddp'])} | "
              f"{' '.join(f'{x * 1e3:.0f}' for x in blocks['malletrain'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
