"""Chaos campaign on the control plane (issue 26): a local cluster, four jobs, random faults.

A LocalCluster (the allocator as a daemon so that it can be killed, node agents, and the
control store: a three-member etcd cluster on loopback with --store etcd, a TCPStore process
with --store tcp) runs four digits jobs (examples/train_digits.py with --out, so that every
micro-batch is traced) on four local nodes that follow the demo's idle trace
(examples/demo_idle_trace.csv) and then stay offered, while a fault injector draws --faults
faults at random (seeded) from:

    rank        kill -9 of a running rank (its agent's child, or its zygote's)
    agent       kill -9 of a node agent (its rank dies with it); the node comes back 3 s later
    allocator   kill -9 of the allocator daemon, restarted from its journal 2 s later
    store       kill -9 of a store member (etcd) or of the store process (tcp), back 3 s later
    sigstop     SIGSTOP of a running rank for 3 s, then SIGCONT (a hang)
    zygote      kill -9 of a node agent's zygote (the warm interpreter its ranks are forked
                from: they die with it, PR_SET_PDEATHSIG); the agent starts a new one

    partition   (with --partitions, where every node runs on a host of its own: a network
                namespace on a bridge, tests/python/netns.py) a node's link down for 3 s

Reported, per job and in total: completed or not, its committed history (the chain of
incarnations whose committed steps make up the final state: a new incarnation resumes from the
state its predecessor parked or snapshotted, tests/python/committed_history.py), samples lost
or repeated in that history and (step, worker) pairs whose samples differ from the fixed-size
run's (all must be 0), the final model against the fixed-size run's (relative L2 difference),
the number of incarnations, the recovery time after
each fault (until every job that was training before it has committed a step again), and the
held node time (productive vs held without training) from the allocator's status.

    .venv/bin/python tests/bench/chaos_bench.py --faults 100 --interval 2 --store etcd \\
        --partitions --steps-scale 2.5 --out out/chaos

Prints a table and writes <out>/chaos.json. Every process it starts is a _C.LocalProcess (or a
child of one) and is stopped by pid when it ends.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import signal
import statistics
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from malletrain import _C, launcher  # noqa: E402
from state_compare import differences  # noqa: E402  (tests/python: the whole saved state)
from committed_history import (committed_history, differs_from,  # noqa: E402
                               lost_and_repeated)
from malletrain.cluster import LocalCluster, held_summary  # noqa: E402

EXAMPLE = ROOT / "examples" / "train_digits.py"
N_TRAIN = 1500
# job -> (steps, logical workers, extra args, compute sleep per micro-batch)
JOBS = {
    "digits": (1600, 4, [], 0.04),
    "wide": (1600, 4, ["--hidden", "256", "--seed", "2"], 0.04),
    "hpo-lr1": (1200, 2, ["--lr", "1e-3", "--seed", "3"], 0.04),
    "hpo-lr3": (1200, 2, ["--lr", "3e-3", "--seed", "4"], 0.04),
}


def command(out: pathlib.Path, steps: int, lw: int, extra, sleep: float):
    return [sys.executable, str(EXAMPLE), "--steps", str(steps), "--out", str(out),
            "--logical-workers", str(lw), "--compute-sleep", str(sleep), *extra]


def free_ports(n: int):
    import socket
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Etcd:
    def __init__(self, tmp: pathlib.Path, members: int = 3, host: str = "127.0.0.1"):
        self.host = host
        ports = free_ports(2 * members)
        self.client = {f"e{i}": ports[2 * i] for i in range(members)}
        self.peer = {f"e{i}": ports[2 * i + 1] for i in range(members)}
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.procs = {}
        self.cluster = ",".join(f"{n}=http://{host}:{p}" for n, p in self.peer.items())
        for name in self.client:
            self.start(name, "new")
        self.address = "etcd://" + ",".join(f"{host}:{p}" for p in self.client.values())

    def start(self, name: str, state: str) -> None:
        c, p, h = self.client[name], self.peer[name], self.host
        self.procs[name] = _C.LocalProcess.spawn(
            ["etcd", "--name", name, "--data-dir", str(self.tmp / name),
             "--listen-client-urls", f"http://{h}:{c}",
             "--advertise-client-urls", f"http://{h}:{c}",
             "--listen-peer-urls", f"http://{h}:{p}",
             "--initial-advertise-peer-urls", f"http://{h}:{p}",
             "--initial-cluster", self.cluster, "--initial-cluster-state", state,
             "--initial-cluster-token", f"chaos-{os.getpid()}"],
            stdout=str(self.tmp / f"{name}.log"), stderr_to_stdout=True)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill(timeout=10)


def _children(pid: int):
    """Pids whose parent is ``pid`` (any of its threads: LocalProcess forks on a spawner thread)."""
    pids = []
    for task in pathlib.Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return pids


def _is_zygote(pid: int) -> bool:
    try:
        return b"malletrain._zygote" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def rank_pids(cluster: LocalCluster):
    """node -> pid of a rank its agent runs, for live agents. A rank started cold is the
    agent's child; a warm one is a child of the agent's zygote (which is the agent's child)."""
    out = {}
    for node, agent in list(cluster._agents.items()):
        if agent.poll() is not None:
            continue
        ranks = []
        for kid in _children(agent.pid):
            ranks += _children(kid) if _is_zygote(kid) else [kid]
        if ranks:
            out[node] = ranks[0]
    return out


def zygote_pids(cluster: LocalCluster):
    """node -> pid of its agent's zygote."""
    out = {}
    for node, agent in list(cluster._agents.items()):
        if agent.poll() is None:
            z = [k for k in _children(agent.pid) if _is_zygote(k)]
            if z:
                out[node] = z[0]
    return out


def traces(out: pathlib.Path, members=None):
    """The trace rows of `members` (all if None), each file in its own order."""
    rows = []
    for f in sorted(out.glob("trace-*.jsonl")):
        if members is not None and f.stem[len("trace-"):] not in members:
            continue
        member = f.stem[len("trace-"):]
        for line in f.read_text().splitlines():
            try:
                rows.append(dict(json.loads(line), member=member))
            except ValueError:
                pass  # a line cut by a kill -9
    return rows


def incarnation_members(log_dir: pathlib.Path, job: str):
    """runtime id (<job>.i<k>) -> the members the agents started for it (their logs say so)."""
    import re
    found = collections.defaultdict(set)
    for log in log_dir.glob("agent-*.log"):
        # "started rank <member> [(local rank i of n) ]of <job>.i<k> (pid ...)" (agent.cc)
        for m in re.finditer(rf"started rank (\S+) (?:\(local rank \d+ of \d+\) )?of "
                             rf"({re.escape(job)}\.i\d+) \(", log.read_text(errors="replace")):
            found[m.group(2)].add(m.group(1))
    return found


def account(out: pathlib.Path, log_dir: pathlib.Path, job: str, final: str, steps: int,
            workers: int, reference):
    """The job's committed history across its incarnations (tests/python/committed_history.py):
    samples lost and repeated in it, (step, worker) whose samples differ from the fixed-size
    run's, and what could not be accounted for."""
    rows = {inc: traces(out, members) for inc, members in incarnation_members(log_dir, job).items()}
    h = committed_history(rows, final, steps, workers)
    lost, repeated = lost_and_repeated(h, steps, workers, N_TRAIN)
    return dict(segments=h.segments, lost=lost, repeated=repeated,
                differ_from_fixed=len(differs_from(h, reference)), problems=h.problems[:10],
                incarnations_traced=len(rows), lost_commits=h.lost_commits)


def _ip(*args: str) -> None:
    import subprocess
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _run_on_hosts(argv, args) -> int:
    """--partitions: builds 5 hosts (network namespaces on one bridge, tests/python/netns.py)
    and runs this program again on host 0, where it starts the store, the allocator and the
    agents, each agent on its node's host. Every namespace is removed at the end."""
    import subprocess
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    import netns

    why = netns.unavailable()
    if why:
        print(f"chaos_bench --partitions: {why}", file=sys.stderr)
        return 2
    netns.remove_stale()
    out = pathlib.Path(args.out).resolve()
    if out.exists():
        import shutil
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with netns.Hosts(5) as hosts:
        spec = out / "hosts.json"
        spec.write_text(json.dumps({"names": hosts.names, "switch": hosts.switch,
                                    "addrs": [hosts.addr(i) for i in range(len(hosts))]}))
        inner = subprocess.Popen(["ip", "netns", "exec", hosts.names[0], sys.executable,
                                  str(pathlib.Path(__file__).resolve()), *argv,
                                  "--inside", str(spec)])
        try:
            return inner.wait()
        finally:
            if inner.poll() is None:  # interrupted: stopped by its pid
                inner.send_signal(signal.SIGINT)
                try:
                    inner.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    inner.kill()
                    inner.wait(timeout=10)


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", type=int, default=100)
    p.add_argument("--interval", type=float, default=3.0, help="mean seconds between faults")
    p.add_argument("--store", choices=["etcd", "tcp"], default="etcd")
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--out", default="out/chaos")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--steps-scale", type=float, default=1.0,
                   help="the jobs' steps times this (longer jobs take more faults)")
    p.add_argument("--partitions", action="store_true",
                   help="every node on a host of its own (a network namespace, "
                   "tests/python/netns.py; needs root), and draw partitions too: a node's link "
                   "down for 3 s. The allocator, the store and this program run on host 0")
    p.add_argument("--inside", default=None, help=argparse.SUPPRESS)  # hosts.json, on host 0
    args = p.parse_args(argv)
    if args.partitions and args.inside is None:
        return _run_on_hosts(argv if argv is not None else sys.argv[1:], args)
    hosts = json.loads(pathlib.Path(args.inside).read_text()) if args.inside else None
    jobs = {j: (max(1, int(steps * args.steps_scale)), lw, extra, sleep)
            for j, (steps, lw, extra, sleep) in JOBS.items()}
    out = pathlib.Path(args.out).resolve()
    if out.exists() and hosts is None:  # inside the hosts, the outer run made it
        import shutil
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)

    # The fixed-size references: each job alone on as many ranks as it has logical workers.
    fixed, reference = {}, {}
    for job, (steps, lw, extra, _sleep) in jobs.items():
        r = launcher.run_local(command(out / "fixed" / job, steps, lw, extra, 0.0), nodes=lw,
                               job_id=f"fixed-{job}", timeout=600, quiet=True,
                               log_dir=str(out / "fixed" / f"{job}-logs"))
        assert r.ok, f"fixed-size run of {job} failed"
        fixed[job] = torch.load(out / "fixed" / job / "final.pt")
        reference[job] = committed_history({"fixed": traces(out / "fixed" / job)}, "fixed",
                                           steps, lw)
        assert reference[job].complete, (job, reference[job].problems)

    etcd = Etcd(out / "etcd", host=hosts["addrs"][0] if hosts else "127.0.0.1") \
        if args.store == "etcd" else None
    if hosts and not etcd:
        raise SystemExit("--partitions needs --store etcd (a store on host 0's address)")
    kinds = ["rank", "agent", "allocator", "store", "sigstop", "zygote"]
    if hosts:
        kinds.append("partition")
    node_host = {f"n{i}": i + 1 for i in range(4)}  # node n<i> runs on host i+1
    faults, recoveries = [], []
    nodes = ["n0", "n1", "n2", "n3"]
    t_start = time.monotonic()
    try:
        prefix = (lambda n: ["ip", "netns", "exec", hosts["names"][node_host[n]]]) \
            if hosts else None
        with LocalCluster(nodes, policy="milp", allocator="process", grace=5.0,
                          heartbeat_timeout=6.0, workdir=out / "cluster", keep_logs=True,
                          store=etcd.address if etcd else "process",
                          agent_prefix=prefix) as c:
            # The demo's idle trace for the first ~100 s, then every node stays offered.
            from malletrain.cluster import load_idle_trace
            trace = load_idle_trace(ROOT / "examples" / "demo_idle_trace.csv")
            c.follow_trace(trace)
            last_t = trace[-1].t if trace else 0.0
            up_all = threading.Timer(last_t + 1.0, lambda: [c.node_up(n) for n in nodes])
            up_all.daemon = True
            up_all.start()
            for job, (steps, lw, extra, sleep) in jobs.items():
                c.submit(job, command(out / job, steps, lw, extra, sleep), max_nodes=lw,
                         logical_workers=lw)
            stop = threading.Event()
            names = list(jobs)

            def progress():
                res = {}
                for j in c.jobs().values():
                    if j["phase"] == "running" and j.get("runtime_id"):
                        v = c.store.try_get(launcher.progress_key(j["runtime_id"]))
                        res[j["job"]] = int(v) if v else 0
                return res

            def inject() -> None:
                while len(faults) < args.faults and not stop.is_set():
                    if stop.wait(rng.expovariate(1 / args.interval)):
                        return
                    kind = rng.choice(kinds)
                    t = time.monotonic() - t_start
                    try:
                        before = progress()
                    except Exception:  # noqa: BLE001 - the store may be the one down
                        before = {}
                    what = ""
                    pids = rank_pids(c)
                    if kind in ("rank", "sigstop") and pids:
                        node = rng.choice(sorted(pids))
                        pid = pids[node]
                        if kind == "rank":
                            os.kill(pid, signal.SIGKILL)
                            what = f"kill -9 rank pid {pid} on {node}"
                        else:
                            os.kill(pid, signal.SIGSTOP)
                            time.sleep(3)
                            try:
                                os.kill(pid, signal.SIGCONT)
                            except ProcessLookupError:
                                pass
                            what = f"SIGSTOP 3 s rank pid {pid} on {node}"
                    elif kind == "partition" and c.live_nodes():
                        node = rng.choice(sorted(c.live_nodes()))
                        link = f"v{node_host[node]}"
                        _ip("-n", hosts["switch"], "link", "set", link, "down")
                        time.sleep(3)
                        _ip("-n", hosts["switch"], "link", "set", link, "up")
                        what = f"partition of {node} (host {node_host[node]}) for 3 s"
                    elif kind == "zygote" and zygote_pids(c):
                        zps = zygote_pids(c)
                        node = rng.choice(sorted(zps))
                        os.kill(zps[node], signal.SIGKILL)
                        what = f"kill -9 zygote pid {zps[node]} on {node} (its warm ranks die with it)"
                    elif kind == "agent" and c.live_nodes():
                        node = rng.choice(sorted(c.live_nodes()))
                        c.kill_agent(node)
                        what = f"kill -9 agent of {node}"
                        time.sleep(3)
                        c.node_up(node)
                    elif kind == "allocator":
                        c.stop_allocator(kill=True)
                        time.sleep(2)
                        c.start_allocator()
                        what = "kill -9 allocator"
                    elif kind == "store":
                        if etcd:
                            name = rng.choice(sorted(etcd.procs))
                            etcd.procs[name].kill(timeout=10)
                            time.sleep(3)
                            etcd.start(name, "existing")
                            what = f"kill -9 etcd member {name}"
                        else:
                            c.stop_store(kill=True)
                            time.sleep(3)
                            c.start_store()
                            what = "kill -9 store process"
                    else:
                        continue
                    faults.append({"t": round(t, 2), "kind": kind, "what": what})
                    # Recovery: every job that was training commits a step again.
                    t0 = time.monotonic()
                    pending = dict(before)
                    while pending and time.monotonic() - t0 < 120 and not stop.is_set():
                        try:
                            now = progress()
                        except Exception:  # noqa: BLE001
                            now = {}
                        pending = {j: s for j, s in pending.items()
                                   if j in now and now[j] <= s}
                        time.sleep(0.1)
                    recoveries.append(round(time.monotonic() - t0, 2) if not pending else None)

            injector = threading.Thread(target=inject, daemon=True)
            injector.start()
            try:
                final = c.wait(names, timeout=args.timeout)
            finally:
                stop.set()
                injector.join(timeout=30)
            status = c.status()
    finally:
        if etcd:
            etcd.close()

    rows = []
    for job, (steps, lw, extra, _s) in jobs.items():
        j = final[job]
        final_id = str(j.get("runtime_id"))
        acc = account(out / job, out / "cluster" / "logs", job, final_id, steps, lw,
                      reference[job])
        if j["phase"] != "succeeded":  # an unfinished run has no committed history to account
            acc.update(lost=None, repeated=None)
        # The whole final state (model, optimizer, schedule) against the fixed-size run's.
        if (out / job / "final.pt").exists():
            ndiff, diff = differences(torch.load(out / job / "final.pt"), fixed[job])
            ndiff = len(ndiff)
        else:
            ndiff, diff = -1, float("nan")
        held = j.get("held") or {}
        rows.append(dict(job=job, phase=j["phase"], final_incarnation=final_id,
                         incarnations=int(final_id.rsplit(".i", 1)[1]) if ".i" in final_id
                         else 0, rel_diff=diff, state_entries_differing=ndiff,
                         productive_node_s=held.get("productive_node_s", 0),
                         held_idle_node_s=held.get("held_idle_node_s", 0), **acc))
    rec = [r for r in recoveries if r is not None]
    by_kind = ", ".join(f"{k} {sum(f['kind'] == k for f in faults)}" for k in kinds)
    print(f"chaos campaign: {len(faults)} faults ({by_kind}), store {args.store}, "
          f"{time.monotonic() - t_start:.0f} s")
    print(f"{'job':<9} {'phase':<10} {'incarn.':>7} {'lost':>5} {'repeat':>6} {'!=fixed':>7} "
          f"{'model vs fixed':>15} {'productive':>11} {'held idle':>10}  committed history")
    for r in rows:
        chain = " ".join(f"{name.rsplit('.', 1)[-1]}[{a},{b})" for name, a, b in r["segments"])
        print(f"{r['job']:<9} {r['phase']:<10} {r['incarnations']:>7} {str(r['lost']):>5} "
              f"{str(r['repeated']):>6} {r['differ_from_fixed']:>7} "
              f"{r['rel_diff']:>15.2e} {r['productive_node_s']:>10.1f}s {r['held_idle_node_s']:>9.1f}s"
              f"  {chain}")
        if r["lost_commits"]:
            print(f"    {r['job']}: {r['lost_commits']} step(s) committed by a rank killed right "
                  f"after, redone by the others (not in the history)")
        for problem in r["problems"]:
            print(f"    {r['job']}: {problem}")
    if rec:
        q = statistics.quantiles(rec, n=20, method="inclusive") if len(rec) >= 2 else [rec[0]] * 19
        print(f"recovery (until every training job committed again): n={len(rec)}, median "
              f"{statistics.median(rec):.2f} s, p95 {q[18]:.2f} s, max {max(rec):.2f} s; "
              f"not recovered within 120 s: {sum(r is None for r in recoveries)}")
        for kind in kinds:
            ks = [r for f, r in zip(faults, recoveries) if f["kind"] == kind and r is not None]
            if ks:
                print(f"  {kind:<10} n={len(ks):<3} median {statistics.median(ks):5.2f} s, "
                      f"max {max(ks):5.2f} s")
    print(held_summary(status.get("held") or {}))
    (out / "chaos.json").write_text(json.dumps(dict(faults=faults, recoveries=recoveries,
                                                    jobs=rows, held=status.get("held"),
                                                    allocator=status.get("allocator")), indent=1))
    ok = all(r["phase"] == "succeeded" and r["lost"] == 0 and r["repeated"] == 0
             and r["differ_from_fixed"] == 0 and not r["problems"]
             and r["state_entries_differing"] == 0 for r in rows)
    print("result:", "every job completed with its fixed-size state; no sample lost or repeated"
          if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
