"""Helpers shared by the multi-process tests that train examples/train_digits.py with
``--out``: its per-micro-batch traces and final parameters, and the checks made on them."""

from __future__ import annotations

import collections
import json
import pathlib
import sys

import torch

from malletrain import launcher

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_digits.py"

STEPS = 60
N_TRAIN = 1500  # digits: 1,797 samples, 297 held out


def run_job(tmp: pathlib.Path, name: str, nodes: int, schedule: str = "", extra=(),
            env=None, step_sleep: float = 0.0):
    """Trains the digits example with `malletrain local` into tmp/name; (out dir, result)."""
    out = tmp / name
    cmd = [sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--out", str(out),
           "--step-sleep", str(step_sleep), *extra]
    result = launcher.run_local(cmd, nodes=nodes, schedule=schedule, job_id=name, timeout=240,
                                log_dir=str(tmp / f"{name}-logs"), env=env)
    return out, result


def logs(tmp: pathlib.Path, name: str) -> str:
    """The tail of every rank's log of run `name`, for an assertion message."""
    d = tmp / f"{name}-logs"
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(d.glob("*.log")))


def read_traces(out: pathlib.Path):
    rows = []
    for f in sorted(out.glob("trace-*.jsonl")):
        member = f.stem[len("trace-"):]
        for line in f.read_text().splitlines():
            r = json.loads(line)
            r["member"] = member
            rows.append(r)
    return rows


def final_state(out: pathlib.Path):
    """The whole final state rank 0 saved: {"model", "optimizer", "scheduler"} state_dicts."""
    return torch.load(out / "final.pt")


def check_replicas_and_data(rows, steps=STEPS, workers=4):
    """(3) every sample once per epoch, (4) identical replicas after every committed step."""
    # The committed attempt of every (step, worker): the last one recorded.
    by_step = collections.defaultdict(dict)
    digests = collections.defaultdict(set)
    for r in rows:
        if r["type"] == "micro":
            by_step[r["step"]][r["worker"]] = r["indices"]
        elif r["type"] == "commit":
            digests[r["step"]].add(r["digest"])
    assert sorted(by_step) == list(range(steps))
    for s in range(steps):
        assert sorted(by_step[s]) == list(range(workers)), s
        assert len(digests[s]) == 1, f"replicas differ after step {s}: {digests[s]}"
    stream = [i for s in range(steps) for k in range(workers) for i in by_step[s][k]]
    for e in range(len(stream) // N_TRAIN):
        assert sorted(stream[e * N_TRAIN:(e + 1) * N_TRAIN]) == list(range(N_TRAIN)), e
    tail = stream[(len(stream) // N_TRAIN) * N_TRAIN:]
    assert len(set(tail)) == len(tail)


def sizes_seen(rows):
    seq = []
    rows = [r for r in rows if r["type"] == "micro"]
    for r in sorted(rows, key=lambda r: (r["step"], r["generation"])):
        if not seq or seq[-1] != (r["generation"], r["size"]):
            if not seq or r["generation"] > seq[-1][0]:
                seq.append((r["generation"], r["size"]))
    return [size for _, size in seq]


