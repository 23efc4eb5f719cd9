#include "libmalle/cluster/node_slots.h"

#include <dirent.h>

#include <cctype>
#include <cstdlib>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace malle::cluster {
namespace {

// A comma-separated device list. `uuids`: entries may also be GPU-/MIG- UUIDs
// (CUDA_VISIBLE_DEVICES accepts them). The error names `what`.
absl::StatusOr<std::vector<std::string>> ParseList(absl::string_view what, absl::string_view text, bool uuids,
                                                   int driver_devices) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (absl::string_view raw : absl::StrSplit(text, ',')) {
    const std::string entry(absl::StripAsciiWhitespace(raw));
    int index = -1;
    if (absl::SimpleAtoi(entry, &index) && index >= 0) {
      if (driver_devices >= 0 && index >= driver_devices) {
        return absl::InvalidArgumentError(absl::StrCat(what, "='", text, "' names GPU ", index, ", but the driver shows ",
                                                       driver_devices, " device(s) on this node"));
      }
    } else if (!(uuids && (absl::StartsWith(entry, "GPU-") || absl::StartsWith(entry, "MIG-")) && entry.size() > 4)) {
      return absl::InvalidArgumentError(absl::StrCat(what, "='", text, "': '", entry,
                                                     "' is not a GPU index (a non-negative integer)",
                                                     uuids ? " nor a GPU-/MIG- UUID" : ""));
    }
    if (!seen.insert(entry).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, "='", text, "' lists GPU ", entry, " twice"));
    }
    out.push_back(entry);
  }
  return out;
}

}  // namespace

absl::StatusOr<NodeGpus> DetectGpus(const EnvLookup& lookup, int driver_devices) {
  if (std::optional<std::string> cvd = lookup(kEnvCudaVisibleDevices)) {
    const std::string v(absl::StripAsciiWhitespace(*cvd));
    if (v.empty() || v == "-1" || v == "NoDevFiles") {
      return absl::NotFoundError(absl::StrCat(kEnvCudaVisibleDevices, "='", *cvd,
                                              "' hides every GPU from this node's processes"));
    }
    auto list = ParseList(kEnvCudaVisibleDevices, v, /*uuids=*/true, driver_devices);
    if (!list.ok()) return list.status();
    NodeGpus g;
    g.count = static_cast<int>(list->size());
    g.source = absl::StrCat(kEnvCudaVisibleDevices, "=", v);
    return g;  // the ranks inherit it
  }
  for (const char* var : {kEnvSlurmStepGpus, kEnvSlurmJobGpus}) {
    std::optional<std::string> ids = lookup(var);
    if (!ids || absl::StripAsciiWhitespace(*ids).empty()) continue;
    auto list = ParseList(var, absl::StripAsciiWhitespace(*ids), /*uuids=*/false, driver_devices);
    if (!list.ok()) return list.status();
    NodeGpus g;
    g.count = static_cast<int>(list->size());
    g.visible_devices = absl::StrJoin(*list, ",");
    g.source = absl::StrCat(var, "=", g.visible_devices);
    return g;
  }
  if (std::optional<std::string> n = lookup(kEnvSlurmGpusOnNode); n && !n->empty()) {
    int count = 0;
    if (!absl::SimpleAtoi(*n, &count) || count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kEnvSlurmGpusOnNode, ": must be a non-negative integer, got '", *n, "'"));
    }
    if (count == 0) {
      return absl::NotFoundError(absl::StrCat(kEnvSlurmGpusOnNode,
                                              "=0: the Slurm allocation gives this node no GPU"));
    }
    NodeGpus g;
    g.count = count;
    g.source = absl::StrCat(kEnvSlurmGpusOnNode, "=", count);
    return g;
  }
  if (driver_devices > 0) {
    NodeGpus g;
    g.count = driver_devices;
    g.source = absl::StrCat("the driver (", driver_devices, " /dev/nvidia<N> devices)");
    return g;
  }
  return absl::NotFoundError(absl::StrCat(
      "no GPU on this node: ", kEnvCudaVisibleDevices, ", ", kEnvSlurmStepGpus, ", ",
      kEnvSlurmJobGpus, " and ", kEnvSlurmGpusOnNode, " are unset and the driver shows ",
      "no device (/dev/nvidia<N>)",
      "; run without --gpus for CPU ranks (Gloo), with --slots N"));
}

absl::StatusOr<NodeGpus> ParseGpuList(absl::string_view list, int driver_devices) {
  const absl::string_view v = absl::StripAsciiWhitespace(list);
  if (v.empty()) return absl::InvalidArgumentError("--gpus: give 'auto' or a list of GPU indices such as 0,1");
  auto ids = ParseList("--gpus", v, /*uuids=*/false, driver_devices);
  if (!ids.ok()) return ids.status();
  NodeGpus g;
  g.count = static_cast<int>(ids->size());
  g.visible_devices = absl::StrJoin(*ids, ",");
  g.source = absl::StrCat("--gpus ", g.visible_devices);
  return g;
}

absl::StatusOr<int> ResolveSlots(int slots, const std::optional<NodeGpus>& gpus) {
  if (slots == -1) return gpus ? gpus->count : 1;
  if (slots < 1 || slots > kMaxNodeSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slots: must be in [1, ", kMaxNodeSlots, "] (ranks per node), got ", slots));
  }
  if (gpus && slots > gpus->count) {
    return absl::InvalidArgumentError(absl::StrCat("--slots ", slots, " is more than the ", gpus->count,
                                                   " GPU(s) of this node (", gpus->source,
                                                   "): each rank needs its own device"));
  }
  return slots;
}

absl::StatusOr<int> RankCudaDevice(const RankEnv& env, int visible_devices) {
  const std::string where = env.node.empty() ? "this node" : absl::StrCat("node ", env.node);
  if (visible_devices <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", env.member_id.empty() ? "" : absl::StrCat(env.member_id, " "), "(", kEnvLocalRank, "=",
        env.local_rank, ") sees no CUDA device on ", where, " (", kEnvCudaVisibleDevices,
        " hides them, or there is no GPU): the NCCL backend needs one per rank; use backend 'gloo' on CPU"));
  }
  if (env.local_rank >= visible_devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", env.member_id.empty() ? "" : absl::StrCat(env.member_id, " "), "(", kEnvLocalRank, "=",
        env.local_rank, " of ", kEnvLocalWorldSize, "=", env.local_world_size, ") has no CUDA device: ", where,
        " shows ", visible_devices, " device(s); run at most ", visible_devices,
        " slot(s) there (malle-agent --slots / --gpus auto)"));
  }
  return env.local_rank;
}

std::optional<std::string> ProcessEnvRaw(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

int CountDriverDevices(const std::string& dev_dir) {
  DIR* dir = ::opendir(dev_dir.c_str());
  if (dir == nullptr) return 0;
  int n = 0;
  while (const dirent* e = ::readdir(dir)) {
    absl::string_view name(e->d_name);
    if (!absl::ConsumePrefix(&name, "nvidia") || name.empty()) continue;
    bool digits = true;
    for (char c : name) digits &= std::isdigit(static_cast<unsigned char>(c)) != 0;
    n += digits ? 1 : 0;
  }
  ::closedir(dir);
  return n;
}

}  // namespace malle::cluster
