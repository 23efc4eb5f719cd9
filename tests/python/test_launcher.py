"""The local launcher: schedule grammar, member choice, process ownership, exit codes.

End-to-end runs use a tiny rank program (RANK) over malletrain._C.ElasticGroup, started by
the launcher on a loopback store with an ephemeral port. Every wait has a timeout, and every
test checks that the processes it caused to start are gone afterwards, by pid.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from malletrain import cli, launcher
from malletrain.errors import MalleValueError

PYTHONPATH = os.path.dirname(os.path.dirname(os.path.abspath(launcher.__file__)))


def test_schedule_grammar():
    evs = launcher.parse_schedule("step=10 leave 2, t=1.5 join,step=20  kill 1 ,t=3 stop")
    assert [str(e) for e in evs] == ["step=10 leave 2", "t=1.5 join 1", "step=20 kill 1",
                                     "t=3 stop 1"]
    assert [(e.trigger, e.at, e.action, e.count) for e in evs][:2] == [
        ("step", 10.0, "leave", 2), ("t", 1.5, "join", 1)]
    assert launcher.parse_schedule("") == [] and launcher.parse_schedule("  ") == []
    assert launcher.progress_key("j1") == "malle/job/j1/progress"


@pytest.mark.parametrize("spec, message", [
    ("step=10 explode 1",
     "schedule: item 1 'step=10 explode 1': unknown action 'explode'; expected one of "
     "join, leave, kill, term, stop, cont"),
    ("step=10 leave 2,, step=3 join", "schedule: item 2 is empty in 'step=10 leave 2,, "
     "step=3 join'"),
    ("step=1 join,", "schedule: item 2 is empty in 'step=1 join,'"),
    ("at 10 leave",
     "schedule: item 1 'at 10 leave' is not 'step=K ACTION [COUNT]' or "
     "'t=SECONDS ACTION [COUNT]'"),
    ("step=3 join, t=x kill",
     "schedule: item 2 't=x kill' is not 'step=K ACTION [COUNT]' or "
     "'t=SECONDS ACTION [COUNT]'"),
    ("step=5 join two", "schedule: item 1 'step=5 join two' is not"),
    ("step=1.5 join", "schedule: item 1 'step=1.5 join': step must be an integer"),
    ("step=5 join 0", "schedule: item 1 'step=5 join 0': count must be >= 1"),
])
def test_bad_schedules_name_the_item(spec, message):
    with pytest.raises(MalleValueError) as e:
        launcher.parse_schedule(spec)
    assert str(e.value).startswith(message)


MEMBERS = ["a", "b", "c", "d"]  # rank order: a is rank 0, the leader
ALL = set(MEMBERS)


@pytest.mark.parametrize("action, count, alive, stopped, want", [
    ("leave", 2, ALL, [], ["d", "c"]),            # highest ranks first
    ("leave", 9, ALL, [], ["d", "c", "b"]),       # never rank 0: never the last member
    ("leave", 1, {"a"}, [], []),
    ("kill", 1, ALL, [], ["d"]),
    ("kill", 2, ALL - {"d"}, [], ["c", "b"]),     # a dead process is not killed again
    ("kill", 9, ALL, [], ["d", "c", "b", "a"]),   # without a seed the leader may go too
    ("kill", 1, ALL, ["d"], ["d"]),               # a stopped process can be killed
    ("term", 9, ALL, [], ["d", "c", "b", "a"]),   # SIGTERM, like a reclaim: the leader too
    ("stop", 2, ALL, ["d"], ["c", "b"]),          # but not stopped twice
    ("cont", 1, ALL, ["c", "x"], ["c"]),          # stopped first, continued first
    ("cont", 5, ALL | {"x"}, ["c", "x"], ["c", "x"]),  # x was excluded meanwhile: still woken
])
def test_choose_members(action, count, alive, stopped, want):
    assert launcher.choose_members(action, count, MEMBERS, alive=alive,
                                   stopped=stopped) == want


def test_seeded_choice_is_random_reproducible_and_spares_the_leader():
    members = [f"n{i}" for i in range(8)]
    picks = [launcher.choose_members("kill", 3, members, alive=set(members),
                                     rng=random.Random(seed)) for seed in range(20)]
    assert all(len(p) == 3 and "n0" not in p for p in picks)
    assert len({tuple(sorted(p)) for p in picks}) > 1  # not always the highest ranks
    assert picks[7] == launcher.choose_members("kill", 3, members, alive=set(members),
                                               rng=random.Random(7))
    assert launcher.choose_members("kill", 5, ["n0", "n1"], alive={"n0", "n1"},
                                   rng=random.Random(1)) == ["n1"]
    with pytest.raises(MalleValueError, match="'join' does not choose members"):
        launcher.choose_members("join", 1, members, alive=set(members))


# One member: join, then steps of allreduce + commit; rank 0 publishes the progress.
# Exits 0 when it leaves or is excluded, or once it has done argv[1] steps and the group has
# at least UNTIL_SIZE members (so a test need not guess how long joiners take to start).
RANK = textwrap.dedent("""
    import os, sys, time
    from malletrain import _C
    host, port = os.environ["MALLE_STORE"].rsplit(":", 1)
    store = _C.ControlStore.connect(host, int(port))
    job = os.environ["MALLE_JOB_ID"]
    g = _C.ElasticGroup.join(store, job, member_id=os.environ["MALLE_MEMBER_ID"],
                             bootstrap_size=int(os.environ["MALLE_BOOTSTRAP_SIZE"]),
                             heartbeat_timeout=float(os.environ.get("HB", "2")),
                             recovery_grace=float(os.environ.get("GRACE", "0.2")))
    import torch
    steps, until_size = int(sys.argv[1]), int(os.environ.get("UNTIL_SIZE", "0"))
    step = 0
    t = g.last_transition  # the join's own transition comes first, without a boundary
    while True:
        if t is None:
            t = g.at_step_boundary()
        if t.kind in ("left", "excluded"):
            print(t.kind, "at", step, flush=True)
            sys.exit(0)
        if t.changed:
            step = t.resume_step
            print("generation", t.generation, t.kind, "size", t.size, "at", step, flush=True)
        t = None
        if step >= steps and g.size >= until_size:  # the same for every member
            break
        try:
            g.allreduce([torch.ones(1)])
        except Exception as e:
            continue  # the next boundary recovers
        g.commit(step)
        step += 1
        if g.rank == 0:
            store.set(f"malle/job/{job}/progress", str(step).encode())
        time.sleep(0.02)
    print("done", step, g.size, flush=True)
""")


def gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def assert_all_gone(res: launcher.LocalResult) -> None:
    assert sorted(res.pids) == sorted(res.exit_codes)
    assert all(code is not None for code in res.exit_codes.values())
    wait_for(lambda: all(gone(p) for p in res.pids.values()), 5, "every rank process to go")


def read_logs(tmp_path, res) -> dict:
    return {m: (tmp_path / "logs" / f"{m}.log").read_text() for m in res.exit_codes}


def test_join_leave_kill_fire_at_their_step_and_every_process_is_reaped(tmp_path):
    """Also: the launcher reports every exit to the job, like a node agent, so with a 60 s
    recovery_grace the survivor still recovers from the kill -9 at once."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = dict(os.environ, GRACE="60", UNTIL_SIZE="3")
    res = launcher.run_local([sys.executable, str(script), "40"], nodes=3,
                             schedule="step=10 leave 1, step=20 kill 1, step=30 join 2",
                             job_id="lt", timeout=120, log_dir=str(tmp_path / "logs"),
                             env=env, quiet=True)
    logs = read_logs(tmp_path, res)
    assert res.ok, {m: text[-2000:] for m, text in logs.items()}
    assert_all_gone(res)
    leave, kill, join = res.events
    assert (leave.action, kill.action, join.action) == ("leave", "kill", "join")
    # Fired when the progress reached the trigger, not long after (it moves ~1 step/20 ms;
    # the slack is for a loaded machine).
    assert 10 <= leave.fired_step <= 20 and 20 <= kill.fired_step <= 30
    assert 30 <= join.fired_step <= 40
    assert leave.fired_t < kill.fired_t < join.fired_t
    # Rank order is bootstrap arrival order, not the launch order: read it from generation 0.
    r0, r1, r2 = res.history[0].members
    assert leave.members == [r2] and kill.members == [r1]  # the highest ranks
    assert join.members == ["node3", "node4"]
    assert res.killed == [r1] and res.exit_codes[r1] == -signal.SIGKILL
    left_at = int(re.search(r"^left at (\d+)$", logs[r2], re.M).group(1))
    assert 10 <= left_at <= leave.fired_step + 2, logs[r2]  # at the next step boundary
    assert not res.unadmitted
    assert sorted(res.exit_codes) == ["node0", "node1", "node2", "node3", "node4"]
    first, after_leave, after_kill, *joins = res.history
    assert (first.cause, after_leave.cause, after_kill.cause) == (
        "bootstrap", "planned", "recovery")
    assert (after_leave.members, after_kill.members) == ((r0, r1), (r0,))
    assert after_kill.seen_t - kill.fired_t < 10  # not the 60 s grace
    # The two joiners get in together or one boundary apart.
    assert 1 <= len(joins) <= 2 and all(g.cause == "planned" for g in joins)
    final = res.history[-1].members
    assert final[0] == r0 and sorted(final[1:]) == ["node3", "node4"]
    assert res.generations == len(res.history) and res.final_members == list(final)
    for m in (r0, "node3", "node4"):
        assert re.search(r"^done \d+ 3$", logs[m], re.M), logs[m]


def test_stop_cont_and_what_is_left_when_the_job_ends(tmp_path):
    """A stopped member is dropped by heartbeat; cont wakes it although it is no longer in
    the generation, and it finds itself excluded. When the last member finishes, a member
    stopped and never continued and a joiner not yet admitted are stopped by the launcher
    instead of hanging it until the timeout."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = dict(os.environ, HB="1", GRACE="0.2")
    res = launcher.run_local([sys.executable, str(script), "60"], nodes=3,
                             schedule="step=5 stop 1, step=15 cont 1, step=25 stop 1, "
                             "step=55 join 1", job_id="hang", timeout=60, env=env,
                             log_dir=str(tmp_path / "logs"), quiet=True)
    logs = read_logs(tmp_path, res)
    assert res.ok and not res.timed_out, {m: text[-2000:] for m, text in logs.items()}
    assert_all_gone(res)
    r0, r1, r2 = res.history[0].members
    assert [e.members for e in res.events] == [[r2], [r2], [r1], ["node3"]]
    assert "excluded at" in logs[r2] and res.exit_codes[r2] == 0
    assert res.killed == [r1]  # stopped for good
    assert res.unadmitted == ["node3"]  # 5 steps (~0.1 s) are too few to start Python + torch
    assert [g.members for g in res.history] == [(r0, r1, r2), (r0, r1), (r0,)]
    assert "done 60 1" in logs[r0]


def test_timeout_kills_every_process(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(60)\n")
    res = launcher.run_local([sys.executable, str(script)], nodes=2, timeout=1.0,
                             job_id="to", quiet=True)
    assert res.timed_out and not res.ok
    assert res.exit_codes == {"node0": -9, "node1": -9}
    assert res.wall_s < 10
    assert_all_gone(res)


def test_bad_arguments_are_value_errors():
    with pytest.raises(MalleValueError, match="nodes: must be a positive integer, got 0"):
        launcher.run_local([sys.executable, "-c", "pass"], nodes=0)
    with pytest.raises(MalleValueError, match="timeout: must be a positive number"):
        launcher.run_local([sys.executable, "-c", "pass"], nodes=1, timeout=float("nan"))
    with pytest.raises(MalleValueError, match="job_id: must match"):
        launcher.run_local([sys.executable, "-c", "pass"], nodes=1, job_id="a/b")
    with pytest.raises(MalleValueError, match="command: give the program"):
        launcher.run_local([], nodes=1)


def test_cli_reports_bad_input_with_exit_code_2(capsys):
    assert cli.main(["local", "--nodes", "2", "--schedule", "step=1 fly", "--",
                     sys.executable, "-c", "pass"]) == 2
    assert capsys.readouterr().err == (
        "malletrain local: error: schedule: item 1 'step=1 fly': unknown action 'fly'; "
        "expected one of join, leave, kill, term, stop, cont\n")
    assert cli.main(["local", "--nodes", "2"]) == 2
    assert "give the program to run after --" in capsys.readouterr().err
    for bad in (["--nodes", "0"], ["--nodes", "2", "--timeout", "-1"]):
        with pytest.raises(SystemExit) as e:
            cli.main(["local", *bad, "--", sys.executable, "-c", "pass"])
        assert e.value.code == 2


def test_cli_prints_actions_and_summary_and_exit_code_follows_the_ranks(capsys):
    assert cli.main(["local", "--nodes", "2", "--schedule", "t=0 join 1", "--",
                     sys.executable, "-c", "pass"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\[malletrain local\] t=\d+\.\ds step=0: join node2$", out, re.M), out
    assert re.search(r"^  node2 +pid \d+ +exit 0$", out, re.M), out
    assert re.search(r"^  0 generations, \d+\.\d s: ok$", out, re.M), out
    assert cli.main(["local", "--nodes", "1", "--", sys.executable, "-c",
                     "import sys; sys.exit(3)"]) == 1
    assert re.search(r"^  node0 +pid \d+ +exit 3  FAILED$", capsys.readouterr().out, re.M)


PID_WRITER = ("import os, time; d = os.environ['PIDS']; "
              "open(os.path.join(d, os.environ['MALLE_MEMBER_ID'] + '.tmp'), 'w')"
              ".write(str(os.getpid())); "
              "os.rename(os.path.join(d, os.environ['MALLE_MEMBER_ID'] + '.tmp'), "
              "os.path.join(d, os.environ['MALLE_MEMBER_ID'])); time.sleep(60)")


def start_cli(tmp_path, nodes: int) -> tuple[subprocess.Popen, list[int]]:
    """`malletrain local` in its own process, and the pids of its (sleeping) ranks."""
    pids = tmp_path / "pids"
    pids.mkdir()
    env = dict(os.environ, PIDS=str(pids),
               PYTHONPATH=os.pathsep.join([PYTHONPATH, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "malletrain.cli", "local", "--nodes", str(nodes),
         "--timeout", "60", "--", sys.executable, "-c", PID_WRITER],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len([p for p in pids.iterdir() if p.suffix != ".tmp"]) == nodes,
                 30, "the ranks to start")
    except BaseException:
        proc.kill()
        proc.wait(timeout=10)
        raise
    return proc, [int(p.read_text()) for p in pids.iterdir()]


def test_cli_sigterm_kills_every_rank_and_exits_130(tmp_path):
    proc, ranks = start_cli(tmp_path, 2)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert proc.returncode == 130, err
    assert "interrupted; every process was killed" in err
    wait_for(lambda: all(gone(p) for p in ranks), 5, "the ranks to go")


def test_cli_sigint_kills_every_rank_and_exits_130(tmp_path, capsys, monkeypatch):
    """In this process (the launcher runs on the test's main thread): Ctrl-C once the
    ranks run."""
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("PIDS", str(pids))
    ranks: list[int] = []

    def interrupt() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done = [p for p in pids.iterdir() if p.suffix != ".tmp"]
            if len(done) == 2:
                ranks.extend(int(p.read_text()) for p in done)
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # also on a timeout: never leave cli.main hanging

    # Ctrl-C as in an interactive shell. A shell starts background commands (`cmd &`) with
    # SIGINT ignored, and Python then leaves it ignored: pytest run that way would never see
    # the interrupt.
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Thread(target=interrupt)
    timer.start()
    try:
        code = cli.main(["local", "--nodes", "2", "--timeout", "30", "--",
                         sys.executable, "-c", PID_WRITER])
    finally:
        timer.join(timeout=30)
        signal.signal(signal.SIGINT, saved)
    assert code == 130
    assert "interrupted; every process was killed" in capsys.readouterr().err
    assert len(ranks) == 2
    wait_for(lambda: all(gone(p) for p in ranks), 5, "the ranks to go")


def test_ranks_die_with_a_killed_launcher(tmp_path):
    """PR_SET_PDEATHSIG: even a kill -9 of the launcher leaves no rank behind."""
    proc, ranks = start_cli(tmp_path, 2)
    proc.kill()
    proc.wait(timeout=10)
    try:
        wait_for(lambda: all(gone(p) for p in ranks), 10, "the orphaned ranks to die")
    finally:  # on a failure, do not leave them sleeping
        for p in ranks:
            if not gone(p):
                os.kill(p, signal.SIGKILL)


def test_a_child_outlives_the_thread_that_started_it():
    """_C.LocalProcess: PR_SET_PDEATHSIG follows the thread that forks, so forks happen on one
    thread that lives as long as the process. A child started from a short-lived thread (as
    LocalCluster's trace follower starts agents) must live on after that thread ends."""
    import threading

    from malletrain import _C

    box = {}
    t = threading.Thread(target=lambda: box.update(p=_C.LocalProcess.spawn(["/bin/sleep", "30"])))
    t.start()
    t.join()
    time.sleep(0.5)
    try:
        assert box["p"].poll() is None, "the child died with the thread that started it"
    finally:
        assert box["p"].kill(timeout=10) == -9


def test_warm_members_are_forked_from_a_zygote_and_train_the_same_model(tmp_path, capsys):
    """`malletrain local --warm`: every member, the first ones and a joiner, is a fork of a
    zygote of the command's interpreter (no "started cold" line), and the job ends with the
    same model as the same schedule run cold."""
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_digits.py")
    import torch

    states = {}
    for warm in (False, True):
        out = tmp_path / ("warm" if warm else "cold")
        code = cli.main(["local", "--nodes", "2", "--schedule", "step=5 join 1", "--timeout",
                         "240", "--log-dir", str(out / "logs"), *(["--warm"] if warm else []),
                         "--", sys.executable, example, "--steps", "25", "--logical-workers",
                         "3", "--out", str(out)])
        text = capsys.readouterr().out
        assert code == 0, text
        if warm:
            assert "zygote ready after" in text and "started cold" not in text, text
            assert (out / "logs" / "zygote.log").exists()
        states[warm] = torch.load(out / "final.pt")
    from state_compare import assert_same_state
    assert_same_state(states[True], states[False])
    assert cli.main(["local", "--nodes", "1", "--warm", "--idle-trace", "x.csv", "--",
                     sys.executable, "-c", "pass"]) == 2
    assert "start warm already" in capsys.readouterr().err
