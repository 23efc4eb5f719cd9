"""End-to-end tests of the shared allocator, node agents and elastic jobs (issue 7).

Real processes on loopback: the control store is hosted by the test's LocalCluster
(ephemeral port), node agents are malle-agent processes, ranks are train_digits.py processes
started by the agents; every process is stopped by pid (LocalCluster.close), every wait has a
timeout. Each job's result is compared with its fixed-size run, and its data accounting is
checked sample by sample from the ranks' traces.
"""

from __future__ import annotations

import json
import re
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from malletrain import _C, launcher
from malletrain.cluster import LocalCluster, load_idle_trace
from malletrain.errors import MalleValueError

from state_compare import assert_same_state
from digits_runs import check_replicas_and_data, final_state, read_traces, sizes_seen

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_digits.py"
A_STEPS, B_STEPS = 60, 120
A_ARGS = ["--logical-workers", "4"]
B_ARGS = ["--logical-workers", "2", "--hidden", "64", "--seed", "1"]


def train_cmd(out: pathlib.Path, steps: int, args, sleep: float):
    # The sleep is per micro-batch (it stands in for compute and is divided among the ranks),
    # so the jobs really are faster on more nodes and their advisors see it.
    return [sys.executable, str(EXAMPLE), "--steps", str(steps), "--out", str(out),
            "--compute-sleep", str(sleep), *args]


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """The fixed-size runs the elastic runs must equal: A on 4 ranks, B on 2."""
    tmp = tmp_path_factory.mktemp("fixed")
    res = {}
    for name, steps, args, ranks in (("a", A_STEPS, A_ARGS, 4), ("b", B_STEPS, B_ARGS, 2)):
        out = tmp / name
        r = launcher.run_local(train_cmd(out, steps, args, 0.0), nodes=ranks, job_id=name,
                               timeout=240, log_dir=str(tmp / f"{name}-logs"))
        assert r.ok, name
        res[name] = final_state(out)
    return res


def wait_for(what, cond, timeout=120.0, poll=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def job_view(cluster, job):
    return cluster.jobs().get(job, {})


def progress(cluster, runtime_id: str) -> int:
    v = cluster.store.try_get(launcher.progress_key(runtime_id))
    return int(v) if v else 0


def nodes_running(cluster, runtime_id: str):
    return [n["node"] for n in cluster.status()["nodes"] if n.get("running") == runtime_id]


def member_nodes(cluster, runtime_id: str):
    """Nodes of the members of the job's latest generation, rank 0 first (a member id is
    '<node>-<agent pid>-r<k>'); [] before its first generation. A rank an agent runs is not a
    member until the job has admitted it."""
    g = _C.latest_generation(cluster.store, runtime_id)
    return [m.rsplit("-", 2)[0] for m in (g or {}).get("members", [])]


def dump_logs(cluster) -> str:
    parts = []
    for p in sorted(cluster.log_dir.glob("*")):
        if p.is_file():
            parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}")
    return "\n".join(parts)


def test_idle_trace_file_is_validated(tmp_path):
    good = tmp_path / "t.csv"
    good.write_text("# comment\ntime,node,idle\n100,n0,1\n110,n1,1\n130,n0,0\n")
    ev = load_idle_trace(good, time_scale=2)
    assert [(e.t, e.node, e.idle) for e in ev] == [(0, "n0", True), (5, "n1", True),
                                                   (15, "n0", False)]
    for text, msg in (("time,node\n", "header"), ("time,node,idle\n1,n0,2\n", ":2: idle"),
                      ("time,node,idle\n5,n0,1\n4,n1,1\n", ":3: time"),
                      ("time,node,idle\nx,n0,1\n", "not a number"),
                      ("time,node,idle\n1,n 0,1\n", "not an id")):
        bad = tmp_path / "bad.csv"
        bad.write_text(text)
        with pytest.raises(MalleValueError, match=msg):
            load_idle_trace(bad)


def test_two_jobs_share_nodes_that_come_and_go(tmp_path, fixed):
    """Nodes appear, one is reclaimed with grace, one agent is killed; a job that finishes
    frees its nodes; both jobs end with their fixed-size models and exact data accounting."""
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    snapshots = []
    with LocalCluster([f"n{i}" for i in range(5)], policy="dp", grace=8.0,
                      heartbeat_timeout=3.0, workdir=tmp_path / "cluster") as c:
        try:
            for n in ("n0", "n1", "n2"):
                c.node_up(n)
            c.submit("a", train_cmd(out_a, A_STEPS, A_ARGS, 0.08), max_nodes=4,
                     logical_workers=4)
            c.submit("b", train_cmd(out_b, B_STEPS, B_ARGS, 0.1), max_nodes=2,
                     logical_workers=2)

            def snap():
                snapshots.append((time.monotonic(), c.jobs()))

            wait_for("both jobs training", lambda: snap() or (
                progress(c, "a.i1") >= 5 and progress(c, "b.i1") >= 5), timeout=120)
            c.node_up("n3")
            c.node_up("n4")
            # a grows onto n3/n4; the kill needs a member to survive it. (A rank an agent runs
            # is not a member until admitted: killing the only member parks the job, which
            # resumes as a.i2, and a.i1 never reaches step 35.)
            wait_for("a at step 20 with two members or more", lambda: snap() or (
                progress(c, "a.i1") >= 20 and len(member_nodes(c, "a.i1")) >= 2), timeout=120)
            # kill -9 of an agent (its rank dies with it) that runs a member of a other than
            # rank 0.
            victims = member_nodes(c, "a.i1")[1:]
            assert victims, c.status()
            c.kill_agent(victims[-1])
            wait_for("a at step 35", lambda: snap() or progress(c, "a.i1") >= 35, timeout=120)
            # The main scheduler reclaims a node of b: its rank leaves within the grace.
            b_nodes = nodes_running(c, "b.i1")
            assert b_nodes, c.status()
            c.node_down(b_nodes[-1], wait=True)
            final = c.wait(["a", "b"], timeout=300, on_poll=lambda _: snap())
            snap()
            status = c.status()
        except BaseException:
            print(dump_logs(c))
            raise
    assert final["a"]["phase"] == "succeeded" and final["b"]["phase"] == "succeeded", status
    # No node was ever planned for two jobs at once.
    for _, jobs in snapshots:
        planned = [n for j in jobs.values() for n in j.get("nodes", [])]
        assert len(planned) == len(set(planned)), jobs
    # a resized (3 nodes, more when n3/n4 came, fewer after the kill); b shrank at the reclaim.
    rows_a, rows_b = read_traces(out_a), read_traces(out_b)
    assert len(set(sizes_seen(rows_a))) >= 2, sizes_seen(rows_a)
    assert len(set(sizes_seen(rows_b))) >= 2, sizes_seen(rows_b)
    # After a ended, b (still running) was given 2 nodes again: a's nodes went to b.
    t_a_done = next(t for t, jobs in snapshots if jobs.get("a", {}).get("phase") == "succeeded")
    after = [jobs["b"] for t, jobs in snapshots
             if t >= t_a_done and jobs.get("b", {}).get("phase") == "running"]
    if after:  # b may have finished first on a slow machine; then there is nothing to free
        assert max(len(j["nodes"]) for j in after) == 2, after
    # Exactly-once data, identical replicas after every step, and the fixed-size models.
    check_replicas_and_data(rows_a, steps=A_STEPS, workers=4)
    check_replicas_and_data(rows_b, steps=B_STEPS, workers=2)
    assert_same_state(final_state(out_a), fixed["a"])
    assert_same_state(final_state(out_b), fixed["b"])
    gone = {n["node"]: n for n in status["nodes"] if n["phase"] == "gone"}
    assert victims[-1] in gone and "silent" in gone[victims[-1]]["why_gone"], status["nodes"]
    assert b_nodes[-1] in gone and "reclaimed" in gone[b_nodes[-1]]["why_gone"], status["nodes"]


def node_view(cluster, node):
    return next((n for n in cluster.status()["nodes"] if n["node"] == node), {})


def zygote_of(cluster, node: str) -> int:
    """Pid of the zygote the node's agent runs (its child running malletrain._zygote)."""
    agent = cluster._agents[node].pid
    for task in pathlib.Path(f"/proc/{agent}/task").glob("*"):
        for kid in (task / "children").read_text().split():
            try:
                if b"malletrain._zygote" in pathlib.Path(f"/proc/{kid}/cmdline").read_bytes():
                    return int(kid)
            except OSError:
                pass
    raise AssertionError(f"no zygote under {node}'s agent {agent}")


def test_ranks_are_forked_warm_and_a_killed_zygote_is_replaced(tmp_path, fixed):
    """Issue 26: an agent offers its node once its zygote (an interpreter that has imported
    torch, malletrain and the script's data module) is ready, and starts the job's ranks as
    forks of it. kill -9 of a zygote takes its node's warm rank with it (a crash, from which
    the job recovers); the agent starts a new zygote, and ranks start cold until it is ready.
    The job ends with its fixed-size model and exact data either way."""
    out = tmp_path / "a"
    with LocalCluster(["n0", "n1"], policy="dp", grace=8.0, heartbeat_timeout=5.0,
                      workdir=tmp_path / "cluster",
                      preload=["torch", "torch._dynamo", "malletrain", "sklearn.datasets"]) as c:
        try:
            c.node_up("n0")
            c.node_up("n1")
            c.submit("a", train_cmd(out, A_STEPS, A_ARGS, 0.15), max_nodes=2, logical_workers=4)
            wait_for("a on both nodes", lambda: progress(c, "a.i1") >= 5 and len(
                [n for n in ("n0", "n1") if node_view(c, n).get("rank_phase") == "training"]) == 2,
                timeout=180)
            first = zygote_of(c, "n1")
            os.kill(first, signal.SIGKILL)
            wait_for("a new zygote on n1", lambda: zygote_of_or_none(c, "n1") not in (None, first),
                     timeout=60)
            final = c.wait(["a"], timeout=300)
            status = c.status()
        except BaseException:
            print(dump_logs(c))
            raise
    assert final["a"]["phase"] == "succeeded", status
    logs = {n: (c.log_dir / f"agent-{n}.log").read_text() for n in ("n0", "n1")}
    for n, log in logs.items():
        # The node was offered only once its zygote was ready, and its first rank was warm.
        assert log.index("zygote ready after") < log.index(f"offers node {n}"), log[-3000:]
        starts = [line for line in log.splitlines() if "started rank" in line]
        assert starts and "warm: forked from the zygote" in starts[0], starts
    # n1's rank died with its zygote (reported like any crash) and the agent replaced both.
    assert "is unusable" in logs["n1"], logs["n1"][-3000:]
    assert len(re.findall(r"zygote \d+ started \(", logs["n1"])) >= 2, logs["n1"][-3000:]
    assert len(re.findall(r"zygote \d+ ready in", logs["n1"])) >= 2, logs["n1"][-3000:]
    assert "ended with status 137 (exited)" in logs["n1"], logs["n1"][-3000:]  # SIGKILL
    rows = read_traces(out)
    check_replicas_and_data(rows, steps=A_STEPS, workers=4)
    assert_same_state(final_state(out), fixed["a"])


def test_a_zygote_that_cannot_import_means_cold_starts_and_rarer_retries(tmp_path):
    """A zygote whose imports fail does not keep the node from being offered: the agent says
    why, its ranks start cold (the job trains), and it retries the zygote after 5 s, then 10 s
    (not in a loop that would take the node's CPU)."""
    out = tmp_path / "a"
    with LocalCluster(["n0"], policy="dp", workdir=tmp_path / "cluster",
                      preload=["torch", "no_such_module_for_the_test"]) as c:
        try:
            c.node_up("n0")
            c.submit("a", train_cmd(out, 40, ["--logical-workers", "1"], 0.3), max_nodes=1,
                     logical_workers=1)
            wait_for("two failed zygotes", lambda: (c.log_dir / "agent-n0.log").read_text()
                     .count("is unusable") >= 2, timeout=120)
            final = c.wait(["a"], timeout=180)
        except BaseException:
            print(dump_logs(c))
            raise
    log = (c.log_dir / "agent-n0.log").read_text()
    assert final["a"]["phase"] == "succeeded", final
    assert "zygote failed (import no_such_module_for_the_test" in log, log[-3000:]
    assert log.index("zygote failed") < log.index("offers node n0"), log[-3000:]
    start = next(line for line in log.splitlines() if "started rank" in line)
    assert ", cold: " in start, start
    assert "a new one in 5s" in log and "a new one in 10s" in log, log[-3000:]


def zygote_of_or_none(cluster, node: str):
    try:
        return zygote_of(cluster, node)
    except (AssertionError, OSError, KeyError):
        return None


def test_a_warming_joiner_never_holds_its_node(tmp_path):
    """The demo's case (issue 26): a joiner still warming up (not yet a member) when its node
    is reclaimed, or when its job completes, is stopped at once: the node is back within a
    second or two, not after the agent's 60 s finish/leave timeout, and another job gets it.
    The allocator counts that time as held without training (warming), not as productive."""
    out_a = tmp_path / "a"
    # Joiners of `a` warm up for 120 s (a model that takes long to build); its bootstrap rank
    # starts at once and trains alone.
    slow = ("if [ \"$MALLE_BOOTSTRAP_SIZE\" = 0 ]; then sleep 120; fi; exec \"$@\"")
    cmd_a = ["/bin/sh", "-c", slow, "sh",
             *train_cmd(out_a, 70, ["--logical-workers", "2"], 0.1)]
    with LocalCluster(["n0", "n1", "n2"], policy="dp", grace=8.0, heartbeat_timeout=5.0,
                      workdir=tmp_path / "cluster") as c:
        try:
            c.node_up("n0")
            c.submit("a", cmd_a, max_nodes=2, logical_workers=2)
            wait_for("a training on n0", lambda: progress(c, "a.i1") >= 3, timeout=120)
            # n1 comes: a grows onto it, its joiner warms up there. Then n1 is reclaimed.
            c.node_up("n1")
            wait_for("a's joiner warming on n1", lambda: node_view(c, "n1").get("rank_phase")
                     == "starting", timeout=30)
            t0 = time.monotonic()
            c.node_down("n1", wait=True)
            reclaim_s = time.monotonic() - t0
            # n2 comes: another warming joiner; a completes meanwhile; b waits for a node.
            c.node_up("n2")
            wait_for("a's joiner warming on n2", lambda: node_view(c, "n2").get("rank_phase")
                     == "starting", timeout=30)
            c.submit("b", train_cmd(tmp_path / "b", 10, ["--logical-workers", "1"], 0.0),
                     max_nodes=1, logical_workers=1)
            wait_for("a done", lambda: job_view(c, "a").get("phase") == "succeeded", timeout=180)
            t_done = time.monotonic()
            wait_for("n2 free of a's joiner", lambda: node_view(c, "n2").get("running") != "a.i1",
                     timeout=60, poll=0.05)
            release_s = time.monotonic() - t_done
            wait_for("b training", lambda: progress(c, "b.i1") >= 1, timeout=120)
            final = c.wait(["a", "b"], timeout=120)
            status = c.status()
        except BaseException:
            print(dump_logs(c))
            raise
    assert final["a"]["phase"] == "succeeded" and final["b"]["phase"] == "succeeded", status
    # The agent stopped the warming rank at once instead of waiting for a leave that cannot
    # happen (grace 8 s) or a finish that never comes (60 s).
    assert reclaim_s < 3.0, f"n1's agent took {reclaim_s:.1f} s to vacate a warming joiner"
    assert release_s < 2.5, f"n2 was held {release_s:.1f} s by a joiner of a completed job"
    held_a = next(j for j in status["jobs"] if j["job"] == "a")["held"]
    # Two joiners warmed for seconds each: held, not productive; nothing drained for long.
    assert held_a["warming_node_s"] >= 1.0, held_a
    assert held_a["draining_node_s"] < 5.0, held_a
    total = status["held"]
    assert abs(total["held_node_s"] - total["productive_node_s"] - total["held_idle_node_s"]) < 1e-6
    assert total["productive_node_s"] > 0 and total["held_idle_pct"] > 0, total


def test_allocator_kill9_and_restart_lose_nothing(tmp_path, fixed):
    """kill -9 of the allocator daemon mid-run: the job keeps training meanwhile, what was sent
    while it was down is handled after the restart, no job or node is lost."""
    out_b, out_c = tmp_path / "b", tmp_path / "c"
    with LocalCluster(["n0", "n1", "n2"], policy="dp", allocator="process",
                      heartbeat_timeout=5.0, workdir=tmp_path / "cluster") as c:
        try:
            c.node_up("n0")
            c.node_up("n1")
            c.submit("b", train_cmd(out_b, B_STEPS, B_ARGS, 0.08), max_nodes=2,
                     logical_workers=2)
            wait_for("b training on 2 nodes", lambda: progress(c, "b.i1") >= 10
                     and len(nodes_running(c, "b.i1")) == 2, timeout=120)
            c.stop_allocator(kill=True)
            p1 = progress(c, "b.i1")
            time.sleep(3)
            p2 = progress(c, "b.i1")
            assert p2 > p1, "training stopped while the allocator was down"
            # Sent while it is down: a node and a job wait in the inbox.
            c.node_up("n2")
            c.submit("c", train_cmd(out_c, A_STEPS, A_ARGS, 0.0), max_nodes=1,
                     logical_workers=4)
            time.sleep(1)
            c.start_allocator()
            final = c.wait(["b", "c"], timeout=300)
            status = c.status()
        except BaseException:
            print(dump_logs(c))
            raise
    assert final["b"]["phase"] == "succeeded" and final["c"]["phase"] == "succeeded", status
    assert status["allocator"]["epoch"] == 2
    assert {n["node"] for n in status["nodes"]} == {"n0", "n1", "n2"}
    check_replicas_and_data(read_traces(out_b), steps=B_STEPS, workers=2)
    assert_same_state(final_state(out_b), fixed["b"])
    assert_same_state(final_state(out_c), fixed["a"])  # c ran alone on 1 node, L = 4
    journal = [json.loads(json.loads(line)["envelope"])
               for line in (tmp_path / "cluster" / "journal").read_text().splitlines()]
    submitted = [e["body"]["job"] for e in journal if e["type"] == "job_submit"]
    assert submitted == ["b", "c"], submitted
    plans = [e["body"] for e in journal if e["type"] == "allocation_plan"]
    assert [p["plan"] for p in plans] == list(range(1, len(plans) + 1))  # none lost or reused


def test_bad_input_and_attacks_are_rejected_and_nothing_crashes(tmp_path):
    with LocalCluster(["n0"], policy="dp", heartbeat_timeout=30.0,
                      workdir=tmp_path / "cluster") as c:
        c.node_up("n0")
        wait_for("n0 registered", lambda: any(n["node"] == "n0" for n in c.status()["nodes"]))
        env = dict(os.environ, MALLE_STORE=c.address, MALLE_SECRET=str(c.secret_path))
        # A job spec with min > max: refused before anything is sent, naming the field.
        r = subprocess.run([sys.executable, "-m", "malletrain.cli", "submit", "--job", "x",
                            "--min-nodes", "3", "--max-nodes", "1", "--", "true"],
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r
        assert "max_nodes" in r.stderr and "min_nodes" in r.stderr, r.stderr
        # Raw messages into the inbox: unsigned, truncated, forged, oversized, replayed.
        secret = _C.load_secret(str(c.secret_path))
        other = tmp_path / "other-secret"
        _C.write_new_secret(str(other))
        forged_with = _C.load_secret(str(other))
        body = json.dumps({"job": "evil", "command": ["true"], "env": {}, "cwd": "",
                           "min_nodes": 1, "max_nodes": 1, "logical_workers": None,
                           "weight": 1, "priority": 0})
        now = time.time()
        good = _C.sign_control_message(secret, "client.t", 1, now, "job_submit", body)
        forged = _C.sign_control_message(forged_with, "client.t", 2, now, "job_submit",
                                         body.replace("evil", "evil2"))
        unsigned = good.rsplit(" ", 1)[0]
        truncated = good[: len(good) // 2]
        oversized = good[:-65] + " " * (2 << 20) + good[-65:]
        flipped = good.replace('"evil"', '"evIl"')  # one character of the body changed
        before = c.status()["allocator"]["rejected"]
        for wire in (unsigned, truncated, forged, oversized, flipped, good, good):
            ticket = c.store.add("malle/ctl/inbox/next", 1)
            c.store.set(f"malle/ctl/inbox/{ticket}", wire.encode())
        wait_for("all seven handled", lambda: c.status()["allocator"]["rejected"] - before >= 6,
                 timeout=30)
        st = c.status()
        assert st["allocator"]["rejected"] - before == 6, st["allocator"]
        assert "replayed" in st["allocator"]["last_rejection"], st["allocator"]
        assert [j["job"] for j in st["jobs"]] == ["evil"]  # the one genuine message
        # A second agent for a node that is registered and alive: refused, the first stays.
        first_agent = next(n["agent"] for n in st["nodes"] if n["node"] == "n0")
        intruder = subprocess.Popen(
            [c._agent, f"--store={c.address}", f"--secret={c.secret_path}", "--node=n0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for("the second registration refused",
                     lambda: any("already registered" in r for r in
                                 c.status()["allocator"]["recent_rejections"]), timeout=30)
        finally:
            intruder.send_signal(signal.SIGINT)
            intruder.wait(timeout=30)
        n0 = next(n for n in c.status()["nodes"] if n["node"] == "n0")
        assert n0["agent"] == first_agent and n0["phase"] == "active", n0
        assert c.allocator_running


NAS = ROOT / "build" / "ci" / "examples" / "nas_search"


@pytest.mark.skipif(not NAS.is_file(), reason="examples/nas_search is built by tests/run_all.sh "
                    "(MALLE_BUILD_EXAMPLES=ON); a plain `pip install .` does not build it")
def test_cpp_nas_driver_submits_trials_that_share_the_nodes(tmp_path):
    """examples/nas_search.cpp, on the C++ client API: three trials of different widths on two
    nodes; every trial succeeds and the driver names the best one."""
    with LocalCluster(["n0", "n1"], policy="dp", workdir=tmp_path / "cluster") as c:
        c.node_up("n0")
        c.node_up("n1")
        r = subprocess.run(
            [str(NAS), f"--store={c.address}", f"--secret={c.secret_path}",
             f"--python={sys.executable}", f"--script={EXAMPLE}", "--widths=16,32,64",
             "--steps=60", "--max_nodes=2", f"--out={tmp_path / 'nas'}", "--timeout=5m"],
            capture_output=True, text=True, timeout=400)
        jobs = c.jobs()
    assert r.returncode == 0, r.stdout + r.stderr
    for w in (16, 32, 64):
        assert jobs[f"nas-w{w}"]["phase"] == "succeeded"
        assert f"nas-w{w} (width {w}): succeeded, test accuracy" in r.stdout
        assert json.loads((tmp_path / "nas" / f"nas-w{w}" / "result.json").read_text())["steps"] == 60
    assert "best: nas-w" in r.stdout


def commits(out: pathlib.Path) -> int:
    """Steps committed so far, from the ranks' traces (readable while the store is down)."""
    steps = set()
    for f in out.glob("trace-*.jsonl"):
        for line in f.read_text().splitlines():
            if '"commit"' in line:
                try:
                    steps.add(json.loads(line)["step"])
                except ValueError:  # a line being written
                    pass
    return len(steps)


def ranks_started(cluster, job: str) -> int:
    return sum(log.read_text().count(f" of {job} (pid")
               for log in cluster.log_dir.glob("agent-*.log"))


def test_jobs_train_through_a_control_store_outage_and_reconnect(tmp_path, fixed):
    """kill -9 of the control store (a TCPStore in its own process) mid-training, restarted
    on the same port 4 s later: the job trains on at its size meanwhile (its generation
    needs no store between changes), agents and the allocator wait instead of dying, the
    allocator re-seeds the empty store from its own state, and the job ends with its
    fixed-size model and exact data: no rank restarted, no step lost."""
    out_b = tmp_path / "b"
    with LocalCluster(["n0", "n1"], policy="dp", store="process", heartbeat_timeout=15.0,
                      workdir=tmp_path / "cluster") as c:
        try:
            c.node_up("n0")
            c.node_up("n1")
            c.submit("b", train_cmd(out_b, B_STEPS, B_ARGS, 0.1), max_nodes=2,
                     logical_workers=2)
            wait_for("b training on 2 nodes", lambda: progress(c, "b.i1") >= 10
                     and len(nodes_running(c, "b.i1")) == 2, timeout=120)
            c.stop_store(kill=True)
            before = commits(out_b)
            time.sleep(4)
            during = commits(out_b)
            c.start_store()
            final = c.wait(["b"], timeout=300)
            status = c.status()
        except BaseException:
            print(dump_logs(c))
            raise
    assert during >= before + 3, f"training stopped with the store: {before} -> {during} steps"
    assert final["b"]["phase"] == "succeeded", status
    assert status["allocator"]["store_resets"] == 1, status["allocator"]
    assert ranks_started(c, "b.i1") == 2  # nobody was restarted
    check_replicas_and_data(read_traces(out_b), steps=B_STEPS, workers=2)
    assert_same_state(final_state(out_b), fixed["b"])


def _free_ports(n: int):
    import socket
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Etcd:
    """A three-member etcd cluster on loopback (ephemeral ports, data in tmp); every member
    is a _C.LocalProcess of this test, killed by pid at the end."""

    def __init__(self, tmp: pathlib.Path, members: int = 3):
        ports = _free_ports(2 * members)
        self.client = {f"e{i}": ports[2 * i] for i in range(members)}
        self.peer = {f"e{i}": ports[2 * i + 1] for i in range(members)}
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.procs = {}
        self.cluster = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in self.peer.items())
        for name in self.client:
            self.start(name, "new")
        self.address = "etcd://" + ",".join(f"127.0.0.1:{p}" for p in self.client.values())
        wait_for("etcd healthy", lambda: self.leader() is not None, timeout=60)

    def start(self, name: str, state: str) -> None:
        c, p = self.client[name], self.peer[name]
        self.procs[name] = _C.LocalProcess.spawn(
            ["etcd", "--name", name, "--data-dir", str(self.tmp / name),
             "--listen-client-urls", f"http://127.0.0.1:{c}",
             "--advertise-client-urls", f"http://127.0.0.1:{c}",
             "--listen-peer-urls", f"http://127.0.0.1:{p}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{p}",
             "--initial-cluster", self.cluster, "--initial-cluster-state", state,
             "--initial-cluster-token", f"malle-{os.getpid()}"],
            stdout=str(self.tmp / f"{name}.log"), stderr_to_stdout=True)

    def leader(self):
        """The member that leads now, or None."""
        live = [n for n, p in self.procs.items() if p.poll() is None]
        for name in live:
            r = subprocess.run(["etcdctl", f"--endpoints=127.0.0.1:{self.client[name]}",
                                "endpoint", "status", "-w", "json"], capture_output=True,
                               text=True, timeout=10)
            if r.returncode != 0:
                continue
            st = json.loads(r.stdout)[0]["Status"]
            if st["leader"] and st["leader"] == st["header"]["member_id"]:
                return name
        return None

    def kill(self, name: str) -> None:
        self.procs[name].kill(timeout=10)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill(timeout=10)


def test_etcd_store_survives_its_leader_killed_mid_training(tmp_path, fixed):
    """The replicated control store: a real three-member etcd cluster on loopback. Its
    leader is killed (kill -9) mid-training; the allocator, the agents and the job carry on
    (requests move to the surviving members while they elect a new leader) and the job ends
    with its fixed-size model and exact data, no rank restarted."""
    out_b = tmp_path / "b"
    etcd = Etcd(tmp_path / "etcd")
    try:
        with LocalCluster(["n0", "n1"], policy="dp", store=etcd.address, heartbeat_timeout=15.0,
                          workdir=tmp_path / "cluster") as c:
            try:
                c.node_up("n0")
                c.node_up("n1")
                c.submit("b", train_cmd(out_b, B_STEPS, B_ARGS, 0.1), max_nodes=2,
                         logical_workers=2)
                wait_for("b training on 2 nodes", lambda: progress(c, "b.i1") >= 10
                         and len(nodes_running(c, "b.i1")) == 2, timeout=180)
                leader = etcd.leader()
                assert leader is not None
                etcd.kill(leader)
                before = progress(c, "b.i1")
                wait_for("a new leader", lambda: etcd.leader() not in (None, leader), timeout=30)
                wait_for("b training on", lambda: progress(c, "b.i1") >= before + 5, timeout=60)
                final = c.wait(["b"], timeout=300)
                status = c.status()
                alive = c.allocator_running
            except BaseException:
                print(dump_logs(c))
                raise
    finally:
        etcd.close()
    assert alive and final["b"]["phase"] == "succeeded", status
    assert ranks_started(c, "b.i1") == 2
    check_replicas_and_data(read_traces(out_b), steps=B_STEPS, workers=2)
    assert_same_state(final_state(out_b), fixed["b"])


def scrape(url: str) -> dict:
    """{(name, labels as a sorted tuple): value} of a Prometheus endpoint, parsed by
    prometheus-client's own parser (so the format is checked too)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_allocator_objective_terms_and_total_steps_reach_the_allocator(tmp_path):
    """The objective terms that won in docs/benchmarks.md (speedup, rank weights and their
    aging, hysteresis) are the allocator's options in both modes (the daemon's flags in process mode), and a job's
    declared length reaches its status (the work left follows from its reports: the C++
    ObjectiveTermsTest). No node is up: nothing runs."""
    for mode in ("thread", "process"):
        with LocalCluster(["n0"], policy="dp", allocator=mode, objective="speedup",
                          rank_weights=1, rank_aging=3600, resize_hysteresis=2,
                          reclaim_hazard=True, workdir=tmp_path / f"cluster-{mode}") as c:
            c.submit("long", ["true"], total_steps=1000)
            c.submit("unsaid", ["true"])
            jobs = wait_for("both jobs known", lambda: (lambda j: j if len(j) == 2 else None)(
                {j["job"]: j for j in c.status()["jobs"]}), timeout=60)
            assert jobs["long"]["total_steps"] == 1000, (mode, jobs["long"])
            assert jobs["unsaid"]["total_steps"] is None, (mode, jobs["unsaid"])
            assert jobs["long"]["remaining_samples"] is None  # no report yet
            reclaims = c.status()["reclaims"]
            assert reclaims["priced"] is True and reclaims["seen"] == 0, (mode, reclaims)
            assert c.allocator_running, mode
        with pytest.raises(MalleValueError, match="rank_weight_exponent"):
            LocalCluster(["n0"], allocator="thread", rank_weights=-1,
                         workdir=tmp_path / f"bad-{mode}").close()
    with pytest.raises(MalleValueError, match="rank_aging is 1h, but rank weights are off"):
        LocalCluster(["n0"], allocator="thread", rank_aging=3600,
                     workdir=tmp_path / "bad-aging").close()
    with pytest.raises(MalleValueError, match="rank_aging: expected a finite number of seconds"):
        LocalCluster(["n0"], allocator="thread", rank_weights=1, rank_aging=-5,
                     workdir=tmp_path / "bad-aging-2").close()
    with LocalCluster(["n0"], allocator="thread", workdir=tmp_path / "steps") as c:
        with pytest.raises(ValueError, match="total_steps"):
            c.submit("zero", ["true"], total_steps=0)


def test_a_training_job_tells_the_allocator_the_work_it_has_left(tmp_path):
    """End to end: a job that declares its length, trained by a real rank, reports its step and
    global batch through its advisor; the allocator's work left is (total - step) x batch."""
    with LocalCluster(["n0"], policy="dp", objective="speedup", rank_weights=1,
                      report_min_interval=0.5, workdir=tmp_path / "cluster") as c:
        try:
            c.node_up("n0")
            # 2 logical workers of 16: global batch 32. Paced so that it reports while it runs.
            c.submit("j", train_cmd(tmp_path / "j", 400, ["--logical-workers", "2"], 0.05),
                     logical_workers=2, max_nodes=1, total_steps=400)
            view = wait_for("the work left known", lambda: (lambda j: j if j.get(
                "remaining_samples") is not None else None)(job_view(c, "j")), timeout=180)
            assert view["total_steps"] == 400
            assert view["remaining_samples"] == (400 - view["step"]) * 32, view
            assert 0 < view["remaining_samples"] <= 400 * 32
            c.cancel("j")
        except BaseException:
            print(dump_logs(c))
            raise


def test_allocator_and_agents_export_prometheus_metrics(tmp_path):
    """The embedded allocator (through prometheus-client), the allocator daemon and every
    agent (their own endpoint) serve metrics on loopback; scraped after a job ran, they say
    what happened: nodes, jobs, decisions and their latency, rank starts, held node time."""
    out = tmp_path / "j"
    for mode in ("thread", "process"):
        with LocalCluster(["n0", "n1"], policy="dp", allocator=mode, metrics=True,
                          workdir=tmp_path / f"cluster-{mode}") as c:
            try:
                c.node_up("n0")
                c.node_up("n1")
                # Paced (0.1 s a step): the agents see the ranks as members while they train.
                c.submit("j", train_cmd(out / mode, 20, ["--logical-workers", "2"], 0.1),
                         max_nodes=2, logical_workers=2)
                c.wait(["j"], timeout=180)
                url = c.allocator_metrics_url()
                assert url.startswith("http://127.0.0.1:"), url  # loopback only
                wait_for("metrics caught up", lambda: scrape(url).get(
                    ("malle_allocator_jobs", (("phase", "succeeded"),))) == 1, timeout=30)
                m = scrape(url)
                agent_url = c.agent_metrics_url("n0")
                # Its rank finishes in the background once the job succeeded.
                wait_for("n0's rank reported", lambda: scrape(agent_url).get(
                    ("malle_agent_rank_exits_total", (("cause", "exited"),))) == 1, timeout=60)
                agent = scrape(agent_url)
            except BaseException:
                print(dump_logs(c))
                raise
        assert m[("malle_allocator_nodes", (("phase", "active"),))] == 2, (mode, m)
        assert m[("malle_allocator_decisions_total", ())] >= 1
        assert m[("malle_allocator_decision_seconds_count", ())] == \
            m[("malle_allocator_decisions_total", ())]
        assert m[("malle_allocator_messages_total", (("result", "accepted"),))] > 0
        assert m[("malle_allocator_messages_total", (("result", "rejected"),))] == 0
        productive = m[("malle_allocator_held_node_seconds_total",
                        (("job", "j"), ("kind", "productive")))]
        assert productive > 0, m
        assert 0 <= m[("malle_allocator_held_idle_ratio", ())] < 1
        assert agent[("malle_agent_rank_starts_total", ())] == 1, agent
        assert agent[("malle_agent_rank_exits_total", (("cause", "exited"),))] == 1, agent
