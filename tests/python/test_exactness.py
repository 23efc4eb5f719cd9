"""Exactness (issue 20): an elastic run ends with the *whole* state of the fixed-size run —
parameters, buffers (BatchNorm statistics and counters, a user module's own buffers),
optimizer state, tracked objects — through planned resizes and kill -9 during a step, with
random augmentation in ``Dataset.__getitem__``, in a ``collate_fn`` and in DataLoader
worker processes; and ``redone_steps`` counts the steps that were run again.

The script is the tests' own (tests/python/exact_job.py), not the project's example. Faults
are injected: a member SIGKILLs itself at a chosen step and phase, so a step really fails.
Every run: loopback store on an ephemeral port, every process started and stopped by the
launcher by pid, a timeout on every wait.
"""

from __future__ import annotations

import collections
import json
import pathlib
import sys

import pytest
import torch

from malletrain import launcher

from state_compare import assert_same_state

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "exact_job.py"
STEPS = 30


def run(tmp: pathlib.Path, name: str, nodes: int = 4, schedule: str = "", *args: str):
    out = tmp / name
    cmd = [sys.executable, str(SCRIPT), "--steps", str(STEPS), "--out", str(out), *args]
    res = launcher.run_local(cmd, nodes=nodes, schedule=schedule, job_id=name, timeout=240,
                             log_dir=str(tmp / f"{name}-logs"), quiet=True)
    return out, res


def logs(tmp: pathlib.Path, name: str) -> str:
    d = tmp / f"{name}-logs"
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(d.glob("*.log")))


def final(out: pathlib.Path):
    return torch.load(out / "final.pt")


def traces(out: pathlib.Path):
    rows = []
    for f in sorted(out.glob("trace-*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            r["member"] = f.stem[len("trace-"):]
            rows.append(r)
    return rows


def results(out: pathlib.Path):
    return {f.stem[len("result-"):]: json.loads(f.read_text())
            for f in sorted(out.glob("result-*.json"))}


def check_run(tmp, name, out, res, *, deaths: int = 0):
    """`deaths` members killed themselves (SIGKILL); every other one exited 0."""
    codes = {m: c for m, c in res.exit_codes.items() if m not in res.unadmitted}
    assert not res.timed_out, logs(tmp, name)
    dead = [m for m, c in codes.items() if c == -9]
    assert len(dead) == deaths, f"{codes}\n{logs(tmp, name)}"
    assert all(c == 0 for m, c in codes.items() if m not in dead), f"{codes}\n{logs(tmp, name)}"


def check_redone_counts(out: pathlib.Path) -> int:
    """Every surviving member's redone_steps equals the steps it started more than once
    (from its trace); returns the total."""
    started = collections.defaultdict(list)
    for r in traces(out):
        if r["micro"] == 0:
            started[r["member"]].append(r["step"])
    total = 0
    for member, res in results(out).items():
        seq = started[member]
        redone = len(seq) - len(set(seq))
        assert res["redone_steps"] == redone, (member, res, seq)
        total += redone
    return total


def check_same_batches(out: pathlib.Path, ref: pathlib.Path) -> None:
    """Every (step, logical worker) saw the same samples, the same augmented inputs and the
    same model RNG stream as in the reference run."""
    want = {(r["step"], r["worker"]): r for r in traces(ref)}
    got = {}
    for r in traces(out):  # the last attempt of a redone step is the one that counted
        got[(r["step"], r["worker"])] = r
    assert sorted(got) == sorted(want)
    for k, r in got.items():
        w = want[k]
        assert r["indices"] == w["indices"], k
        assert r["x0"] == w["x0"], (k, r["member"], r["size"], r["x0"], w["x0"])
        assert r["draw"] == w["draw"], (k, r["member"], r["size"])


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """Fixed 4-rank runs: plain, deterministic, and deterministic with augmentation."""
    tmp = tmp_path_factory.mktemp("exact-fixed")
    runs = {}
    for name, args in (("plain", ()), ("det", ("--deterministic",)),
                       ("augdet", ("--deterministic", "--aug", "both"))):
        out, res = run(tmp, name, 4, "", *args)
        assert res.ok, logs(tmp, name)
        assert check_redone_counts(out) == 0
        runs[name] = out
    return runs


def test_kill9_during_steps_keeps_the_whole_state_exact(tmp_path, fixed):
    """kill -9 of rank 2 after its forward (the others' buffers moved, nothing reduced):
    BatchNorm's statistics and counter, the user module's buffers, AdamW's state and the
    tracked scheduler end as in the fixed run."""
    out, res = run(tmp_path, "kills", 4, "", "--die", "2@6:forward")
    check_run(tmp_path, "kills", out, res, deaths=1)
    got, want = final(out), final(fixed["plain"])
    assert int(got["model"]["1.num_batches_tracked"]) == STEPS
    assert_same_state(got, want)
    assert check_redone_counts(out) >= 1  # the failure really hit a step


def test_kill9_of_rank0_mid_step_deterministic_is_bitwise(tmp_path, fixed):
    """kill -9 of rank 0 (the leader) after its last backward, deterministic mode: the whole
    state is bitwise the fixed run's."""
    out, res = run(tmp_path, "kills0det", 4, "", "--deterministic", "--die", "0@9:backward")
    check_run(tmp_path, "kills0det", out, res, deaths=1)
    assert_same_state(final(out), final(fixed["det"]), bitwise=True)
    assert check_redone_counts(out) >= 1


def test_augmentation_follows_the_logical_worker_through_resizes_and_a_kill(tmp_path, fixed):
    """Random augmentation in __getitem__ (torch, NumPy, random) and in collate_fn, through a
    planned leave of two, a join and a kill -9 during a step: bitwise the fixed run's batches,
    RNG streams and final state (deterministic mode)."""
    out, res = run(tmp_path, "augdet", 4, "step=4 leave 2, t=0 join 1",
                   "--deterministic", "--aug", "both", "--step-sleep", "0.1",
                   "--die", "1@22:forward")
    check_run(tmp_path, "augdet", out, res, deaths=1)
    sizes = {r["size"] for r in traces(out)}
    assert {4, 2} <= sizes, sizes
    check_same_batches(out, fixed["augdet"])
    assert_same_state(final(out), final(fixed["augdet"]), bitwise=True)
    assert check_redone_counts(out) >= 1


def test_augmentation_in_dataloader_workers_follows_the_logical_worker(tmp_path, fixed):
    """The same with num_workers=2 (augmentation runs in DataLoader worker processes) and the
    default, non-deterministic reduction: the same batches bit for bit, the same state up to
    summation order."""
    out, res = run(tmp_path, "augworkers", 4, "step=5 leave 1, step=9 leave 1",
                   "--aug", "both", "--num-workers", "2", "--die", "1@15:backward")
    check_run(tmp_path, "augworkers", out, res, deaths=1)
    check_same_batches(out, fixed["augdet"])
    assert_same_state(final(out), final(fixed["augdet"]))
    assert check_redone_counts(out) >= 1
