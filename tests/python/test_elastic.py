"""Multi-process tests of elastic training (issue 3): the digits example run through resize
and failure schedules by the local launcher, compared with fixed-size runs.

Every run: loopback store on an ephemeral port, rank processes started and stopped by the
launcher by pid, a timeout on every wait.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import sys

import pytest
import torch

from malletrain import launcher

from state_compare import assert_same_state
from digits_runs import (check_replicas_and_data, final_state, logs, read_traces,
                         run_job, sizes_seen)

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_digits.py"
STEPS = 60
N_TRAIN = 1500  # digits: 1,797 samples, 297 held out


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fixed")
    out, res = run_job(tmp, "fixed4", 4)
    assert res.ok, logs(tmp, "fixed4")
    out_d, res_d = run_job(tmp, "fixed4det", 4, extra=["--deterministic"])
    assert res_d.ok, logs(tmp, "fixed4det")
    return final_state(out), final_state(out_d)


# Joiners need a few seconds to start (import torch) on a loaded 2-core machine: the
# runs sleep 0.25 s per step so that both are in well before step 60.
RESIZE = "step=8 leave 2, step=14 join 1, step=20 join 1"


# The digits model's state is small (69 KB of parameters): with the default threshold
# (1 MiB) every tensor is packed by copying. These runs lower it, so the state is sent from
# the flat buffers as they are and the joiners receive the model in place; the other runs
# keep the default and test the packed path.
DIRECT = {"MALLE_STATE_DIRECT_MIN_BYTES": "4096"}


def received_bytes(tmp: pathlib.Path, name: str) -> dict:
    """member -> (bytes of state received in place, bytes received into memory it faulted
    in while warming up), from the example's resize lines."""
    found = {}
    for p in sorted((tmp / f"{name}-logs").glob("*.log")):
        got = [(int(m.group(2)), int(m.group(3))) for m in re.finditer(
            r"state (\d+) B \((\d+) B in place, (\d+) B into pre-faulted memory\)",
            p.read_text())]
        found[p.stem] = (sum(g[0] for g in got), sum(g[1] for g in got))
    return found


def test_resize_4_2_3_4_matches_the_fixed_run(tmp_path, fixed):
    out, res = run_job(tmp_path, "resize", 4, RESIZE, step_sleep=0.25,
                       env=dict(os.environ, **DIRECT))
    assert res.ok, logs(tmp_path, "resize")
    rows = read_traces(out)
    assert sizes_seen(rows) == [4, 2, 3, 4]
    assert_same_state(final_state(out), fixed[0])
    check_replicas_and_data(rows)
    # Both joiners received the model straight into their parameters, and Adam's state
    # (which a joiner has not got before its first step) into memory they faulted in
    # while warming up, from the layout the leader published.
    got = received_bytes(tmp_path, "resize")
    joiners = [m for m in got if m not in ("node0", "node1", "node2", "node3")]
    assert len(joiners) == 2, got
    assert all(got[m][0] >= 17_000 * 4 for m in joiners), got
    assert all(got[m][1] >= 2 * 17_000 * 4 for m in joiners), got


def test_deterministic_mode_is_bitwise_equal_across_schedules(tmp_path, fixed):
    out, res = run_job(tmp_path, "resizedet", 4, RESIZE, extra=["--deterministic"],
                       step_sleep=0.25)
    assert res.ok, logs(tmp_path, "resizedet")
    assert sizes_seen(read_traces(out)) == [4, 2, 3, 4]
    assert_same_state(final_state(out), fixed[1], bitwise=True)


def test_kill9_of_members_and_of_a_joiner_in_state_sync(tmp_path, fixed):
    # node4 (the first joiner) dies in the middle of receiving state; node5 joins later.
    env = dict(os.environ, MALLE_FAULT_EXIT_IN_STATE_SYNC="node4", **DIRECT)
    schedule = "step=6 kill 1, step=12 join 1, step=16 join 1, step=30 kill 1"
    out, res = run_job(tmp_path, "kills", 4, schedule, env=env, step_sleep=0.15)
    assert res.exit_codes["node4"] == 137, logs(tmp_path, "kills")  # died in the sync
    others = {m: c for m, c in res.exit_codes.items()
              if m not in res.killed and m not in res.unadmitted and m != "node4"}
    assert others and all(c == 0 for c in others.values()), logs(tmp_path, "kills")
    assert len(res.killed) == 2 and not res.timed_out
    rows = read_traces(out)
    assert_same_state(final_state(out), fixed[0])
    check_replicas_and_data(rows)
    # At most one step is redone per failure (3 failures).
    attempts = collections.Counter(
        (r["step"], r["member"]) for r in rows if r["type"] == "micro" and r["micro"] == 0)
    redone = sum(c - 1 for c in attempts.values())
    assert redone <= 3 * 3  # each of at most 3 survivors may redo one step per failure
    assert max(attempts.values()) <= 1 + 3


def test_a_joiner_with_a_different_model_is_refused(tmp_path):
    out_dir = tmp_path / "mismatch"
    cmd_ok = [sys.executable, str(EXAMPLE), "--steps", "40", "--out", str(out_dir),
              "--step-sleep", "0.1"]
    # The launcher starts identical commands; the joiner's model width comes from its env.
    env = dict(os.environ, DIGITS_HIDDEN_FOR_node2="96")
    # The joiner starts with the others (t=0) and joins once the job is running.
    res = launcher.run_local(cmd_ok, nodes=2, schedule="t=0 join 1", job_id="mismatch",
                             timeout=180, log_dir=str(tmp_path / "mismatch-logs"), env=env)
    joiner_log = (tmp_path / "mismatch-logs" / "node2.log").read_text()
    assert "model mismatch" in joiner_log, logs(tmp_path, "mismatch")
    assert res.exit_codes["node2"] != 0
    assert res.exit_codes["node0"] == 0 and res.exit_codes["node1"] == 0, logs(tmp_path,
                                                                               "mismatch")


def test_global_batch_following_the_world_size_rescales_the_learning_rate(tmp_path):
    out = tmp_path / "follow"
    cmd = [sys.executable, str(EXAMPLE), "--steps", "16", "--out", str(out), "--step-sleep",
           "0.1", "--lr-scaling", "linear", "--lr", "0.004"]
    res = launcher.run_local(cmd, nodes=2, schedule="step=5 leave 1", job_id="follow",
                             timeout=180, log_dir=str(tmp_path / "follow-logs"))
    assert res.ok, logs(tmp_path, "follow")
    rows = read_traces(out)
    by_size = {r["size"]: r["lr"] for r in rows if r["type"] == "commit"}
    assert by_size == {2: pytest.approx(0.004), 1: pytest.approx(0.002)}
    # Exactly once: each step read fresh samples of the stream.
    micro = [r for r in rows if r["type"] == "micro"]
    seen = [i for r in micro for i in r["indices"]]
    assert len(seen) == len(set(seen))
    sizes = sorted({(r["step"], r["size"]) for r in micro})
    assert [s for s, _ in sizes] == list(range(16))
    assert len(seen) == sum(16 * size for _, size in sizes)


def test_batchnorm_buffers_follow_logical_worker_0_across_a_shrink(tmp_path):
    """Buffers (running statistics, an int64 counter) end as in the fixed 4-rank run."""
    fixed_out, res = run_job(tmp_path, "bnfixed", 4, extra=["--batchnorm"])
    assert res.ok, logs(tmp_path, "bnfixed")
    out, res = run_job(tmp_path, "bnshrink", 4, "step=8 leave 2", extra=["--batchnorm"],
                       step_sleep=0.05)
    assert res.ok, logs(tmp_path, "bnshrink")
    assert sizes_seen(read_traces(out)) == [4, 2]
    got, want = final_state(out), final_state(fixed_out)
    assert "1.running_mean" in want["model"]
    assert int(want["model"]["1.num_batches_tracked"]) == STEPS
    assert_same_state(got, want)  # integer buffers (the counter) exactly
