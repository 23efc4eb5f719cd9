"""Slots per node (issue 23): a node agent runs N ranks of its job, and a node that goes takes
all of them out in one generation change.

Real processes on loopback (LocalCluster: ephemeral ports, agents and ranks stopped by pid,
every wait bounded). The training script is the tests' own exact_job.py.

- 2 nodes x 2 slots on CPU with Gloo = 4 ranks. n1 is reclaimed (its 2 ranks leave in one
  planned generation), comes back (2 ranks join), then its agent is killed -9 (its 2 ranks
  die together and one recovery removes both). The generation records in the store show each
  of these as one change; the job ends with the fixed-size run's whole state (every
  state_dict tensor, buffers included, the optimizer's state, the LR scheduler).
- Bad input: --slots 0, more slots than GPUs, a rank with no device for its LOCAL_RANK,
  --slots without agents: clear errors naming the problem.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

import malletrain
from malletrain import _C, launcher
from malletrain.cluster import LocalCluster, agent_binary
from malletrain.errors import MalleValueError

from state_compare import assert_same_state

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "exact_job.py"
STEPS = 120
ARGS = ["--logical-workers", "4"]


def job_cmd(out: pathlib.Path, *extra: str):
    return [sys.executable, str(SCRIPT), "--steps", str(STEPS), "--out", str(out), *ARGS, *extra]


def wait_for(what, cond, timeout=120.0, poll=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def progress(cluster, runtime_id: str) -> int:
    v = cluster.store.try_get(launcher.progress_key(runtime_id))
    return int(v) if v else 0


def records(store, runtime_id: str):
    """Every generation record of the job, in order: {generation, cause, members, reason}."""
    out = []
    for g in range(10_000):
        # The group's keys live under c10d's PrefixStore("malle/job/<id>/"), which adds a "/".
        raw = store.try_get(f"malle/job/{runtime_id}//gen/{g}/record")
        if raw is None:
            return out
        fields = dict(line.split("=", 1) for line in raw.decode().splitlines() if "=" in line)
        out.append({"generation": g, "cause": fields["cause"],
                    "members": [m for m in fields["members"].split(",") if m],
                    "reason": fields.get("reason", "")})
    return out


def node_of(member: str) -> str:
    return member.split("-")[0]  # the agent names its ranks <node>-<agent pid>-r<k>


def on(rec, node: str):
    return [m for m in rec["members"] if node_of(m) == node]


def dump_logs(cluster) -> str:
    parts = []
    for p in sorted(cluster.log_dir.glob("*")):
        if p.is_file():
            parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}")
    return "\n".join(parts)


def test_two_slots_per_node_leave_and_kill_are_one_generation_each(tmp_path):
    # The fixed-size reference: 4 ranks, no change.
    ref = tmp_path / "ref"
    r = launcher.run_local(job_cmd(ref), nodes=4, job_id="ref", timeout=240,
                           log_dir=str(tmp_path / "ref-logs"), quiet=True)
    assert r.ok, r
    fixed = torch.load(ref / "final.pt")

    out = tmp_path / "job"
    rid = "s.i1"
    slow = tmp_path / "slow"  # the job steps slowly (0.5 s) until the last event is seen
    slow.touch()
    with LocalCluster(["n0", "n1"], policy="dp", grace=20.0, heartbeat_timeout=5.0,
                      workdir=tmp_path / "cluster", slots=2) as c:
        try:
            c.node_up("n0")
            c.node_up("n1")
            c.submit("s", job_cmd(out, "--step-sleep", "0.5", "--slow-while", str(slow)),
                     max_nodes=2, logical_workers=4)
            # 4 ranks: 2 per node, LOCAL_RANK 0 and 1 on each.
            wait_for("4 ranks training", lambda: len((records(c.store, rid) or [{"members": []}])[-1]
                                                     ["members"]) == 4, timeout=180)
            wait_for("step 4", lambda: progress(c, rid) >= 4)
            # The main scheduler reclaims n1: its two ranks leave at one step boundary.
            c.node_down("n1", wait=True)
            wait_for("2 ranks left", lambda: len(records(c.store, rid)[-1]["members"]) == 2, timeout=30)
            # n1 comes back (a new agent): its two ranks join.
            c.node_up("n1")
            wait_for("n1's ranks back", lambda: len(on(records(c.store, rid)[-1], "n1")) == 2,
                     timeout=120)
            at = progress(c, rid)
            wait_for("a step on 4 ranks", lambda: progress(c, rid) > at + 1, timeout=60)
            # A node failure: n1's agent is killed -9, its ranks die with it.
            c.kill_agent("n1")
            wait_for("n1's ranks gone", lambda: not on(records(c.store, rid)[-1], "n1"), timeout=60)
            slow.unlink()
            assert progress(c, rid) < STEPS - 5, "the job was too fast for the schedule"
            final = c.wait(["s"], timeout=240)
            history = records(c.store, rid)
        except BaseException:
            print(dump_logs(c))
            raise
    assert final["s"]["phase"] == "succeeded", final
    lines = "\n".join(f"{h['generation']} {h['cause']} {h['members']} {h['reason'][:80]}"
                      for h in history)
    # n1's ranks go out together, both times: no generation takes one of them out without
    # the other. (Joins are not batched: a node's ranks are admitted as each finishes
    # warming up, sometimes in two generations.)
    for prev, cur in zip(history, history[1:]):
        assert len(on(cur, "n0")) == 2, lines
        if len(on(cur, "n1")) < len(on(prev, "n1")):
            assert len(on(prev, "n1")) == 2 and not on(cur, "n1"), lines
    changes = [(prev, cur) for prev, cur in zip(history, history[1:])
               if len(on(prev, "n1")) == 2 and not on(cur, "n1")]
    assert len(changes) == 2, lines  # the reclaim and the kill
    (left_from, left), (killed_from, killed) = changes
    assert left["cause"] == "planned", lines
    assert left["members"] == on(left_from, "n0"), lines  # n0's ranks stay, in their order
    assert killed["cause"] == "recovery", lines
    assert killed["members"] == on(killed_from, "n0"), lines
    print(lines)  # the generation history (pytest -s)
    final_state = torch.load(out / "final.pt")
    assert final_state["steps"] == STEPS
    assert_same_state(final_state, fixed)


def secret(tmp_path) -> str:
    path = tmp_path / "secret"
    if not path.exists():
        _C.write_new_secret(str(path))
    return str(path)


def run_agent(tmp_path, *flags, env=None):
    return subprocess.run([agent_binary("malle-agent"), "--store=127.0.0.1:1",
                           f"--secret={secret(tmp_path)}", "--node=n0", *flags],
                          capture_output=True, text=True, timeout=60, env=env)


def test_bad_slots_are_clear_errors(tmp_path):
    zero = run_agent(tmp_path, "--slots=0")
    assert zero.returncode == 2, zero
    assert "--slots: must be in [1, 1024] (ranks per node), got 0" in zero.stderr, zero.stderr
    # More slots than the GPUs the node (here: CUDA_VISIBLE_DEVICES) gives.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0,1")
    more = run_agent(tmp_path, "--gpus=auto", "--slots=3", env=env)
    assert more.returncode == 2, more
    assert "--slots 3 is more than the 2 GPU(s) of this node (CUDA_VISIBLE_DEVICES=0,1)" in more.stderr
    # No GPU at all: --gpus auto says where it looked.
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS",
                        "SLURM_GPUS_ON_NODE")}
    if not any(p.name[6:].isdigit() for p in pathlib.Path("/dev").glob("nvidia*")):
        none = run_agent(tmp_path, "--gpus=auto", env=env)
        assert none.returncode == 2, none
        assert "no GPU on this node" in none.stderr, none.stderr
    # The Python paths that start agents check before starting anything.
    with pytest.raises(MalleValueError, match=r"slots: ranks per node, an integer in \[1, 1024\], got 0"):
        LocalCluster(1, slots=0, workdir=tmp_path / "c")
    cli = subprocess.run([sys.executable, "-m", "malletrain", "local", "--nodes", "2", "--slots", "2",
                          "--", "true"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "--slots needs --idle-trace" in cli.stderr, cli


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() >= 3,
                    reason="this machine has a device for LOCAL_RANK 2")
def test_a_rank_with_no_device_for_its_local_rank_is_told_why(monkeypatch):
    monkeypatch.setenv("MALLE_STORE", "127.0.0.1:1")  # never dialled: the check comes first
    monkeypatch.setenv("MALLE_NODE", "n7")
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(MalleValueError, match=r"no CUDA device|sees no CUDA device on node n7"):
        malletrain.init(logical_workers=4, backend="nccl", member_id="n7-1-r3")
    # A LOCAL_RANK outside LOCAL_WORLD_SIZE is refused whatever the backend.
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(MalleValueError, match=r"LOCAL_RANK=3: must be in \[0, LOCAL_WORLD_SIZE=3\)"):
        malletrain.init(logical_workers=4, member_id="n7-1-r4")
