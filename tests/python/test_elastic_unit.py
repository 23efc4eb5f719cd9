"""Unit tests of the elastic training pieces that need no peers: sampler, state packing,
worker assignment, argument checks."""

from __future__ import annotations

import collections
import time

import pytest
import torch

import malletrain
from malletrain import state as mstate
from malletrain.errors import MalleError, MalleValueError
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


def test_pack_sends_flat_buffers_as_they_are_and_round_trips():
    model = torch.nn.Sequential(torch.nn.Linear(600, 500), torch.nn.BatchNorm1d(500))
    assert mstate.flatten_module(model)
    assert not mstate.flatten_module(model)  # already flat
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 600)).sum().backward()
    opt.step()
    assert mstate.flatten_optimizer(opt)
    model(torch.randn(5, 600)).sum().backward()
    opt.step()  # Adam updates its flat state in place
    assert not mstate.flatten_optimizer(opt)
    st = {"model": model.state_dict(), "optimizer": opt.state_dict(), "extra": {"k": [1, "x"]},
          "small": torch.arange(3)}
    skeleton, segments = mstate.pack(st)
    tree, specs = mstate.read_skeleton(skeleton)
    # The model's float32 buffer and the optimizer's are sent without a copy; the int64
    # tensors (num_batches_tracked, the small extra) are packed into one segment.
    assert [(s.dtype, s.direct) for s in specs] == [("float32", True), ("float32", True),
                                                      ("int64", False)]
    weight = model[0].weight
    assert segments[0].untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    assert [s.numel for s in specs] == [t.numel() for t in segments]
    received = [t.clone() for t in segments]
    back = mstate.unpack(tree, received)
    assert mstate.digest(back) == mstate.digest(st)
    model2 = torch.nn.Sequential(torch.nn.Linear(600, 500), torch.nn.BatchNorm1d(500))
    model2.load_state_dict(back["model"])
    opt2 = torch.optim.Adam(model2.parameters())
    opt2.load_state_dict(back["optimizer"])
    assert mstate.digest(opt2.state_dict()) == mstate.digest(opt.state_dict())
    assert back["extra"] == {"k": [1, "x"]}
    assert torch.equal(back["small"], torch.arange(3))


def test_flattening_keeps_a_channels_last_weight_as_it_is():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Linear(4, 4))
    model[0].to(memory_format=torch.channels_last)
    strides = model[0].weight.stride()
    assert mstate.flatten_module(model)
    assert model[0].weight.stride() == strides  # its layout is the user's choice
    assert model[1].weight.untyped_storage().data_ptr() == \
        model[0].bias.untyped_storage().data_ptr()  # the contiguous rest is one buffer
    st = {"model": dict(model.named_parameters())}
    skeleton, segments = mstate.pack(st, direct_min_bytes=0)
    back = mstate.unpack(mstate.read_skeleton(skeleton)[0], [t.clone() for t in segments])
    assert mstate.digest(back) == mstate.digest(st)


def test_unflattened_state_still_round_trips_with_few_messages():
    big = [torch.randn(300, 1000) for _ in range(3)]   # 1.2 MB each: sent one by one
    small = [torch.randn(10) for _ in range(50)]       # packed into one segment
    st = {"big": big, "small": small, "view": big[0][0]}
    skeleton, segments = mstate.pack(st)
    tree, specs = mstate.read_skeleton(skeleton)
    assert len(specs) == 4 and sum(s.direct for s in specs) == 3
    back = mstate.unpack(tree, [t.clone() for t in segments])
    assert mstate.digest(back) == mstate.digest(st)


def test_a_joiner_receives_matching_segments_in_place():
    def build():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(600, 500), torch.nn.Linear(500, 10))
        mstate.flatten_module(m)
        return m
    src, joiner = build(), build()
    with torch.no_grad():
        src[0].weight.add_(1.0)
    skeleton, segments = mstate.pack({"model": dict(src.named_parameters())})
    tree, specs = mstate.read_skeleton(skeleton)
    targets = mstate.in_place_targets({"model": dict(joiner.named_parameters())}, tree, specs)
    assert len(targets) == 1 and targets[0] is not None
    targets[0].copy_(segments[0])  # what the receive does
    assert torch.equal(joiner[0].weight, src[0].weight)
    # A different model (other shapes) matches nothing: it is received into fresh memory.
    other = torch.nn.Sequential(torch.nn.Linear(500, 600), torch.nn.Linear(600, 10))
    mstate.flatten_module(other)
    assert mstate.in_place_targets({"model": dict(other.named_parameters())}, tree,
                                   specs) == [None]


def test_digest_sees_one_changed_bit():
    st = {"w": torch.zeros(10)}
    d0 = mstate.digest(st)
    st["w"][3] = -0.0  # a different bit pattern, equal value
    assert mstate.digest(st) != d0


def test_corrupt_state_message_is_reported():
    with pytest.raises(ValueError, match="corrupt state message"):
        mstate.read_skeleton(b"not a pickle")
    tree, _ = mstate.read_skeleton(mstate.pack({"w": torch.ones(4)})[0])
    with pytest.raises(ValueError, match="outside the received buffers"):
        mstate.unpack(tree, [torch.ones(2)])
    with pytest.raises(ValueError, match="names no received segment"):
        mstate.unpack(tree, [])


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


def test_max_recoveries_without_commit_is_validated_at_join():
    store = malletrain._C.ControlStore.serve()
    job = malletrain.init(logical_workers=1, store=f"127.0.0.1:{store.port}", bootstrap_size=1,
                          job_id="cap", max_recoveries_without_commit=0)
    with pytest.raises(MalleValueError, match="max_recoveries_without_commit must be >= 1"):
        job.join()


def test_a_grace_shorter_than_the_watchdog_tick_is_refused():
    """A survivor busy computing checks in at its watchdog's next tick: a 50 ms grace with
    the default 100 ms tick would declare it failed."""
    store = malletrain._C.ControlStore.serve()
    job = malletrain.init(logical_workers=1, store=f"127.0.0.1:{store.port}", bootstrap_size=1,
                          job_id="grace", recovery_grace=0.05)
    with pytest.raises(MalleValueError, match="must be at least heartbeat_interval"):
        job.join()
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


def test_bucket_layout_is_fixed_at_wrap_time():
    """A joiner (no step run yet) and a survivor must reduce identical bucket layouts:
    the Reducer's one-time rebuild happens at wrap time, in reverse parameter order (the
    last layers' gradients are ready first, so their bucket is launched first)."""
    store = malletrain._C.ControlStore.serve()
    job = malletrain.init(logical_workers=1, store=f"127.0.0.1:{store.port}",
                          bootstrap_size=1, job_id="buckets", bucket_cap_mb=0.001)
    # Two branches: gradients become ready in an order that differs from parameter order.
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(20, 20)
            self.b = torch.nn.Linear(20, 20)

        def forward(self, x):
            return self.b(x).sum() + self.a(x * 2).sum()

    model = job.wrap_model(Net())
    buckets = model._reducer._get_zeros_like_grad_buckets()
    order = [p for b in buckets for p in b.parameters()]
    params = list(model.module.parameters())
    assert len(buckets) > 1
    assert [id(p) for p in order] == [id(p) for p in reversed(params)]
    opt = job.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    data = torch.utils.data.TensorDataset(torch.randn(8, 20))
    for (x,) in job.loader(data, batch_size=2, steps=3):
        opt.zero_grad()
        model(x).backward()
        opt.step()
        assert model._reducer._rebuild_buckets() is False  # nothing left to rebuild
    job.close()
    assert job.step == 3


class _RecordingAdvisor:
    def __init__(self):
        self.samples = []

    FIELDS = ("step", "world_size", "logical_workers", "local_batch", "global_batch",
              "data_wait_s", "compute_s", "comm_s", "optimizer_s", "resize_pause_s", "total_s",
              "after_resize", "after_failure", "warmup")

    def record(self, *args):  # _C.Advisor.record's positional order
        assert len(args) == len(self.FIELDS), args
        self.samples.append(dict(zip(self.FIELDS, args)))


def _advisor_sample(size, *, prev_gap=0.012, boundary=0.010):
    """One step through ElasticJob._record_step on a stand-in job (no store, no peers):
    2 ms data wait, 30 ms to the optimizer of which the last 5 ms waited for gradients,
    a step boundary of ``boundary`` s that changed nothing."""
    from types import SimpleNamespace

    from malletrain.elastic import ElasticJob, _StepProfile

    adv = _RecordingAdvisor()
    job = SimpleNamespace(_advisor=adv, logical_workers=4, deterministic=False, size=size,
                          rank=0, _batch_size_for_position=8, _step=7,
                          _st=SimpleNamespace(workers=range(4 // size)), _outbox=None,
                          _reporter=None)
    prof = _StepProfile()
    prof.steps_in_process = 5
    prof.start = time.perf_counter() - 0.040
    prof.prev_end = None if prev_gap is None else prof.start - prev_gap
    prof.boundary = boundary
    prof.data_wait = 0.002
    prof.last_hook = prof.start + 0.025
    t_opt = prof.start + 0.030
    ElasticJob._record_step(job, prof, t_opt, t_opt)
    (s,) = adv.samples
    return s


def test_the_step_boundary_is_communication_for_the_advisor():
    # Size 2: the boundary is a collective that waits for the slowest peer, so it is
    # exposed communication (the network term models it), not untimed rest.
    s = _advisor_sample(2)
    assert s["comm_s"] == pytest.approx(0.005 + 0.010, abs=1e-9)
    assert s["compute_s"] == pytest.approx(0.030 - 0.002 - 0.005, abs=1e-9)
    assert s["total_s"] >= 0.040 + 0.012
    parts = s["data_wait_s"] + s["compute_s"] + s["comm_s"] + s["optimizer_s"]
    assert parts <= s["total_s"]
    # Size 1: no peer to wait for; the boundary stays in the rest of the step.
    s1 = _advisor_sample(1)
    assert s1["comm_s"] == pytest.approx(0.005, abs=1e-9)
    assert s1["compute_s"] == pytest.approx(s["compute_s"], abs=1e-9)
    # No previous step end (first step in this process, or after a redone step): the
    # boundary is still part of the step's total.
    s0 = _advisor_sample(2, prev_gap=None)
    assert s0["comm_s"] == pytest.approx(0.015, abs=1e-9)
    assert s0["total_s"] >= 0.040 + 0.010


def test_record_stand_in_has_the_bindings_argument_order():
    """_record_step passes the sample positionally: the stand-in above must follow the
    binding's order, or the boundary test would check the wrong fields."""
    import re

    from malletrain import _C

    sig = _C.Advisor.record.__doc__.splitlines()[0]
    names = re.findall(r"(\w+): ", sig)
    assert tuple(n for n in names if n != "self") == _RecordingAdvisor.FIELDS


def test_backend_is_checked():
    with pytest.raises(MalleValueError, match="backend: must be 'gloo' or 'nccl'"):
        malletrain.init(logical_workers=1, store="127.0.0.1:1", backend="mpi")
    store = malletrain._C.ControlStore.serve()
    job = malletrain.init(logical_workers=1, store=f"127.0.0.1:{store.port}",
                          bootstrap_size=1, job_id="nccl-cpu", backend="nccl")
    job.wrap_model(torch.nn.Linear(4, 4))
    # NCCL reduces CUDA tensors only: a CPU model is refused when the job joins.
    with pytest.raises(MalleValueError, match="backend='nccl' reduces CUDA tensors"):
        job.join()
    with pytest.raises(MalleValueError, match="data_backend: got 'mpi'"):
        malletrain._C.ElasticGroup.join(store, "x", data_backend="mpi")


def test_model_without_trainable_parameters_is_refused():
    store = malletrain._C.ControlStore.serve()
    job = malletrain.init(logical_workers=1, store=f"127.0.0.1:{store.port}",
                          bootstrap_size=1, job_id="frozen")
    frozen = torch.nn.Linear(4, 4).requires_grad_(False)
    with pytest.raises(MalleValueError, match="no parameter that requires a gradient"):
        job.wrap_model(frozen)


def test_comm_hook_binding_checks_its_reducer_and_hands_back_unarmed_buckets():
    """The C++ comm hook refuses anything but a torch.distributed.Reducer, by name, and a
    backward run while it is not armed (no group: a failed step being redone) hands every
    bucket back as it is and counts it."""
    sync = malletrain._C.BucketSync()
    with pytest.raises(MalleValueError, match="expected a torch.distributed.Reducer, got .*Linear"):
        sync.register(torch.nn.Linear(2, 2))
    store = malletrain._C.ControlStore.serve()
    job = malletrain.init(logical_workers=2, store=f"127.0.0.1:{store.port}",
                          bootstrap_size=1, job_id="unarmed", bucket_cap_mb=1e-5)
    model = job.wrap_model(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)))
    reducer, hook = model._reducer, job._bucket_sync
    with pytest.raises(MalleError, match="comm hook|register_comm_hook|already"):
        malletrain._C.BucketSync().register(reducer)  # c10d allows one hook per Reducer
    hook.arm(None)
    reducer.prepare_for_forward()
    out = model.module(torch.ones(2, 3)).sum()
    reducer.prepare_for_backward([])
    out.backward()
    launched, completed, last = hook.take()
    assert launched == completed == len(reducer._get_zeros_like_grad_buckets()) >= 2
    assert last is not None and abs(last - time.perf_counter()) < 60
    # Not divided: the plain gradient of sum(Linear(Linear(x))) w.r.t. the last bias.
    assert torch.equal(model.module[1].bias.grad, torch.tensor([2.0]))
    hook.close()
    hook.close()  # idempotent
    job.close()


def _seg(dtype, numel, direct=True, device="cpu"):
    return mstate.Segment(dtype, numel, device, direct)


def test_landing_buffers_cover_what_the_joiners_own_buffers_will_not_take():
    P = 300_000  # parameters, float32: 1.2 MB
    own = [_seg("float32", P), _seg("int64", 3, direct=False)]
    # Adam: parameters, the moments (2 P, padded), a small packed rest.
    adam = [_seg("float32", P), _seg("float32", 2 * P + 16), _seg("float32", 10, direct=False)]
    got = mstate.landing_buffers(adam, own, min_bytes=1 << 20)
    assert [(b.dtype, b.numel()) for b in got] == [(torch.float32, 2 * P + 16)]
    assert not got[0].any()  # zero-filled, i.e. every page written once
    # SGD with momentum: the momentum buffer has exactly the parameters' length; own
    # buffers are counted as a multiset, so one of the two still gets a landing.
    sgd = [_seg("float32", P), _seg("float32", P)]
    assert [b.numel() for b in mstate.landing_buffers(sgd, own, min_bytes=1 << 20)] == [P]
    # Small segments, CUDA segments: nothing (fresh small or GPU memory costs no faults).
    assert mstate.landing_buffers([_seg("float32", 1000), _seg("float32", 2 * P, device="cuda")],
                                  own, min_bytes=1 << 20) == []
    landing = mstate.landing_buffers(adam, [], min_bytes=1 << 20)
    assert len(landing) == 2
    assert mstate.take_landing(landing, _seg("float32", 7)) is None
    assert mstate.take_landing(landing, _seg("float64", P)) is None  # dtype must match
    b = mstate.take_landing(landing, _seg("float32", P, direct=False))
    assert b is not None and b.numel() == P and len(landing) == 1
    assert mstate.take_landing(landing, _seg("float32", P)) is None  # taken once


def test_state_layout_round_trips_and_bad_layouts_are_named():
    segs = [_seg("float32", 12), _seg("bfloat16", 0, direct=False), _seg("int64", 5, device="cuda")]
    assert mstate.decode_layout(mstate.encode_layout(segs)) == segs
    for data, message in [
        (b"\xff\xfe", "state layout: .*codec"),
        (b"{not json", "state layout: "),
        (b'{"a": 1}', "expected a list, got dict"),
        (b'[["float32", -1, "cpu", true]]', "segment 0: expected"),
        (b'[["float32", 1.5, "cpu", true]]', "segment 0: expected"),
        (b'[["float32", 4, "tpu", true]]', "segment 0: expected"),
        (b'[["float32", 4, "cpu", true], ["float32", 4, "cpu"]]', "segment 1: expected"),
        (b'[["complex512", 4, "cpu", true]]', "unknown dtype 'complex512'"),
    ]:
        with pytest.raises(ValueError, match=message):
            mstate.decode_layout(data)


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
    assert job._landing == []  # nothing published yet: a new job
    key = malletrain.elastic.state_layout_key("layout")
    assert store.try_get(key) is None
    for x, y in job.loader(data, batch_size=4, steps=2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    published = mstate.decode_layout(store.try_get(key))
    assert published == mstate.segments_of(job.job_state(), direct_min_bytes=4096)
    moments = [s for s in published if s.direct and s.numel > 2 * 2254]  # 2 x 2254 parameters
    assert len(moments) == 1

    joiner = malletrain.init(logical_workers=1, store=addr, job_id="layout")
    joiner.wrap_model(net())
    joiner.wrap_optimizer(torch.optim.Adam(joiner._model.parameters(), lr=1e-3))
    assert [b.numel() for b in joiner._landing] == [moments[0].numel]

    store.set(key, b'[["float32", "many", "cpu", true]]')
    late = malletrain.init(logical_workers=1, store=addr, job_id="layout")
    late.wrap_model(net())
    late.wrap_optimizer(torch.optim.Adam(late._model.parameters(), lr=1e-3))
    assert late._landing == []
    for j in (job, joiner, late):
        j.close()
