"""Parking (issue 22) under ``malletrain local``: a job that loses every rank keeps its
progress. The whole final state (parameters, BatchNorm statistics and counters, a user
module's buffers, AdamW's state, the tracked scheduler) is compared bit for bit with a run
that never stopped (deterministic mode), with random augmentation in ``__getitem__`` and a
``collate_fn``.

- SIGTERM to every rank at once (a whole allocation preempted with a grace period): they
  all leave at the next step boundary, the last one parks; a new run resumes at that step.
- kill -9 of every rank at once: the new run resumes from the newest snapshot and redoes
  only the steps since it; with the newest snapshot corrupted, from the one before.
- Bad input: another model's parked state is a MalleValueError naming the mismatch.
- A user's own checkpoint: ``job.save`` / ``init(resume_from=...)``, ``job.export`` loads
  into plain PyTorch.

The script is the tests' own (tests/python/exact_job.py). Every run: loopback store on an
ephemeral port, processes started and stopped by the launcher by pid, a timeout on every
wait.
"""

from __future__ import annotations

import shutil
import sys

import pytest
import torch

from malletrain import launcher

from state_compare import assert_same_state
from test_exactness import HERE, logs, results, traces

SCRIPT = HERE / "exact_job.py"
STEPS = 30
ARGS = ("--deterministic", "--aug", "both")


def run(tmp, name, nodes, *args, park=None):
    out = tmp / name
    cmd = [sys.executable, str(SCRIPT), "--steps", str(STEPS), "--out", str(out), *ARGS, *args]
    res = launcher.run_local(cmd, nodes=nodes, job_id="parked-job", timeout=240,
                             log_dir=str(tmp / f"{name}-logs"), quiet=True,
                             park_dir=str(park) if park else None)
    return out, res


def final(out):
    return torch.load(out / "final.pt")


def state_files(park):
    return sorted(p.name for p in park.iterdir() if p.suffix == ".mstate")


def steps_started(out):
    return sorted({r["step"] for r in traces(out)})


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("park-fixed")
    out, res = run(tmp, "fixed", 2)
    assert res.ok, logs(tmp, "fixed")
    return out


def test_sigterm_to_every_rank_parks_and_resumes_at_the_exact_step(tmp_path, fixed):
    park = tmp_path / "park"
    out, res = run(tmp_path, "preempted", 3, "--term-all", "12", "--snapshot-every", "-1",
                   park=park)
    assert not res.timed_out and all(c == 0 for c in res.exit_codes.values()), \
        (res.exit_codes, logs(tmp_path, "preempted"))
    r = results(out)
    parkers = [m for m, v in r.items() if v["parked"]]
    assert len(parkers) == 1, r  # the last member, and only it
    at = r[parkers[0]]["steps"]
    assert 12 < at < STEPS, r
    assert not (out / "final.pt").exists()
    files = state_files(park)
    assert len(files) == 1 and f"state-{at:012d}-" in files[0], files

    out2, res2 = run(tmp_path, "resumed", 2, park=park)
    assert res2.ok, logs(tmp_path, "resumed")
    r2 = results(out2)
    assert {v["resumed_at"] for v in r2.values()} == {at}, r2
    assert sum(bool(v["resumed_from"]) for v in r2.values()) == 1  # the bootstrap's source
    assert steps_started(out2) == list(range(at, STEPS))
    assert_same_state(final(out2), final(fixed), bitwise=True)


def test_kill9_of_every_rank_resumes_from_the_newest_good_snapshot(tmp_path, fixed):
    park = tmp_path / "park"
    out, res = run(tmp_path, "killed", 2, "--die-all", "17", "--snapshot-every", "5",
                   park=park)
    assert sorted(res.exit_codes.values()) == [-9, -9], (res.exit_codes, logs(tmp_path, "killed"))
    files = state_files(park)
    # Snapshots at the boundaries of steps 5, 10 and 15; the two newest are kept.
    assert [f[len("state-"):len("state-") + 12] for f in files] == ["000000000010", "000000000015"], files
    spare = tmp_path / "park-copy"
    shutil.copytree(park, spare)

    out2, res2 = run(tmp_path, "resumed", 2, park=park)
    assert res2.ok, logs(tmp_path, "resumed")
    assert {v["resumed_at"] for v in results(out2).values()} == {15}
    assert steps_started(out2) == list(range(15, STEPS))  # only the steps since the snapshot
    assert_same_state(final(out2), final(fixed), bitwise=True)

    # The newest snapshot corrupted (a bit flipped on disk): refused, the one before is used.
    newest = spare / files[-1]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x10
    newest.write_bytes(bytes(data))
    out3, res3 = run(tmp_path, "fallback", 1, park=spare)
    assert res3.ok, logs(tmp_path, "fallback")
    assert {v["resumed_at"] for v in results(out3).values()} == {10}
    assert "checksum mismatch" in logs(tmp_path, "fallback")
    assert_same_state(final(out3), final(fixed), bitwise=True)


def test_another_models_parked_state_is_a_value_error(tmp_path):
    park = tmp_path / "park"
    out, res = run(tmp_path, "first", 1, "--term-all", "3", "--snapshot-every", "-1", park=park)
    assert res.ok and len(state_files(park)) == 1, logs(tmp_path, "first")
    out2, res2 = run(tmp_path, "other", 1, "--model", "other", park=park)
    assert not res2.ok
    text = logs(tmp_path, "other")
    assert "MalleValueError" in text and "model mismatch" in text, text
    assert not (out2 / "final.pt").exists()


def test_save_resume_from_and_export(tmp_path, fixed):
    out, res = run(tmp_path, "saver", 2, "--save-at", "9")
    assert res.ok, logs(tmp_path, "saver")
    ckpt = out / "ckpt.mstate"
    assert ckpt.exists()
    out2, res2 = run(tmp_path, "from-ckpt", 3, "--resume-from", str(ckpt))
    assert res2.ok, logs(tmp_path, "from-ckpt")
    assert {v["resumed_at"] for v in results(out2).values()} == {9}
    assert_same_state(final(out2), final(fixed), bitwise=True)

    # The export is plain PyTorch: a fresh model and optimizer load it.
    sys.path.insert(0, str(HERE))
    import exact_job

    exported = torch.load(out / "export.pt")
    assert exported["step"] == 9
    model = exact_job.build_model()
    model.load_state_dict(exported["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    opt.load_state_dict(exported["optimizer"])
    assert int(model[1].num_batches_tracked) == 9
