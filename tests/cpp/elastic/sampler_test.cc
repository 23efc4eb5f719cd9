// ElasticSampler, MixSeed and AssignWorkers: pure functions that match the
// Python implementation bit for bit (expected values computed with
// python/malletrain/sampler.py), exactly-once per epoch across straddling
// steps, and clear errors for bad input.
#include "libmalle/elastic/sampler.h"

#include <map>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::elastic {
namespace {

using ::malle::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

SamplerOptions Opts(int64_t n, int l, int64_t b, uint64_t seed, bool shuffle = true) {
  SamplerOptions o;
  o.num_samples = n;
  o.logical_workers = l;
  o.batch_size = b;
  o.seed = seed;
  o.shuffle = shuffle;
  return o;
}

TEST(MixSeedTest, MatchesPythonMixSeed) {
  // PYTHONPATH=python python -c "from malletrain.sampler import mix_seed; print(mix_seed(...))"
  EXPECT_EQ(MixSeed({0}), 7960286522194355700ULL);
  EXPECT_EQ(MixSeed({0, 0}), 5095610196844313600ULL);
  EXPECT_EQ(MixSeed({7, 3, 1}), 8308220510286519323ULL);
  EXPECT_EQ(MixSeed({-1, 5}), 8221817183302629875ULL);
  EXPECT_EQ(MixSeed({123456789, int64_t{1} << 40, 3}), 3129061745672329517ULL);
  EXPECT_LT(MixSeed({99, 98}), uint64_t{1} << 63);
}

TEST(ElasticSamplerTest, SameIndicesAsPythonSampler) {
  // ElasticSampler(100, 4, 8, seed=5).indices(step, worker) in Python.
  ASSERT_OK_AND_ASSIGN(ElasticSampler s, ElasticSampler::Create(Opts(100, 4, 8, 5)));
  EXPECT_THAT(s.Indices(0, 0), ElementsAre(96, 73, 24, 14, 5, 28, 80, 40));
  EXPECT_THAT(s.Indices(3, 2), ElementsAre(56, 32, 39, 87, 83, 66, 1, 89));
  EXPECT_THAT(s.Indices(12, 3), ElementsAre(73, 36, 7, 83, 93, 40, 24, 2));
  EXPECT_THAT(s.Indices(3, 0), ElementsAre(38, 95, 82, 91, 45, 64, 19, 37));  // straddles epochs 0/1
  ASSERT_OK_AND_ASSIGN(ElasticSampler ordered, ElasticSampler::Create(Opts(100, 4, 8, 5, false)));
  EXPECT_THAT(ordered.Indices(3, 0), ElementsAre(96, 97, 98, 99, 0, 1, 2, 3));
}

TEST(ElasticSamplerTest, IsAPureFunctionOfSeedStepAndWorker) {
  ASSERT_OK_AND_ASSIGN(ElasticSampler a, ElasticSampler::Create(Opts(1000, 6, 7, 42)));
  ASSERT_OK_AND_ASSIGN(ElasticSampler b, ElasticSampler::Create(Opts(1000, 6, 7, 42)));
  // Different query orders (b jumps around, evicting its cache) give the same answers.
  std::map<std::pair<int64_t, int>, std::vector<int64_t>> seen;
  for (int64_t step = 0; step < 60; ++step) {
    for (int k = 0; k < 6; ++k) seen[{step, k}] = a.Indices(step, k);
  }
  for (int64_t step = 59; step >= 0; step -= 7) {
    for (int k = 5; k >= 0; --k) EXPECT_EQ(b.Indices(step, k), (seen[{step, k}])) << step << "," << k;
  }
  ASSERT_OK_AND_ASSIGN(ElasticSampler other_seed, ElasticSampler::Create(Opts(1000, 6, 7, 43)));
  EXPECT_NE(other_seed.Indices(0, 0), (seen[{0, 0}]));
}

TEST(ElasticSamplerTest, EverySampleExactlyOncePerEpochAcrossStraddlingSteps) {
  // N = 103 is not a multiple of the global batch 3 x 5 = 15: steps straddle epochs.
  ASSERT_OK_AND_ASSIGN(ElasticSampler s, ElasticSampler::Create(Opts(103, 3, 5, 9)));
  std::map<int64_t, std::multiset<int64_t>> by_epoch;
  const int64_t steps = s.StepsForEpochs(4.0);
  EXPECT_EQ(steps, 27);  // floor(4 * 103 / 15)
  for (int64_t step = 0; step < steps; ++step) {
    for (int k = 0; k < 3; ++k) {
      std::vector<int64_t> idx = s.Indices(step, k);
      std::vector<int64_t> ep = s.SampleEpochs(step, k);
      ASSERT_EQ(idx.size(), 5u);
      for (size_t i = 0; i < idx.size(); ++i) by_epoch[ep[i]].insert(idx[i]);
    }
  }
  for (int64_t e = 0; e < 3; ++e) {  // complete epochs: each index exactly once
    ASSERT_EQ(by_epoch[e].size(), 103u) << "epoch " << e;
    for (int64_t i = 0; i < 103; ++i) EXPECT_EQ(by_epoch[e].count(i), 1u) << "epoch " << e << " index " << i;
  }
  EXPECT_EQ(by_epoch[3].size(), 27u * 15 - 3 * 103);  // the partial last epoch: no repeats
  EXPECT_EQ(std::set<int64_t>(by_epoch[3].begin(), by_epoch[3].end()).size(), by_epoch[3].size());
  EXPECT_EQ(s.EpochOf(6), 0);
  EXPECT_EQ(s.EpochOf(7), 1);  // positions 105.. are in epoch 1
}

TEST(ElasticSamplerTest, BadInputIsNamed) {
  EXPECT_THAT(ElasticSampler::Create(Opts(0, 4, 8, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_samples")));
  EXPECT_THAT(ElasticSampler::Create(Opts(100, 0, 8, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("logical_workers")));
  EXPECT_THAT(ElasticSampler::Create(Opts(100, 4, -1, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch_size")));
  EXPECT_THAT(ElasticSampler::Create(Opts(31, 4, 8, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fewer than one global batch")));
}

TEST(AssignWorkersTest, ContiguousBlocksFirstRanksGetOneMore) {
  struct Case {
    int l, n, rank;
    std::vector<int> want;
  };
  const std::vector<Case> cases = {
      {4, 4, 0, {0}},       {4, 4, 3, {3}},       {4, 2, 0, {0, 1}},    {4, 2, 1, {2, 3}},
      {4, 3, 0, {0, 1}},    {4, 3, 1, {2}},       {4, 3, 2, {3}},       {4, 1, 0, {0, 1, 2, 3}},
      {7, 3, 0, {0, 1, 2}}, {7, 3, 1, {3, 4}},    {7, 3, 2, {5, 6}},    {1, 1, 0, {0}},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(AssignWorkers(c.l, c.n, c.rank), c.want) << c.l << " " << c.n << " " << c.rank;
  }
  // Every size partitions [0, L) in rank order.
  for (int n = 1; n <= 9; ++n) {
    std::vector<int> all;
    for (int r = 0; r < n; ++r) {
      std::vector<int> w = AssignWorkers(9, n, r);
      all.insert(all.end(), w.begin(), w.end());
    }
    ASSERT_EQ(all.size(), 9u);
    for (int k = 0; k < 9; ++k) EXPECT_EQ(all[k], k);
  }
}

TEST(AssignWorkersDeathTest, MoreRanksThanWorkersIsAProgrammingError) {
  EXPECT_DEATH(AssignWorkers(2, 3, 0), "world size 3");
}

}  // namespace
}  // namespace malle::elastic
