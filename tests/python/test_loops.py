"""The training loops people write (issue 24), each against the fixed-size run of the same
loop: AMP with a GradScaler that skips steps, clipping of the synchronised gradient, an LR
scheduler on the wrapped optimizer, torch.compile with optimizer.step(closure), an iterable
dataset with a resumable position, persistent DataLoader workers with drop_last=False, the
resize and step callbacks. Through planned leaves, joins and kill -9 during a step; the
whole final state (parameters, buffers, optimizer, scheduler, scaler) is compared.

The script is tests/python/loops_job.py. Every run: loopback store on an ephemeral port,
every process started and stopped by the launcher by pid, a timeout on every wait.
"""

from __future__ import annotations

import os
import pathlib
import sys

import pytest
import torch

from malletrain import launcher

from state_compare import assert_same_state, differences
from test_exactness import check_redone_counts, check_run, logs, results, traces

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "loops_job.py"


def run(tmp: pathlib.Path, name: str, nodes: int, schedule: str, *args: str, env=None):
    """``env``: variables added to this process's environment for the ranks."""
    out = tmp / name
    env = dict(os.environ, **env) if env else None
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), *args]
    res = launcher.run_local(cmd, nodes=nodes, schedule=schedule, job_id=name, timeout=300,
                             log_dir=str(tmp / f"{name}-logs"), quiet=True, env=env)
    return out, res


def final(out: pathlib.Path):
    return torch.load(out / "final.pt", weights_only=False)


_FIXED = {}


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """fixed(*args): the fixed 4-rank run of the loop with these arguments (run once)."""
    tmp = tmp_path_factory.mktemp("loops-fixed")

    def get(*args: str, env=None) -> pathlib.Path:
        if args not in _FIXED:
            name = f"fixed{len(_FIXED)}"
            out, res = run(tmp, name, 4, "", *args, env=env)
            assert res.ok, logs(tmp, name)
            assert check_redone_counts(out) == 0
            _FIXED[args] = out
        return _FIXED[args]
    return get


def same_samples(out: pathlib.Path, ref: pathlib.Path) -> None:
    """Every (step, logical worker) trained the reference run's samples (its last attempt)."""
    want = {(r["step"], r["worker"]): r["indices"] for r in traces(ref)}
    got = {(r["step"], r["worker"]): r["indices"] for r in traces(out)}
    assert got == want


def callbacks_saw_every_commit_once(out: pathlib.Path, steps: int) -> None:
    for member, r in results(out).items():
        if r["left"]:
            continue
        seq = r["callback_steps"]
        assert seq == sorted(set(seq)) and seq[-1] == steps - 1, (member, seq)
        assert r["callback_resizes"] == r["history"][1:] or \
            r["callback_resizes"] == r["history"], (member, r)


AMP = ("--amp", "--deterministic")


def test_amp_grad_scaler_skips_steps_like_the_fixed_run(tmp_path, fixed):
    """bf16 autocast and a GradScaler whose scale overflows every few steps: the skipped
    steps are ordinary steps, the same ones as in the fixed run, through a planned leave, a
    join and a kill -9 after a backward; parameters, buffers, AdamW, scheduler and the
    scaler's scale and growth tracker are bitwise the fixed run's."""
    ref = fixed(*AMP)
    out, res = run(tmp_path, "amp", 4, "step=5 leave 2, t=0 join 1", *AMP,
                   "--step-sleep", "0.1", "--die", "1@14:backward")
    check_run(tmp_path, "amp", out, res, deaths=1)
    want = final(ref)
    assert_same_state(final(out), want, bitwise=True)
    
    scales = next(r["scales"] for r in results(ref).values() if r["scales"])
    # Skipped steps: the scale went down after them (an inf in the gradient).
    seq = [scales[str(s)] for s in range(24)]
    skipped = sum(1 for a, b in zip([2.0**103] + seq, seq) if b < a)
    assert skipped >= 3, seq
    assert check_redone_counts(out) >= 1
    assert {r["size"] for r in traces(out)} >= {4, 2}


CLIP = ("--clip", "0.05", "--deterministic")


def test_clip_grad_norm_sees_the_synchronised_gradient(tmp_path, fixed):
    """opt.clip_grad_norm_ clips the full gradient once per step, in deterministic mode
    (where the reduction happens in step()): bitwise the fixed run, through a leave and a
    kill -9; the norms it returned are the fixed run's. Clipping with torch.nn.utils before
    step() (the local, partial gradient) is not."""
    ref = fixed(*CLIP)
    out, res = run(tmp_path, "clip", 4, "step=4 leave 2", *CLIP, "--die", "1@9:backward")
    check_run(tmp_path, "clip", out, res, deaths=1)
    assert_same_state(final(out), final(ref), bitwise=True)
    want = next(r["norms"] for r in results(ref).values() if r["norms"])
    assert all(v > 0.05 for v in want.values())  # clipping bit every step
    for r in results(out).values():
        for s, v in r["norms"].items():
            assert v == want[s], (s, v, want[s])
    # The wrong way: torch.nn.utils.clip_grad_norm_ before opt.step() on every micro-batch.
    naive, res = run(tmp_path, "naive", 2, "", *CLIP, "--naive-clip")
    assert res.ok, logs(tmp_path, "naive")
    diffs, _ = differences(final(naive), final(ref), bitwise=True)
    assert diffs


def test_scheduler_takes_the_wrapped_optimizer_and_steps_once_per_commit(tmp_path, fixed):
    """StepLR(opt) on the wrapped optimizer, stepped when opt.step() says the step
    committed, with per-step iteration (loader.steps(), whose len() is the step count): the
    fixed run's state through a leave, a join and a kill -9 of rank 0 after its backward
    (a kill after its step could land after every rank committed: no redo); the step
    callback saw each committed step once, the resize callback each membership change."""
    ref = fixed("--per-step")
    out, res = run(tmp_path, "sched", 3, "step=6 leave 1, t=0 join 1", "--per-step",
                   "--step-sleep", "0.1", "--die", "0@12:backward")
    check_run(tmp_path, "sched", out, res, deaths=1)
    got = final(out)
    assert_same_state(got, final(ref))
    assert got["scheduler"]["last_epoch"] == 24
    assert all(r["n_steps"] == 24 for r in results(ref).values())
    callbacks_saw_every_commit_once(out, 24)
    assert check_redone_counts(out) >= 1


COMPILE = ("--compile", "--closure", "--steps", "12")
# Dynamo and AOTAutograd (graph capture, the compiled backward accumulating into .grad, the
# buffers updated by the graph), without inductor's C++ code generation, which costs ~100 s
# more on two cores; with inductor this test passed too (2026-11-25, 133 s).
AOT = {"LOOPS_COMPILE_BACKEND": os.environ.get("LOOPS_COMPILE_BACKEND", "aot_eager")}


def test_compiled_model_with_a_closure_matches_the_fixed_run(tmp_path, fixed):
    """torch.compile of the wrapped model, trained with optimizer.step(closure): the fixed
    (compiled) run's state through a leave and a kill -9."""
    ref = fixed(*COMPILE, env=AOT)
    out, res = run(tmp_path, "compile", 3, "step=3 leave 1", *COMPILE,
                   "--die", "1@7:backward", env=AOT)
    check_run(tmp_path, "compile", out, res, deaths=1)
    assert_same_state(final(out), final(ref))
    assert check_redone_counts(out) >= 1


STREAM = ("--stream", "--deterministic")


def test_iterable_dataset_is_read_exactly_once_through_resizes(tmp_path, fixed):
    """An IterableDataset with a resumable position: every step trains the fixed run's
    samples on the same logical workers (so every sample of the stream once) through a
    leave, a join (which receives the position) and a kill -9 (the redo rewinds it);
    bitwise the fixed run's state."""
    ref = fixed(*STREAM)
    out, res = run(tmp_path, "stream", 4, "step=5 leave 2, t=0 join 1", *STREAM,
                   "--step-sleep", "0.1", "--die", "1@15:forward")
    check_run(tmp_path, "stream", out, res, deaths=1)
    same_samples(out, ref)
    assert_same_state(final(out), final(ref), bitwise=True)
    assert check_redone_counts(out) >= 1


WORKERS = ("--num-workers", "2", "--persistent-workers", "--keep-last", "--epochs", "0.2")


def test_persistent_workers_and_drop_last_false(tmp_path, fixed):
    """Persistent DataLoader workers across resizes, and drop_last=False (0.2 epochs of
    1400 samples at 32 a step: 9 steps, the last one completed from the next epoch): the
    fixed run's samples and state through a leave and a kill -9."""
    ref = fixed(*WORKERS)
    out, res = run(tmp_path, "workers", 4, "step=2 leave 1", *WORKERS,
                   "--die", "1@5:forward")
    check_run(tmp_path, "workers", out, res, deaths=1)
    assert final(ref)["steps"] == 9
    same_samples(out, ref)
    assert_same_state(final(out), final(ref))


# --- one rank, no peers: the API's contracts -----------------------------------------------

def _job(job_id, **kw):
    import malletrain
    store = malletrain._C.ControlStore.serve()
    return store, malletrain.init(store=f"127.0.0.1:{store.port}", bootstrap_size=1,
                                  job_id=job_id, **kw)


class _Plain(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(torch.arange(1000.0).view(-1, 1))


def test_an_iterable_dataset_without_a_position_is_refused_and_lbfgs_too():
    from malletrain.errors import MalleValueError
    store, job = _job("refuse", logical_workers=2)
    model = job.wrap_model(torch.nn.Linear(1, 1))
    with pytest.raises(MalleValueError, match="LBFGS"):
        job.wrap_optimizer(torch.optim.LBFGS(model.parameters()))
    job.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(MalleValueError, match="resumable position, state_dict"):
        job.loader(_Plain(), batch_size=2, steps=3)
    job.close()


class _Recorder:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, step))

    def flush(self):
        pass


def test_per_step_iteration_scheduler_on_the_wrapped_optimizer_and_callbacks():
    """One rank running 4 logical workers: loader.steps() has one item per step and len()
    the step count, the loader itself no len(); StepLR takes the wrapped optimizer;
    step() is True once per step; the callbacks see each step and the bootstrap."""
    import malletrain
    store, job = _job("steps", logical_workers=4)
    model = job.wrap_model(torch.nn.Linear(3, 1))
    opt = job.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(opt, torch.optim.Optimizer)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    job.track("sched", sched)
    seen = []

    class CB(malletrain.callbacks.Callback):
        def on_step_end(self, job, step):
            seen.append(("step", step))

        def on_resize(self, job, event):
            seen.append((event.kind, event.size))

    job.add_callback(CB())
    tb = malletrain.callbacks.TensorBoard("unused", batch_size=2, every=2, writer=_Recorder())
    job.add_callback(tb)
    data = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
    loader = job.loader(data, batch_size=2, steps=5)
    with pytest.raises(TypeError):
        len(loader)
    steps = loader.steps()
    assert len(steps) == 5
    results = []
    for step in steps:
        n = 0
        for x, y in step:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            results.append(opt.step())
            n += 1
        assert n == 4
        sched.step()
    job.close()
    assert results == [False, False, False, True] * 5
    assert seen == [("bootstrap", 1)] + [("step", s) for s in range(5)]
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)
    assert ("elastic/world_size", 0) in tb.writer.scalars
    assert any(t == "elastic/samples_per_s" for t, _ in tb.writer.scalars)
