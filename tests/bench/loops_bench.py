"""Steady-state step time with AMP and with torch.compile: malletrain vs DDP (issue 24).

    .venv/bin/python tests/bench/loops_bench.py [--ranks 2] [--blocks 6] [--block 8]

Each of the ``--ranks`` processes (started by malletrain's local launcher, loopback) holds a
``DistributedDataParallel`` replica on a torch.distributed Gloo group and a malletrain job
(L = ranks, one micro-batch per rank per step), the same MLP and AdamW, and runs both in
rotating blocks of steps (A-B, B-A, ...), so that the load of other programs on the machine
hits both about equally. Modes: ``amp`` (bf16 autocast, a GradScaler: malletrain's wrapped
one) and ``compile`` (torch.compile of the model, inductor). Prints the median step time
per system and mode (block 0 is the warm-up, and compilation) and the ratio.

Two DDP references: ``ddp`` slices each batch out of the dataset tensor (no DataLoader: the
cheapest possible input), ``ddp+loader`` reads it through a DataLoader with a
DistributedSampler, as DDP scripts do and as malletrain's ``job.loader`` does (per-sample
``__getitem__`` and collation). ``--device cuda`` puts every rank's model on the one GPU
(Gloo for all: NCCL refuses two ranks of a group on one device); ``--profile DIR`` writes
torch.profiler tables of each system's last block on rank 0.
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


def build_model(width: int = 1024):
    """4 x (Linear + ReLU) from 1024 inputs, then Linear to 10; ``width`` small: a model whose
    step is mostly the frameworks' fixed cost per step."""
    import torch
    torch.manual_seed(0)
    layers, fan_in = [], 1024
    for _ in range(4):
        layers += [torch.nn.Linear(fan_in, width), torch.nn.ReLU()]
        fan_in = width
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
    dev = torch.device(args.device)
    ddp = DDP(build_model(args.width).to(dev))
    dopt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    dscaler = torch.amp.GradScaler(dev.type, enabled=args.mode == "amp")
    lddp = DDP(build_model(args.width).to(dev))
    lopt = torch.optim.AdamW(lddp.parameters(), lr=1e-4)
    lscaler = torch.amp.GradScaler(dev.type, enabled=args.mode == "amp")
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=n, rank=rank, seed=0,
                                                  drop_last=True)
    lit = iter(torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler,
                                           drop_last=True))
    job = malletrain.init(logical_workers=n, seed=0)
    model = job.wrap_model(build_model(args.width).to(dev))
    mopt = job.wrap_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-4))
    mscaler = job.wrap_scaler(torch.amp.GradScaler(dev.type, enabled=args.mode == "amp"))
    if args.mode == "compile":
        ddp_fwd, l_fwd, m_fwd = torch.compile(ddp), torch.compile(lddp), torch.compile(model)
    else:
        ddp_fwd, l_fwd, m_fwd = ddp, lddp, model
    amp = args.mode == "amp"
    it = iter(job.loader(data, batch_size=args.batch, steps=args.blocks * args.block))

    def train(x, y, fwd, opt, scaler):
        """One step of the loop every system runs; returns what scaler.step returned."""
        x, y = x.to(dev), y.to(dev)
        opt.zero_grad()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(fwd(x), y)
        scaler.scale(loss).backward()
        stepped = scaler.step(opt)
        scaler.update()
        return stepped

    def ddp_step(step: int) -> None:
        base = (step * n + rank) * args.batch % (len(data) - args.batch)
        train(*data[base:base + args.batch], ddp_fwd, dopt, dscaler)

    def ddp_loader_step(step: int) -> None:
        nonlocal lit
        try:
            x, y = next(lit)
        except StopIteration:
            sampler.set_epoch(step)
            lit = iter(torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler,
                                                   drop_last=True))
            x, y = next(lit)
        train(x, y, l_fwd, lopt, lscaler)

    def malle_step(step: int) -> None:
        # The wrapped optimizer's step() returns whether the step committed.
        if not train(*next(it), m_fwd, mopt, mscaler):
            raise RuntimeError(f"malletrain step {step} was not committed")

    systems = ["ddp", "ddp+loader", "malletrain"]
    run_step = {"ddp": ddp_step, "ddp+loader": ddp_loader_step, "malletrain": malle_step}
    steps = {s: 0 for s in systems}
    times = {s: {} for s in systems}
    for b in range(args.blocks):
        for j in range(len(systems)):
            s = systems[(b + j) % len(systems)]
            last = None
            prof = None
            if args.profile and rank == 0 and b == args.blocks - 1:
                # The last block of each system under torch's profiler: where a step's time goes.
                acts = [torch.profiler.ProfilerActivity.CPU] + (
                    [torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" else [])
                prof = torch.profiler.profile(activities=acts)
                prof.__enter__()
            for _ in range(args.block):
                run_step[s](steps[s])
                steps[s] += 1
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)  # a step ends when its kernels have run
                now = time.perf_counter()
                if last is not None:
                    times[s].setdefault(b, []).append(now - last)
                last = now
            if prof is not None:
                prof.__exit__(None, None, None)
                with open(os.path.join(args.profile, f"{args.mode}-{s.replace('+', '_')}.txt"), "w") as f:
                    f.write(prof.key_averages().table(sort_by="self_cpu_time_total",
                                                      row_limit=40, max_name_column_width=60))
                prof.export_chrome_trace(os.path.join(
                    args.profile, f"{args.mode}-{s.replace('+', '_')}.trace.json"))
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
    p.add_argument("--width", type=int, default=1024, help="the MLP's width")
    p.add_argument("--profile", default="",
                   help="a folder: rank 0 profiles each system's last block (torch.profiler)")
    p.add_argument("--device", default="cpu",
                   help="cpu, or cuda: both ranks' models on the one GPU (Gloo for both)")
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
                   "--block", str(args.block), "--batch", str(args.batch),
                   "--device", args.device, "--profile", args.profile,
                   "--width", str(args.width)]
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
        rows.append((mode, med, blocks))
    print(f"{'mode':<10}{'DDP':>8}{'DDP+loader':>12}{'malletrain':>12}   ms/step; ratios: "
          f"{'/DDP':>6}{'/DDP+loader':>12}   per-block medians (ddp | ddp+loader | malletrain)")
    for mode, med, blocks in rows:
        d_, l_, m_ = med["ddp"], med["ddp+loader"], med["malletrain"]
        print(f"{mode:<10}{d_ * 1e3:>8.1f}{l_ * 1e3:>12.1f}{m_ * 1e3:>12.1f}   {'':>16}"
              f"{m_ / d_:>6.3f}{m_ / l_:>12.3f}   "
              + " | ".join(' '.join(f'{x * 1e3:.0f}' for x in blocks[s])
                           for s in ("ddp", "ddp+loader", "malletrain")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
