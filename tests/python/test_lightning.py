"""The PyTorch Lightning strategy (issue 24): a LightningModule trained with
``Trainer(strategy=malletrain.lightning.ElasticStrategy(...))`` through a planned leave, a
join in the second epoch and a kill -9 after a backward ends with the fixed-size run's whole
state (parameters, buffers, AdamW, both LR schedulers, Lightning's step and epoch), bitwise
in deterministic mode; and the Trainer settings it cannot honour are refused by name.

The script is tests/python/lightning_job.py (exact_job.py's digits and model). Every run:
loopback store on an ephemeral port, every process started and stopped by the launcher by
pid, a timeout on every wait.
"""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")  # malletrain[lightning]; tests/setup_env.sh installs it

from malletrain import launcher
from malletrain.errors import MalleValueError

from state_compare import assert_same_state
from test_exactness import check_redone_counts, check_run, logs, results, traces

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "lightning_job.py"
STEPS, PER_EPOCH = 33, 11


def run(tmp: pathlib.Path, name: str, nodes: int, schedule: str, *args: str):
    out = tmp / name
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), *args]
    res = launcher.run_local(cmd, nodes=nodes, schedule=schedule, job_id=name, timeout=300,
                             log_dir=str(tmp / f"{name}-logs"), quiet=True)
    return out, res


def finals(out: pathlib.Path):
    """member -> the final state it wrote (every member still in the job at the end)."""
    return {f.stem[len("final-"):]: torch.load(f, weights_only=False)
            for f in sorted(out.glob("final-*.pt"))}


def test_lightning_elastic_fit_ends_with_the_fixed_runs_state(tmp_path):
    """Fixed: 1 rank running the 4 logical workers (one process to start: the test's cost is
    mostly starting processes that import Lightning). Elastic: 3 ranks, 1 leaves at step 5, one (started with the others)
    joins at step 12 or 13
    (second epoch: its loop starts mid-epoch), rank 1 is killed after its backward at step
    22 (the step is redone inside the same Lightning batch). Bitwise the same module state
    (BatchNorm statistics, the module's own buffers), AdamW state, per-step and per-epoch
    schedulers, global step and epoch; every step trained the fixed run's samples; each
    member's loop saw each committed step once, with the batch index and epoch of the job's
    step; the resize callback saw the membership changes."""
    ref, res = run(tmp_path, "fixed", 1, "", "--deterministic")
    assert res.ok, logs(tmp_path, "fixed")
    assert check_redone_counts(ref) == 0
    out, res = run(tmp_path, "elastic", 3, "t=0 join 1, step=5 leave 1", "--deterministic",
                   "--join-at", "12", "--die", "1@22:backward", "--step-sleep", "0.1")
    check_run(tmp_path, "elastic", out, res, deaths=1)

    want = finals(ref)
    assert len(want) == 1
    want = next(iter(want.values()))
    assert want["global_step"] == STEPS and want["epoch"] == 3
    got = finals(out)
    assert len(got) == 2  # the original member and the joiner that survived
    for member, state in got.items():
        assert_same_state(state, want, bitwise=True)

    samples = lambda o: {(r["step"], r["worker"]): r["indices"] for r in traces(o)}  # noqa: E731
    assert samples(out) == samples(ref)
    assert check_redone_counts(out) >= 1
    size_at = {r["step"]: r["size"] for r in traces(out)}
    assert [size_at[s] for s in (0, 8, 16, 30)] == [3, 2, 3, 2], size_at
    # Lightning's batch index and epoch in training_step are the job step's.
    for r in traces(out):
        assert (r["batch_idx"], r["epoch"]) == (r["step"] % PER_EPOCH, r["step"] // PER_EPOCH), r

    joined = 0
    for member, r in results(out).items():
        if r["left"]:
            continue
        steps = [b[0] for b in r["batches"]]
        first = steps[0]
        assert steps == list(range(first, STEPS)), (member, steps)  # each step once
        for i, (step, batch_idx, epoch, global_step) in enumerate(r["batches"]):
            if i == 0 and first > 0:
                # The joiner's first batch: Lightning's loop chose the batch_idx it passes to
                # on_train_batch_end before the boundary told the job's step (documented).
                assert batch_idx == 0
                batch_idx = step % PER_EPOCH
            assert (batch_idx, epoch, global_step) == \
                (step % PER_EPOCH, step // PER_EPOCH, step + 1), (member, r["batches"])
        assert (r["global_step"], r["epoch"]) == (STEPS, 3), member
        assert [e[:2] for e in r["resizes"]] == r["history"], (member, r)
        if first > 0:  # the joiner: its loop started in the second epoch, mid-epoch
            joined += 1
            assert r["history"][0][0] == "joined" and PER_EPOCH < first < 2 * PER_EPOCH, r
    assert joined == 1, results(out)


# --- one rank, no peers: the settings it refuses, the loop it drives -----------------------

def _job(job_id, **kw):
    import malletrain
    store = malletrain._C.ControlStore.serve()
    return store, malletrain.init(store=f"127.0.0.1:{store.port}", bootstrap_size=1,
                                  job_id=job_id, **kw)


class _Tiny(pl.LightningModule):
    def __init__(self, sampler=None, manual=False, n=64):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 1)
        self.sampler, self.n = sampler, n
        self.automatic_optimization = not manual
        self.steps, self.calls = [], 0

    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        data = torch.utils.data.TensorDataset(torch.randn(self.n, 3, generator=g),
                                              torch.randn(self.n, 1, generator=g))
        sampler = self.sampler(data) if self.sampler else None
        return torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler,
                                           shuffle=None if sampler else True)

    def training_step(self, batch, batch_idx):
        self.calls += 1
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.lin(x), y)
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.steps.append((batch.step, batch_idx, self.trainer.global_step))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(job, module, **trainer_kw):
    from malletrain.lightning import ElasticStrategy
    kw = dict(accelerator="cpu", devices=1, max_epochs=2, logger=False,
              enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False)
    kw.update(trainer_kw)
    pl.Trainer(strategy=ElasticStrategy(job=job), **kw).fit(module)


@pytest.mark.parametrize("what, module, trainer_kw, match", [
    ("accumulate", {}, {"accumulate_grad_batches": 2}, "accumulate_grad_batches=2"),
    ("manual", {"manual": True}, {}, "manual optimization"),
    ("limit", {}, {"limit_train_batches": 3}, "limit_train_batches"),
    ("sampler", {"sampler": lambda data: torch.utils.data.SubsetRandomSampler(range(8))},
     {}, "sampler SubsetRandomSampler"),
    ("too small", {"n": 6}, {}, "fewer than one global batch"),
])
def test_unsupported_trainer_settings_are_refused_by_name(what, module, trainer_kw, match):
    store, job = _job(f"refuse-{what.replace(' ', '-')}", logical_workers=2)
    with pytest.raises(MalleValueError, match=match):
        _fit(job, _Tiny(**module), **trainer_kw)
    job.close()


def test_the_loop_sees_one_batch_per_step_and_each_logical_worker_trains():
    """One rank running 2 logical workers, 64 samples of batch 4: 8 steps an epoch, 2
    epochs. Lightning's loop runs 16 batches (global_step 16, on_train_batch_end once per
    step, with the step handle), training_step runs twice per step (once per logical
    worker), and the job committed 16 steps; the strategy closed the job."""
    store, job = _job("loop", logical_workers=2)
    module = _Tiny()
    _fit(job, module)
    assert module.steps == [(s, s % 8, s + 1) for s in range(16)]
    assert module.calls == 32
    assert job.step == 16 and job.closed


def test_a_grad_scaler_acts_once_per_step_and_is_job_state():
    """precision="16-mixed" with a CPU GradScaler (the CUDA path has no GPU here): the
    scaler's unscale/step/update run once per step on the synchronised gradient (its growth
    tracker counts 16 steps, not the 32 micro-batches of 2 logical workers), and the strategy
    made the scaler job state."""
    from lightning.pytorch.plugins.precision import MixedPrecision
    store, job = _job("scaler", logical_workers=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=1000)
    _fit(job, _Tiny(), plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    assert job.step == 16
    assert scaler.state_dict()["_growth_tracker"] == 16 and scaler.get_scale() == 16.0
    assert "grad_scaler" in job._tracked
