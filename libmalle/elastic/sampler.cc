#include "libmalle/elastic/sampler.h"

#include <algorithm>
#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/randperm.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libmalle/base/check.h"

namespace malle::elastic {

uint64_t MixSeed(absl::Span<const int64_t> parts) {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
  uint64_t h = kGolden;
  for (int64_t part : parts) {
    h ^= static_cast<uint64_t>(part);
    h += kGolden;
    uint64_t z = h;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    h = z ^ (z >> 31);
  }
  return h & ((uint64_t{1} << 63) - 1);
}

std::vector<int> AssignWorkers(int logical_workers, int world_size, int rank) {
  MALLE_CHECK(world_size >= 1 && world_size <= logical_workers)
      << "world size " << world_size << " with " << logical_workers << " logical workers";
  MALLE_CHECK(rank >= 0 && rank < world_size) << "rank " << rank << " of " << world_size;
  const int base = logical_workers / world_size;
  const int extra = logical_workers % world_size;
  const int start = rank * base + std::min(rank, extra);
  const int count = base + (rank < extra ? 1 : 0);
  std::vector<int> workers(count);
  for (int i = 0; i < count; ++i) workers[i] = start + i;
  return workers;
}

absl::StatusOr<ElasticSampler> ElasticSampler::Create(const SamplerOptions& options) {
  if (options.num_samples <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_samples: must be positive, got ", options.num_samples));
  }
  if (options.logical_workers <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("logical_workers: must be positive, got ", options.logical_workers));
  }
  if (options.batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size: must be positive, got ", options.batch_size));
  }
  const int64_t global = options.logical_workers * options.batch_size;
  if (options.num_samples < global) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset: has ", options.num_samples, " samples, fewer than one global batch (logical_workers ",
        options.logical_workers, " x batch_size ", options.batch_size, " = ", global, ")"));
  }
  return ElasticSampler(options);
}

int64_t ElasticSampler::StepsForEpochs(double epochs, bool drop_last) const {
  const double steps = epochs * static_cast<double>(options_.num_samples) / static_cast<double>(global_batch());
  // ceil: 1e-9 keeps an exact multiple computed in floating point exact.
  return static_cast<int64_t>(drop_last ? std::floor(steps) : std::ceil(steps - 1e-9));
}

const at::Tensor& ElasticSampler::Permutation(int64_t epoch) {
  auto it = perms_.find(epoch);
  if (it != perms_.end()) return it->second;
  at::Tensor perm;
  if (options_.shuffle) {
    // Same as Python's torch.Generator().manual_seed(s): a fresh mt19937 seeded with s.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
        MixSeed({static_cast<int64_t>(options_.seed), epoch}));
    perm = at::randperm(options_.num_samples, gen);
  } else {
    perm = at::arange(options_.num_samples, at::kLong);
  }
  // Steps only move forward (or redo one): two epochs cover a straddling step.
  if (perms_.size() >= 2) perms_.erase(perms_.begin());
  return perms_.emplace(epoch, perm.contiguous()).first->second;
}

std::vector<int64_t> ElasticSampler::Indices(int64_t step, int worker) {
  MALLE_CHECK(step >= 0) << "step " << step;
  MALLE_CHECK(worker >= 0 && worker < options_.logical_workers) << "worker " << worker;
  return Stream(step * global_batch() + worker * options_.batch_size, options_.batch_size);
}

std::vector<int64_t> ElasticSampler::Stream(int64_t position, int64_t count) {
  MALLE_CHECK(position >= 0 && count >= 0) << "stream " << position << " " << count;
  std::vector<int64_t> out;
  out.reserve(count);
  int64_t pos = position;
  const int64_t end = position + count;
  const int64_t n = options_.num_samples;
  while (pos < end) {
    const int64_t epoch = pos / n;
    const int64_t offset = pos % n;
    const int64_t take = std::min(end - pos, n - offset);
    const int64_t* p = Permutation(epoch).data_ptr<int64_t>();
    out.insert(out.end(), p + offset, p + offset + take);
    pos += take;
  }
  return out;
}

std::vector<int64_t> ElasticSampler::SampleEpochs(int64_t step, int worker) const {
  const int64_t start = step * global_batch() + worker * options_.batch_size;
  std::vector<int64_t> out(options_.batch_size);
  for (int64_t i = 0; i < options_.batch_size; ++i) out[i] = (start + i) / options_.num_samples;
  return out;
}

}  // namespace malle::elastic
