"""CUDA models (needs a GPU; every test here skips itself without one, it does not pass).

The digits example trains on the GPU through the same resize and failure schedules as
test_elastic.py: several ranks share the one GPU of the machine, so their gradients go
through Gloo (NCCL refuses two ranks of one communicator on one device); a one-rank job
exercises NCCL. Run on an H100 on 2026-11-23 (docs/benchmarks.md, "GPU").
"""

from __future__ import annotations

import os

import pytest
import torch

from state_compare import assert_same_state
from digits_runs import (check_replicas_and_data, final_state, logs, read_traces,
                         run_job, sizes_seen)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

CUDA = ["--device", "cuda"]
# As in test_elastic.py: the state goes from the flat buffers as they are, and a joiner
# receives it in place, which on the GPU means into its CUDA buffers.
DIRECT = {"MALLE_STATE_DIRECT_MIN_BYTES": "4096"}


@pytest.fixture(scope="module")
def fixed_cuda(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fixed-cuda")
    out, res = run_job(tmp, "fixed4", 4, extra=CUDA)
    assert res.ok, logs(tmp, "fixed4")
    return final_state(out)


def test_cuda_resize_4_2_3_4_matches_the_fixed_run(tmp_path, fixed_cuda):
    # A rank process needs about 10 s to be ready here (import torch, CUDA context, with
    # other ranks on the same GPU): the joiners start early and 16 steps apart, so they are
    # admitted one at a time.
    out, res = run_job(tmp_path, "resize", 4, "step=8 leave 2, step=10 join 1, step=26 join 1",
                       extra=CUDA, step_sleep=0.5, env=dict(os.environ, **DIRECT))
    assert res.ok, logs(tmp_path, "resize")
    rows = read_traces(out)
    assert sizes_seen(rows) == [4, 2, 3, 4]
    assert_same_state(final_state(out), fixed_cuda)
    check_replicas_and_data(rows)


def test_cuda_kill_9_matches_the_fixed_run(tmp_path, fixed_cuda):
    out, res = run_job(tmp_path, "kills", 4, "step=6 kill 1, step=12 join 1, step=30 kill 1",
                       extra=CUDA, step_sleep=0.15, env=dict(os.environ, **DIRECT))
    assert res.ok, logs(tmp_path, "kills")
    assert_same_state(final_state(out), fixed_cuda)
    check_replicas_and_data(read_traces(out))


def test_nccl_one_rank_per_gpu(tmp_path):
    out, res = run_job(tmp_path, "nccl", 1, extra=CUDA,
                       env=dict(os.environ, MALLE_BACKEND="nccl"))
    assert res.ok, logs(tmp_path, "nccl")
    check_replicas_and_data(read_traces(out), workers=4)


def test_cuda_amp_grad_scaler_matches_the_fixed_run(tmp_path, tmp_path_factory):
    """The CUDA GradScaler (issue 24): bf16 autocast on the GPU, a scale that overflows every
    few steps, through a planned leave, a join and a kill -9 after a backward; the whole
    state (parameters, buffers, AdamW, scheduler, scaler) equals the fixed 4-rank CUDA run's,
    and the scaler's scale after every step is the fixed run's (the same steps skipped)."""
    from test_exactness import check_redone_counts, check_run, results
    from test_loops import final, run

    amp = ("--amp", "--deterministic", "--device", "cuda")
    ref, res = run(tmp_path_factory.mktemp("loops-fixed-cuda"), "fixed", 4, "", *amp)
    assert res.ok, res
    out, res = run(tmp_path, "amp", 4, "step=5 leave 2, t=0 join 1", *amp,
                   "--step-sleep", "0.1", "--die", "1@14:backward")
    check_run(tmp_path, "amp", out, res, deaths=1)
    got, want = final(out), final(ref)
    assert got["scaler"] == want["scaler"]
    worst = assert_same_state(got, want)
    print(f"largest relative difference from the fixed CUDA run: {worst:.3g}")
    scales = {s: v for r in results(out).values() for s, v in r["scales"].items()}
    ref_scales = next(r["scales"] for r in results(ref).values() if r["scales"])
    assert {s: scales[s] for s in ref_scales} == ref_scales
    seq = [ref_scales[str(s)] for s in range(24)]
    assert sum(1 for a, b in zip([2.0**103] + seq, seq) if b < a) >= 3, seq  # steps skipped
    assert check_redone_counts(out) >= 1
