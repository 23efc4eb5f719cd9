// ElasticSampler: exactly-once data order for elastic jobs, as a pure function.
//
// Defines ElasticSampler, MixSeed and AssignWorkers, the one implementation
// (python/malletrain/sampler.py binds them). Permutations are at::randperm
// from a CPU generator seeded with MixSeed(seed, epoch), as
// torch.randperm(n, generator=torch.Generator().manual_seed(s)) draws them.
//
// The samples form one stream: epoch e is a permutation of [0, N) seeded by
// MixSeed(seed, e), then epoch e+1, ... Step s takes the global batch at
// stream positions [s*L*B, (s+1)*L*B) and logical worker k the k-th slice of
// B. Every sample is trained exactly once per epoch whatever the resizes; a
// step may straddle two epochs (the global batch never shrinks).
//
//   SamplerOptions o;
//   o.num_samples = 1500, o.logical_workers = 4, o.batch_size = 16, o.seed = 0;
//   MALLE_ASSIGN_OR_RETURN(ElasticSampler sampler, ElasticSampler::Create(o));
//   for (int k : AssignWorkers(4, size, rank)) Train(sampler.Indices(step, k));
//
// Thread-safety: ElasticSampler caches the permutations of the two newest
// epochs it was asked for, so one instance must not be used by two threads at
// once (copies are independent). MixSeed and AssignWorkers are pure.
#ifndef MALLE_ELASTIC_SAMPLER_H_
#define MALLE_ELASTIC_SAMPLER_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace malle::elastic {

// A 63-bit seed from integers: the splitmix64 fold of
// malletrain.sampler.mix_seed (negative parts enter as their two's complement).
uint64_t MixSeed(absl::Span<const int64_t> parts);

// The logical workers rank `rank` of `world_size` runs: a contiguous block,
// the first L mod n ranks one more, so rank 0 always runs worker 0.
// Requires 1 <= world_size <= logical_workers and 0 <= rank < world_size
// (MALLE_CHECK: callers get both from a validated membership).
std::vector<int> AssignWorkers(int logical_workers, int world_size, int rank);

struct SamplerOptions {
  int64_t num_samples = 0;    // N, the dataset length
  int logical_workers = 0;    // L, fixed for the whole job
  int64_t batch_size = 0;     // B, samples per logical worker per step
  uint64_t seed = 0;          // seeds every epoch's permutation
  bool shuffle = true;        // false: dataset order in every epoch
};

class ElasticSampler {
 public:
  // Errors: kInvalidArgument naming the field if an argument is not positive,
  // or if N < L*B (an epoch would be shorter than one global batch).
  static absl::StatusOr<ElasticSampler> Create(const SamplerOptions& options);

  int64_t num_samples() const { return options_.num_samples; }
  int logical_workers() const { return options_.logical_workers; }
  int64_t batch_size() const { return options_.batch_size; }
  int64_t global_batch() const { return options_.logical_workers * options_.batch_size; }
  // Whole steps that fit in `epochs` epochs: floor(epochs * N / (L*B)); with
  // drop_last false, one more when a tail is left: ceil(epochs * N / (L*B)).
  int64_t StepsForEpochs(double epochs, bool drop_last = true) const;
  // The epoch of the first sample of `step`.
  int64_t EpochOf(int64_t step) const { return step * global_batch() / options_.num_samples; }

  // Dataset indices of logical worker `worker` at `step` (B of them).
  // Requires step >= 0 and 0 <= worker < L (MALLE_CHECK).
  std::vector<int64_t> Indices(int64_t step, int worker);
  // Dataset indices at stream positions [position, position + count).
  std::vector<int64_t> Stream(int64_t position, int64_t count);
  // The epoch of each index Indices(step, worker) returns.
  std::vector<int64_t> SampleEpochs(int64_t step, int worker) const;

 private:
  explicit ElasticSampler(const SamplerOptions& options) : options_(options) {}
  const at::Tensor& Permutation(int64_t epoch);

  SamplerOptions options_;
  std::map<int64_t, at::Tensor> perms_;  // at most two epochs
};

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_SAMPLER_H_
