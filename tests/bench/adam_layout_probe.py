"""Does Adam step slower on the engine's flat state layout, and what do page faults cost a step?

Issue 22's snapshot overhead question: the engine moves the optimizer's state tensors into
one flat buffer per dtype (Engine::FlattenParts -> FlattenTensors: one zeroed buffer, each
tensor a view at a 64-byte aligned offset, ``set_data``), after Adam's first step and after
every state transfer (a grow's joiners, a resume). If Adam were slower on that layout, every
job would pay it from its first step on, and every joiner after a grow.

One process, one torch thread, the resize_bench model (21.0 M parameters) twice: model A's
Adam state as torch allocates it, model B's moved into a flat buffer exactly as FlattenTensors
lays it out. Steps alternate A, B, B, A, ... (the machine's load hits both alike); per
optimizer step: the training thread's CPU time (time.thread_time) and the page faults
(getrusage). Run twice, in child processes: glibc's heap thresholds as they are, and fixed
(MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_, as park_bench's snapshot runs), which shows
what the faults alone cost.

    .venv/bin/python tests/bench/adam_layout_probe.py [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
from park_bench import FIXED_MALLOC, build_model  # noqa: E402
from resize_bench import IN_OUT, WIDTH  # noqa: E402


def flatten_like_the_engine(opt) -> object:
    """Moves `opt`'s state tensors into one buffer, as libmalle/elastic/state_pack.cc's
    FlattenTensors does (zeros, 64-byte aligned offsets, the same tensor objects)."""
    import torch

    ts = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    pad = lambda n: (n + 15) // 16 * 16  # noqa: E731  (16 float32 = 64 bytes)
    buf = torch.zeros(sum(pad(t.numel()) for t in ts))
    off = 0
    for t in ts:
        v = buf.narrow(0, off, t.numel()).view(t.shape)
        v.copy_(t)
        t.data = v
        off += pad(t.numel())
    return buf


def child(steps: int) -> None:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    x, y = torch.randn(16, IN_OUT), torch.randn(16, IN_OUT)
    runs = {}
    for name in ("torch layout", "flat layout"):
        m = build_model(WIDTH)
        runs[name] = (m, torch.optim.Adam(m.parameters(), lr=1e-4))

    def step(m, o):
        o.zero_grad()
        F.mse_loss(m(x), y).backward()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        c0 = time.thread_time()
        o.step()
        return time.thread_time() - c0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0

    for m, o in runs.values():
        step(m, o)  # Adam's state exists after its first step
    keep = flatten_like_the_engine(runs["flat layout"][1])
    cpu = {k: [] for k in runs}
    faults = {k: [] for k in runs}
    names = list(runs)
    for i in range(steps):
        for k in names if i % 2 == 0 else names[::-1]:
            c, f = step(*runs[k])
            cpu[k].append(c)
            faults[k].append(f)
    del keep
    print(json.dumps({"cpu": cpu, "faults": faults}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--child", action="store_true")
    args = p.parse_args()
    if args.child:
        child(args.steps)
        return 0
    print(f"adam_layout_probe {time.strftime('%Y-%m-%d %H:%M')}: {WIDTH}-wide resize_bench model, "
          f"Adam, one torch thread, {args.steps} steps per layout; load {os.getloadavg()[0]:.1f}")
    print(f"{'glibc heap':18} {'layout':14} {'opt step CPU ms (median, mean)':>32} {'faults/step':>12}"
          f"  {'flat / torch per pair':>22}")
    for heap, extra in (("default", {}), ("fixed thresholds", FIXED_MALLOC)):
        env = dict(os.environ, **extra)
        out = subprocess.run([sys.executable, HERE, "--child", "--steps", str(args.steps)],
                             capture_output=True, text=True, env=env, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-3000:])
        r = json.loads(out.stdout.strip().splitlines()[-1])
        pairs = [b / a for a, b in zip(r["cpu"]["torch layout"], r["cpu"]["flat layout"])]
        for k in r["cpu"]:
            c = r["cpu"][k]
            print(f"{heap:18} {k:14} {1e3 * statistics.median(c):>20.1f} {1e3 * statistics.fmean(c):>10.1f}"
                  f" {statistics.median(r['faults'][k]):>12.0f}"
                  + (f"  {statistics.median(pairs):>22.3f}" if k == "flat layout" else ""))
    print(f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
