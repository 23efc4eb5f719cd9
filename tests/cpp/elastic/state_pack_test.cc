// Job state in flat buffers: the record stream round-trips every kind of
// value, corrupt messages give errors (never crashes), optimizer state
// (Adam's moments and step count, SGD's momentum) moves to a fresh
// optimizer so that both then take identical steps, and a trainer refuses
// the state of a different model with "model mismatch".
#include "libmalle/elastic/state_pack.h"

#include <thread>

#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "libmalle/comm/elastic_group.h"
#include "tests/cpp/testing/group_options.h"
#include "libmalle/elastic/elastic_trainer.h"
#include "libmalle/elastic/optimizer_state.h"

namespace malle::elastic {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

TEST(StatePackTest, RoundTripsValuesAndTensorsOfSeveralDtypes) {
  at::Tensor f = at::randn({3, 4});
  at::Tensor f2 = at::randn({5});
  at::Tensor l = at::arange(6, at::kLong).view({2, 3});
  at::Tensor b = at::ones({4}, at::kBool);
  at::Tensor strided = at::randn({4, 4}).t();  // not contiguous
  StatePacker p;
  p.PutInt(-42);
  p.PutDouble(0.125);
  p.PutString(std::string("a\0b", 3));
  p.PutTensor(f);
  p.PutTensor(at::Tensor());
  p.PutTensor(l);
  p.PutTensor(f2);
  p.PutTensor(b);
  p.PutTensor(strided);
  PackedState packed = std::move(p).Finish();
  // All small: packed by copying into one segment per dtype (float, long, bool).
  ASSERT_EQ(packed.buffers.size(), 3u);
  EXPECT_EQ(packed.buffers[0].numel(), 12 + 5 + 16);
  EXPECT_EQ(packed.direct, std::vector<bool>({false, false, false}));
  ASSERT_OK_AND_ASSIGN(auto specs, SegmentSpecs(packed.skeleton));
  EXPECT_EQ(specs[1].dtype, at::kLong);
  EXPECT_EQ(specs[1].numel, 6);

  ASSERT_OK_AND_ASSIGN(StateUnpacker in, StateUnpacker::Open(std::move(packed)));
  EXPECT_THAT(in.Int(), ::malle::testing::IsOkAndHolds(-42));
  EXPECT_THAT(in.Double(), ::malle::testing::IsOkAndHolds(0.125));
  EXPECT_THAT(in.String(), ::malle::testing::IsOkAndHolds(std::string("a\0b", 3)));
  ASSERT_OK_AND_ASSIGN(at::Tensor f_out, in.Tensor());
  EXPECT_TRUE(at::equal(f_out, f));
  ASSERT_OK_AND_ASSIGN(at::Tensor undefined, in.Tensor());
  EXPECT_FALSE(undefined.defined());
  ASSERT_OK_AND_ASSIGN(at::Tensor l_out, in.Tensor());
  EXPECT_TRUE(at::equal(l_out, l));
  ASSERT_OK_AND_ASSIGN(at::Tensor f2_out, in.Tensor());
  EXPECT_TRUE(at::equal(f2_out, f2));
  ASSERT_OK_AND_ASSIGN(at::Tensor b_out, in.Tensor());
  EXPECT_TRUE(at::equal(b_out, b));
  ASSERT_OK_AND_ASSIGN(at::Tensor s_out, in.Tensor());
  EXPECT_TRUE(at::equal(s_out, strided));
  EXPECT_TRUE(in.done());
  EXPECT_THAT(in.Int(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ends")));
}

TEST(StatePackTest, ReaderOutOfStepOrCorruptMessageIsAnError) {
  StatePacker p;
  p.PutInt(1);
  p.PutTensor(at::ones({2}));
  PackedState packed = std::move(p).Finish();
  {
    ASSERT_OK_AND_ASSIGN(StateUnpacker in, StateUnpacker::Open(packed));
    EXPECT_THAT(in.String(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected a string")));
  }
  PackedState truncated = packed;
  truncated.skeleton.resize(truncated.skeleton.size() - 3);
  {
    ASSERT_OK_AND_ASSIGN(StateUnpacker in, StateUnpacker::Open(truncated));
    ASSERT_OK(in.Int().status());
    EXPECT_THAT(in.Tensor(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));
  }
  PackedState bad_magic = packed;
  bad_magic.skeleton[0] = 'X';
  EXPECT_THAT(StateUnpacker::Open(bad_magic), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("magic")));
  PackedState short_buffer = packed;
  short_buffer.buffers[0] = at::ones({1});
  EXPECT_THAT(StateUnpacker::Open(short_buffer), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SegmentSpecs("MSK"), StatusIs(absl::StatusCode::kInvalidArgument));
}

// Tensors in one flat buffer go as one segment that *is* that buffer (no
// copy); a rank with the same layout can receive straight into its own.
TEST(StatePackTest, FlatTensorsAreSentAsTheyAreAndReceivedInPlace) {
  auto make = [](int rows) {
    std::vector<at::Tensor> ts = {at::randn({rows, 1000}), at::randn({1000}), at::randn({3})};
    EXPECT_TRUE(FlattenTensors(ts));
    EXPECT_FALSE(FlattenTensors(ts));  // already flat
    return ts;
  };
  std::vector<at::Tensor> src = make(300);  // 1.2 MB of float32
  at::Tensor weight_before = src[0].clone();
  EXPECT_EQ(src[0].storage().data(), src[2].storage().data());
  EXPECT_TRUE(at::equal(src[0], weight_before));
  auto pack = [](const std::vector<at::Tensor>& ts) {
    StatePacker p;
    p.PutInt(7);
    for (const at::Tensor& t : ts) p.PutTensor(t);
    p.PutTensor(at::arange(4, at::kLong));  // small: packed
    return std::move(p).Finish();
  };
  PackedState packed = pack(src);
  ASSERT_EQ(packed.buffers.size(), 2u);
  EXPECT_EQ(packed.direct, std::vector<bool>({true, false}));
  EXPECT_EQ(packed.buffers[0].data_ptr(), src[0].data_ptr());  // the parameters' own memory
  EXPECT_EQ(packed.buffers[0].numel(), 300 * 1000 + 1008 + 3);  // each tensor on a 64-byte boundary

  std::vector<at::Tensor> joiner = make(300);
  PackedState own = pack(joiner);
  ASSERT_OK_AND_ASSIGN(std::vector<at::Tensor> targets, InPlaceTargets(own, packed.skeleton));
  ASSERT_EQ(targets.size(), 2u);
  ASSERT_TRUE(targets[0].defined());
  EXPECT_FALSE(targets[1].defined());
  targets[0].copy_(packed.buffers[0]);  // what the receive does
  EXPECT_TRUE(at::equal(joiner[0], src[0]));
  EXPECT_TRUE(at::equal(joiner[2], src[2]));

  // Another layout (a different first shape) matches nothing.
  PackedState other = pack(make(301));
  ASSERT_OK_AND_ASSIGN(targets, InPlaceTargets(other, packed.skeleton));
  EXPECT_FALSE(targets[0].defined());

  // Unflattened large tensors still travel without a copy, one segment each,
  // and everything round-trips.
  std::vector<at::Tensor> loose = {at::randn({300, 1000}), at::randn({300, 1000}), at::randn({2})};
  PackedState parts = pack(loose);
  EXPECT_EQ(parts.direct, std::vector<bool>({true, true, false, false}));
  PackedState received = parts;
  for (at::Tensor& b : received.buffers) b = b.clone();
  ASSERT_OK_AND_ASSIGN(StateUnpacker in, StateUnpacker::Open(std::move(received)));
  EXPECT_THAT(in.Int(), ::malle::testing::IsOkAndHolds(7));
  for (const at::Tensor& t : loose) {
    ASSERT_OK_AND_ASSIGN(at::Tensor got, in.Tensor());
    EXPECT_TRUE(at::equal(got, t));
  }
  ASSERT_OK_AND_ASSIGN(at::Tensor small, in.Tensor());
  EXPECT_TRUE(at::equal(small, at::arange(4, at::kLong)));
}

bool SameLayout(const std::vector<SegmentLayout>& a, const std::vector<SegmentLayout>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].dtype != b[i].dtype || a[i].numel != b[i].numel || a[i].device_type != b[i].device_type ||
        a[i].direct != b[i].direct) {
      return false;
    }
  }
  return true;
}

TEST(StateLayoutTest, RoundTripsInPythonsFormatAndBadLayoutsAreNamed) {
  std::vector<at::Tensor> ts = {at::randn({300, 1000}), at::randn({3})};
  FlattenTensors(ts);
  StatePacker p;
  for (const at::Tensor& t : ts) p.PutTensor(t);
  p.PutTensor(at::arange(4, at::kLong));
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentLayout> layout, LayoutOf(std::move(p).Finish()));
  const std::string json = EncodeLayout(layout);
  // What python/malletrain/state.py's encode_layout writes for the same state.
  EXPECT_EQ(json, R"([["float32",300003,"cpu",true],["int64",4,"cpu",false]])");
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentLayout> back, DecodeLayout(json));
  EXPECT_TRUE(SameLayout(back, layout));
  ASSERT_OK_AND_ASSIGN(back, DecodeLayout(R"([["bfloat16", 0, "cuda", false]])"));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].dtype, at::kBFloat16);
  EXPECT_EQ(back[0].device_type, "cuda");
  for (auto [bad, message] : std::vector<std::pair<std::string, std::string>>{
           {"{not json", "not JSON"},
           {R"({"a": 1})", "expected a list, got object"},
           {R"([["float32", -1, "cpu", true]])", "segment 0: expected"},
           {R"([["float32", 1.5, "cpu", true]])", "segment 0: expected"},
           {R"([["float32", 4, "tpu", true]])", "segment 0: expected"},
           {R"([["float32", 4, "cpu", true], ["float32", 4, "cpu"]])", "segment 1: expected"},
           {R"([["complex512", 4, "cpu", true]])", "unknown dtype 'complex512'"}}) {
    EXPECT_THAT(DecodeLayout(bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message))) << bad;
  }
}

TEST(StateLayoutTest, LandingBuffersCoverWhatOwnBuffersWillNotTake) {
  constexpr int64_t kP = 300000;  // parameters, float32: 1.2 MB
  const std::vector<SegmentLayout> own = {{at::kFloat, kP, "cpu", true}, {at::kLong, 3, "cpu", false}};
  // Adam: parameters, the moments, a small packed rest.
  const std::vector<SegmentLayout> adam = {
      {at::kFloat, kP, "cpu", true}, {at::kFloat, 2 * kP + 16, "cpu", true}, {at::kFloat, 10, "cpu", false}};
  std::vector<at::Tensor> got = LandingBuffers(adam, own, 1 << 20);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].numel(), 2 * kP + 16);
  EXPECT_EQ(got[0].scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(got[0], at::zeros({2 * kP + 16})));  // zero-filled: every page written once
  // SGD with momentum: one momentum buffer exactly as long as the parameters;
  // own buffers count as a multiset, so it still gets one.
  const std::vector<SegmentLayout> sgd = {{at::kFloat, kP, "cpu", true}, {at::kFloat, kP, "cpu", true}};
  got = LandingBuffers(sgd, own, 1 << 20);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].numel(), kP);
  // Small and CUDA segments: nothing.
  EXPECT_TRUE(LandingBuffers({{at::kFloat, 1000, "cpu", true}, {at::kFloat, 2 * kP, "cuda", true}}, own, 1 << 20)
                  .empty());
}

TEST(StateLayoutTest, TransferStateReceivesIntoLandingBuffers) {
  auto store = comm::ControlStore::InMemory();
  auto flat = [](int seed) {
    at::manual_seed(seed);
    std::vector<at::Tensor> params = {at::randn({300, 1000}), at::randn({1000})};
    std::vector<at::Tensor> moments = {at::randn({300, 1000}), at::randn({1000}), at::randn({300, 1000}),
                                       at::randn({1000})};
    FlattenTensors(params);
    FlattenTensors(moments);
    return std::make_pair(params, moments);
  };
  auto pack = [](const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& moments) {
    StatePacker p;
    for (const at::Tensor& t : params) p.PutTensor(t);
    for (const at::Tensor& t : moments) p.PutTensor(t);
    return std::move(p).Finish();
  };
  auto [src_params, src_moments] = flat(1);
  std::vector<absl::Status> status(2);
  PackedState received;
  std::vector<at::Tensor> landing;
  const void* landing_ptr = nullptr;
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto group = comm::ElasticGroup::Join(
          store, comm::testing::GroupOptions("landing", "m" + std::to_string(i), 2));
      if (!group.ok()) {
        status[i] = group.status();
        return;
      }
      const int source = 0;
      if ((*group)->rank() == source) {
        PackedState mine = pack(src_params, src_moments);
        status[i] = TransferState((*group)->comm(), source, {1}, &mine).status();
      } else {
        // A joiner: parameters of its own (received in place), no moments yet;
        // it faulted in their memory from the source's layout.
        auto [params, unused] = flat(2);
        StatePacker p;
        for (const at::Tensor& t : params) p.PutTensor(t);
        PackedState own = std::move(p).Finish();
        auto expected = LayoutOf(pack(src_params, src_moments));
        auto mine = LayoutOf(own);
        if (!expected.ok() || !mine.ok()) {
          status[i] = expected.ok() ? mine.status() : expected.status();
          return;
        }
        landing = LandingBuffers(*expected, *mine, 1 << 20);
        if (landing.size() == 1) landing_ptr = landing[0].data_ptr();
        auto got = TransferState((*group)->comm(), source, {1}, nullptr, &own, &landing);
        status[i] = got.status();
        if (got.ok()) received = *std::move(got);
      }
      (*group)->Finish();
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_OK(status[0]);
  ASSERT_OK(status[1]);
  ASSERT_NE(landing_ptr, nullptr) << "one landing buffer expected: the moments";
  EXPECT_TRUE(landing.empty()) << "the landing buffer was not taken";
  ASSERT_EQ(received.buffers.size(), 2u);
  EXPECT_EQ(received.buffers[1].data_ptr(), landing_ptr) << "the moments landed in fresh memory";
  EXPECT_EQ(received.direct, std::vector<bool>({true, false}));  // only the parameters are the joiner's own
  ASSERT_OK_AND_ASSIGN(StateUnpacker in, StateUnpacker::Open(std::move(received)));
  for (const at::Tensor& t : src_params) {
    ASSERT_OK_AND_ASSIGN(at::Tensor got, in.Tensor());
    EXPECT_TRUE(at::equal(got, t));
  }
  for (const at::Tensor& t : src_moments) {
    ASSERT_OK_AND_ASSIGN(at::Tensor got, in.Tensor());
    EXPECT_TRUE(at::equal(got, t));
  }
}

TEST(NodeTransferTest, PlanCrossesIntoEachNodeOnce) {
  using Relay = NodeTransferPlan::Relay;
  auto relays = [](const NodeTransferPlan& p) {
    std::vector<std::pair<int, std::vector<int>>> out;
    for (const Relay& r : p.relays) out.emplace_back(r.rank, r.peers);
    return out;
  };
  // Ranks 0 (source) and 1 on node a, 2 and 3 joining on node c, 4 on node d.
  NodeTransferPlan p = PlanNodeTransfer(0, {3, 2, 4, 1}, {"a", "a", "c", "c", "d"}, 5);
  EXPECT_EQ(p.from_root, std::vector<int>({2, 1, 4}));  // relays first
  EXPECT_EQ(relays(p), (std::vector<std::pair<int, std::vector<int>>>{{2, {3}}}));
  EXPECT_FALSE(p.broadcast);  // 0 and 1 share a node: point to point, as planned
  // Every rank on a node of its own, everyone receives: one broadcast.
  p = PlanNodeTransfer(1, {0, 2}, {"a", "b", "c"}, 3);
  EXPECT_TRUE(p.broadcast);
  EXPECT_EQ(p.from_root, std::vector<int>({0, 2}));
  EXPECT_TRUE(p.relays.empty());
  // Unknown nodes ("" or no names at all) are nodes of their own: as before.
  p = PlanNodeTransfer(0, {1, 2}, {"", "", ""}, 3);
  EXPECT_TRUE(p.broadcast);
  EXPECT_TRUE(p.relays.empty());
  p = PlanNodeTransfer(0, {2}, {}, 3);
  EXPECT_EQ(p.from_root, std::vector<int>({2}));
  EXPECT_FALSE(p.broadcast);
  // A source whose node peers receive: they get it from it directly, no relay.
  p = PlanNodeTransfer(2, {0, 1, 3}, {"x", "y", "y", "y"}, 4);
  EXPECT_EQ(p.from_root, std::vector<int>({0, 1, 3}));  // rank 0: alone on node x
  EXPECT_TRUE(p.relays.empty());
  EXPECT_FALSE(p.broadcast);
}

TEST(NodeTransferTest, StateReachesEveryReceiverAndCrossesIntoANodeOnce) {
  // Rank 0 (node a) holds the state; ranks 1 and 2 share node c, rank 3 is on d,
  // rank 4 (node a) holds it already and takes no part.
  const std::vector<std::string> nodes = {"a", "c", "c", "d", "a"};
  const std::vector<int> receivers = {1, 2, 3};
  auto store = comm::ControlStore::InMemory();
  at::manual_seed(7);
  std::vector<at::Tensor> src = {at::randn({200, 1000}), at::randn({1000}), at::randn({17})};
  FlattenTensors(src);
  std::vector<absl::Status> status(5);
  std::vector<NodeTransferCounts> counts(5);
  std::vector<std::vector<at::Tensor>> got(5);
  std::vector<std::thread> threads;
  for (int i = 0; i < 5; ++i) {
    threads.emplace_back([&, i] {
      auto group = comm::ElasticGroup::Join(store, comm::testing::GroupOptions("nodes", "m" + std::to_string(i), 5));
      if (!group.ok()) {
        status[i] = group.status();
        return;
      }
      const int rank = (*group)->rank();
      StatePacker p(/*direct_min_bytes=*/1 << 16);
      for (const at::Tensor& t : src) p.PutTensor(t);
      PackedState mine = std::move(p).Finish();
      auto out = TransferStateByNode((*group)->comm(), 0, receivers, nodes, rank == 0 ? &mine : nullptr, nullptr,
                                     nullptr, &counts[rank]);
      status[rank] = out.status();
      if (out.ok() && !out->skeleton.empty()) {
        auto in = StateUnpacker::Open(*std::move(out));
        if (!in.ok()) {
          status[rank] = in.status();
        } else {
          for (size_t k = 0; k < src.size(); ++k) {
            auto t = in->Tensor();
            if (!t.ok()) status[rank] = t.status();
            if (t.ok()) got[rank].push_back(t->clone());
          }
        }
      }
      (*group)->Finish();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 5; ++r) ASSERT_OK(status[r]) << "rank " << r;
  for (int r : receivers) {
    ASSERT_EQ(got[r].size(), src.size()) << "rank " << r;
    for (size_t k = 0; k < src.size(); ++k) EXPECT_TRUE(at::equal(got[r][k], src[k])) << r << "/" << k;
  }
  EXPECT_TRUE(got[4].empty()) << "a rank that is not a receiver takes no part";
  const int64_t s = counts[0].state_bytes;
  ASSERT_GT(s, 800000);
  // Across nodes: once into c (to rank 1), once into d; rank 1 copies to rank 2 on c.
  EXPECT_EQ(counts[0].sent_remote, 2 * s);
  EXPECT_EQ(counts[0].sent_local, 0);
  EXPECT_EQ(counts[1].received_remote, s);
  EXPECT_EQ(counts[1].sent_local, s);
  EXPECT_EQ(counts[2].received_remote, 0);
  EXPECT_EQ(counts[3].received_remote, s);
  EXPECT_EQ(counts[4].state_bytes, 0);
  int64_t wire = 0;
  for (const NodeTransferCounts& c : counts) wire += c.received_remote;
  EXPECT_EQ(wire, 2 * s) << "three receivers on two nodes other than the source's: two states on the wire";
}

// Two parameters with gradients from a fixed function of the parameters.
struct Toy {
  at::Tensor w = at::randn({4, 3}).set_requires_grad(true);
  at::Tensor b = at::randn({3}).set_requires_grad(true);
  void Grads() {
    w.mutable_grad() = (w * 0.5 + 0.1).detach();
    b.mutable_grad() = (b * -0.25 + 0.3).detach();
  }
};

template <typename Opt, typename Options>
void ExpectOptimizerRoundTrip(Options options) {
  Toy a;
  Opt opt_a({a.w, a.b}, options);
  for (int i = 0; i < 3; ++i) {
    a.Grads();
    opt_a.step();
  }
  static_cast<Options&>(opt_a.param_groups()[0].options()).lr(0.0123);  // a schedule moved it
  ASSERT_OK_AND_ASSIGN(PartState part, SaveOptimizer(opt_a));
  for (at::Tensor& t : part.tensors) t = t.clone();  // what a transfer delivers: other memory

  Toy b;  // a "joiner": different parameters, an optimizer that never stepped
  b.w.detach().copy_(a.w);
  b.b.detach().copy_(a.b);
  Opt opt_b({b.w, b.b}, options);
  ASSERT_OK(LoadOptimizer(std::move(part), opt_b));
  EXPECT_EQ(opt_b.param_groups()[0].options().get_lr(), 0.0123);
  for (int i = 0; i < 2; ++i) {
    a.Grads();
    opt_a.step();
    b.Grads();
    opt_b.step();
  }
  EXPECT_TRUE(at::equal(a.w, b.w));
  EXPECT_TRUE(at::equal(a.b, b.b));
}

TEST(OptimizerStateTest, AdamStateAndStepCountMoveToAFreshOptimizer) {
  ExpectOptimizerRoundTrip<torch::optim::Adam>(torch::optim::AdamOptions(1e-2).amsgrad(true));
  // The step count itself (bias correction) travels.
  Toy a;
  torch::optim::Adam opt({a.w, a.b}, torch::optim::AdamOptions(1e-2));
  a.Grads();
  opt.step();
  a.Grads();
  opt.step();
  ASSERT_OK_AND_ASSIGN(PartState part, SaveOptimizer(opt));
  Toy b;
  torch::optim::Adam fresh({b.w, b.b}, torch::optim::AdamOptions(1e-2));
  ASSERT_OK(LoadOptimizer(std::move(part), fresh));
  auto& st = static_cast<torch::optim::AdamParamState&>(*fresh.state().at(b.w.unsafeGetTensorImpl()));
  EXPECT_EQ(st.step(), 2);
}

TEST(OptimizerStateTest, SgdMomentumMovesToAFreshOptimizer) {
  ExpectOptimizerRoundTrip<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
}

TEST(OptimizerStateTest, MismatchesAreRefusedBeforeAnythingChanges) {
  Toy a;
  torch::optim::Adam adam({a.w, a.b}, torch::optim::AdamOptions(1e-2));
  a.Grads();
  adam.step();
  ASSERT_OK_AND_ASSIGN(PartState part, SaveOptimizer(adam));

  at::Tensor w = at::randn({5, 3}).set_requires_grad(true);  // different shape
  at::Tensor b = at::randn({3}).set_requires_grad(true);
  torch::optim::Adam other({w, b}, torch::optim::AdamOptions(1e-3));
  EXPECT_THAT(LoadOptimizer(part, other),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("optimizer mismatch")));
  EXPECT_TRUE(other.state().empty());
  EXPECT_EQ(other.param_groups()[0].options().get_lr(), 1e-3);

  torch::optim::SGD sgd({a.w, a.b}, torch::optim::SGDOptions(0.1));
  EXPECT_THAT(LoadOptimizer(part, sgd), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'adam'")));
}

ElasticTrainerOptions TrainerOptions() {
  ElasticTrainerOptions o;
  o.logical_workers = 2;
  o.num_samples = 64;
  o.batch_size = 4;
  o.steps = 10;
  return o;
}

comm::ElasticGroupOptions GroupOptions() {
  comm::ElasticGroupOptions g;
  g.job_id = "pack";
  g.member_id = "m0";
  return g;
}

TEST(JobStateTest, TrainerStateRoundTripsAndMismatchedModelIsRefused) {
  Toy a;
  at::Tensor running = at::randn({3});
  torch::optim::Adam adam({a.w, a.b}, torch::optim::AdamOptions(1e-2));
  a.Grads();
  adam.step();
  ASSERT_OK_AND_ASSIGN(auto source, ElasticTrainer::Create(comm::ControlStore::InMemory(), GroupOptions(),
                                                           TrainerOptions(),
                                                           ModelState::FromTensors({a.w, a.b}, {running}), adam));
  int64_t counter = 17;
  ASSERT_OK(source->Track("counter", [&] { return ExtraState{{at::ones({2}) * counter}, "x"}; },
                          [](const ExtraState&) { return absl::OkStatus(); }));
  ASSERT_OK_AND_ASSIGN(PackedState packed, source->PackJobState());
  ASSERT_OK_AND_ASSIGN(std::string digest, source->StateDigest());

  Toy b;
  at::Tensor running_b = at::zeros({3});
  torch::optim::Adam adam_b({b.w, b.b}, torch::optim::AdamOptions(1e-2));
  ASSERT_OK_AND_ASSIGN(auto receiver, ElasticTrainer::Create(comm::ControlStore::InMemory(), GroupOptions(),
                                                             TrainerOptions(),
                                                             ModelState::FromTensors({b.w, b.b}, {running_b}),
                                                             adam_b));
  ExtraState got;
  ASSERT_OK(receiver->Track("counter", [] { return ExtraState{}; }, [&](const ExtraState& s) {
    got = s;
    return absl::OkStatus();
  }));
  EXPECT_NE(receiver->StateDigest().value(), digest);
  ASSERT_OK(receiver->LoadJobState(packed));
  EXPECT_EQ(receiver->StateDigest().value(), digest);
  EXPECT_TRUE(at::equal(b.w, a.w));
  EXPECT_TRUE(at::equal(running_b, running));
  ASSERT_EQ(got.tensors.size(), 1u);
  EXPECT_EQ(got.tensors[0][0].item<float>(), 17.0f);
  EXPECT_EQ(got.bytes, "x");

  // A rank whose model has another shape gets a clear error and keeps its state.
  at::Tensor w3 = at::randn({4, 5}).set_requires_grad(true);
  at::Tensor b3 = at::randn({3}).set_requires_grad(true);
  at::Tensor w3_before = w3.detach().clone();
  torch::optim::Adam adam3({w3, b3}, torch::optim::AdamOptions(1e-2));
  ASSERT_OK_AND_ASSIGN(auto other, ElasticTrainer::Create(comm::ControlStore::InMemory(), GroupOptions(),
                                                          TrainerOptions(),
                                                          ModelState::FromTensors({w3, b3}, {at::zeros({3})}),
                                                          adam3));
  EXPECT_THAT(other->LoadJobState(packed),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("model mismatch"), HasSubstr("Float[4,5]"),
                                        HasSubstr("Float[4,3]"))));
  EXPECT_TRUE(at::equal(w3, w3_before));

  // Another logical-worker count is a job mismatch.
  ElasticTrainerOptions three = TrainerOptions();
  three.logical_workers = 3;
  ASSERT_OK_AND_ASSIGN(auto l3, ElasticTrainer::Create(comm::ControlStore::InMemory(), GroupOptions(), three,
                                                       ModelState::FromTensors({b.w, b.b}, {running_b}), adam_b));
  EXPECT_THAT(l3->LoadJobState(packed), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job mismatch")));
}

// A trainer's packed state has direct segments that are views of its own
// tensors; loading it into another trainer of the same process must copy
// them, or the two optimizers would share their moments.
TEST(JobStateTest, LoadedStateIsNotSharedWithTheSource) {
  ElasticTrainerOptions direct = TrainerOptions();
  direct.state_direct_min_bytes = 0;
  Toy a;
  torch::optim::Adam adam({a.w, a.b}, torch::optim::AdamOptions(1e-2));
  a.Grads();
  adam.step();
  ASSERT_OK_AND_ASSIGN(auto source, ElasticTrainer::Create(comm::ControlStore::InMemory(), GroupOptions(), direct,
                                                           ModelState::FromTensors({a.w, a.b}), adam));
  ASSERT_OK_AND_ASSIGN(PackedState packed, source->PackJobState());
  EXPECT_EQ(packed.direct, std::vector<bool>({true, true}));  // parameters; Adam's moments
  Toy b;
  torch::optim::Adam adam_b({b.w, b.b}, torch::optim::AdamOptions(1e-2));
  ASSERT_OK_AND_ASSIGN(auto receiver, ElasticTrainer::Create(comm::ControlStore::InMemory(), GroupOptions(), direct,
                                                             ModelState::FromTensors({b.w, b.b}), adam_b));
  ASSERT_OK(receiver->LoadJobState(packed));
  const std::string loaded = receiver->StateDigest().value();
  EXPECT_EQ(source->StateDigest().value(), loaded);
  a.Grads();
  adam.step();  // the source moves on
  EXPECT_NE(source->StateDigest().value(), loaded);
  EXPECT_EQ(receiver->StateDigest().value(), loaded);
}

TEST(ElasticTrainerOptionsTest, BadOptionsAreNamed) {
  Toy a;
  torch::optim::Adam adam({a.w, a.b}, torch::optim::AdamOptions(1e-2));
  auto make = [&](ElasticTrainerOptions o, int bootstrap = 0) {
    comm::ElasticGroupOptions g = GroupOptions();
    g.bootstrap_size = bootstrap;
    return ElasticTrainer::Create(comm::ControlStore::InMemory(), g, o, ModelState::FromTensors({a.w, a.b}), adam)
        .status();
  };
  ElasticTrainerOptions o = TrainerOptions();
  EXPECT_THAT(make(o), IsOk());
  o.logical_workers = 0;
  EXPECT_THAT(make(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("logical_workers")));
  o = TrainerOptions();
  o.state_direct_min_bytes = -1;
  EXPECT_THAT(make(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("state_direct_min_bytes")));
  o = TrainerOptions();
  EXPECT_THAT(make(o, /*bootstrap=*/3), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  HasSubstr("smaller than the job's starting size")));
  o.epochs = 2;  // and steps = 10
  EXPECT_THAT(make(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exactly one")));
  o = TrainerOptions();
  o.num_samples = 7;  // < 2 x 4
  EXPECT_THAT(make(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fewer than one global batch")));
  at::Tensor stranger = at::randn({2}).set_requires_grad(true);
  torch::optim::SGD sgd({a.w, stranger}, torch::optim::SGDOptions(0.1));
  EXPECT_THAT(ElasticTrainer::Create(comm::ControlStore::InMemory(), GroupOptions(), TrainerOptions(),
                                     ModelState::FromTensors({a.w, a.b}), sgd)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not in the model")));
}

}  // namespace
}  // namespace malle::elastic
