// ElasticTrainer with ranks as threads over an in-memory store: the plan a
// rank gets, misuse errors, and that 1 and 2 ranks with the same L train to
// the same parameters (bitwise in deterministic mode). Resizes, joins and
// real processes are in elastic_trainer_process_test.
#include "libmalle/elastic/elastic_trainer.h"

#include <set>
#include <string>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libmalle/base/status_macros.h"
#include "tests/cpp/testing/status_matchers.h"
#include "tests/cpp/testing/group_options.h"

namespace malle::elastic {
namespace {

using ::malle::comm::testing::GroupOptions;
using ::malle::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

ElasticTrainerOptions Options(bool deterministic, bool use_reducer = true) {
  ElasticTrainerOptions o;
  o.use_reducer = use_reducer;
  o.logical_workers = 2;
  o.seed = 3;
  o.deterministic = deterministic;
  o.num_samples = 40;
  o.batch_size = 4;
  o.steps = 12;
  o.bucket_bytes = 64;  // two buckets
  return o;
}

struct Rank {
  at::Tensor w, b;
  std::unique_ptr<torch::optim::Adam> adam;
  absl::Status status;
};

// Trains y = x A with `n` ranks as threads; returns rank 0's parameters.
// Member r starts from parameters drawn with seed `init_seed + r`; the state
// sync at bootstrap makes everyone start from rank 0's, and rank 0 is the
// member that arrived first, so `*rank0_member` says which one that was.
// `ranks_per_node`: the ranks' node slots (the advisor counts nodes); rank 0's
// advisor report goes to `*report0`.
// `clip` > 0: the full gradient is clipped to that norm before each update.
std::vector<at::Tensor> Train(const std::string& job, int n, bool deterministic, int init_seed = 100,
                              int* rank0_member = nullptr, bool use_reducer = true, int ranks_per_node = 1,
                              std::string* report0 = nullptr, double clip = 0) {
  at::Generator data_gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor x = at::randn({40, 5}, data_gen, at::TensorOptions());
  const at::Tensor y = at::matmul(x, at::randn({5, 2}, data_gen, at::TensorOptions()));
  auto store = comm::ControlStore::InMemory();
  std::vector<Rank> ranks(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Rank& me = ranks[r];
      at::Generator init = at::make_generator<at::CPUGeneratorImpl>(init_seed + r);  // rank 0's start wins
      me.w = at::randn({5, 2}, init, at::TensorOptions()).set_requires_grad(true);
      me.b = at::randn({2}, init, at::TensorOptions()).set_requires_grad(true);
      me.adam = std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{me.w, me.b},
                                                     torch::optim::AdamOptions(0.05));
      ElasticTrainerOptions o = Options(deterministic, use_reducer);
      o.ranks_per_node = ranks_per_node;
      auto trainer = ElasticTrainer::Create(store, GroupOptions(job, "m" + std::to_string(r), n), o,
                                            ModelState::FromTensors({me.w, me.b}), *me.adam);
      if (!trainer.ok()) {
        me.status = trainer.status();
        return;
      }
      for (;;) {
        auto plan = (*trainer)->NextStep();
        if (!plan.ok()) {
          me.status = plan.status();
          return;
        }
        if (!plan->has_value()) break;
        if ((*plan)->step == 0 && (*plan)->rank == 0 && rank0_member != nullptr) *rank0_member = r;
        for (size_t i = 0; i < (*plan)->workers.size(); ++i) {
          (*trainer)->BeginMicroBatch(i);
          at::Tensor rows = at::tensor((*plan)->workers[i].indices, at::kLong);
          at::mse_loss(at::matmul(x.index_select(0, rows), me.w) + me.b, y.index_select(0, rows)).backward();
          me.status = (*trainer)->EndMicroBatch();
          if (!me.status.ok()) return;
        }
        auto committed = clip > 0 ? (*trainer)->FinishStep([&]() -> absl::Status {
          torch::nn::utils::clip_grad_norm_(std::vector<at::Tensor>{me.w, me.b}, clip);
          return absl::OkStatus();
        })
                                  : (*trainer)->FinishStep();
        if (!committed.ok() || !*committed) {
          me.status = committed.ok() ? absl::InternalError("step not committed") : committed.status();
          return;
        }
      }
      if ((*trainer)->step() != 12) me.status = absl::InternalError("did not train 12 steps");
      if (report0 != nullptr && (*trainer)->rank() == 0) *report0 = (*trainer)->ReportJson();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_OK(ranks[r].status) << "rank " << r;
  for (int r = 1; r < n; ++r) {
    EXPECT_TRUE(at::equal(ranks[r].w, ranks[0].w)) << "rank " << r << " diverged";
  }
  return {ranks[0].w.detach().clone(), ranks[0].b.detach().clone()};
}

TEST(ElasticTrainerTest, TwoRanksTrainLikeOneInDeterministicMode) {
  int first = -1;
  std::vector<at::Tensor> two = Train("two", 2, true, 100, &first);
  ASSERT_GE(first, 0);
  std::vector<at::Tensor> one = Train("one", 1, true, 100 + first);
  EXPECT_TRUE(at::equal(one[0], two[0]));
  EXPECT_TRUE(at::equal(one[1], two[1]));
}

TEST(ElasticTrainerTest, TwoRanksTrainLikeOneUpToRounding) {
  int first = -1;
  std::vector<at::Tensor> two = Train("two", 2, false, 100, &first);
  ASSERT_GE(first, 0);
  std::vector<at::Tensor> one = Train("one", 1, false, 100 + first);
  const double rel = (one[0] - two[0]).abs().max().item<double>() / one[0].abs().max().item<double>();
  EXPECT_LT(rel, 1e-5);
}

TEST(ElasticTrainerTest, ClippingTheFullGradientTrainsLikeOneRankInDeterministicMode) {
  // FinishStep's hook sees the synchronised gradient: clipped on two ranks it
  // is what one rank clips, bitwise; and clipping did change the result.
  int first = -1;
  std::vector<at::Tensor> two = Train("clip2", 2, true, 100, &first, true, 1, nullptr, /*clip=*/0.05);
  ASSERT_GE(first, 0);
  std::vector<at::Tensor> one = Train("clip1", 1, true, 100 + first, nullptr, true, 1, nullptr, /*clip=*/0.05);
  EXPECT_TRUE(at::equal(one[0], two[0]));
  EXPECT_TRUE(at::equal(one[1], two[1]));
  std::vector<at::Tensor> unclipped = Train("noclip", 1, true, 100 + first);
  EXPECT_FALSE(at::equal(one[0], unclipped[0])) << "a clip that never acted proves nothing";
}

TEST(ElasticTrainerTest, ReducerAndFlatBucketsTrainAlike) {
  // The two gradient paths (c10d::Reducer with the comm hook during backward;
  // flat buckets after it): two ranks on flat buckets against one rank on the
  // Reducer, from the same start.
  int first = -1;
  std::vector<at::Tensor> flat = Train("flat", 2, false, 100, &first, /*use_reducer=*/false);
  ASSERT_GE(first, 0);
  std::vector<at::Tensor> reducer = Train("reducer", 1, false, 100 + first, nullptr, /*use_reducer=*/true);
  for (size_t i = 0; i < reducer.size(); ++i) {
    const double rel = (reducer[i] - flat[i]).abs().max().item<double>() / flat[i].abs().max().item<double>();
    EXPECT_LT(rel, 1e-5) << "tensor " << i;
  }
}

TEST(ElasticTrainerTest, LastMicroBatchWithoutBackwardIsNamed) {
  // With the Reducer, the step's last backward reduces; one that never ran
  // (or missed a parameter) leaves buckets unreduced and says so.
  at::Tensor w = at::randn({5, 2}).set_requires_grad(true);
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.1));
  ElasticTrainerOptions o = Options(false);
  ASSERT_OK_AND_ASSIGN(auto trainer, ElasticTrainer::Create(comm::ControlStore::InMemory(), GroupOptions("nograd", "m0", 1),
                                                            o, ModelState::FromTensors({w}), adam));
  ASSERT_OK_AND_ASSIGN(std::optional<StepPlan> plan, trainer->NextStep());
  ASSERT_TRUE(plan.has_value());
  ASSERT_EQ(plan->workers.size(), 2u);
  trainer->BeginMicroBatch(0);
  ASSERT_OK(trainer->EndMicroBatch());
  trainer->BeginMicroBatch(1);
  EXPECT_THAT(trainer->EndMicroBatch(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("reduced 0 of 1 gradient buckets")));
}

TEST(ElasticTrainerTest, FailedReductionIsRedoneWithTheReducer) {
  // A generation that fails while the last backward reduces (here: aborted
  // just before it) leaves the step uncommitted; the next boundary recovers
  // and the same step runs again.
  at::Tensor w = at::randn({5, 2}).set_requires_grad(true);
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.1));
  ElasticTrainerOptions o = Options(false);
  o.logical_workers = 1;
  ASSERT_OK_AND_ASSIGN(auto trainer, ElasticTrainer::Create(comm::ControlStore::InMemory(), GroupOptions("abort", "m0", 1),
                                                            o, ModelState::FromTensors({w}), adam));
  const at::Tensor x = at::randn({40, 5});
  auto run_step = [&](bool abort_first) -> absl::StatusOr<bool> {
    MALLE_ASSIGN_OR_RETURN(std::optional<StepPlan> plan, trainer->NextStep());
    if (!plan.has_value()) return absl::InternalError("no plan");
    trainer->BeginMicroBatch(0);
    if (abort_first) trainer->group()->comm().Abort(absl::UnavailableError("test: peer lost"));
    at::Tensor rows = at::tensor(plan->workers[0].indices, at::kLong);
    at::matmul(x.index_select(0, rows), w).pow(2).mean().backward();
    MALLE_RETURN_IF_ERROR(trainer->EndMicroBatch());
    return trainer->FinishStep();
  };
  ASSERT_OK_AND_ASSIGN(bool committed, run_step(false));
  EXPECT_TRUE(committed);
  const at::Tensor before = w.detach().clone();
  ASSERT_OK_AND_ASSIGN(committed, run_step(true));
  EXPECT_FALSE(committed);
  EXPECT_TRUE(at::equal(w, before)) << "the optimizer stepped on a failed reduction";
  EXPECT_EQ(trainer->step(), 1);
  ASSERT_OK_AND_ASSIGN(committed, run_step(false));  // recovered: step 1 again
  EXPECT_TRUE(committed);
  EXPECT_EQ(trainer->step(), 2);
  EXPECT_EQ(trainer->redone_steps(), 1);  // step 1 ran twice
  EXPECT_GE(trainer->generation(), 1);    // the abort was recovered from by a new generation
}

// One rank, L = 2, a model with buffers updated in every forward (a running
// mean, a float64 counter), a tracked extra and a learning-rate decay stepped
// after every FinishStep() whatever it returned (as users step a schedule).
// Returns the final parameters, buffers, extra and learning rate, and the
// trainer's redone_steps.
struct BufferRun {
  std::vector<at::Tensor> state;
  int64_t extra = 0;
  double lr = 0;
  int64_t redone = 0;
};

BufferRun TrainWithBuffers(const std::string& job, const std::set<int64_t>& fail_steps) {
  BufferRun out;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor x = at::randn({40, 5}, gen, at::TensorOptions());
  at::Tensor w = at::randn({5, 2}, gen, at::TensorOptions()).set_requires_grad(true);
  at::Tensor mean = at::zeros({5});
  at::Tensor count = at::zeros({}, at::kDouble);
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.05));
  ElasticTrainerOptions o = Options(/*deterministic=*/true);
  o.steps = 8;
  auto trainer = ElasticTrainer::Create(comm::ControlStore::InMemory(), GroupOptions(job, "m0", 1), o,
                                        ModelState::FromTensors({w}, {mean, count}), adam);
  EXPECT_OK(trainer.status());
  if (!trainer.ok()) return out;
  int64_t schedule = 0;  // the tracked extra
  EXPECT_OK((*trainer)->Track(
      "schedule", [&] { return ExtraState{{}, std::to_string(schedule)}; },
      [&](const ExtraState& s) {
        schedule = std::stoll(s.bytes);
        return absl::OkStatus();
      }));
  std::set<int64_t> to_fail = fail_steps;
  for (;;) {
    auto plan = (*trainer)->NextStep();
    EXPECT_OK(plan.status());
    if (!plan.ok() || !plan->has_value()) break;
    const bool fail = to_fail.erase((*plan)->step) > 0;
    for (size_t i = 0; i < (*plan)->workers.size(); ++i) {
      (*trainer)->BeginMicroBatch(i);
      at::Tensor xb = x.index_select(0, at::tensor((*plan)->workers[i].indices, at::kLong));
      mean.mul_(0.9).add_(xb.mean(0), 0.1);  // what BatchNorm does to its statistics
      count.add_(xb.size(0));
      if (fail && i + 1 == (*plan)->workers.size()) {
        (*trainer)->group()->comm().Abort(absl::UnavailableError("test: peer lost"));
      }
      at::matmul(xb, w).pow(2).mean().backward();
      EXPECT_OK((*trainer)->EndMicroBatch());
    }
    auto committed = (*trainer)->FinishStep();
    EXPECT_OK(committed.status());
    if (committed.ok()) EXPECT_EQ(*committed, !fail);
    // Unguarded, as users step a schedule: the trainer undoes both when the
    // step did not commit.
    ++schedule;
    adam.param_groups()[0].options().set_lr(adam.param_groups()[0].options().get_lr() * 0.9);
  }
  EXPECT_EQ((*trainer)->step(), 8);
  out.state = {w.detach().clone(), mean.clone(), count.clone()};
  out.extra = schedule;
  out.lr = adam.param_groups()[0].options().get_lr();
  out.redone = (*trainer)->redone_steps();
  return out;
}

TEST(ElasticTrainerTest, AFailedStepLeavesNoTraceInBuffersOrTrackedState) {
  const BufferRun clean = TrainWithBuffers("clean", {});
  const BufferRun failed = TrainWithBuffers("failed", {2, 5});
  EXPECT_EQ(clean.redone, 0);
  EXPECT_EQ(failed.redone, 2);
  ASSERT_EQ(failed.state.size(), 3u);
  EXPECT_TRUE(at::equal(failed.state[0], clean.state[0])) << "parameters";
  EXPECT_TRUE(at::equal(failed.state[1], clean.state[1])) << "running mean buffer";
  EXPECT_EQ(failed.state[2].item<double>(), clean.state[2].item<double>()) << "counter buffer";
  // Buffers keep logical worker 0's result each step (DDP with broadcast
  // buffers over L ranks): 8 steps x its 4 samples.
  EXPECT_EQ(clean.state[2].item<double>(), 8 * 4);
  // 8 commits; the failed attempts' increments were rolled back. The last
  // FinishStep's increment comes after the final snapshot: 8 in both runs.
  EXPECT_EQ(failed.extra, clean.extra);
  EXPECT_EQ(clean.extra, 8);
  EXPECT_EQ(failed.lr, clean.lr) << "the optimizer's learning rate kept a failed step's decay";
}

// A sink that keeps what the job reports.
class RecordingSink : public advisor::ReportSink {
 public:
  absl::Status SendReport(const std::string& report_json) override {
    absl::MutexLock lock(&mu_);
    reports_.push_back(report_json);
    return absl::OkStatus();
  }
  absl::Status SendComplete(int64_t steps, int64_t samples) override {
    absl::MutexLock lock(&mu_);
    completions_.emplace_back(steps, samples);
    return absl::OkStatus();
  }
  std::vector<std::string> reports() {
    absl::MutexLock lock(&mu_);
    return reports_;
  }
  std::vector<std::pair<int64_t, int64_t>> completions() {
    absl::MutexLock lock(&mu_);
    return completions_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> reports_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, int64_t>> completions_ ABSL_GUARDED_BY(mu_);
};

TEST(ElasticTrainerTest, ACppJobTakesAdvisorSamplesAndReportsToItsSink) {
  // The C++ trainer is the engine the Python API runs on, advisor included:
  // one sample per committed step, a report on the reporter thread while it
  // trains, a last report and the completion when it is done.
  at::Tensor w = at::randn({5, 2}).set_requires_grad(true);
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.05));
  ElasticTrainerOptions o = Options(false);
  o.steps = 40;
  auto sink = std::make_shared<RecordingSink>();
  o.report_sink = sink;
  o.report_interval = absl::Milliseconds(500);
  o.advisor_job = "cpp-advisor";
  ASSERT_OK_AND_ASSIGN(auto trainer, ElasticTrainer::Create(comm::ControlStore::InMemory(),
                                                            GroupOptions("advisor", "m0", 1), o,
                                                            ModelState::FromTensors({w}), adam));
  EXPECT_EQ(trainer->ReportJson(), "");  // nothing before the first step
  const at::Tensor x = at::randn({40, 5});
  for (;;) {
    ASSERT_OK_AND_ASSIGN(std::optional<StepPlan> plan, trainer->NextStep());
    if (!plan) break;
    for (size_t i = 0; i < plan->workers.size(); ++i) {
      trainer->BeginMicroBatch(i);
      at::Tensor rows = at::tensor(plan->workers[i].indices, at::kLong);
      at::matmul(x.index_select(0, rows), w).pow(2).mean().backward();
      ASSERT_OK(trainer->EndMicroBatch());
    }
    ASSERT_OK_AND_ASSIGN(bool committed, trainer->FinishStep());
    ASSERT_TRUE(committed);
    if (plan->step == 20) absl::SleepFor(absl::Milliseconds(700));  // one reporter tick
  }
  const std::string report = trainer->ReportJson();
  EXPECT_THAT(report, HasSubstr("\"job\":\"cpp-advisor\""));
  EXPECT_THAT(report, HasSubstr("\"steps_observed\":"));
  EXPECT_FALSE(trainer->ReportTable().empty());
  EXPECT_GE(sink->reports().size(), 2u);  // at least one while training, one at the end
  // 40 steps of L = 2 workers x 4 samples.
  EXPECT_THAT(sink->completions(), ElementsAre(std::make_pair(int64_t{40}, int64_t{40 * 2 * 4})));
}

TEST(ElasticTrainerTest, TheAdvisorCountsNodesNotRanks) {
  // Two ranks on one node of 2 slots: the allocator gave the job one node, and
  // the advisor's report (its size, its curve) must say 1, not 2.
  std::string one_node, two_nodes;
  Train("rpn2", 2, false, 100, nullptr, true, /*ranks_per_node=*/2, &one_node);
  Train("rpn1", 2, false, 100, nullptr, true, /*ranks_per_node=*/1, &two_nodes);
  EXPECT_THAT(one_node, HasSubstr("\"current_nodes\":1"));
  EXPECT_THAT(two_nodes, HasSubstr("\"current_nodes\":2"));
}

TEST(ElasticTrainerTest, PlanAndMisuse) {
  at::Tensor w = at::randn({5, 2}).set_requires_grad(true);
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.1));
  ElasticTrainerOptions o = Options(false);
  o.logical_workers = 3;
  ASSERT_OK_AND_ASSIGN(auto trainer, ElasticTrainer::Create(comm::ControlStore::InMemory(), GroupOptions("misuse", "m0", 1),
                                                            o, ModelState::FromTensors({w}), adam));
  EXPECT_EQ(trainer->rank(), -1);  // joins at the first NextStep
  EXPECT_THAT(trainer->FinishStep(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("NextStep")));
  ASSERT_OK_AND_ASSIGN(std::optional<StepPlan> plan, trainer->NextStep());
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->step, 0);
  EXPECT_EQ(plan->size, 1);
  ASSERT_EQ(plan->workers.size(), 3u);  // one rank runs all three logical workers
  EXPECT_EQ(plan->workers[2].worker, 2);
  EXPECT_EQ(plan->workers[1].rng_seed, MixSeed({3, 0, 1}));
  EXPECT_THAT(plan->workers[0].indices, ::testing::SizeIs(4));
  ASSERT_EQ(trainer->history().size(), 1u);
  EXPECT_EQ(trainer->history()[0].kind, comm::Transition::Kind::kBootstrap);
  EXPECT_THAT(trainer->NextStep(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("FinishStep")));
  trainer->BeginMicroBatch(0);
  ASSERT_OK(trainer->EndMicroBatch());
  EXPECT_THAT(trainer->EndMicroBatch(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(trainer->FinishStep(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("1 of 3")));
}

}  // namespace
}  // namespace malle::elastic
