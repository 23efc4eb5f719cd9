"""Unit tests of the elastic training pieces that need no peers: sampler, state packing,
worker assignment, argument checks."""

from __future__ import annotations

import collections
import json

import pytest
import torch

import malletrain
from malletrain import state as mstate
from malletrain.errors import MalleValueError
from malletrain.sampler import ElasticSampler, assign_workers, mix_seed


def test_sampler_is_a_pure_function_of_seed_step_and_worker():
    a = ElasticSampler(103, logical_workers=4, batch_size=5, seed=7)
    b = ElasticSampler(103, logical_workers=4, batch_size=5, seed=7)
    # Ask in a different order (a redo after a failure, a new owner after a resize).
    first = [a.indices(s, k) for s in range(12) for k in range(4)]
    second = [b.indices(s, k) for s in reversed(range(12)) for k in reversed(range(4))]
    assert first == list(reversed(second))
    assert ElasticSampler(103, 4, 5, seed=8).indices(0, 0) != a.indices(0, 0)


def test_every_sample_once_per_epoch_even_when_steps_straddle_epochs():
    n, workers, bs = 103, 4, 5  # 20 samples per step: epochs end mid-step
    s = ElasticSampler(n, workers, bs, seed=3)
    per_epoch = collections.defaultdict(list)
    for step in range(26):  # 520 samples: 5 full epochs and a part
        for k in range(workers):
            for i, e in zip(s.indices(step, k), s.sample_epochs(step, k)):
                per_epoch[e].append(i)
    for e in range(5):
        assert sorted(per_epoch[e]) == list(range(n)), e
    assert len(set(per_epoch[5])) == len(per_epoch[5]) == 520 - 5 * n
    assert s.epoch_of(0) == 0 and s.epoch_of(6) == 1  # step 6 starts at sample 120
    assert s.steps_for_epochs(2) == 10  # 206 // 20


def test_unshuffled_sampler_reads_in_order():
    s = ElasticSampler(10, 2, 2, shuffle=False)
    assert s.indices(0, 0) == [0, 1] and s.indices(0, 1) == [2, 3]
    assert s.indices(2, 1) == [0, 1]  # stream position 10: epoch 1 starts over
    assert s.stream(8, 4) == [8, 9, 0, 1]


@pytest.mark.parametrize(
    "args, message",
    [((7, 4, 2), "fewer than one global batch"),
     ((0, 1, 1), "num_samples"),
     ((10, 0, 1), "logical_workers"),
     ((10, 1, -1), "batch_size")])
def test_sampler_rejects_bad_arguments(args, message):
    with pytest.raises(MalleValueError, match=message):
        ElasticSampler(*args)


def test_sampler_rejects_bad_step_and_worker():
    s = ElasticSampler(10, 2, 2)
    with pytest.raises(MalleValueError, match="worker"):
        s.indices(0, 2)
    with pytest.raises(MalleValueError, match="step"):
        s.indices(-1, 0)


def test_workers_are_contiguous_blocks_and_rank0_has_worker0():
    for n in range(1, 9):
        blocks = [assign_workers(8, n, r) for r in range(n)]
        flat = [k for b in blocks for k in b]
        assert flat == list(range(8)), n
        assert 0 in blocks[0]
        assert max(len(b) for b in blocks) - min(len(b) for b in blocks) <= 1
    assert list(assign_workers(4, 3, 0)) == [0, 1]
    with pytest.raises(MalleValueError, match="exceeds logical_workers"):
        assign_workers(2, 3, 0)


def test_mix_seed_is_stable_and_spreads():
    assert mix_seed(1, 2, 3) == mix_seed(1, 2, 3)
    seeds = {mix_seed(0, s, k) for s in range(100) for k in range(8)}
    assert len(seeds) == 800
    assert all(0 <= x < 2**63 for x in seeds)


def test_a_python_part_keeps_its_tensors_and_pickles_only_the_skeleton():
    """An optimizer's state_dict becomes (its tensors, the pickled rest): the tensors are the
    optimizer's own objects (the engine moves them into flat buffers in place and sends them
    with the model's), and the state comes back whole."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    sd = opt.state_dict()
    tensors, data = mstate.to_part(sd)
    assert len(tensors) == 4 * 3  # exp_avg, exp_avg_sq, step per parameter
    assert any(t is opt.state[model[0].weight]["exp_avg"] for t in tensors)
    assert b"exp_avg" in data and len(data) < 2000  # no tensor data in the pickle
    back = mstate.from_part([t.clone() for t in tensors], data)
    opt2 = torch.optim.Adam(model.parameters())
    opt2.load_state_dict(back)
    assert opt2.state_dict()["param_groups"] == sd["param_groups"]
    assert torch.equal(opt2.state[model[0].weight]["exp_avg_sq"],
                       opt.state[model[0].weight]["exp_avg_sq"])
    with pytest.raises(MalleValueError, match="corrupt part"):
        mstate.from_part([], b"not a pickle")
    with pytest.raises(MalleValueError, match="tensor 0 of a part that has 0"):
        mstate.from_part([], data)
    with pytest.raises(MalleValueError, match="cannot be part of it"):
        mstate.to_part({"s": torch.zeros(3, 3).to_sparse()})


def _job(job_id, **kw):
    store = malletrain._C.ControlStore.serve()
    return store, malletrain.init(store=f"127.0.0.1:{store.port}", bootstrap_size=1,
                                  job_id=job_id, **kw)


def test_wrap_model_flattens_the_model_and_keeps_a_channels_last_weight_as_it_is():
    store, job = _job("flat", logical_workers=1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Linear(4, 4),
                                torch.nn.BatchNorm1d(4))
    model[0].to(memory_format=torch.channels_last)
    strides = model[0].weight.stride()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model[1].weight
    job.wrap_model(model)
    assert model[1].weight is weight  # the same Parameter objects, new storage
    assert model[0].weight.stride() == strides  # its layout is the user's choice
    storage = model[1].weight.untyped_storage().data_ptr()
    assert model[0].bias.untyped_storage().data_ptr() == storage  # one float32 buffer
    assert model[2].running_mean.untyped_storage().data_ptr() == storage
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    job.close()


def test_digest_sees_one_changed_bit():
    store, job = _job("digest", logical_workers=1)
    model = job.wrap_model(torch.nn.Linear(4, 3))
    job.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with torch.no_grad():
        model.module.bias.zero_()
    d0 = job.state_digest()
    assert job.state_digest() == d0
    with torch.no_grad():
        model.module.bias[1] = -0.0  # a different bit pattern, equal value
    assert job.state_digest() != d0
    job.close()


def test_init_rejects_bad_arguments(monkeypatch):
    monkeypatch.delenv("MALLE_STORE", raising=False)
    with pytest.raises(MalleValueError, match="no control store"):
        malletrain.init(logical_workers=4)
    with pytest.raises(MalleValueError, match="host:port"):
        malletrain.init(logical_workers=4, store="nowhere")
    with pytest.raises(MalleValueError, match="logical_workers"):
        malletrain.init(logical_workers=0, store="127.0.0.1:1")
    with pytest.raises(MalleValueError, match="lr_scaling"):
        malletrain.init(logical_workers=None, store="127.0.0.1:1")
    with pytest.raises(MalleValueError, match="lr_scaling: only with"):
        malletrain.init(logical_workers=2, lr_scaling="linear", store="127.0.0.1:1")
    with pytest.raises(MalleValueError, match="deterministic"):
        malletrain.init(lr_scaling="sqrt", deterministic=True, store="127.0.0.1:1")


def test_fewer_logical_workers_than_the_starting_size_is_an_error():
    store = malletrain._C.ControlStore.serve()
    with pytest.raises(MalleValueError, match="smaller than the job's starting size 4"):
        malletrain.init(logical_workers=2, store=f"127.0.0.1:{store.port}", bootstrap_size=4)


def test_max_recoveries_without_commit_is_validated_at_init():
    store = malletrain._C.ControlStore.serve()
    with pytest.raises(MalleValueError, match="max_recoveries_without_commit must be >= 1"):
        malletrain.init(logical_workers=1, store=f"127.0.0.1:{store.port}", bootstrap_size=1,
                        job_id="cap", max_recoveries_without_commit=0)


def test_a_grace_shorter_than_the_watchdog_tick_is_refused():
    """A survivor busy computing checks in at its watchdog's next tick: a 50 ms grace with
    the default 100 ms tick would declare it failed."""
    store = malletrain._C.ControlStore.serve()
    with pytest.raises(MalleValueError, match="must be at least heartbeat_interval"):
        malletrain.init(logical_workers=1, store=f"127.0.0.1:{store.port}", bootstrap_size=1,
                        job_id="grace", recovery_grace=0.05)
    ok = malletrain.init(logical_workers=1, store=f"127.0.0.1:{store.port}", bootstrap_size=1,
                         job_id="grace2", recovery_grace=0.05, heartbeat_interval=0.05)
    ok.join()
    assert ok.size == 1
    ok.close()


def test_loader_rejects_a_dataset_smaller_than_the_global_batch():
    store = malletrain._C.ControlStore.serve()
    job = malletrain.init(logical_workers=4, store=f"127.0.0.1:{store.port}", bootstrap_size=1,
                          job_id="small")
    job.wrap_model(torch.nn.Linear(2, 1))
    data = torch.utils.data.TensorDataset(torch.zeros(10, 2))
    with pytest.raises(MalleValueError, match="10 samples, fewer than one global batch"):
        job.loader(data, batch_size=4, steps=1)
    with pytest.raises(MalleValueError, match="exactly one of steps= or epochs="):
        job.loader(data, batch_size=1)
    with pytest.raises(MalleValueError, match="call wrap_model first|already"):
        job.wrap_model(torch.nn.Linear(2, 1))
    job.close()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_single_rank_job_trains_and_matches_plain_accumulation(set_to_none):
    """One rank running all 4 logical workers equals plain 4-micro-batch averaging, whether
    zero_grad drops the gradients or zeroes them in place (then they stay views of the
    Reducer's buckets, and the no-sync micro-batches accumulate into those)."""
    store = malletrain._C.ControlStore.serve()
    torch.manual_seed(0)
    x = torch.randn(64, 5)
    y = x @ torch.randn(5, 1)
    data = torch.utils.data.TensorDataset(x, y)

    def net():
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    job = malletrain.init(logical_workers=4, store=f"127.0.0.1:{store.port}",
                          bootstrap_size=1, job_id="one", seed=5, bucket_cap_mb=0.0001)
    model = job.wrap_model(net())
    opt = job.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for xb, yb in job.loader(data, batch_size=2, steps=6):
        opt.zero_grad(set_to_none=set_to_none)
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    assert job.step == 6 and job.size == 1 and list(job.workers) == [0, 1, 2, 3]
    job.close()

    ref = net()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    sampler = ElasticSampler(64, 4, 2, seed=5)
    for step in range(6):
        ref_opt.zero_grad()
        for k in range(4):
            idx = sampler.indices(step, k)
            (torch.nn.functional.mse_loss(ref(x[idx]), y[idx]) / 4).backward()
        ref_opt.step()
    for a, b in zip(model.module.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


class _Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((3,), float(i)), torch.tensor([float(i)]), i


def test_loader_with_dataloader_workers_reads_every_sample_once_per_epoch():
    store = malletrain._C.ControlStore.serve()
    job = malletrain.init(logical_workers=2, store=f"127.0.0.1:{store.port}",
                          bootstrap_size=1, job_id="workers")
    model = job.wrap_model(torch.nn.Linear(3, 1))
    opt = job.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    seen = []
    for x, y, i in job.loader(_Numbers(), batch_size=4, steps=10, num_workers=2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x) / 100, y / 100).backward()
        opt.step()
        seen += i.tolist()
    job.close()
    assert job.step == 10
    assert sorted(seen[:40]) == list(range(40)) and sorted(seen[40:]) == list(range(40))


# The bucket layout fixed at creation (reverse parameter order, never rebuilt) is the C++
# GradReducer's: tests/cpp/elastic/grad_reducer_test.cc. How the advisor splits a step's time
# (the boundary is communication between ranks) is the engine's: SampleOfStep in
# tests/cpp/elastic/engine_test.cc.


def test_backend_is_checked():
    with pytest.raises(MalleValueError, match="backend: must be 'gloo' or 'nccl'"):
        malletrain.init(logical_workers=1, store="127.0.0.1:1", backend="mpi")
    store = malletrain._C.ControlStore.serve()
    if not torch.cuda.is_available():
        # NCCL needs a CUDA device per rank (LOCAL_RANK's): refused at init, naming the cause.
        with pytest.raises(MalleValueError, match="sees no CUDA device.*use backend 'gloo'"):
            malletrain.init(logical_workers=1, store=f"127.0.0.1:{store.port}",
                            bootstrap_size=1, job_id="nccl-cpu", backend="nccl")
    else:
        job = malletrain.init(logical_workers=1, store=f"127.0.0.1:{store.port}",
                              bootstrap_size=1, job_id="nccl-cpu", backend="nccl")
        # NCCL reduces CUDA tensors only: a CPU model is refused when it is wrapped.
        with pytest.raises(MalleValueError, match="backend='nccl' reduces CUDA tensors"):
            job.wrap_model(torch.nn.Linear(4, 4))
    with pytest.raises(MalleValueError, match="data_backend: got 'mpi'"):
        malletrain._C.ElasticGroup.join(store, "x", data_backend="mpi")


def test_model_without_trainable_parameters_is_refused():
    store = malletrain._C.ControlStore.serve()
    job = malletrain.init(logical_workers=1, store=f"127.0.0.1:{store.port}",
                          bootstrap_size=1, job_id="frozen")
    frozen = torch.nn.Linear(4, 4).requires_grad_(False)
    with pytest.raises(MalleValueError, match="no parameter that requires a gradient"):
        job.wrap_model(frozen)


# Landing buffers and the state layout's format are the engine's (state_pack.h):
# tests/cpp/elastic/state_pack_test.cc, StateLayoutTest.


def test_the_leader_publishes_its_state_layout_and_a_joiner_faults_in_its_landing(monkeypatch):
    """After the first step (Adam's state appears), rank 0 publishes the segments of its
    state; a rank that wraps its optimizer afterwards (a joiner, warming up) prepares one
    buffer for the moments, which its own parameters' buffer cannot take. A corrupt
    published layout is ignored with a warning: it only saves page faults."""
    monkeypatch.setenv("MALLE_STATE_DIRECT_MIN_BYTES", "4096")
    store = malletrain._C.ControlStore.serve()
    addr = f"127.0.0.1:{store.port}"

    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(40, 50), torch.nn.Linear(50, 4))

    data = torch.utils.data.TensorDataset(torch.randn(16, 40), torch.randn(16, 4))
    job = malletrain.init(logical_workers=1, store=addr, bootstrap_size=1, job_id="layout")
    model = job.wrap_model(net())
    opt = job.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
    assert job._engine.landing_bytes == 0  # nothing published yet: a new job
    key = malletrain._C.state_layout_key("layout")
    assert store.try_get(key) is None
    for x, y in job.loader(data, batch_size=4, steps=2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    published = json.loads(store.try_get(key))

    def span(sizes):  # every tensor of a flat buffer starts on a 64-byte boundary
        return sum(-(-n // 16) * 16 for n in sizes[:-1]) + sizes[-1]

    sizes = [p.numel() for p in net().parameters()]
    params = span(sizes)
    moments = span([k for n in sizes for k in (1, n, n)])  # Adam: step, exp_avg, exp_avg_sq
    # Sent from the job's own buffers: the parameters' and the optimizer's.
    assert [s for s in published if s[3]] == [["float32", params, "cpu", True],
                                              ["float32", moments, "cpu", True]]

    joiner = malletrain.init(logical_workers=1, store=addr, job_id="layout")
    joiner.wrap_model(net())
    joiner.wrap_optimizer(torch.optim.Adam(joiner._model.module.parameters(), lr=1e-3))
    assert joiner._engine.landing_bytes == moments * 4  # its own buffers take the parameters

    store.set(key, b'[["float32", "many", "cpu", true]]')
    late = malletrain.init(logical_workers=1, store=addr, job_id="layout")
    late.wrap_model(net())
    late.wrap_optimizer(torch.optim.Adam(late._model.module.parameters(), lr=1e-3))
    assert late._engine.landing_bytes == 0  # a corrupt layout is ignored (it only saves faults)
    for j in (job, joiner, late):
        j.close()


class _Noisy(torch.utils.data.Dataset):
    """Random augmentation in __getitem__: a sample plus a draw of torch's CPU generator."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.full((2,), float(i)) + torch.randn(2)


def test_micro_batches_seed_the_cpu_generator_as_manual_seed_does_and_nothing_more(monkeypatch):
    """Without an accelerator, a micro-batch's fetch seeds only torch's CPU generator: the
    draws are torch.manual_seed(seed)'s, without the lazy seeding torch queues for devices
    that cannot start here (a stack trace formatted per device and call)."""
    from malletrain import data as mdata

    if mdata._accelerators():
        pytest.skip("an accelerator is present: torch.manual_seed is the one used")
    torch.manual_seed(77)
    want = torch.stack([_Noisy()[i] for i in (3, 5)])
    fetch = mdata._MicroBatches(_Noisy(), None)
    calls = []
    monkeypatch.setattr(torch, "manual_seed", lambda s: calls.append(s))
    got = fetch[(77, [3, 5])]
    assert calls == []
    assert torch.equal(got, want)


def test_with_cuda_running_micro_batches_seed_the_gpus_directly(monkeypatch):
    """Where CUDA alone is there and started, the CPU generator and every GPU's are seeded at
    once (what torch.manual_seed does there), without its lazy calls for other devices."""
    from malletrain import data as mdata

    fetch = mdata._MicroBatches(_Noisy(), None)
    fetch.accelerators = "cuda"
    seeded, calls = [], []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seeded.append)
    monkeypatch.setattr(torch, "manual_seed", calls.append)
    torch.default_generator.manual_seed(77)
    want = torch.stack([_Noisy()[i] for i in (3, 5)])
    got = fetch[(77, [3, 5])]
    assert (seeded, calls) == ([77], [])
    assert torch.equal(got, want)
    # CUDA not started yet: torch.manual_seed, which queues the GPUs' seeding for its start.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    fetch[(78, [3])]
    assert calls == [78]
