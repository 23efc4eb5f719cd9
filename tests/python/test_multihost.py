"""Several hosts (issue 23): the allocator, its control store, node agents and the ranks of one
job on four "hosts" of their own, network namespaces joined by a bridge (tests/python/netns.py),
each with its own address; nothing runs on loopback between hosts.

Host 0 runs ``malle-allocator --listen`` (the allocator hosting the control store on its
address); hosts 1-3 run a ``malle-agent`` each, connecting to host 0's address. One job
(tests/python/exact_job.py) trains across them through a grow, a planned leave and a kill -9
of a rank mid-step; then one host is cut off the network mid-step (its bridge port goes down:
silence, no error). The majority must go on within the ranks' heartbeat timeout, the cut-off
rank must stop training and exit by itself, no step may have a second writer, and after the
link comes back the host's agent re-registers and the job grows onto it again with a new
member. The job ends with the whole state of the fixed-size run.

Needs root and iproute2 (skips with the reason otherwise). Every namespace, bridge and veth
is the test's own and removed when it ends, failed or not; every process it starts is
stopped by pid; every wait has a timeout.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import sys
import time

import pytest

from malletrain import _C, launcher
from malletrain.cluster import agent_binary

import netns
from state_compare import assert_same_state

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "exact_job.py"
STEPS = 320
WORKERS = 4
JOB = "mh"
RUNTIME = f"{JOB}.i1"
HEARTBEAT_TIMEOUT_S = 2.0  # the ranks' (ElasticGroupOptions.heartbeat_timeout default)
SLOW, FAST = "0.15", "0.0"  # seconds after each step while the test acts / after


@pytest.fixture(scope="module")
def hosts_ok():
    why = netns.unavailable()
    if why:
        pytest.skip(f"multi-host test needs network namespaces: {why}")
    netns.remove_stale()


def job_cmd(out: pathlib.Path, *extra: str):
    return [sys.executable, str(SCRIPT), "--steps", str(STEPS), "--out", str(out),
            "--logical-workers", str(WORKERS), *extra]


def wait_for(what, cond, timeout=60.0, poll=0.1):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


class Deployment:
    """The allocator (hosting the store) on host 0 and an agent per other host; the test's
    view of the store is a client opened inside host 0's namespace."""

    def __init__(self, hosts: netns.Hosts, work: pathlib.Path) -> None:
        self.hosts = hosts
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.secret = work / "secret"
        _C.write_new_secret(str(self.secret))
        self.allocator = hosts.spawn(
            0, [agent_binary("malle-allocator"), f"--listen={hosts.addr(0)}:0",
                f"--secret={self.secret}", "--policy=equal_share", "--heartbeat_timeout=4s",
                "--debounce=0.2s"], log=self.logs / "allocator.log")
        text = wait_for("the allocator's store", lambda: re.search(
            r"control store listening on (\S+)", self.log("allocator")), timeout=60)
        self.address = text.group(1)
        assert self.address.startswith(hosts.addr(0) + ":"), self.address
        with hosts.inside(0):
            self.store = _C.open_store(self.address, timeout=30.0)
            self.client = _C.ControlClient(self.store, _C.load_secret(str(self.secret)))
        self.agents = {}  # host index -> Popen

    def log(self, name: str) -> str:
        p = self.logs / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def agent_up(self, i: int):
        p = self.agents.get(i)
        assert p is None or p.poll() is not None, f"agent of h{i} already running"
        self.agents[i] = self.hosts.spawn(
            i, [agent_binary("malle-agent"), f"--store={self.address}",
                f"--secret={self.secret}", f"--node=h{i}", "--grace=8s",
                f"--log_dir={self.logs}", f"--park_dir={self.work / 'park'}"],
            log=self.logs / f"agent-h{i}.log")
        return self.agents[i]

    # Every store access from host 0's namespace: a reconnect opens its socket there too.
    def status(self):
        with self.hosts.inside(0):
            try:
                return json.loads(self.client.status_json())
            except Exception:  # not published yet
                return {"nodes": [], "jobs": []}

    def progress(self) -> int:
        with self.hosts.inside(0):
            v = self.store.try_get(launcher.progress_key(RUNTIME))
        return int(v) if v else 0

    def generation(self):
        with self.hosts.inside(0):
            return _C.latest_generation(self.store, RUNTIME)

    def record(self, g: int):
        """Generation g's record as {field: value} ('members' a list), or None."""
        with self.hosts.inside(0):
            # c10d's PrefixStore joins prefix and key with '/': the job's prefix ends with one.
            v = self.store.try_get(f"malle/job/{RUNTIME}//gen/{g}/record")
        if v is None:
            return None
        rec = dict(line.split("=", 1) for line in v.decode().splitlines() if "=" in line)
        rec["members"] = [m for m in rec.get("members", "").split(",") if m]
        return rec

    def members_on(self, host: int):
        g = self.generation()
        return [m for m in (g or {}).get("members", []) if m.startswith(f"h{host}-")]

    def node(self, host: int):
        return next((n for n in self.status()["nodes"] if n["node"] == f"h{host}"), {})

    def job(self):
        return next((j for j in self.status()["jobs"] if j["job"] == JOB), {})

    def dump(self) -> str:
        parts = []
        for p in sorted(self.logs.glob("*.log")):
            parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


def children(pid: int):
    """Pids whose parent is ``pid`` (the ranks an agent started)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def traces(out: pathlib.Path):
    rows = []
    for f in sorted(out.glob("trace-*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            r["member"] = f.stem[len("trace-"):]
            rows.append(r)
    return rows


@pytest.fixture(scope="module")
def fixed(tmp_path_factory, hosts_ok):
    """The fixed-size run (2 ranks on loopback) the multi-host run must equal."""
    tmp = tmp_path_factory.mktemp("mh-fixed")
    out = tmp / "out"
    res = launcher.run_local(job_cmd(out), nodes=2, job_id="fixed", timeout=240,
                             log_dir=str(tmp / "logs"), quiet=True)
    assert res.ok, res
    import torch
    return torch.load(out / "final.pt")


def test_job_across_hosts_survives_grow_leave_kill_and_a_partition(tmp_path, fixed):
    out = tmp_path / "out"
    pace = tmp_path / "pace"
    pace.write_text(SLOW)
    events = {}
    with netns.Hosts(4) as hosts:
        names = list(hosts.exists())
        d = Deployment(hosts, tmp_path)
        try:
            d.agent_up(1)
            d.agent_up(2)
            d.client.submit(job=JOB, command=job_cmd(out, "--pace-file", str(pace),
                                                     "--die", "1@60:backward"),
                            env={}, cwd=str(HERE), min_nodes=1, max_nodes=3,
                            logical_workers=WORKERS, weight=1.0, priority=0)
            wait_for("training on 2 hosts", lambda: d.progress() >= 5
                     and len((d.generation() or {}).get("members", [])) == 2, timeout=120)
            # Grow: a third host comes.
            d.agent_up(3)
            wait_for("grown onto h3", lambda: d.members_on(3)
                     and d.node(3).get("rank_phase") == "training", timeout=90)
            events["grown_at"] = d.progress()
            # Planned leave: h3 is reclaimed (SIGTERM to its agent); its rank leaves.
            d.agents[3].send_signal(signal.SIGTERM)
            assert d.agents[3].wait(timeout=30) == 0, d.dump()
            wait_for("h3's member gone", lambda: not d.members_on(3), timeout=30)
            events["left_at"] = d.progress()
            # kill -9: the rank that is rank 1 at step 60 SIGKILLs itself mid-step
            # (exact_job.py --die); the job recovers and the agent's node gets a new rank.
            wait_for("the kill -9 at step 60", lambda: (out / "died").exists(), timeout=120)
            wait_for("training past the kill", lambda: d.progress() >= 64, timeout=60)
            # h3 comes back: the job grows to 3 hosts again.
            d.agent_up(3)
            wait_for("3 members, h3 again", lambda: d.members_on(3)
                     and len(d.generation()["members"]) == 3
                     and d.node(3).get("rank_phase") == "training", timeout=90)
            # --- the partition --------------------------------------------------------
            victim = 3
            member = d.members_on(victim)[0]
            ranks = children(d.agents[victim].pid)
            assert len(ranks) == 1, (ranks, d.dump())
            gen_before = d.generation()["generation"]
            p0 = d.progress()
            t0 = time.monotonic()
            hosts.partition(victim)
            # The majority goes on: a new generation without the victim, steps commit again.
            wait_for("a generation without the cut-off member", lambda: member not in
                     d.generation()["members"], timeout=30, poll=0.05)
            t_excluded = time.monotonic() - t0
            p1 = d.progress()
            wait_for("the majority training on", lambda: d.progress() >= p1 + 3, timeout=30,
                     poll=0.05)
            t_training = time.monotonic() - t0
            # The cut-off rank stops and exits by itself (its agent cannot reach the store).
            wait_for("the cut-off rank to exit", lambda: not alive(ranks[0]), timeout=60,
                     poll=0.2)
            t_exit = time.monotonic() - t0
            cut_log = (d.logs / f"{member}.err").read_text(errors="replace")
            wait_for("h3 withdrawn by the allocator", lambda: d.node(victim).get("phase")
                     == "gone", timeout=30)
            cut_rows = [r for r in traces(out) if r["member"] == member]
            # --- healing --------------------------------------------------------------
            hosts.heal(victim)
            t_heal = time.monotonic()
            wait_for("h3 back in the job as a new member", lambda: [
                m for m in d.members_on(victim) if m != member], timeout=90)
            t_rejoin = time.monotonic() - t_heal
            events["rejoined_at"] = d.progress()
            assert events["rejoined_at"] < STEPS, "the job ended before the host rejoined"
            pace.write_text(FAST)
            final = wait_for("the job to end", lambda: d.job().get("phase") in (
                "succeeded", "failed", "cancelled") and d.job(), timeout=120, poll=0.3)
            gens = []
            g = 0
            while (rec := d.record(g)) is not None:
                gens.append(rec)
                g += 1
            status = d.status()
        except BaseException:
            print(d.dump())
            import shutil
            shutil.copytree(d.logs, f"/tmp/mh-logs-{os.getpid()}", dirs_exist_ok=True)
            raise
        finally:
            for p in d.agents.values():
                hosts.stop(p)
            hosts.stop(d.allocator, sig=signal.SIGTERM)
    # Every namespace (and with them the bridge and veths) is gone.
    assert not any(os.path.exists(f"/run/netns/{n}") for n in names), names

    print(f"multihost: excluded after {t_excluded:.2f} s, training on after {t_training:.2f} s, "
          f"cut-off rank exited after {t_exit:.2f} s, rejoined {t_rejoin:.2f} s after healing; "
          f"events {events}; {len(gens)} generations")
    assert final["phase"] == "succeeded", (final, status)
    # The majority continued within the heartbeat timeout (plus the recovery's own work).
    assert t_excluded < HEARTBEAT_TIMEOUT_S + 8, t_excluded
    # The cut-off rank left because it saw itself cut off (not killed by its agent).
    assert "is cut off" in cut_log, cut_log[-2000:]
    # No split brain: the cut-off member is in no generation after the partition, and it
    # started no step after the one it was cut off in (so it wrote none).
    after = [r for r in gens if int(r["generation"]) > gen_before]
    assert after and all(member not in r["members"] for r in after), after
    assert not cut_rows or max(r["step"] for r in cut_rows) <= p0 + 1, (p0, cut_rows[-3:])
    assert len([r for r in traces(out) if r["member"] == member]) == len(cut_rows)
    # Generations form one chain (each record written once, by CreateIfAbsent).
    assert [int(r["generation"]) for r in gens] == list(range(len(gens)))
    # Nothing lost: the whole state equals the fixed-size run's.
    import torch
    assert_same_state(torch.load(out / "final.pt"), fixed)
