"""The local launcher: schedule grammar, process ownership, timeouts."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from malletrain import cli, launcher
from malletrain.errors import MalleValueError


def test_schedule_grammar():
    evs = launcher.parse_schedule("step=10 leave 2, t=1.5 join,step=20  kill 1 ,t=3 stop")
    assert [str(e) for e in evs] == ["step=10 leave 2", "t=1.5 join 1", "step=20 kill 1",
                                     "t=3 stop 1"]
    assert launcher.parse_schedule("") == [] and launcher.parse_schedule("  ") == []


@pytest.mark.parametrize("spec, message", [
    ("step=10 explode 1", "item 1 'step=10 explode 1': unknown action 'explode'"),
    ("step=10 leave 2,, step=3 join", "item 2 is empty"),
    ("at 10 leave", "item 1 'at 10 leave' is not 'step=K ACTION [COUNT]'"),
    ("step=1.5 join", "step must be an integer"),
    ("step=5 join 0", "count must be >= 1"),
])
def test_bad_schedules_name_the_item(spec, message):
    with pytest.raises(MalleValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        launcher.parse_schedule(spec)


RANK = textwrap.dedent("""
    import os, sys, time
    from malletrain import _C
    host, port = os.environ["MALLE_STORE"].rsplit(":", 1)
    store = _C.ControlStore.connect(host, int(port))
    job = os.environ["MALLE_JOB_ID"]
    g = _C.ElasticGroup.join(store, job, member_id=os.environ["MALLE_MEMBER_ID"],
                             bootstrap_size=int(os.environ["MALLE_BOOTSTRAP_SIZE"]),
                             recovery_grace=float(os.environ.get("GRACE", "0.2")))
    import torch
    step = 0
    t = g.last_transition  # the join's own transition comes first, without a boundary
    while step < int(sys.argv[1]):
        if t is None:
            t = g.at_step_boundary()
        if t.kind == "left":
            print("left at", step, flush=True)
            sys.exit(0)
        if t.changed:
            step = t.resume_step
        t = None
        x = torch.ones(1)
        try:
            g.allreduce([x])
        except Exception as e:
            continue
        g.commit(step)
        step += 1
        if g.rank == 0:
            store.set(f"malle/job/{job}/progress", str(step).encode())
        time.sleep(0.02)
    g.at_step_boundary()
    print("done", step, g.size, flush=True)
""")


def test_join_leave_kill_and_every_process_reaped(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    res = launcher.run_local([sys.executable, str(script), "400"], nodes=3,
                             schedule="step=10 leave 1, step=20 kill 1, step=30 join 2",
                             job_id="lt", timeout=120, log_dir=str(tmp_path / "logs"),
                             quiet=True)
    assert res.ok, {m: (tmp_path / "logs" / f"{m}.log").read_text()[-2000:]
                    for m in res.exit_codes}
    assert [e.action for e in res.events] == ["leave", "kill", "join"]
    assert all(e.fired_step is not None for e in res.events)
    assert res.events[0].fired_step >= 10 and res.events[1].fired_step >= 20
    (left,) = res.events[0].members
    assert len(res.killed) == 1 and res.exit_codes[res.killed[0]] == -9
    assert left not in res.killed
    assert sorted(res.exit_codes) == ["node0", "node1", "node2", "node3", "node4"]
    assert "left at" in (tmp_path / "logs" / f"{left}.log").read_text()
    assert not res.unadmitted
    assert sorted(res.final_members) == sorted(
        set(res.exit_codes) - {left} - set(res.killed))  # 3 - 1 left - 1 killed + 2 joined
    for m in res.exit_codes:  # reaped: no process is left behind
        assert res.exit_codes[m] is not None


def test_joiners_of_a_finished_job_are_stopped(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    res = launcher.run_local([sys.executable, str(script), "5"], nodes=1,
                             schedule="t=0 join 1", job_id="late", timeout=60, quiet=True)
    # The one-member job may finish before the joiner is admitted: then the joiner is
    # stopped instead of waiting a minute for a job that is over.
    assert res.ok and res.wall_s < 40
    assert res.unadmitted in ([], ["node1"])


def test_reported_exits_end_recovery_without_waiting_out_the_grace(tmp_path):
    """The launcher reports every exit to the job, like a node agent: with a 60 s
    recovery_grace, the survivors still recover from two kill -9s at once."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = dict(os.environ, GRACE="60")
    res = launcher.run_local([sys.executable, str(script), "200"], nodes=3,
                             schedule="step=10 kill 1, step=40 kill 1", job_id="grace",
                             timeout=45, env=env, quiet=True)
    assert res.ok and not res.timed_out
    assert res.generations == 3 and len(res.killed) == 2


def test_timeout_kills_every_process(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(60)\n")
    res = launcher.run_local([sys.executable, str(script)], nodes=2, timeout=1.0,
                             job_id="to", quiet=True)
    assert res.timed_out and not res.ok
    assert res.exit_codes == {"node0": -9, "node1": -9}


def test_cli_reports_a_bad_schedule(capsys):
    assert cli.main(["local", "--nodes", "2", "--schedule", "step=1 fly", "--",
                     sys.executable, "-c", "pass"]) == 2
    assert "unknown action 'fly'" in capsys.readouterr().err
    assert cli.main(["local", "--nodes", "2"]) == 2


def test_cli_exit_code_follows_the_ranks(tmp_path):
    ok = cli.main(["local", "--nodes", "2", "--", sys.executable, "-c", "pass"])
    bad = cli.main(["local", "--nodes", "1", "--", sys.executable, "-c",
                    "import sys; sys.exit(3)"])
    assert (ok, bad) == (0, 1)
    assert os.path.exists(tmp_path)
