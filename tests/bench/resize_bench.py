"""Resize cost of malletrain versus torchrun's restart, and steady-state step time versus DDP.

One run measures, on this machine, with a ~21 M-parameter MLP and Adam on CPU ranks:

* malletrain: a planned shrink (3 -> 2), a planned grow (2 -> 3: the joiner warms up, then
  joins), a kill -9 (3 -> 2): time from the change to training resuming (the pause) and to
  the first completed step at the new size, split into phases (detect, agree, group build,
  state transfer);
* the floor of each path: group build + state bytes / loopback bandwidth (both measured in
  this run);
* torchrun (`torch.distributed.run` of the same torch, `--max-restarts`, c10d rendezvous,
  checkpoint every 5 steps): time from a kill -9 to the first completed step after the
  restart, and the steps redone;
* steady-state step time of malletrain and of `DistributedDataParallel` (Gloo), same model,
  same world size, one micro-batch per rank.

    .venv/bin/python tests/bench/resize_bench.py [--json out.json]

Every process is started and stopped here, by pid, with a timeout on every wait.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

HERE = os.path.abspath(__file__)
WIDTH, DEPTH, IN_OUT = 2048, 4, 1024  # 1024 -> 2048 x5 -> 1024: ~21 M parameters


# --------------------------------------------------------------------------- model / data
def build_model():
    import torch

    torch.manual_seed(0)
    dims = [IN_OUT] + [WIDTH] * (DEPTH + 1) + [IN_OUT]
    layers = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def dataset(n: int = 512):
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(torch.randn(n, IN_OUT, generator=g),
                                          torch.randn(n, IN_OUT, generator=g))


def append(path: str, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


# --------------------------------------------------------------------------- rank programs
def malle_rank(args) -> int:
    import torch

    import malletrain

    torch.set_num_threads(1)
    log = os.path.join(args.dir, f"{os.environ['MALLE_MEMBER_ID']}.jsonl")
    job = malletrain.init(logical_workers=args.workers, seed=0)
    model = job.wrap_model(build_model())
    opt = job.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-4))
    loader = job.loader(dataset(), batch_size=args.batch, steps=args.steps)
    append(log, {"type": "ready", "t": time.time()})  # warmed up; the join happens next
    probe = args.probe_bandwidth
    seen = 0
    pending_events: List[dict] = []
    for x, y in loader:
        while seen < len(job.history):
            ev = job.history[seen]
            seen += 1
            pending_events.append({"type": "event", "kind": ev.kind, "generation": ev.generation,
                                   "size": ev.size, "rank": ev.rank, "phases": ev.phases,
                                   "state_bytes": ev.state_bytes, "t_resume": time.time()})
            if probe and ev.kind == "bootstrap":
                probe = False
                buf = torch.zeros(64 * 2**20 // 4)
                job._group.barrier()
                t0 = time.perf_counter()
                for _ in range(3):
                    job._group.broadcast([buf], 0)
                dt = (time.perf_counter() - t0) / 3
                pending_events.append({"type": "bandwidth", "bytes": buf.numel() * 4, "s": dt})
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        step = job.step
        opt.step()
        if job.step > step:
            now = time.time()
            for rec in pending_events:
                rec["t_first_commit"] = now
                append(log, rec)
            pending_events = []
            append(log, {"type": "commit", "step": step, "t": now, "size": job.size,
                         "rank": job.rank})
            if args.step_sleep:
                time.sleep(args.step_sleep)
    job.close()
    return 0


def ddp_rank(args) -> int:
    """Plain DDP under torchrun; checkpoints every --ckpt steps and resumes from it."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    log = os.path.join(args.dir, f"ddp-{rank}.jsonl")
    append(log, {"type": "start", "pid": os.getpid(), "t": time.time(),
                 "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))})
    dist.init_process_group("gloo")
    model = DDP(build_model())
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    ckpt = os.path.join(args.dir, "ckpt.pt")
    start = 0
    if os.path.exists(ckpt):
        st = torch.load(ckpt)
        model.module.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        start = st["step"]
    data = dataset()
    n = dist.get_world_size()
    for step in range(start, args.steps):
        base = (step * n + rank) * args.batch % (len(data) - args.batch)
        x, y = data[base:base + args.batch]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        append(log, {"type": "commit", "step": step, "t": time.time()})
        if args.ckpt and (step + 1) % args.ckpt == 0 and rank == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                        "step": step + 1}, tmp)
            os.replace(tmp, ckpt)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------- driver helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read(path: str) -> List[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Procs:
    """Children started by this benchmark: stopped by pid, always."""

    def __init__(self) -> None:
        self.procs: Dict[str, subprocess.Popen] = {}

    def start(self, name: str, cmd: List[str], env: Dict[str, str], log: str) -> None:
        from malletrain.launcher import _die_with_parent

        out = open(log, "w")
        # A session of its own: torchrun's workers are its children, and killing the
        # session's process group (by the pgid we created) stops every one of them.
        self.procs[name] = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            preexec_fn=_die_with_parent,
                                            start_new_session=True)
        out.close()

    def wait_all(self, timeout: float) -> Dict[str, Optional[int]]:
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return {n: p.poll() for n, p in self.procs.items()}

    def stop_all(self) -> None:
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the child and everything it started
            except ProcessLookupError:
                pass
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass


def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.005)


def run_malletrain_resizes(args, d: str) -> dict:
    from malletrain import _C
    from malletrain.launcher import progress_key

    store = _C.ControlStore.serve()
    job = "bench"
    env = dict(os.environ, MALLE_STORE=f"127.0.0.1:{store.port}", MALLE_JOB_ID=job,
               MALLE_LOG_LEVEL="warning")
    procs = Procs()
    cmd = [sys.executable, HERE, "--role", "malle", "--dir", d, "--workers", "6", "--batch",
           str(args.batch), "--steps", str(args.steps), "--step-sleep", "0.05"]

    def start(member: str, boot: int, probe: bool = False) -> None:
        e = dict(env, MALLE_MEMBER_ID=member, MALLE_BOOTSTRAP_SIZE=str(boot))
        procs.start(member, cmd + (["--probe-bandwidth"] if probe else []), e,
                    os.path.join(d, f"{member}.log"))

    def progress() -> int:
        v = store.try_get(progress_key(job))
        return int(v) if v else 0

    def members() -> List[str]:
        g = _C.latest_generation(store, job)
        return list(g["members"]) if g else []

    marks = {}
    try:
        for i in range(3):
            start(f"n{i}", 3, probe=True)
        wait_until(lambda: progress() >= 6, 180, "3 ranks to run 6 steps")
        victim = members()[-1]
        marks["shrink"] = time.time()
        _C.request_leave(store, job, victim)
        wait_until(lambda: len(members()) == 2 and progress() >= 12, 120, "the shrink")
        start("n3", 0)
        wait_until(lambda: len(members()) == 3, 120, "the joiner")
        target = progress() + 4
        wait_until(lambda: progress() >= target, 120, "steps after the grow")
        victim = members()[-1]
        procs.procs[victim].kill()
        marks["kill"] = time.time()
        procs.procs[victim].wait(timeout=10)
        _C.report_dead(store, job, victim)
        codes = procs.wait_all(300)
    finally:
        procs.stop_all()
    bad = {n: c for n, c in codes.items() if c not in (0, -9)}
    if bad:
        raise RuntimeError(f"malletrain ranks failed: {bad}; logs in {d}")
    joiner_ready = [r["t"] for r in read(os.path.join(d, "n3.jsonl")) if r["type"] == "ready"]
    marks["grow"] = joiner_ready[0]
    # A member that stayed all along saw every event: the one whose log has the most.
    logs = {m: read(os.path.join(d, f"{m}.jsonl")) for m in ("n0", "n1", "n2")
            if codes.get(m) == 0}
    recs = max(logs.values(), key=lambda rs: sum(r["type"] == "event" for r in rs))
    events = [r for r in recs if r["type"] == "event"]
    commits = [r for r in recs if r["type"] == "commit"]
    bw = [r for r in recs if r["type"] == "bandwidth"]
    steps_by_size: Dict[int, List[float]] = {}
    for a, b in zip(commits, commits[1:]):
        if a["size"] == b["size"]:
            steps_by_size.setdefault(b["size"], []).append(b["t"] - a["t"] - 0.05)
    out = {"bandwidth_Bps": bw[0]["bytes"] / bw[0]["s"] if bw else None,
           "step_s": {k: statistics.median(v) for k, v in steps_by_size.items()}}
    for name, kind in (("planned shrink", "planned"), ("planned grow", "planned"),
                       ("kill -9", "recovered")):
        mark = marks[{"planned shrink": "shrink", "planned grow": "grow",
                      "kill -9": "kill"}[name]]
        ev = next(e for e in events if e["kind"] == kind and e["t_resume"] >= mark)
        events.remove(ev)
        out[name] = {"pause_s": ev["t_resume"] - mark, "first_step_s": ev["t_first_commit"] - mark,
                     "phases": ev["phases"], "state_bytes": ev["state_bytes"],
                     "size": ev["size"]}
    return out


def run_torchrun_kill(args, d: str) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=3",
           "--max-restarts=3", "--monitor-interval=0.1", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{port}", HERE, "--role", "ddp", "--dir", d, "--batch",
           str(args.batch), "--steps", "30", "--ckpt", "5", "--step-sleep", "0.05"]
    procs = Procs()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        procs.start("torchrun", cmd, env, os.path.join(d, "torchrun.log"))
        log0 = os.path.join(d, "ddp-0.jsonl")
        wait_until(lambda: sum(r["type"] == "commit" for r in read(log0)) >= 12, 240,
                   "torchrun to run 12 steps")
        victim = [r for r in read(os.path.join(d, "ddp-2.jsonl")) if r["type"] == "start"][-1]
        last_before = max(r["step"] for r in read(log0) if r["type"] == "commit")
        os.kill(victim["pid"], signal.SIGKILL)
        t_kill = time.time()
        codes = procs.wait_all(args.torchrun_wait)
    finally:
        procs.stop_all()
        # Belt and braces: the workers' own pids, from their logs.
        for r in range(3):
            for rec in read(os.path.join(d, f"ddp-{r}.jsonl")):
                if rec["type"] == "start":
                    try:
                        os.kill(rec["pid"], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
    recs = read(os.path.join(d, "ddp-0.jsonl"))
    after = [r for r in recs if r["type"] == "commit" and r["t"] > t_kill]
    if codes.get("torchrun") is None and not after:
        # Seen on this loaded 2-core machine: the restarted round never trains.
        return {"first_step_s": None, "restart_ready_s": None, "steps_redone": None,
                "hung_s": args.torchrun_wait}
    if codes.get("torchrun") != 0:
        with open(os.path.join(d, "torchrun.log")) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"torchrun failed ({codes}):\n{tail}")
    restarts = [r for r in recs if r["type"] == "start" and r["t"] > t_kill]
    first = after[0]
    return {"first_step_s": first["t"] - t_kill,
            "restart_ready_s": (restarts[0]["t"] - t_kill) if restarts else None,
            "steps_redone": last_before + 1 - first["step"]}


def steady(args, d: str) -> dict:
    """Median step time: malletrain (L = 3, one micro-batch per rank) vs DDP, 3 ranks."""
    from malletrain import _C

    res = {}
    store = _C.ControlStore.serve()
    env = dict(os.environ, MALLE_STORE=f"127.0.0.1:{store.port}", MALLE_JOB_ID="steady",
               MALLE_LOG_LEVEL="warning", OMP_NUM_THREADS="1")
    procs = Procs()
    md = os.path.join(d, "steady-malle")
    os.makedirs(md)
    try:
        for i in range(3):
            procs.start(f"s{i}", [sys.executable, HERE, "--role", "malle", "--dir", md,
                                  "--workers", "3", "--batch", str(args.batch), "--steps",
                                  "30"], dict(env, MALLE_MEMBER_ID=f"s{i}",
                                              MALLE_BOOTSTRAP_SIZE="3"),
                        os.path.join(md, f"s{i}.log"))
        codes = procs.wait_all(300)
    finally:
        procs.stop_all()
    if any(c != 0 for c in codes.values()):
        raise RuntimeError(f"steady malletrain run failed: {codes}; logs in {md}")
    t = [r["t"] for r in read(os.path.join(md, "s0.jsonl")) if r["type"] == "commit"]
    res["malletrain_s"] = statistics.median([b - a for a, b in zip(t[5:], t[6:])])
    dd = os.path.join(d, "steady-ddp")
    os.makedirs(dd)
    port = free_port()
    procs = Procs()
    try:
        procs.start("torchrun", [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
                                 "--nproc-per-node=3", "--rdzv-backend=c10d",
                                 f"--rdzv-endpoint=127.0.0.1:{port}", HERE, "--role", "ddp",
                                 "--dir", dd, "--batch", str(args.batch), "--steps", "30",
                                 "--ckpt", "0"], dict(os.environ, OMP_NUM_THREADS="1"),
                    os.path.join(dd, "torchrun.log"))
        codes = procs.wait_all(300)
    finally:
        procs.stop_all()
    if codes.get("torchrun") != 0:
        raise RuntimeError(f"steady DDP run failed; log in {dd}/torchrun.log")
    t = [r["t"] for r in read(os.path.join(dd, "ddp-0.jsonl")) if r["type"] == "commit"]
    res["ddp_s"] = statistics.median([b - a for a, b in zip(t[5:], t[6:])])
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=["driver", "malle", "ddp"], default="driver")
    p.add_argument("--dir", default=None)
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ckpt", type=int, default=5)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--probe-bandwidth", action="store_true")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--torchrun-wait", type=float, default=120.0,
                   help="seconds to wait for torchrun to recover from the kill")
    args = p.parse_args()
    if args.role == "malle":
        return malle_rank(args)
    if args.role == "ddp":
        return ddp_rank(args)

    import torch

    model = build_model()
    n_params = sum(q.numel() for q in model.parameters())
    with tempfile.TemporaryDirectory(prefix="malle-resize-bench-") as d:
        os.makedirs(os.path.join(d, "m"))
        os.makedirs(os.path.join(d, "t"))
        print(f"model: {n_params / 1e6:.1f} M parameters, Adam; torch {torch.__version__}; "
              f"{os.cpu_count()} cores; ranks are CPU processes, 1 thread each", flush=True)
        m = run_malletrain_resizes(args, os.path.join(d, "m"))
        t = run_torchrun_kill(args, os.path.join(d, "t"))
        s = steady(args, d)
    bw = m["bandwidth_Bps"]
    print(f"\nloopback broadcast bandwidth (3 ranks, 64 MiB): {bw / 1e9:.2f} GB/s")
    print(f"step time at 2 / 3 ranks (L = 6): "
          + ", ".join(f"{k} ranks {v * 1e3:.0f} ms" for k, v in sorted(m["step_s"].items())))
    print("\nmalletrain resize (pause = change -> training resumes; first step = change -> "
          "first completed step at the new size)")
    hdr = (f"{'path':16} {'pause ms':>9} {'1st step ms':>12} {'detect':>7} {'agree':>7} "
           f"{'build':>7} {'state':>7} {'state MB':>9} {'floor ms':>9} {'pause/floor':>12}")
    print(hdr)
    rows = {}
    for name in ("planned shrink", "planned grow", "kill -9"):
        r = m[name]
        ph = r["phases"]
        floor = ph["build"] + r["state_bytes"] / bw
        rows[name] = dict(r, floor_s=floor, ratio=r["pause_s"] / floor)
        print(f"{name:16} {r['pause_s'] * 1e3:9.1f} {r['first_step_s'] * 1e3:12.1f} "
              f"{ph['detect'] * 1e3:7.1f} {ph['agree'] * 1e3:7.1f} {ph['build'] * 1e3:7.1f} "
              f"{ph['state'] * 1e3:7.1f} {r['state_bytes'] / 1e6:9.1f} {floor * 1e3:9.1f} "
              f"{r['pause_s'] / floor:12.1f}x")
    if t["first_step_s"] is None:
        print(f"\ntorchrun restart after kill -9: NO step completed within {t['hung_s']:.0f} s "
              f"(the restarted round hung); ratios below use that bound")
        t["first_step_s"] = t["hung_s"]
    else:
        print(f"\ntorchrun restart after kill -9 (--max-restarts, checkpoint every 5 steps): "
              f"first completed step {t['first_step_s']:.2f} s after the kill (workers "
              f"restarted at {t['restart_ready_s']:.2f} s), {t['steps_redone']} steps redone")
    # torchrun's pause: the kill until its first step minus that step's compute time.
    t["pause_s"] = t["first_step_s"] - s["ddp_s"]
    print(f"  torchrun pause (first step minus one DDP step of {s['ddp_s'] * 1e3:.0f} ms): "
          f"{t['pause_s']:.2f} s")
    for name in ("planned shrink", "kill -9"):
        sp = t["first_step_s"] / rows[name]["first_step_s"]
        pp = t["pause_s"] / rows[name]["pause_s"]
        print(f"  {name}: first step {sp:.0f}x sooner, pause {pp:.0f}x shorter than torchrun's "
              f"(target >= 50x){'' if sp >= 50 else '  MISSED'}")
    for name in rows:
        ok = rows[name]["ratio"] <= 2
        print(f"  {name}: pause / floor = {rows[name]['ratio']:.1f} (target <= 2)"
              f"{'' if ok else '  MISSED'}")
    ratio = s["malletrain_s"] / s["ddp_s"]
    print(f"\nsteady state, 3 ranks, one micro-batch each: malletrain {s['malletrain_s'] * 1e3:.0f}"
          f" ms/step, DDP {s['ddp_s'] * 1e3:.0f} ms/step: {ratio:.3f}x (target <= 1.02)"
          f"{'' if ratio <= 1.02 else '  MISSED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"params": n_params, "malletrain": m, "rows": rows, "torchrun": t,
                       "steady": s}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
