"""Harvesting idle nodes from Slurm (issue 8): the parsers and decisions of malletrain.slurm,
then a REAL private Slurm (munged, slurmctld, slurmd from tests/slurm/slurm_cluster.py, in a
scratch directory, loopback, free ports) in which the harvester keeps node agents submitted to
the preemptible ``scavenger`` partition while a training job grows, is preempted by a job of the
``main`` partition, shrinks within the grace time, and grows back.

No mocks: sbatch, squeue, scontrol and scancel are the real commands. Every process is stopped by
pid (PrivateSlurm.stop cancels every job, then stops the daemons by pid and kills by pid anything
left that carries this Slurm's SLURM_CONF; LocalCluster.close stops the allocator). The Slurm
packages are installed with apt-get when missing; the Slurm tests skip only when that is
impossible (not root: slurmd and munged need root).
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import time

import pytest

from malletrain import launcher
from malletrain.cluster import LocalCluster
from malletrain.errors import MalleValueError
from malletrain.slurm import (AgentJob, Forecast, Harvester, HarvestOptions, Partition, PendingJob,
                              Reservation, SlurmCommandError, SlurmCommands, expand_hostlist,
                              forecast_idle_until, parse_agent_jobs, parse_partitions,
                              parse_reservations, parse_slurm_time, parse_squeue_start,
                              slots_to_submit)

from state_compare import assert_same_state
from digits_runs import check_replicas_and_data, final_state, read_traces, sizes_seen

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "slurm"))
import slurm_cluster  # noqa: E402

EXAMPLE = ROOT / "examples" / "train_digits.py"
T0 = time.mktime(time.strptime("2026-11-22T23:10:52", "%Y-%m-%dT%H:%M:%S"))


# --- parsing and decisions (no Slurm needed) ----------------------------------------------------

def test_slurm_times_and_hostlists():
    assert parse_slurm_time("2026-11-22T23:10:52") == T0
    for unknown in ("N/A", "Unknown", "None", "(null)", ""):
        assert parse_slurm_time(unknown) is None
    with pytest.raises(MalleValueError, match="start time: expected YYYY"):
        parse_slurm_time("tomorrow", what="start time")
    assert expand_hostlist("vm") == ["vm"]
    assert expand_hostlist("n[01-03,7],login") == ["n01", "n02", "n03", "n7", "login"]
    assert expand_hostlist("r[1-2]-n[1-2]") == ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
    assert expand_hostlist("(null)") == []
    for bad in ("n[1-", "n]1[", "n[3-1]", "n[a-b]", "bad host"):
        with pytest.raises(MalleValueError, match="hostlist"):
            expand_hostlist(bad)


def test_squeue_and_scontrol_output_is_parsed():
    pend = parse_squeue_start("5|wrap|main|2026-11-22T23:10:52|(null)\n"
                              "6|big|main,debug|N/A|n[1-2]\n")
    assert pend == [PendingJob("5", "wrap", ("main",), T0, ()),
                    PendingJob("6", "big", ("main", "debug"), None, ("n1", "n2"))]
    res = parse_reservations(
        "ReservationName=maint StartTime=2026-11-22T23:10:52 EndTime=2026-11-22T23:20:52 "
        "Duration=00:10:00 Nodes=vm NodeCnt=1 CoreCnt=3 Features=(null) PartitionName=(null) "
        "Flags=MAINT,SPEC_NODES TRES=cpu=3 Users=root State=INACTIVE Watts=n/a\n")
    assert res == [Reservation("maint", T0, T0 + 600, ("vm",), "MAINT,SPEC_NODES")]
    assert parse_reservations("No reservations in the system\n") == []
    parts = parse_partitions(
        "PartitionName=main AllowGroups=ALL Default=YES GraceTime=0 Nodes=vm PriorityTier=10 "
        "PreemptMode=OFF State=UP TRES=cpu=3,mem=2000M\n"
        "PartitionName=scavenger GraceTime=15 Nodes=vm PriorityTier=1 PreemptMode=CANCEL "
        "State=UP\n")
    assert parts == [Partition("main", 10, 0, "OFF", ("vm",)),
                     Partition("scavenger", 1, 15, "CANCEL", ("vm",))]
    jobs = parse_agent_jobs("12|RUNNING|None|vm|2026-11-22T23:10:52\n13|PENDING|Resources||N/A\n")
    assert jobs == [AgentJob("12", "RUNNING", "None", ("vm",), T0),
                    AgentJob("13", "PENDING", "Resources", (), None)]


@pytest.mark.parametrize("parser,text,message", [
    (parse_squeue_start, "5|wrap|main|2026-11-22T23:10:52\n", "line 1: expected 5 fields"),
    (parse_squeue_start, "5|wrap|main|soon|(null)\n", "line 1: start time: expected"),
    (parse_squeue_start, "x5|wrap|main|N/A|(null)\n", "line 1: job id"),
    (parse_squeue_start, "5|w|main|N/A|(null)\n6|w||N/A|(null)\n", "line 2: partition"),
    (parse_squeue_start, "5|w|main|N/A|n[1-\n", "line 1: nodes: hostlist"),
    (parse_reservations, "ReservationName=r EndTime=2026-11-22T23:10:52\n",
     "line 1: field StartTime missing"),
    (parse_reservations, "ReservationName=r StartTime=later EndTime=N/A\n",
     "line 1: StartTime: expected"),
    (parse_partitions, "PartitionName=p GraceTime=15\n", "field PriorityTier missing"),
    (parse_partitions, "PartitionName=p GraceTime=-1 PriorityTier=1\n",
     "GraceTime: expected a non-negative integer"),
    (parse_agent_jobs, "12|WEIRD|None|vm|N/A\n", "line 1: state: unknown job state 'WEIRD'"),
    (parse_agent_jobs, "slurm_load_jobs error: Unable to contact slurm controller\n",
     "expected 5 fields"),
])
def test_bad_output_gets_a_clear_error(parser, text, message):
    with pytest.raises(MalleValueError, match=re.escape(message)):
        parser(text)


PARTS = [Partition("main", 10, 0, "OFF", ("n1", "n2")),
         Partition("scavenger", 1, 30, "CANCEL", ("n1", "n2")),
         Partition("other", 10, 0, "OFF", ("n9",)),
         Partition("low", 0, 0, "OFF", ("n1", "n2"))]


@pytest.mark.parametrize("pending,reservations,limit,expect,why", [
    ([], [], None, None, "no pending higher-priority job"),
    ([PendingJob("5", "w", ("main",), T0 + 100, ())], [], None, T0 + 100, "job 5 (main)"),
    # the earliest claim wins; a job planned elsewhere, of a lower tier, of a partition without
    # our nodes, or with no forecast start does not count
    ([PendingJob("5", "w", ("main",), T0 + 100, ()),
      PendingJob("6", "w", ("main",), T0 + 50, ("n2",)),
      PendingJob("7", "w", ("main",), T0 + 10, ("n7",)),
      PendingJob("8", "w", ("low",), T0 + 10, ()),
      PendingJob("9", "w", ("other",), T0 + 10, ()),
      PendingJob("10", "w", ("main",), None, ())], [], None, T0 + 50, "job 6"),
    ([], [Reservation("m", T0 + 40, T0 + 90, ("n1",)), Reservation("x", T0 + 5, T0 + 9, ("n9",)),
          Reservation("now", T0 - 5, T0 + 9, ("n1",))], None, T0 + 40, "reservation m"),
    ([PendingJob("5", "w", ("main",), T0 + 100, ())], [], 60.0, T0 + 60, "time limit"),
    # a start already in the past (the job is about to start) means now
    ([PendingJob("5", "w", ("main",), T0 - 100, ())], [], None, T0, "job 5"),
])
def test_forecast_takes_the_earliest_claim_on_our_nodes(pending, reservations, limit, expect,
                                                        why):
    f = forecast_idle_until("scavenger", PARTS, pending, reservations, T0, time_limit=limit)
    assert f.idle_until == expect and why in f.reason, f
    with pytest.raises(MalleValueError, match="'nope' is not one of"):
        forecast_idle_until("nope", PARTS, pending, reservations, T0)


def test_slots_to_submit():
    run = AgentJob("1", "RUNNING", "None", ("vm",), T0)
    pend = AgentJob("2", "PENDING", "Resources", (), None)
    ending = AgentJob("3", "COMPLETING", "None", ("vm",), T0)
    assert slots_to_submit([run, pend], 3, T0)[0] == 1
    assert slots_to_submit([run, pend, ending], 3, T0)[0] == 0  # its slot is not free yet
    n, why = slots_to_submit([run], 3, T0, not_before=T0 + 8)
    assert n == 0 and "backing off for 8 s" in why
    assert slots_to_submit([], 2, T0 + 9, not_before=T0 + 8)[0] == 2
    # The job that preempted an agent is still pending (its start: now): wait for it to start.
    soon = Forecast(T0 + 3, "job 7 (main) is expected to start at ...")
    n, why = slots_to_submit([run], 3, T0, forecast=soon, min_window=60)
    assert n == 0 and "waiting: idle window 3 s < 60 s (job 7 (main)" in why
    assert slots_to_submit([run], 3, T0, forecast=Forecast(T0 + 61, "x"), min_window=60)[0] == 2
    assert slots_to_submit([run], 3, T0, forecast=Forecast(None, "x"), min_window=60)[0] == 2


def test_events_are_kept_bounded_and_followed():
    h = Harvester(HarvestOptions(store="127.0.0.1:5", secret="/s", slots=1))
    n, lines = h.events_since(0)
    assert (n, lines) == (0, [])
    for i in range(1005):
        h._note(f"e{i}")
    assert len(h.events) == 1000 and h.events[-1].endswith("e1004")
    n, lines = h.events_since(1003)
    assert n == 1005 and [x.split()[-1] for x in lines] == ["e1003", "e1004"]
    assert len(h.events_since(0)[1]) == 1000  # the older ones are gone


def test_options_are_validated():
    good = dict(store="127.0.0.1:5", secret="/s", slots=2)
    HarvestOptions(**good).validate()
    for change, field in (({"store": "nohost"}, "store"), ({"slots": 0}, "slots"),
                          ({"per": "gpu"}, "per"), ({"grace": -1.0}, "grace"),
                          ({"job_name": "a b"}, "job_name"), ({"poll": 0.0}, "poll"),
                          ({"secret": ""}, "secret"),
                          ({"time_limit": 30.0}, "min_window")):
        with pytest.raises(MalleValueError, match=f"^{field}:"):
            HarvestOptions(**{**good, **change}).validate()


def test_agents_start_warm_when_given_a_zygote_interpreter():
    """--zygote-python reaches every agent's batch script (warm rank starts); without it the
    agents start their ranks cold, as before."""
    def script(**kw):
        h = Harvester(HarvestOptions(store="127.0.0.1:5", secret="/s", slots=1, **kw))
        h._grace, h._agent = 30.0, "/opt/malle/bin/malle-agent"
        return h.batch_script(None)
    cold = script()
    assert "zygote" not in cold and cold.startswith("#!/bin/sh")
    warm = script(zygote_python="/opt/venv/bin/python", zygote_preload="torch,malletrain")
    assert "--zygote_python=/opt/venv/bin/python" in warm
    assert "--zygote_preload=torch,malletrain" in warm
    assert "--zygote_preload" not in script(zygote_python="/opt/venv/bin/python")


# --- a real Slurm ------------------------------------------------------------------------------

GRACE = 15


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = slurm_cluster.can_install()
    if why:
        pytest.skip(f"cannot run a private Slurm here: {why}")
    slurm_cluster.ensure_installed()  # apt-get when a program is missing; fails loudly
    s = slurm_cluster.PrivateSlurm(tmp_path_factory.mktemp("slurm"), cpus=3, grace_time=GRACE,
                                   kill_wait=5)
    try:
        s.start()
        yield s
    finally:
        s.stop()
        left = slurm_cluster.leftover_pids(str(s.conf))
        assert not left, f"processes of the private Slurm still alive: {left}"


def sbatch(slurm, *args: str) -> str:
    r = subprocess.run(["sbatch", "--parsable", "--output=/dev/null", *args], env=slurm.env,
                       capture_output=True, text=True, timeout=30, cwd=slurm.dir)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def job_field(slurm, job_id: str, key: str) -> str:
    r = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=slurm.env,
                       capture_output=True, text=True, timeout=30)
    m = re.search(rf"(?:^|\s){key}=(\S*)", r.stdout)
    return m.group(1) if m else ""


def wait_for(what, cond, timeout=120.0, poll=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_slurm_errors_are_clear(slurm, tmp_path):
    cmds = SlurmCommands(env=slurm.env, timeout=30)
    with pytest.raises(SlurmCommandError, match=r"`sbatch --parsable --partition=nope.*` failed "
                       r"\(exit 1\): .*[Ii]nvalid partition"):
        cmds.sbatch(["--partition=nope"], "#!/bin/sh\ntrue\n")
    # A controller that is not there: a clear error within the timeout, not a hang.
    conf = tmp_path / "slurm.conf"
    port = slurm_cluster.free_port()
    conf.write_text(re.sub(r"SlurmctldPort=\d+", f"SlurmctldPort={port}",
                           slurm.conf.read_text()))
    dead = SlurmCommands(env={**slurm.env, "SLURM_CONF": str(conf)}, timeout=5)
    t = time.monotonic()
    with pytest.raises(SlurmCommandError, match="squeue.*(failed|gave no answer within 5 s)"):
        dead.pending_start()
    assert time.monotonic() - t < 30
    h = Harvester(HarvestOptions(store="127.0.0.1:1", secret="/nonexistent", slots=1,
                                 partition="main"), cmds)
    with pytest.raises(MalleValueError, match="partition main has GraceTime=0"):
        h.check()
    missing = SlurmCommands(env={**slurm.env, "PATH": str(tmp_path)})
    with pytest.raises(SlurmCommandError, match="squeue: not found on PATH"):
        missing.agent_jobs("x")


def test_forecast_reads_pending_jobs_and_reservations(slurm):
    cmds = SlurmCommands(env=slurm.env)
    assert cmds.forecast("scavenger").idle_until is None
    job = sbatch(slurm, "-p", "main", "-n1", "-t", "1", "--begin=now+1200", "--wrap", "true")
    try:
        begin = parse_slurm_time(job_field(slurm, job, "StartTime"))
        f = cmds.forecast("scavenger")
        assert f.idle_until == begin and f"job {job} (main)" in f.reason, f
        assert cmds.forecast("scavenger", time_limit=60).idle_until < begin
        r = subprocess.run(["scontrol", "create", "reservation", "reservationname=malle-maint",
                            "starttime=now+600", "duration=10", f"nodes={slurm.node}",
                            "users=root", "flags=maint"], env=slurm.env, capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        try:
            f = cmds.forecast("scavenger")
            assert "reservation malle-maint" in f.reason and f.idle_until < begin, f
            assert abs(f.idle_until - (time.time() + 600)) < 30
            # An agent without a time limit cannot start before the reservation: the harvester
            # says why its agent waits (docs/slurm.md: give agents a time limit).
            h = Harvester(HarvestOptions(store="127.0.0.1:9", secret="/nonexistent", slots=1,
                                         partition="scavenger", per="cpu", agent="/bin/true",
                                         job_name="malle-resv"), cmds)
            try:
                wait_for("the reason reported", lambda: h.poll_once() is not None and any(
                    "pending: ReqNodeNotAvail, Reserved for maintenance" in e
                    for e in h.events), timeout=30, poll=0.5)
            finally:
                h.stop(timeout=10)
        finally:
            subprocess.run(["scontrol", "delete", "reservationname=malle-maint"], env=slurm.env,
                           capture_output=True, timeout=30)
    finally:
        subprocess.run(["scancel", job], env=slurm.env, capture_output=True, timeout=30)


def test_agents_that_fail_at_once_are_resubmitted_with_backoff(slurm, tmp_path):
    """An agent that cannot start (here: a program that exits 1 at once) must not flood the
    queue: each early end doubles the delay before the next submission."""
    cmds = SlurmCommands(env=slurm.env)
    h = Harvester(HarvestOptions(store="127.0.0.1:9", secret="/nonexistent", slots=2,
                                 partition="scavenger", per="cpu", log_dir=str(tmp_path),
                                 poll=0.3, agent="/bin/false", job_name="malle-broken"), cmds)
    h.start()
    try:
        time.sleep(10)
    finally:
        h.stop(timeout=20)
    submitted = [e for e in h.events if "submitted agent job" in e]
    ended = [e for e in h.events if re.search(r"ended \(last seen \w+, (ran \d+ s|never ran)", e)]
    # Without the backoff: 2 jobs every ~0.5 s. With it: 2, then 2 after 4 s, then 16 s later.
    assert 2 <= len(submitted) <= 6 and len(ended) >= 2, h.events
    assert cmds.agent_jobs("malle-broken") == []


def test_cli(slurm, tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "malletrain.cli", "slurm", *args],
                              env=slurm.env, capture_output=True, text=True, timeout=120)

    r = cli("forecast", "--partition", "scavenger", "--time-limit", "600")
    assert r.returncode == 0 and "idle until: 1" in r.stdout and "time limit (600 s)" in r.stdout, r
    r = cli("forecast", "--partition", "nope")
    assert r.returncode == 2 and "'nope' is not one of ['main', 'scavenger']" in r.stderr, r
    base = ["harvest", "--store", "127.0.0.1:9", "--secret", "/nonexistent", "--slots", "2"]
    r = cli(*base, "--partition", "main")
    assert r.returncode == 2 and "partition main has GraceTime=0" in r.stderr, r
    r = cli(*base, "--partition", "scavenger", "--grace", "60")
    assert r.returncode == 2 and "longer than partition scavenger's GraceTime=15" in r.stderr, r
    r = cli(*base[:-1], "0")
    assert r.returncode == 2 and "slots: must be an integer in [1, 100000]" in r.stderr, r
    r = cli(*base, "--partition", "scavenger", "--per", "cpu", "--once", "--job-name",
            "malle-cli", "--agent", "/bin/true", "--log-dir", str(tmp_path))
    assert r.returncode == 0, r
    assert "harvesting 2 slots of partition scavenger (PriorityTier 1, GraceTime 15 s" in r.stdout
    assert r.stdout.count("submitted agent job") == 2, r.stdout
    cmds = SlurmCommands(env=slurm.env)
    cmds.scancel([j.job_id for j in cmds.agent_jobs("malle-cli")])


STEPS = 120
ARGS = ["--logical-workers", "3"]


def train_cmd(out: pathlib.Path, sleep: float, steps: int = STEPS):
    return [sys.executable, str(EXAMPLE), "--steps", str(steps), "--out", str(out),
            "--compute-sleep", str(sleep), *ARGS]


def progress(cluster, runtime_id: str) -> int:
    v = cluster.store.try_get(launcher.progress_key(runtime_id))
    return int(v) if v else 0


def trained_at(out: pathlib.Path, size: int) -> bool:
    """Whether the job's traces so far hold a step at `size` (a trace line still being written
    reads as not yet)."""
    try:
        return size in sizes_seen(read_traces(out))
    except (OSError, ValueError):
        return False


def nodes_running(cluster, runtime_id: str):
    return sorted(n["node"] for n in cluster.status()["nodes"] if n.get("running") == runtime_id)


def dump(cluster, harvester, slurm, logs: pathlib.Path) -> str:
    parts = ["--- harvester", *harvester.events, f"last error: {harvester.last_error}"]
    for p in sorted(list(cluster.log_dir.glob("*")) + list(logs.glob("*"))):
        if p.is_file():
            parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}")
    parts.append(slurm.logs())
    parts.append(f"--- allocator status\n{json.dumps(cluster.status(), indent=1)}")
    parts.append(f"--- digits report\n{cluster.report('digits')}")
    return "\n".join(parts)


def test_job_grows_on_harvested_slots_is_preempted_and_grows_back(slurm, tmp_path):
    """Scavenger slots run agents; a digits job starts on one and grows onto two more; a job
    of the main partition preempts one slot: the rank there leaves within the grace time, the
    main job runs and ends, the harvester's replacement agent takes the slot back and the job
    grows again; the model equals the fixed-size run, no step or sample lost."""
    fixed_out = tmp_path / "fixed"
    r = launcher.run_local(train_cmd(fixed_out, 0.0), nodes=3, job_id="fixed", timeout=300,
                           log_dir=str(tmp_path / "fixed-logs"))
    assert r.ok
    fixed = final_state(fixed_out)

    out = tmp_path / "digits"
    logs = tmp_path / "agents"
    logs.mkdir()
    # A main job that may start in 30 min: the agents' idle windows end then.
    later = sbatch(slurm, "-p", "main", "-n1", "-t", "1", "--begin=now+1800", "--wrap", "true")
    later_start = parse_slurm_time(job_field(slurm, later, "StartTime"))
    cmds = SlurmCommands(env=slurm.env)
    with LocalCluster(["unused"], policy="dp", heartbeat_timeout=5.0,
                      workdir=tmp_path / "cluster") as c:
        h = Harvester(HarvestOptions(store=c.address, secret=str(c.secret_path), slots=1,
                                     partition="scavenger", per="cpu", log_dir=str(logs),
                                     poll=0.5), cmds)
        try:
            h.start()
            assert h.grace == GRACE  # read from the partition's GraceTime

            def agents():
                return [n for n in c.status()["nodes"]
                        if n["node"].startswith("slurm-") and n["phase"] != "gone"]

            wait_for("a harvested agent registered", lambda: len(agents()) == 1, timeout=60)
            c.submit("digits", train_cmd(out, 0.3), max_nodes=3, logical_workers=3)
            wait_for("digits training on 1 slot", lambda: progress(c, "digits.i1") >= 3,
                     timeout=150)
            h.set_slots(3)  # two more slots harvested: the job grows onto them
            first = wait_for("3 harvested agents registered", lambda: len(agents()) == 3
                             and agents(), timeout=60)
            for n in first:
                assert abs(n["idle_until"] - later_start) < 1.5, (n, later_start)
            # Trained at 3, not only given 3 nodes: a joiner still warming when the slot is
            # preempted leaves before the job ever runs at 3 (sizes 1, 2, 2, 3 in one run).
            wait_for("digits training on 3 harvested slots", lambda: progress(c, "digits.i1") >= 10
                     and len(nodes_running(c, "digits.i1")) == 3 and trained_at(out, 3),
                     timeout=150)
            before = nodes_running(c, "digits.i1")

            # The main partition wants one CPU: Slurm preempts one agent job.
            t_main = time.time()
            main = sbatch(slurm, "-p", "main", "-n1", "-t", "1", "--wrap", "sleep 5")
            wait_for("the job shrinks to 2", lambda: len(nodes_running(c, "digits.i1")) == 2,
                     timeout=GRACE + 5)
            t_shrunk = time.time()
            gone = wait_for("the preempted node gone", lambda: [
                n for n in c.status()["nodes"] if n["node"] in before and n["phase"] == "gone"],
                timeout=GRACE + 5)
            victim_job = gone[0]["node"].split("-")[1]  # slurm-<job id>-<restart count>
            victim_state = wait_for("the preempted agent job ended", lambda: job_field(
                slurm, victim_job, "JobState") not in ("RUNNING", "COMPLETING", "") and job_field(
                slurm, victim_job, "JobState"), timeout=GRACE + 10)
            victim_exit = job_field(slurm, victim_job, "ExitCode")
            state = wait_for("the main job running", lambda: job_field(
                slurm, main, "JobState") in ("RUNNING", "COMPLETED") and job_field(
                slurm, main, "JobState"), timeout=GRACE + 10)
            main_start = parse_slurm_time(job_field(slurm, main, "StartTime"))
            wait_for("the main job done", lambda: job_field(slurm, main, "JobState")
                     == "COMPLETED", timeout=60)
            # The replacement agent starts once main's CPU is free, and the job grows back.
            wait_for("digits back on 3 slots", lambda: len(nodes_running(c, "digits.i1")) == 3,
                     timeout=120)
            regrown = nodes_running(c, "digits.i1")
            final = c.wait(["digits"], timeout=300)
            status = c.status()
        except BaseException:
            print(dump(c, h, slurm, logs))
            raise
        finally:
            h.stop(timeout=30)
            cmds.scancel([later])
    assert final["digits"]["phase"] == "succeeded", status
    assert final["digits"]["rank_failures"] == 0, final  # the preempted rank left, not died
    assert state in ("RUNNING", "COMPLETED")
    # The rank left within the grace time, and the agent job was gone before Slurm's kill:
    # the main job started before the grace time was over.
    assert t_shrunk - t_main < GRACE, (t_main, t_shrunk)
    assert main_start - t_main < GRACE, (t_main, main_start)
    assert len(gone) == 1 and "reclaimed" in gone[0]["why_gone"], gone
    assert len(regrown) == 3 and gone[0]["node"] not in regrown, regrown
    new = set(regrown) - set(before)
    assert len(new) == 1, (before, regrown)  # a new agent took the slot back
    # ... told the same idle window as the first ones: not the start of the main job that was
    # still pending when the preempted agent ended (the harvester waits for it to start).
    new_node = next(n for n in status["nodes"] if n["node"] in new)
    assert abs(new_node["idle_until"] - later_start) < 1.5, (new_node, later_start, h.events)
    sizes = sizes_seen(read_traces(out))
    assert sizes[0] == 1, sizes
    assert 2 in sizes[sizes.index(3):], sizes  # shrank when the slot was preempted
    i2 = sizes.index(2, sizes.index(3))
    assert 3 in sizes[i2:], sizes  # grew, shrank, grew back
    check_replicas_and_data(read_traces(out), steps=STEPS, workers=3)
    assert_same_state(final_state(out), fixed)
    # The preempted agent job ended by itself, with exit 0, before Slurm's kill (a job Slurm
    # kills at the end of the grace time is PREEMPTED); its rank left rather than being killed.
    assert (victim_state, victim_exit) == ("COMPLETED", "0:0"), (victim_state, victim_exit)
    text = (logs / f"agent-{victim_job}.log").read_text(errors="replace")
    assert re.search(r"rank slurm-\S+ of digits.i1 ended with status 0 \(left\)", text), text
    assert cmds.agent_jobs("malle-agent") == []  # the harvester's stop ended every agent job


# The park test's job: one rank of 3 logical workers sleeps 0.3 s per micro-batch, 0.9 s a
# step, so the 43 steps after step 5 give the preemption at least 38 s to land, more than the
# test waits for the park (GRACE + 10 s); the second incarnation then has fewer steps to run
# at that pace than with STEPS (120), which made this the suite's longest test (130 s).
PARK_STEPS = 48


def test_a_job_whose_last_slot_is_preempted_parks_and_resumes_at_its_step(slurm, tmp_path):
    """Issue 22 through a real Slurm preemption: a digits job on its only harvested slot; a
    main-partition job wants every CPU, Slurm preempts the agent job with GraceTime; the job's
    last rank parks its state in the harvester's park store and exits 0 (the job is parked,
    not succeeded); when the main job is done the harvester's next agent takes the slot and
    the job's second incarnation resumes at the parked step, ending with the fixed-size
    model."""
    fixed_out = tmp_path / "fixed"
    r = launcher.run_local(train_cmd(fixed_out, 0.0, PARK_STEPS), nodes=1, job_id="fixed",
                           timeout=300, log_dir=str(tmp_path / "fixed-logs"))
    assert r.ok
    fixed = final_state(fixed_out)

    out = tmp_path / "digits"
    logs = tmp_path / "agents"
    logs.mkdir()
    later = sbatch(slurm, "-p", "main", "-n1", "-t", "1", "--begin=now+1800", "--wrap", "true")
    cmds = SlurmCommands(env=slurm.env)
    with LocalCluster(["unused"], policy="dp", heartbeat_timeout=5.0,
                      workdir=tmp_path / "cluster") as c:
        h = Harvester(HarvestOptions(store=c.address, secret=str(c.secret_path), slots=1,
                                     partition="scavenger", per="cpu", log_dir=str(logs),
                                     park_dir=str(c.park_dir), poll=0.5), cmds)
        try:
            h.start()
            c.submit("digits", train_cmd(out, 0.3, PARK_STEPS), max_nodes=3, logical_workers=3)
            wait_for("digits training on its slot", lambda: progress(c, "digits.i1") >= 5,
                     timeout=150)
            # Every CPU wanted by the main partition: the only agent job is preempted.
            main = sbatch(slurm, "-p", "main", "-n3", "-t", "1", "--wrap", "sleep 5")
            job = wait_for("digits parked", lambda: next(
                (j for j in c.status()["jobs"] if j["job"] == "digits"
                 and j["phase"] == "parked"), None), timeout=GRACE + 10)
            assert job["saved"]["kind"] == "park", job
            parked_step = job["saved"]["step"]
            assert 5 <= parked_step < PARK_STEPS, job
            wait_for("the main job done", lambda: job_field(slurm, main, "JobState")
                     == "COMPLETED", timeout=90)
            final = c.wait(["digits"], timeout=300)
            status = c.status()
        except BaseException:
            print(dump(c, h, slurm, logs))
            raise
        finally:
            h.stop(timeout=30)
            cmds.scancel([later])
    assert final["digits"]["phase"] == "succeeded", status
    assert final["digits"]["rank_failures"] == 0, final
    traces = read_traces(out)
    # The second incarnation started at the parked step: no step trained twice, none lost.
    check_replicas_and_data(traces, steps=PARK_STEPS, workers=3)
    assert_same_state(final_state(out), fixed)
    assert final["digits"]["parks"] == 1, final
    # Two ranks in all, one per incarnation: the first trained steps 0 .. parked_step - 1,
    # the second started at parked_step (not from scratch, which would give the same model).
    first, last = {}, {}
    for row in traces:
        if row["type"] == "micro":
            m = row["member"]
            first[m] = min(first.get(m, PARK_STEPS), row["step"])
            last[m] = max(last.get(m, -1), row["step"])
    assert len(first) == 2, first
    m1, m2 = sorted(first, key=first.get)
    assert (first[m1], last[m1], first[m2]) == (0, parked_step - 1, parked_step), (first, last)
    assert cmds.agent_jobs("malle-agent") == []
