"""Park, resume and snapshot cost of malletrain versus the disk floor and torch's checkpoints.

One run, one directory on one disk, the ~250 MB state of resize_bench (a 21.0 M-parameter MLP
with Adam: parameters + exp_avg + exp_avg_sq, float32), CPU rank processes, one torch thread:

* the floor: a plain file of the same bytes written (write() in 64 MiB chunks + fsync) and
  read back (readinto()), cold and warm. Cold: the file's pages evicted with
  posix_fadvise(DONTNEED) (after fsync: no privileges needed, the other programs' cache left
  alone), or with --drop-caches the whole page cache (/proc/sys/vm/drop_caches, as root). The
  report says which. On a virtual disk the host may still cache what the guest evicted.
* malletrain park: a one-rank job trains two steps, then (1) ``job.save(path)`` (Engine::Save:
  the same capture + WriteStateFile as a park), timed around the call, and (2) ``job.leave()``:
  the last member leaves and parks at the next boundary; the engine's own figure (its log line
  "parked at step N (B in S s)": capture + pack + durable write into the park store, old files
  removed) and the wall time of the leaving boundary (membership protocol + park).
* malletrain resume: a new incarnation (a new process, a new control store) bootstraps from
  the park directory: the bootstrap event's "state" phase (read + verify the HMAC + unpack +
  restore into the model's flat buffers) and the wall time of the first ``next(loader)``
  (rendezvous, group build, resume). Cold and warm page cache, as for the floor.
* torch.distributed.checkpoint (single process, no process group): ``dcp.save`` of
  ``{"model": get_model_state_dict, "optim": get_optimizer_state_dict}`` with a
  ``FileSystemWriter`` (sync_files: fsync, as ours), and ``dcp.load`` + ``set_model_state_dict``
  + ``set_optimizer_state_dict`` into a fresh model and optimizer; plain ``torch.save`` (+ fsync)
  / ``torch.load`` + ``load_state_dict`` as a second reference. Cold and warm, as above. The same
  DCP checkpoint is then also loaded in a new process (``role_dcpload``), cold and warm: a resume
  is always a new process with fresh memory, while the same-process "warm" load reuses the
  memory its cold load freed. Both references are reported, with each load's process CPU.
* snapshot overhead: the same job run with snapshots off, adaptive (``snapshot_every=0``) and
  every step (``snapshot_every=1``) (``--snap-settings``), in rotating order, ``--snap-runs``
  times; the mean step time after warm-up of each run, and each run's ratio to the "off" run of
  the same rotation. The adaptive interval is a few hundred steps for this model: a timed window
  (``--measure``) shorter than it holds no snapshot, and the report says NOT MEASURED.

Every measurement is repeated ``--reps`` times in rotating order; the tables give the median
and the min-max spread. Targets (issue 22): park and resume <= 1.5x the floor, >= 2x faster than
torch.distributed.checkpoint; snapshot overhead < 1 % of the step time.

    PYTHONPATH=python .venv/bin/python tests/bench/park_bench.py [--dir DIR] [--json out.json]
    PYTHONPATH=python .venv/bin/python tests/bench/park_bench.py --quick   # a few seconds' smoke
    .venv/bin/python tests/bench/park_bench.py --report-from out.json      # tables again

Every process is started here and waited for with a timeout; the directory is removed at the
end unless it was given with --dir and --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
from resize_bench import DEPTH, IN_OUT, WIDTH  # noqa: E402  (the ~250 MB state: one model)

CHUNK = 64 << 20
PARK_RE = re.compile(r"parked at step (\d+) \((\d+) B in ([0-9.eE+-]+) s(?:; durable write ([0-9.eE+-]+) s)?\)")
RESUME_RE = re.compile(r"resumed from .* at step (\d+) \((\d+) B: read \+ verify ([0-9.eE+-]+) s, "
                       r"unpack \+ restore ([0-9.eE+-]+) s\)")
TARGET_FLOOR = 1.5      # park / resume <= 1.5 x the floor
TARGET_DCP = 2.0        # at least 2x faster than torch.distributed.checkpoint
TARGET_SNAPSHOT = 0.01  # < 1 % of the step time


# --------------------------------------------------------------------------- shared helpers
def build_model(width: int):
    import torch

    torch.manual_seed(0)
    dims = [IN_OUT] + [width] * (DEPTH + 1) + [IN_OUT]
    layers = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def n_params(width: int) -> int:
    dims = [IN_OUT] + [width] * (DEPTH + 1) + [IN_OUT]
    return sum(a * b + b for a, b in zip(dims[:-1], dims[1:]))


def dataset(n: int = 256):
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(torch.randn(n, IN_OUT, generator=g),
                                          torch.randn(n, IN_OUT, generator=g))


DROP_CACHES = False  # --drop-caches: the whole machine's page cache (root), not just our files


def can_drop_caches() -> bool:
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def drop_cache(paths: List[str]) -> str:
    """Evicts `paths` from the page cache; returns how ('drop_caches' or 'fadvise').

    By default posix_fadvise(DONTNEED) on each file (after fsync: dirty pages stay), which
    needs no privileges and leaves the other programs' cache alone (checked with fincore:
    0 pages resident after it); with --drop-caches, /proc/sys/vm/drop_caches if writable."""
    os.sync()
    if DROP_CACHES and can_drop_caches():
        return "drop_caches"
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise"


def files_under(path: str) -> List[str]:
    if os.path.isfile(path):
        return [path]
    out = []
    for root, _, names in os.walk(path):
        out += [os.path.join(root, n) for n in names]
    return out


def bytes_under(path: str) -> int:
    return sum(os.path.getsize(p) for p in files_under(path))


def fsync_dir(d: str) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def emit(rec: dict) -> None:
    print("RESULT " + json.dumps(rec), flush=True)


# --------------------------------------------------------------------------- worker roles
def role_floor(args) -> None:
    """Write + fsync (best of two), then cold and warm read, of a plain file of --source's bytes."""
    import numpy as np

    with open(args.source, "rb") as f:  # the park file's own bytes: the same content
        buf = np.frombuffer(f.read(), dtype=np.uint8).copy()
    n = len(buf)
    mv = memoryview(buf)
    path = os.path.join(args.dir, "floor.bin")
    writes = []
    for _ in range(2):  # the floor: the faster of two
        if os.path.exists(path):
            os.unlink(path)
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        off = 0
        while off < n:
            off += os.write(fd, mv[off:off + CHUNK])
        os.fsync(fd)
        os.close(fd)
        writes.append(time.perf_counter() - t0)
    write_s = min(writes)
    out = np.empty(n, dtype=np.uint8)
    omv = memoryview(out)
    rec: Dict[str, Any] = {"role": "floor", "bytes": n, "write_s": write_s, "writes_s": writes}
    for mode in ("cold", "warm"):
        if mode == "cold":
            rec["cache"] = drop_cache([path])
        t0 = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            got = 0
            while got < n:
                r = f.readinto(omv[got:got + CHUNK])
                if not r:
                    raise RuntimeError("short read")
                got += r
        rec[f"read_{mode}_s"] = time.perf_counter() - t0
    if not np.array_equal(buf[:4096], out[:4096]):
        raise RuntimeError("floor: read back other bytes")
    os.unlink(path)
    emit(rec)


def _malle_job(args, park_dir: str, snapshot_every: int, job_id: str):
    import torch

    import malletrain
    from malletrain import _C

    torch.set_num_threads(1)
    store = _C.ControlStore.serve("127.0.0.1", 0)
    job = malletrain.init(logical_workers=1, seed=0, store=f"127.0.0.1:{store.port}",
                          job_id=job_id, member_id="m0", bootstrap_size=1, park_dir=park_dir,
                          snapshot_every=snapshot_every, handle_sigterm=False)
    model = job.wrap_model(build_model(args.width))
    opt = job.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-4))
    loader = job.loader(dataset(), batch_size=args.batch, steps=args.steps)
    return store, job, model, opt, iter(loader)


def _train_step(it, model, opt) -> bool:
    import torch.nn.functional as F

    try:
        x, y = next(it)
    except StopIteration:
        return False
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    opt.step()
    return True


def role_park(args) -> None:
    """Trains two steps, saves (Engine::Save), then leaves: the last member parks."""
    store, job, model, opt, it = _malle_job(args, args.park_dir, -1, "parkbench")
    for _ in range(2):
        assert _train_step(it, model, opt)
    save_path = os.path.join(args.dir, "save.mstate")
    t0, c0 = time.perf_counter(), time.process_time()
    job.save(save_path)
    save_s = time.perf_counter() - t0
    save_cpu_s = time.process_time() - c0
    save_bytes = os.path.getsize(save_path)
    os.unlink(save_path)
    job.leave()  # queued; a boundary soon after applies it (the loader's next() that stops)
    extra = 0
    while True:
        t0 = time.perf_counter()
        more = _train_step(it, model, opt)
        leave_s = time.perf_counter() - t0
        if not more:
            break
        extra += 1
        if extra > 20:
            break
    if more or not job.parked:
        raise RuntimeError(f"the job did not park (parked={job.parked}, steps after leave {extra})")
    step = job.step
    job.close()
    del store
    emit({"role": "park", "save_s": save_s, "save_cpu_s": save_cpu_s, "save_bytes": save_bytes, "leave_s": leave_s,
          "step": step, "steps_after_leave": extra})


def role_resume(args) -> None:
    """A new incarnation bootstraps from the park directory."""
    t_start = time.perf_counter()
    store, job, model, opt, it = _malle_job(args, args.park_dir, -1, "parkbench")
    t_built = time.perf_counter()
    c0 = time.process_time()
    next(it)  # the bootstrap: rendezvous, group build, resume
    first_s = time.perf_counter() - t_built
    first_cpu_s = time.process_time() - c0  # every thread of the process
    resumed_step = job.step
    boot = [e for e in job.history if e.kind == "bootstrap"]
    if not job.resumed_from or not boot:
        raise RuntimeError(f"no resume (resumed_from={job.resumed_from!r})")
    ev = boot[0]
    # The parameters as resumed (before this process's own step) are not kept; report the
    # step it resumed at, which the driver compares with the park's.
    rec = {"role": "resume", "state_s": ev.phases["state"], "bootstrap_total_s": ev.phases["total"],
           "first_next_s": first_s, "first_next_cpu_s": first_cpu_s, "resume_step": resumed_step,
           "setup_s": t_built - t_start, "resumed_from": os.path.basename(job.resumed_from)}
    job.close()
    del store
    emit(rec)


def role_torch(args) -> None:
    """torch.distributed.checkpoint and torch.save/load of the same model and optimizer."""
    import torch
    import torch.distributed.checkpoint as dcp
    import torch.nn.functional as F
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    torch.set_num_threads(1)
    model = build_model(args.width)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    ds = dataset()
    for s in range(2):
        x, y = ds[s * args.batch:(s + 1) * args.batch]
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    ref = [p.detach().clone() for p in model.parameters()]
    ref_sq = [opt.state[p]["exp_avg_sq"].clone() for p in model.parameters()]

    def fresh():
        m = build_model(args.width)
        with torch.no_grad():
            for p in m.parameters():
                p.zero_()
        return m, torch.optim.Adam(m.parameters(), lr=1e-4)

    def check(m, o, what):
        for p, r, q in zip(m.parameters(), ref, ref_sq):
            if not torch.equal(p, r) or not torch.equal(o.state[p]["exp_avg_sq"], q):
                raise RuntimeError(f"{what}: loaded state differs")

    rec: Dict[str, Any] = {"role": "torch"}
    for kind in args.torch_order.split(","):
        if kind == "dcp":
            d = os.path.join(args.dir, "dcp")
            shutil.rmtree(d, ignore_errors=True)
            t0 = time.perf_counter()
            sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(d))  # sync_files=True: fsync
            rec["dcp_save_s"] = time.perf_counter() - t0
            rec["dcp_bytes"] = bytes_under(d)
            for mode in ("cold", "warm"):
                if mode == "cold":
                    rec["cache"] = drop_cache(files_under(d))
                m2, o2 = fresh()
                t0, c0 = time.perf_counter(), time.process_time()
                sd2 = {"model": get_model_state_dict(m2), "optim": get_optimizer_state_dict(m2, o2)}
                dcp.load(sd2, storage_reader=dcp.FileSystemReader(d))
                set_model_state_dict(m2, sd2["model"])
                set_optimizer_state_dict(m2, o2, sd2["optim"])
                rec[f"dcp_load_{mode}_s"] = time.perf_counter() - t0
                rec[f"dcp_load_{mode}_cpu_s"] = time.process_time() - c0
                check(m2, o2, "dcp")
                del m2, o2, sd2
            if args.keep_dcp:  # for role_dcpload: a load in a process of its own
                with open(os.path.join(args.dir, "dcp_digest.json"), "w") as f:
                    json.dump({"digest": state_digest(model, opt)}, f)
            else:
                shutil.rmtree(d)
        elif kind == "torchsave":
            path = os.path.join(args.dir, "torch.pt")
            t0 = time.perf_counter()
            with open(path, "wb") as f:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
                f.flush()
                os.fsync(f.fileno())
            rec["torchsave_save_s"] = time.perf_counter() - t0
            rec["torchsave_bytes"] = os.path.getsize(path)
            for mode in ("cold", "warm"):
                if mode == "cold":
                    drop_cache([path])
                m2, o2 = fresh()
                t0 = time.perf_counter()
                sd2 = torch.load(path, weights_only=True)
                m2.load_state_dict(sd2["model"])
                o2.load_state_dict(sd2["optimizer"])
                rec[f"torchsave_load_{mode}_s"] = time.perf_counter() - t0
                check(m2, o2, "torch.save")
                del m2, o2, sd2
            os.unlink(path)
    emit(rec)


def state_digest(model, opt) -> str:
    """SHA-256 of the parameters and Adam's exp_avg_sq, in order: the bitwise check of a load
    in another process."""
    import hashlib

    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
        h.update(opt.state[p]["exp_avg_sq"].numpy().tobytes())
    return h.hexdigest()


def role_dcpload(args) -> None:
    """dcp.load of the checkpoint role_torch kept, in a new process (as a job restarting from a
    checkpoint does: nothing allocated before, as in malletrain's resume), cold or warm."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    torch.set_num_threads(1)
    d = os.path.join(args.dir, "dcp")
    m2 = build_model(args.width)
    with torch.no_grad():
        for p in m2.parameters():
            p.zero_()
    o2 = torch.optim.Adam(m2.parameters(), lr=1e-4)
    t0, c0 = time.perf_counter(), time.process_time()
    sd2 = {"model": get_model_state_dict(m2), "optim": get_optimizer_state_dict(m2, o2)}
    dcp.load(sd2, storage_reader=dcp.FileSystemReader(d))
    set_model_state_dict(m2, sd2["model"])
    set_optimizer_state_dict(m2, o2, sd2["optim"])
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    with open(os.path.join(args.dir, "dcp_digest.json")) as f:
        if state_digest(m2, o2) != json.load(f)["digest"]:
            raise RuntimeError("dcp load in a new process: the loaded state differs")
    emit({"role": "dcpload", "load_s": took, "load_cpu_s": cpu})


def role_steady(args) -> None:
    """Steady-state step times of one job with the given snapshot setting.

    Per step: wall time, the training thread's CPU time (time.thread_time: what the step
    itself computed, whatever the other sessions on the machine do) and the page faults
    (getrusage). Over the window: the process's CPU time (the training thread and the
    snapshot writer's hashing and write() copies), i.e. the cores snapshots take."""
    import resource

    park = os.path.join(args.dir, f"snap-{os.getpid()}")
    store, job, model, opt, it = _malle_job(args, park, args.snapshot_every, "snapbench")
    times: List[float] = []
    cpu: List[float] = []
    faults: List[int] = []
    e = job._engine
    written = set()
    flt = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # noqa: E731
    p0 = time.process_time()
    w0 = time.perf_counter()
    for i in range(args.warmup + args.measure):
        if i == args.warmup:
            p0, w0 = time.process_time(), time.perf_counter()
        t0, c0, f0 = time.perf_counter(), time.thread_time(), flt()
        if not _train_step(it, model, opt):
            break
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            faults.append(flt() - f0)
            written.add(e.snapshot_step)
    # A write still in flight belongs to the window: wait for it (close) before reading
    # the process's CPU time.
    snapshot_write_s = e.snapshot_write_seconds
    snapshot_write_cpu_s = e.snapshot_write_cpu_seconds
    job.close()
    proc_cpu = time.process_time() - p0
    window_s = time.perf_counter() - w0
    rec = {"role": "steady", "snapshot_every": args.snapshot_every, "times": times,
           "cpu": cpu, "faults": faults, "proc_cpu_s": proc_cpu, "window_s": window_s,
           "malloc": os.environ.get("MALLOC_TRIM_THRESHOLD_", "glibc default"),
           "snapshot_step": e.snapshot_step, "snapshot_interval": e.snapshot_interval,
           "snapshot_copy_s": e.snapshot_copy_seconds, "snapshot_write_s": snapshot_write_s,
           "snapshot_write_cpu_s": snapshot_write_cpu_s,
           # Snapshots taken at the boundaries of timed steps (step i is timed for i >=
           # warmup) and written by the end of the window.
           "snapshots_in_window": len({s for s in written if s >= args.warmup})}
    del store
    shutil.rmtree(park, ignore_errors=True)
    emit(rec)


# --------------------------------------------------------------------------- driver
# glibc's heap, left to itself, gives freed memory back to the kernel (trim) or maps big
# blocks afresh, by thresholds it moves at run time: whether the optimizer's 16 MB temporaries
# and the gradients are faulted in again at every step differs from one process to the next
# (measured, same job: 0 to 12,000 page faults per step, +10-20 % CPU per step). Fixed
# thresholds make every run alike, so a 1 % effect of snapshots can be seen at all.
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}


def run_role(args, role: str, extra: List[str], timeout: float, log_level: str = "warning") -> dict:
    cmd = [sys.executable, HERE, "--role", role, "--dir", args.dir, "--width", str(args.width),
           "--batch", str(args.batch)] + (["--drop-caches"] if args.drop_caches else []) + extra
    env = dict(os.environ, MALLE_LOG_LEVEL=log_level)
    if role == "steady" and args.malloc == "fixed":
        env.update(FIXED_MALLOC)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    rec = None
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            rec = json.loads(line[len("RESULT "):])
    if p.returncode != 0 or rec is None:
        raise RuntimeError(f"{role} failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    m = PARK_RE.search(p.stderr)
    if m:
        rec["park_engine_s"] = float(m.group(3))
        rec["park_bytes"] = int(m.group(2))
        if m.group(4):  # the engine's split (since the file format v2): the rest is capture + pack
            rec["park_write_s"] = float(m.group(4))
    m = RESUME_RE.search(p.stderr)
    if m:  # the engine's split of a resume (since the file format v2)
        rec["read_verify_s"] = float(m.group(3))
        rec["restore_s"] = float(m.group(4))
    return rec


def loadavg() -> float:
    return os.getloadavg()[0]


def driver(args) -> dict:
    state_bytes = 3 * 4 * n_params(args.width)
    res: Dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "dir": args.dir,
                           "width": args.width, "params": n_params(args.width),
                           "state_bytes_est": state_bytes, "reps": [], "steady": [],
                           "load": [], "cpus": os.cpu_count(),
                           "drop_caches": bool(args.drop_caches)}
    park_dir = os.path.join(args.dir, "park")
    parts = ["malle", "torch"]
    timeout = 600.0
    for r in range(args.reps):
        res["load"].append(loadavg())
        order = parts[r % 2:] + parts[:r % 2]
        rep: Dict[str, Any] = {"order": order, "load": loadavg()}
        for part in order:
            if part == "malle":
                shutil.rmtree(park_dir, ignore_errors=True)
                pk = run_role(args, "park", ["--park-dir", park_dir, "--steps", "1000"], timeout,
                              log_level="info")
                files = files_under(park_dir)
                pk["park_file_bytes"] = sum(os.path.getsize(f) for f in files)
                rep["park"] = pk
                # The floor, right after the park and before the resume: the park file's bytes.
                rep["floor"] = run_role(args, "floor", ["--source", files[0]], timeout)
                for mode in ("cold", "warm"):
                    if mode == "cold":
                        rep["resume_cache"] = drop_cache(files)
                    else:  # warm: read it once through the cache
                        for f in files:
                            with open(f, "rb") as fh:
                                while fh.read(CHUNK):
                                    pass
                    rs = run_role(args, "resume", ["--park-dir", park_dir, "--steps", "1000"], timeout,
                                  log_level="info")
                    if rs["resume_step"] != pk["step"]:
                        raise RuntimeError(f"resumed at step {rs['resume_step']}, parked at {pk['step']}")
                    rep[f"resume_{mode}"] = rs
                shutil.rmtree(park_dir, ignore_errors=True)
            else:
                order_t = "dcp,torchsave" if r % 2 == 0 else "torchsave,dcp"
                rep["torch"] = run_role(args, "torch", ["--torch-order", order_t, "--keep-dcp"], timeout)
                dcp_dir = os.path.join(args.dir, "dcp")
                for mode in ("cold", "warm"):
                    if mode == "cold":
                        drop_cache(files_under(dcp_dir))
                    else:
                        for f in files_under(dcp_dir):
                            with open(f, "rb") as fh:
                                while fh.read(CHUNK):
                                    pass
                    rep[f"dcp_new_{mode}"] = run_role(args, "dcpload", [], timeout)
                shutil.rmtree(dcp_dir, ignore_errors=True)
        res["reps"].append(rep)
        print(f"  rep {r + 1}/{args.reps} done (load {rep['load']:.1f})", file=sys.stderr, flush=True)
    settings = [int(x) for x in args.snap_settings.split(",")]
    for r in range(args.snap_runs):
        order = settings[r % 3:] + settings[:r % 3]
        rot: Dict[str, Any] = {"load": loadavg()}
        for s in order:
            rot[str(s)] = run_role(args, "steady", ["--snapshot-every", str(s), "--steps", "100000",
                                                   "--warmup", str(args.warmup),
                                                   "--measure", str(args.measure)], timeout)
        res["steady"].append(rot)
        print(f"  snapshot rotation {r + 1}/{args.snap_runs} done (load {rot['load']:.1f})",
              file=sys.stderr, flush=True)
    res["load"].append(loadavg())
    return res


# --------------------------------------------------------------------------- report
def med(xs: List[float]) -> float:
    return statistics.median(xs)


def fmt_s(xs: List[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{med(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def snapshot_report(steady: List[dict]) -> List[str]:
    """Snapshot overhead: each setting against the 'off' run of the same rotation.

    Three measures of each run's timed window, means per step: wall time (what a user waits
    for; on a shared machine mostly the other sessions' load), the training thread's CPU time
    (the step's own work: a per-step cost of having snapshots on shows here) and the process's
    CPU time (adds the snapshot writer's hashing and write() copies: the cores snapshots take
    from training). The target is judged on the process's CPU time: it counts everything
    snapshots cost and is the least disturbed by the load."""
    mean = statistics.fmean
    lines = ["", "snapshot overhead (per step, means over each run's timed window; overhead = run / "
             "the 'off' run of the same rotation - 1, median (min to max) over rotations):"]
    malloc = steady[0]["-1"].get("malloc", "?")
    lines.append(f"  glibc heap: {'fixed thresholds' if malloc != 'glibc default' else malloc}")
    has_cpu = "cpu" in steady[0]["-1"]

    def per_step(r: dict) -> Dict[str, float]:
        n = len(r["times"])
        d = {"wall": mean(r["times"])}
        if has_cpu:
            d.update(thread=mean(r["cpu"]), proc=r["proc_cpu_s"] / n,
                     faults=statistics.median(r["faults"]))
        return d

    off = [per_step(r["-1"]) for r in steady]
    verdict_line = None
    for key, name in (("-1", "off"), ("0", "adaptive (snapshot_every=0)"),
                      ("1", "every step (snapshot_every=1)")):
        if key not in steady[0]:
            continue
        st = [per_step(r[key]) for r in steady]
        cols = ["wall", "thread", "proc"] if has_cpu else ["wall"]
        parts = []
        for c in cols:
            v = [x[c] for x in st]
            part = f"{c} {1e3 * med(v):.1f} ms"
            if key != "-1":
                ov = [x[c] / o[c] - 1 for x, o in zip(st, off)]
                part += f" ({100 * med(ov):+.1f} %, {100 * min(ov):+.1f} to {100 * max(ov):+.1f})"
            parts.append(part)
        if has_cpu:
            parts.append(f"faults/step {med([x['faults'] for x in st]):.0f}")
        lines.append(f"  {name:30} " + "; ".join(parts))
        if key == "-1":
            continue
        iv = [steady[i][key]["snapshot_interval"] if key == "0" else 1 for i in range(len(steady))]
        cp = [r[key]["snapshot_copy_s"] for r in steady]
        wr = [r[key].get("snapshot_write_s", 0.0) for r in steady]
        wc = [r[key].get("snapshot_write_cpu_s", 0.0) for r in steady]
        nw = [r[key].get("snapshots_in_window", -1) for r in steady]
        # The engine's own accounting: the copy and the write's CPU (what the interval prices).
        acc = [(c + w) / max(1, i) / o["wall"] for c, w, i, o in zip(cp, wc, iv, off)]
        lines.append(f"  {'':30} copy {fmt_s(cp)} s, write {fmt_s(wr)} s wall, {fmt_s(wc)} s CPU, interval "
                     f"{'/'.join(str(i) for i in iv)} steps, written in the window "
                     f"{'/'.join(str(n) for n in nw)}; (copy + write CPU) / (interval x step) "
                     f"{100 * med(acc):.2f} %")
        if key == "0":
            c = "proc" if has_cpu else "wall"
            ov = [x[c] / o[c] - 1 for x, o in zip(st, off)]
            what = "process CPU" if has_cpu else "wall time"
            if min(nw) < 1:
                # A window in which no snapshot was copied or written measures nothing.
                verdict_line = (f"  {'adaptive snapshots < 1 % of step time':40} {100 * med(ov):+6.2f} % "
                                f"({what}) NOT MEASURED: a timed window held no snapshot (written "
                                f"{'/'.join(str(n) for n in nw)}); --measure must span the interval")
            else:
                verdict_line = (f"  {'adaptive snapshots < 1 % of step time':40} {100 * med(ov):+6.2f} % "
                                f"({what}) {verdict(med(ov) < TARGET_SNAPSHOT)}")
    if verdict_line:
        lines.append(verdict_line)
    return lines


def report(res: dict) -> str:
    reps = res["reps"]
    lines: List[str] = [f"park_bench {res['date']}: {res['params'] / 1e6:.1f} M parameters + Adam; "
                        f"load avg {min(res['load']):.1f}-{max(res['load']):.1f} on {res['cpus']} CPUs"]
    if reps:  # --reps 0: snapshot overhead only
        lines = []
        mb = res["state_bytes_est"] / 1e6
        cache = reps[0]["floor"].get("cache", "?")
        cache_note = ("cold = page cache dropped (/proc/sys/vm/drop_caches)" if cache == "drop_caches" else
                      "cold = the files' pages evicted with posix_fadvise(DONTNEED)")
        cache_note += "; a virtual disk may still be cached by the host"
        g = lambda f: [f(r) for r in reps]  # noqa: E731
        floor_w = g(lambda r: r["floor"]["write_s"])
        floor_rc = g(lambda r: r["floor"]["read_cold_s"])
        floor_rw = g(lambda r: r["floor"]["read_warm_s"])
        park = g(lambda r: r["park"]["park_engine_s"])
        leave = g(lambda r: r["park"]["leave_s"])
        save = g(lambda r: r["park"]["save_s"])
        res_c = g(lambda r: r["resume_cold"]["state_s"])
        res_w = g(lambda r: r["resume_warm"]["state_s"])
        boot_c = g(lambda r: r["resume_cold"]["first_next_s"])
        dcp_s = g(lambda r: r["torch"]["dcp_save_s"])
        dcp_lc = g(lambda r: r["torch"]["dcp_load_cold_s"])
        dcp_lw = g(lambda r: r["torch"]["dcp_load_warm_s"])
        ts_s = g(lambda r: r["torch"]["torchsave_save_s"])
        ts_lc = g(lambda r: r["torch"]["torchsave_load_cold_s"])
        ts_lw = g(lambda r: r["torch"]["torchsave_load_warm_s"])
        fbytes = reps[0]["park"]["park_file_bytes"]
        lines = [f"park_bench {res['date']}: {res['params'] / 1e6:.1f} M parameters + Adam, "
                 f"state {mb:.0f} MB (park file {fbytes / 1e6:.1f} MB, DCP "
                 f"{reps[0]['torch']['dcp_bytes'] / 1e6:.1f} MB, torch.save "
                 f"{reps[0]['torch']['torchsave_bytes'] / 1e6:.1f} MB); dir {res['dir']}; "
                 f"{len(reps)} reps; load avg {min(res['load']):.1f}-{max(res['load']):.1f} on "
                 f"{res['cpus']} CPUs", cache_note, "",
                 "seconds, median (min-max) over reps; ratio = per-rep ratio, median (min-max)", ""]

        def ratio(a: List[float], b: List[float]) -> List[float]:
            return [x / y for x, y in zip(a, b)]

        rows = [
            ("disk floor: write + fsync (best of 2)", floor_w, None, ""),
            ("disk floor: read, cold", floor_rc, None, ""),
            ("disk floor: read, warm", floor_rw, None, ""),
            ("malletrain park (engine: capture + durable write)", park, ratio(park, floor_w),
             "vs floor write"),
            ("malletrain job.save(path) (first write of the process)", save, ratio(save, floor_w), "vs floor write"),
            ("malletrain leave -> parked (boundary wall time)", leave, ratio(leave, floor_w),
             "vs floor write"),
            ("malletrain resume, cold (read + verify + restore)", res_c, ratio(res_c, floor_rc),
             "vs floor read cold"),
            ("malletrain resume, warm", res_w, ratio(res_w, floor_rw), "vs floor read warm"),
        ]
        if all("park_write_s" in r["park"] for r in reps):
            rows.insert(4, ("  of which the durable write (temp file .. dir fsync)",
                            g(lambda r: r["park"]["park_write_s"]), None, ""))
        for mode in ("cold", "warm"):
            if all("read_verify_s" in r[f"resume_{mode}"] for r in reps):
                rows += [(f"  of which read + verify ({mode})", g(lambda r: r[f"resume_{mode}"]["read_verify_s"]),
                          None, ""),
                         (f"  of which unpack + restore ({mode})", g(lambda r: r[f"resume_{mode}"]["restore_s"]),
                          None, "")]
        rows += [
            ("malletrain new incarnation: first next(), cold", boot_c, None, ""),
            ("DCP save (dcp.save, FileSystemWriter)", dcp_s, ratio(dcp_s, park), "vs malle park"),
            ("DCP load, cold (dcp.load + set_state_dict)", dcp_lc, ratio(dcp_lc, res_c),
             "vs malle resume cold"),
            ("DCP load, warm", dcp_lw, ratio(dcp_lw, res_w), "vs malle resume warm"),
        ]
        has_new = all("dcp_new_cold" in r for r in reps)
        if has_new:
            dcp_nc = g(lambda r: r["dcp_new_cold"]["load_s"])
            dcp_nw = g(lambda r: r["dcp_new_warm"]["load_s"])
            rows += [("DCP load in a new process, cold", dcp_nc, ratio(dcp_nc, res_c), "vs malle resume cold"),
                     ("DCP load in a new process, warm", dcp_nw, ratio(dcp_nw, res_w), "vs malle resume warm")]
        rows += [
            ("torch.save + fsync", ts_s, ratio(ts_s, park), "vs malle park"),
            ("torch.load + load_state_dict, cold", ts_lc, ratio(ts_lc, res_c), "vs malle resume cold"),
            ("torch.load + load_state_dict, warm", ts_lw, ratio(ts_lw, res_w), "vs malle resume warm"),
        ]
        w = max(len(r[0]) for r in rows)
        lines.append(f"{'':{w}}  {'seconds':>22}  {'MB/s':>6}  ratio")
        for name, xs, rt, what in rows:
            bw = mb / med(xs)
            rts = f"{fmt_s(rt)}x {what}" if rt else ""
            lines.append(f"{name:{w}}  {fmt_s(xs):>22}  {bw:6.0f}  {rts}")
        lines += ["", "targets (the floor is the disk: cold against cold; warm reads are memory copies, "
                  "shown above for information):"]
        tgt = [
            ("park <= 1.5x floor write", med(ratio(park, floor_w)), med(ratio(park, floor_w)) <= TARGET_FLOOR),
            ("resume (cold) <= 1.5x floor read (cold)", med(ratio(res_c, floor_rc)),
             med(ratio(res_c, floor_rc)) <= TARGET_FLOOR),
            ("park >= 2x faster than DCP save", med(ratio(dcp_s, park)), med(ratio(dcp_s, park)) >= TARGET_DCP),
            ("resume (cold) >= 2x faster than DCP load (cold)", med(ratio(dcp_lc, res_c)),
             med(ratio(dcp_lc, res_c)) >= TARGET_DCP),
            ("resume (warm) >= 2x faster than DCP load (warm)", med(ratio(dcp_lw, res_w)),
             med(ratio(dcp_lw, res_w)) >= TARGET_DCP),
        ]
        if has_new:
            tgt += [
                ("resume (cold) >= 2x faster than DCP load, new process", med(ratio(dcp_nc, res_c)),
                 med(ratio(dcp_nc, res_c)) >= TARGET_DCP),
                ("resume (warm) >= 2x faster than DCP load, new process", med(ratio(dcp_nw, res_w)),
                 med(ratio(dcp_nw, res_w)) >= TARGET_DCP),
            ]
        for name, v, ok in tgt:
            lines.append(f"  {name:55} {v:6.2f}x  {verdict(ok)}")
        if all("first_next_cpu_s" in r["resume_cold"] for r in reps):
            c = lambda f: fmt_s(g(f))  # noqa: E731
            lines += ["", "process CPU seconds (all threads; on a shared machine the CPU a way takes is what "
                      "competes with the other sessions):",
                      f"  malletrain job.save {c(lambda r: r['park']['save_cpu_s'])}; new incarnation's first "
                      f"next() cold {c(lambda r: r['resume_cold']['first_next_cpu_s'])}, warm "
                      f"{c(lambda r: r['resume_warm']['first_next_cpu_s'])}",
                      f"  DCP load, same process: cold {c(lambda r: r['torch']['dcp_load_cold_cpu_s'])}, warm "
                      f"{c(lambda r: r['torch']['dcp_load_warm_cpu_s'])}" + (
                          f"; new process: cold {c(lambda r: r['dcp_new_cold']['load_cpu_s'])}, warm "
                          f"{c(lambda r: r['dcp_new_warm']['load_cpu_s'])}" if has_new else "")]
    if res["steady"]:
        lines += snapshot_report(res["steady"])
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", default="driver",
                   choices=["driver", "floor", "park", "resume", "torch", "dcpload", "steady"])
    p.add_argument("--dir", default=None, help="the directory on the disk to measure (default: a "
                   "temporary one under the repository's build/)")
    p.add_argument("--keep", action="store_true", help="keep --dir's contents")
    p.add_argument("--width", type=int, default=WIDTH)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--snap-runs", type=int, default=3, help="rotations of off/adaptive/every step")
    p.add_argument("--snap-settings", default="-1,0,1", help="snapshot_every values to run in each "
                   "rotation (-1 off, 0 adaptive, N every N steps); -1 is needed for the overhead")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--measure", type=int, default=150, help="steps timed per snapshot run (a few "
                   "adaptive intervals)")
    p.add_argument("--quick", action="store_true", help="a smoke run: small model, one rep")
    p.add_argument("--malloc", choices=["fixed", "default"], default="fixed",
                   help="snapshot runs: glibc's heap thresholds fixed (FIXED_MALLOC, the same in "
                   "every run) or glibc's default (moving thresholds: the page faults per step "
                   "differ from run to run)")
    p.add_argument("--json", default=None)
    p.add_argument("--drop-caches", action="store_true", help="cold = drop the whole page cache "
                   "(/proc/sys/vm/drop_caches, root) instead of evicting our files only")
    p.add_argument("--report-from", default=None)
    # worker arguments
    p.add_argument("--source", default=None, help="floor: the file whose bytes to write")
    p.add_argument("--park-dir", default=None)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--snapshot-every", type=int, default=-1)
    p.add_argument("--torch-order", default="dcp,torchsave")
    p.add_argument("--keep-dcp", action="store_true", help="torch: keep the DCP checkpoint")
    args = p.parse_args()
    global DROP_CACHES
    DROP_CACHES = args.drop_caches
    if args.report_from:
        with open(args.report_from) as f:
            print(report(json.load(f)))
        return 0
    if args.role != "driver":
        {"floor": role_floor, "park": role_park, "resume": role_resume, "torch": role_torch,
         "dcpload": role_dcpload, "steady": role_steady}[args.role](args)
        return 0
    if args.quick:
        args.width, args.reps, args.snap_runs, args.warmup, args.measure = 128, 1, 1, 2, 4
    made = args.dir is None
    if made:
        base = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "build")
        os.makedirs(base, exist_ok=True)
        args.dir = tempfile.mkdtemp(prefix="park_bench.", dir=base)
    os.makedirs(args.dir, exist_ok=True)
    args.dir = os.path.abspath(args.dir)
    try:
        res = driver(args)
    finally:
        if made or not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True) if made else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
