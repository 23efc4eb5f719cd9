"""Fixed cost of a malletrain step: a one-rank job against the plain loop, same tiny model.

    .venv/bin/python tests/bench/step_overhead_bench.py [--steps 400] [--reps 3] [--profile]

Both loops run in this process, alternating in blocks: a plain PyTorch loop (DataLoader,
forward, backward, SGD step) and the same loop through malletrain (a one-rank job on an
in-process control store: ``job.loader``, ``wrap_model``, ``wrap_optimizer``). The model is
4 x Linear(32, 32), so the difference per step is malletrain's fixed cost per step: the step
boundary, the reducer's hooks, the parts' checkpoints, the commit. On a GPU, where a step can
take ~10 ms, this cost is what shows (docs/benchmarks.md, "GPU machine, 2026-11-28").
``--profile`` prints cProfile's top functions of the malletrain loop.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch

import malletrain


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400, help="steps per block")
    p.add_argument("--reps", type=int, default=3, help="blocks per loop")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    store = malletrain._C.ControlStore.serve()
    job = malletrain.init(logical_workers=1, store=f"127.0.0.1:{store.port}", bootstrap_size=1,
                          job_id="overhead", seed=0)

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])

    data = torch.utils.data.TensorDataset(torch.randn(4096, 32), torch.randn(4096, 32))
    plain = build()
    popt = torch.optim.SGD(plain.parameters(), lr=0.01)
    model = job.wrap_model(build())
    mopt = job.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    total = (args.reps + 1) * args.steps + (args.steps if args.profile else 0) + 64
    it = iter(job.loader(data, batch_size=8, steps=total))
    plain_it = iter(())

    def malle_step() -> None:
        x, y = next(it)
        mopt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        mopt.step()

    def plain_step() -> None:
        nonlocal plain_it
        try:
            x, y = next(plain_it)
        except StopIteration:
            plain_it = iter(torch.utils.data.DataLoader(data, batch_size=8, shuffle=True))
            x, y = next(plain_it)
        popt.zero_grad()
        torch.nn.functional.mse_loss(plain(x), y).backward()
        popt.step()

    loops = {"malletrain": malle_step, "plain": plain_step}
    for step in loops.values():  # warm-up
        for _ in range(32):
            step()
    us = {name: [] for name in loops}
    for _ in range(args.reps):
        for name, step in loops.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            us[name].append((time.perf_counter() - t0) / args.steps * 1e6)
    m, q = statistics.median(us["malletrain"]), statistics.median(us["plain"])
    print(f"torch {torch.__version__}; one rank, 4 x Linear(32, 32), batch 8, "
          f"{args.reps} blocks of {args.steps} steps each")
    print(f"  plain loop      {q:7.0f} us/step  (blocks: {', '.join(f'{v:.0f}' for v in us['plain'])})")
    print(f"  malletrain      {m:7.0f} us/step  (blocks: {', '.join(f'{v:.0f}' for v in us['malletrain'])})")
    print(f"  fixed cost      {m - q:7.0f} us/step")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.steps):
            malle_step()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    job.finish()
    job.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
