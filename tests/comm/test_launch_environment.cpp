// Recognising the launcher from the environment, and the errors of an inconsistent env:// launch: every
// problem named with its variable, value and constraint, all of them at once.
#include <gtest/gtest.h>

#include <map>

#include "harness.h"
#include "megatron/comm/launch_environment.h"

namespace megatron::comm {
namespace {

using Env = std::map<std::string, std::string>;

LaunchEnvironment detect(const Env& env) {
  return detect_launch([&](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

// What torchrun 1.13 gives worker 1 of `--nproc_per_node=2` (static rendezvous: the agent's store on MASTER_PORT).
Env torchrun_worker() {
  return {{"RANK", "1"},          {"WORLD_SIZE", "2"},          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
          {"GROUP_RANK", "0"},    {"TORCHELASTIC_RUN_ID", "none"}, {"TORCHELASTIC_RESTART_COUNT", "0"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
}

TEST(LaunchEnvironment, NoLauncherIsAWorldOfOne) {
  EXPECT_EQ(detect({}).launcher, Launcher::None);
  EXPECT_EQ(detect({{"RANK", "3"}}).launcher, Launcher::None) << "RANK alone (a shell variable) is no launch";
  EXPECT_EQ(detect({{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}}).launcher, Launcher::None);
}

TEST(LaunchEnvironment, MpiLaunchers) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    EXPECT_EQ(detect({{name, "0"}}).launcher, Launcher::Mpi) << name;
    // torch's variables exported by a user script do not turn an mpirun launch into an env:// one
    EXPECT_EQ(detect({{name, "0"}, {"RANK", "0"}, {"WORLD_SIZE", "4"}}).launcher, Launcher::Mpi) << name;
  }
}

TEST(LaunchEnvironment, TorchrunWorkerWithTheAgentStore) {
  const LaunchEnvironment l = detect(torchrun_worker());
  ASSERT_EQ(l.launcher, Launcher::Torchrun);
  EXPECT_EQ(l.torchrun.rank, 1);
  EXPECT_EQ(l.torchrun.world_size, 2);
  EXPECT_EQ(l.torchrun.local_rank, 1);
  EXPECT_EQ(l.torchrun.local_world_size, 2);
  EXPECT_EQ(l.torchrun.master_addr, "127.0.0.1");
  EXPECT_EQ(l.torchrun.master_port, 29500);
  EXPECT_EQ(l.torchrun.rendezvous_port, 29501) << "the agent holds MASTER_PORT";
  EXPECT_NE(l.torchrun.rendezvous_port_origin.find("MASTER_PORT + 1"), std::string::npos);
  EXPECT_NE(l.torchrun.job_id.find("127.0.0.1:29500"), std::string::npos);
}

TEST(LaunchEnvironment, RendezvousPortChoice) {
  Env env = torchrun_worker();
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";  // torch 1.13's c10d backend: MASTER_PORT is free for rank 0
  EXPECT_EQ(detect(env).torchrun.rendezvous_port, 29500);
  env.erase("TORCHELASTIC_USE_AGENT_STORE");
  EXPECT_EQ(detect(env).torchrun.rendezvous_port, 29500);
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["MEGATRON_RENDEZVOUS_PORT"] = "40000";
  EXPECT_EQ(detect(env).torchrun.rendezvous_port, 40000);
  EXPECT_EQ(detect(env).torchrun.rendezvous_port_origin, "MEGATRON_RENDEZVOUS_PORT");
}

TEST(LaunchEnvironment, TorchrunWinsOverInheritedMpiVariables) {
  // `srun --mpi=pmix torchrun ...`: the workers inherit the agent's PMIx rank, which is not theirs.
  Env env = torchrun_worker();
  env["PMIX_RANK"] = "0";
  env["OMPI_COMM_WORLD_SIZE"] = "1";
  EXPECT_EQ(detect(env).launcher, Launcher::Torchrun);
}

TEST(LaunchEnvironment, PlainEnvLaunchWithoutLocalWorldSize) {
  const LaunchEnvironment l = detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"},
                                      {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "6000"}});
  ASSERT_EQ(l.launcher, Launcher::Torchrun);
  EXPECT_EQ(l.torchrun.local_world_size, 1);
  EXPECT_EQ(l.torchrun.rendezvous_port, 6000);
}

TEST(LaunchEnvironment, EveryInconsistencyIsNamed) {
  Env env = torchrun_worker();
  env["RANK"] = "2";
  env["LOCAL_RANK"] = "2";
  env.erase("MASTER_ADDR");
  env["MASTER_PORT"] = "http";
  testing::expect_error([&] { detect(env); },
                        {"RANK=2 must be < WORLD_SIZE=2", "LOCAL_RANK=2 must be < LOCAL_WORLD_SIZE=2",
                         "MASTER_ADDR is not set", "MASTER_PORT=http must be an integer in [1, 65535]"});
  env = torchrun_worker();
  env.erase("LOCAL_RANK");
  env["WORLD_SIZE"] = "0";
  testing::expect_error([&] { detect(env); }, {"LOCAL_RANK is not set", "WORLD_SIZE=0 must be an integer in [1,"});
  env = torchrun_worker();
  env["MASTER_ADDR"] = "";
  env["LOCAL_WORLD_SIZE"] = "3";
  env["MEGATRON_RENDEZVOUS_PORT"] = "70000";
  testing::expect_error([&] { detect(env); }, {"MASTER_ADDR is empty", "LOCAL_WORLD_SIZE=3 must be <= WORLD_SIZE=2",
                                              "MEGATRON_RENDEZVOUS_PORT=70000 must be an integer in [1, 65535]"});
  env = torchrun_worker();
  env["MASTER_PORT"] = "65535";
  testing::expect_error([&] { detect(env); }, {"MASTER_PORT=65535 leaves no MASTER_PORT + 1"});
  env = torchrun_worker();
  env["RANK"] = "0";
  testing::expect_error([&] { detect(env); }, {"LOCAL_RANK=1 must be <= RANK=0"});
}

}  // namespace
}  // namespace megatron::comm
