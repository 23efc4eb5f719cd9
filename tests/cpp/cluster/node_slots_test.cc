#include "libmalle/cluster/node_slots.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace malle::cluster {
namespace {

using ::testing::HasSubstr;

// An environment where "" is a value (set but empty), as ProcessEnvRaw gives it.
EnvLookup From(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(NodeSlotsTest, CudaVisibleDevicesWinsAndIsInherited) {
  auto g = DetectGpus(From({{"CUDA_VISIBLE_DEVICES", "2,3"}, {"SLURM_JOB_GPUS", "0,1,2,3"}}), 4);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->count, 2);
  EXPECT_EQ(g->visible_devices, "");  // the ranks inherit the agent's
  EXPECT_EQ(g->source, "CUDA_VISIBLE_DEVICES=2,3");
  auto uuids = DetectGpus(From({{"CUDA_VISIBLE_DEVICES", "GPU-8f1c,MIG-5a2e"}}), -1);
  ASSERT_TRUE(uuids.ok()) << uuids.status();
  EXPECT_EQ(uuids->count, 2);
}

TEST(NodeSlotsTest, SlurmGresListsBecomeTheRanksDevices) {
  // A step's GPUs win over the job's; the ranks see exactly those.
  auto step = DetectGpus(From({{"SLURM_STEP_GPUS", "1,3"}, {"SLURM_JOB_GPUS", "0,1,2,3"},
                               {"SLURM_GPUS_ON_NODE", "4"}}), 4);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->count, 2);
  EXPECT_EQ(step->visible_devices, "1,3");
  auto job = DetectGpus(From({{"SLURM_JOB_GPUS", "0, 2"}}), -1);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->count, 2);
  EXPECT_EQ(job->visible_devices, "0,2");
  EXPECT_EQ(job->source, "SLURM_JOB_GPUS=0,2");
  auto on_node = DetectGpus(From({{"SLURM_GPUS_ON_NODE", "6"}}), 6);
  ASSERT_TRUE(on_node.ok()) << on_node.status();
  EXPECT_EQ(on_node->count, 6);
  EXPECT_EQ(on_node->visible_devices, "");
}

TEST(NodeSlotsTest, DriverDevicesWhenNothingElseSays) {
  auto g = DetectGpus(From({}), 8);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->count, 8);
}

TEST(NodeSlotsTest, NoGpuIsAClearError) {
  auto none = DetectGpus(From({}), 0);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("no GPU on this node: CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS, SLURM_JOB_GPUS and "
                        "SLURM_GPUS_ON_NODE are unset"));
  for (const char* hidden : {"", "-1", "NoDevFiles"}) {
    auto h = DetectGpus(From({{"CUDA_VISIBLE_DEVICES", hidden}}), 4);
    ASSERT_EQ(h.status().code(), absl::StatusCode::kNotFound) << hidden;
    EXPECT_THAT(std::string(h.status().message()), HasSubstr("hides every GPU")) << hidden;
  }
  auto zero = DetectGpus(From({{"SLURM_GPUS_ON_NODE", "0"}}), 4);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kNotFound);
}

TEST(NodeSlotsTest, MalformedListsNameTheVariable) {
  struct Case {
    std::map<std::string, std::string> vars;
    int driver;
    std::string want;
  };
  const Case cases[] = {
      {{{"CUDA_VISIBLE_DEVICES", "0,x"}}, 4, "CUDA_VISIBLE_DEVICES='0,x': 'x' is not a GPU index"},
      {{{"CUDA_VISIBLE_DEVICES", "1,1"}}, 4, "CUDA_VISIBLE_DEVICES='1,1' lists GPU 1 twice"},
      {{{"CUDA_VISIBLE_DEVICES", "0,5"}}, 4, "names GPU 5, but the driver shows 4 device(s)"},
      {{{"SLURM_JOB_GPUS", "0,,1"}}, -1, "SLURM_JOB_GPUS='0,,1': '' is not a GPU index"},
      {{{"SLURM_STEP_GPUS", "GPU-abc"}}, -1, "SLURM_STEP_GPUS='GPU-abc'"},
      {{{"SLURM_GPUS_ON_NODE", "two"}}, -1, "SLURM_GPUS_ON_NODE: must be a non-negative integer"},
  };
  for (const Case& c : cases) {
    auto g = DetectGpus(From(c.vars), c.driver);
    ASSERT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_THAT(std::string(g.status().message()), HasSubstr(c.want));
  }
}

TEST(NodeSlotsTest, ExplicitList) {
  auto g = ParseGpuList("0,1,3", 4);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->count, 3);
  EXPECT_EQ(g->visible_devices, "0,1,3");
  EXPECT_EQ(ParseGpuList("", 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ParseGpuList("0,4", 4).status().message()), HasSubstr("names GPU 4"));
}

TEST(NodeSlotsTest, SlotsAgainstGpus) {
  NodeGpus two{2, "", "CUDA_VISIBLE_DEVICES=0,1"};
  EXPECT_EQ(*ResolveSlots(-1, std::nullopt), 1);  // a CPU node: one rank
  EXPECT_EQ(*ResolveSlots(-1, two), 2);           // one rank per GPU
  EXPECT_EQ(*ResolveSlots(1, two), 1);
  EXPECT_EQ(*ResolveSlots(4, std::nullopt), 4);   // CPU ranks (Gloo)
  auto zero = ResolveSlots(0, std::nullopt);
  ASSERT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(zero.status().message()), HasSubstr("--slots: must be in [1, 1024]"));
  EXPECT_FALSE(ResolveSlots(1025, std::nullopt).ok());
  auto more = ResolveSlots(4, two);
  ASSERT_EQ(more.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(more.status().message()),
              HasSubstr("--slots 4 is more than the 2 GPU(s) of this node (CUDA_VISIBLE_DEVICES=0,1)"));
}

TEST(NodeSlotsTest, RankCudaDeviceIsItsLocalRank) {
  RankEnv env;
  env.node = "n3";
  env.member_id = "n3-7-r2";
  env.local_rank = 1;
  env.local_world_size = 2;
  EXPECT_EQ(*RankCudaDevice(env, 2), 1);
  env.local_rank = 2;
  env.local_world_size = 4;
  auto more = RankCudaDevice(env, 2);
  ASSERT_EQ(more.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(more.status().message()),
              HasSubstr("rank n3-7-r2 (LOCAL_RANK=2 of LOCAL_WORLD_SIZE=4) has no CUDA device: node n3 shows 2 "
                        "device(s)"));
  env.local_rank = 0;
  auto none = RankCudaDevice(env, 0);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("sees no CUDA device on node n3"));
}

TEST(NodeSlotsTest, CountsDriverDeviceFiles) {
  char tmpl[] = "/tmp/node_slots_test.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  for (const char* f : {"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "sda"}) {
    FILE* fp = std::fopen((dir + "/" + f).c_str(), "w");
    ASSERT_NE(fp, nullptr);
    std::fclose(fp);
  }
  EXPECT_EQ(CountDriverDevices(dir), 2);
  EXPECT_EQ(CountDriverDevices(dir + "/absent"), 0);
  for (const char* f : {"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "sda"}) ::unlink((dir + "/" + f).c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace malle::cluster
