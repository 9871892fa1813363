// The drop-in launch: `torchrun --no-python --nproc_per_node=2 pretrain_gpt <flags>` trains the tiny model on
// mock data at DP=2 (distributed optimizer, overlapped reduction) and at TP=2 with sequence parallelism with
// the same losses and gradient norms, iteration by iteration, and the same validation loss as
// `mpirun -np 2 pretrain_gpt <flags>`, and leaves the same bytes in every rank's checkpoint shard (weights
// and optimizer state after the last iteration). The DP run uses torchrun's static rendezvous
// (--master_addr/--master_port: the agent holds MASTER_PORT), the TP run the c10d rendezvous of the guides'
// launcher line (--rdzv_backend=c10d --rdzv_endpoint=HOST:PORT). A machine without torchrun fails the test
// with the way to install it. On two GPUs (suite TorchrunLaunchGpu, label gpu) the DP run goes through NCCL,
// its id broadcast over the socket world: the same log values as under mpirun (--deterministic-mode).
// Without torchrun: inconsistent launch variables, and a rendezvous nobody answers, end pretrain_gpt with the
// variable, its value and the constraint, within the timeout.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "megatron/comm/tcp_socket.h"
#include "megatron/core/philox.h"
#include "megatron/runtime/context.h"

namespace megatron::trainer {
namespace {

namespace fs = std::filesystem;

struct CommandResult {
  int status = -1;
  std::string output;
  double seconds = 0;
};

CommandResult run(const std::string& command) {
  CommandResult r;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buffer;
  while (fgets(buffer.data(), int(buffer.size()), pipe) != nullptr) r.output += buffer.data();
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

// A removed-on-exit temporary directory.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) : path(testing::make_temp_dir(tag)) {}
  ~TempDir() { fs::remove_all(path); }
};

// A port that is free, with the next one free too (the rendezvous takes MASTER_PORT + 1 next to the agent),
// below the range the system hands out to outgoing connections (which could take MASTER_PORT + 1 meanwhile).
int free_port_pair() {
  const uint64_t seed = testing::seed_from(str_cat("ports#", ::getpid()));
  for (uint64_t attempt = 0; attempt < 200; ++attempt) {
    const int port = 20000 + int(philox_uniform(seed, 0, attempt) * 12000.0f);
    try {
      comm::Socket a = comm::listen_on(port, "port probe"), b = comm::listen_on(port + 1, "port probe");
      return port;
    } catch (const Error&) {
    }
  }
  ADD_FAILURE() << "no two consecutive free ports in 20000..32000";
  return 0;
}

// How this machine's torchrun is called: its path and the spelling of --no-python (torch 1.x knows only
// --no_python). Empty path when there is none.
struct Torchrun {
  std::string path, no_python;
};

Torchrun find_torchrun() {
  static const Torchrun found = [] {  // `torchrun --help` imports torch: seconds, so once per process
    Torchrun t;
    const char* from_env = std::getenv("TORCHRUN");
    CommandResult which = run(str_cat("command -v ", from_env != nullptr ? from_env : "torchrun"));
    if (which.status != 0 || which.output.empty()) return t;
    t.path = which.output.substr(0, which.output.find('\n'));
    CommandResult help = run(t.path + " --help");
    t.no_python = help.output.find("--no-python") != std::string::npos ? "--no-python" : "--no_python";
    return t;
  }();
  return found;
}

const char* kInstall =
    "torchrun was not found on PATH. It comes with PyTorch: `apt-get install python3-torch` (Debian 12: torch "
    "1.13; scripts/deps.sh installs it) or `pip install torch`; or set TORCHRUN to its path.";

std::string tiny_flags(const fs::path& save) {
  return "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1 "
         "--global-batch-size 8 --train-iters 6 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 1 "
         "--weight-decay 0.1 --clip-grad 0.5 --mock-data --vocab-size 4096 --hidden-dropout 0.1 "
         "--attention-dropout 0 --seed 5 --eval-interval 3 --eval-iters 2 --log-interval 1 --device cpu --save " +
         save.string();
}

// Megatron's log lines: "iteration N ... lm loss ... grad norm ...|" by iteration, and the validation lines.
std::map<std::string, std::string> logged_values(const std::string& output) {
  std::map<std::string, std::string> out;
  const std::regex step(R"(iteration +(\d+)/ +\d+ \|.*(lm loss: [^|]*\|.*grad norm: [^|]*\|))");
  const std::regex valid(R"((validation loss at iteration \d+[^|]*\| lm loss value: [^|]*\|))");
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, step)) out[str_cat("iteration ", m[1])] = m[2];
    if (std::regex_search(line, m, valid)) out[m[1]] = m[1];
  }
  return out;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// torchrun and mpirun with the same flags: the same log values and (with `same_shards`) the same checkpoint
// shards.
void expect_torchrun_matches_mpirun(const std::string& tag, const std::string& layout, const std::string& rendezvous,
                                    bool same_shards = true) {
  const Torchrun torchrun = find_torchrun();
  ASSERT_FALSE(torchrun.path.empty()) << kInstall;
  TempDir dir(tag);
  // -r 1 -t 1: stdout to a log file and to the console. Debian 12's torchrun (torch 1.13 on Python 3.11) fails
  // with its default (`-r 0`: Python 3.11 no longer lists the enum's zero member); every version takes this.
  const std::string torchrun_line =
      str_cat(torchrun.path, " ", torchrun.no_python, " --nproc_per_node=2 ", rendezvous, " --monitor_interval 0.5",
              " -r 1 -t 1 --log_dir ", (dir.path / "logs").string(), " ", PRETRAIN_GPT_EXE, " ",
              tiny_flags(dir.path / "torchrun"), layout);
  const CommandResult t = run(torchrun_line);
  ASSERT_EQ(t.status, 0) << torchrun_line << "\n" << t.output;
  const std::string mpirun_line = str_cat("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ", MPIEXEC,
                                          " --oversubscribe -np 2 ", PRETRAIN_GPT_EXE, " ",
                                          tiny_flags(dir.path / "mpirun"), layout);
  const CommandResult m = run(mpirun_line);
  ASSERT_EQ(m.status, 0) << mpirun_line << "\n" << m.output;
  EXPECT_NE(t.output.find("launch: torchrun (env://): 2 ranks"), std::string::npos) << t.output;
  const bool gpu = layout.find("--device cuda") != std::string::npos;
  EXPECT_NE(t.output.find(gpu ? "collectives on nccl" : "collectives on socket"), std::string::npos) << t.output;
  EXPECT_NE(m.output.find(gpu ? "collectives on nccl" : "collectives on mpi"), std::string::npos) << m.output;

  const std::map<std::string, std::string> from_torchrun = logged_values(t.output);
  const std::map<std::string, std::string> from_mpirun = logged_values(m.output);
  EXPECT_EQ(from_mpirun.size(), 6u + 3u) << "6 iterations, validation at 3 and 6, the test set\n" << m.output;
  EXPECT_EQ(from_torchrun, from_mpirun) << t.output;
  for (const char* shard : {"rank_00000.safetensors", "rank_00001.safetensors"}) {
    if (!same_shards) break;
    const std::string a = file_bytes(dir.path / "torchrun" / "iter_0000006" / shard);
    const std::string b = file_bytes(dir.path / "mpirun" / "iter_0000006" / shard);
    EXPECT_FALSE(a.empty()) << shard;
    EXPECT_TRUE(a == b) << shard << " differs between the torchrun and the mpirun run";
  }
  std::printf("%s: torchrun %.1f s, mpirun %.1f s\n", tag.c_str(), t.seconds, m.seconds);
}

TEST(TorchrunLaunch, DataParallelDistributedOptimizerMatchesMpirun) {
  const int port = free_port_pair();
  expect_torchrun_matches_mpirun(
      "torchrun_dp", " --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 4000",
      str_cat("--nnodes=1 --node_rank=0 --master_addr=127.0.0.1 --master_port=", port));
}

TEST(TorchrunLaunch, TensorParallelSequenceParallelMatchesMpirun) {
  const int port = free_port_pair();
  expect_torchrun_matches_mpirun("torchrun_tp", " --tensor-model-parallel-size 2 --sequence-parallel",
                                 str_cat("--nnodes=1 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:", port));
}

// NCCL bootstrapped through the rendezvous: one GPU per rank (LOCAL_RANK), the id over the socket world.
TEST(TorchrunLaunchGpu, DataParallelOverNcclMatchesMpirun) {
  if (!cuda_backend_compiled() || cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  const int port = free_port_pair();
  expect_torchrun_matches_mpirun("torchrun_gpu",
                                 " --device cuda --bf16 --deterministic-mode --use-distributed-optimizer",
                                 str_cat("--nnodes=1 --node_rank=0 --master_addr=127.0.0.1 --master_port=", port),
                                 /*same_shards=*/false);
}

// pretrain_gpt started as torchrun starts it, with `variables` (no MPI launcher's variables).
CommandResult pretrain_with(const std::string& variables, const std::string& flags) {
  TempDir dir("torchrun_env");
  return run(str_cat("env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK -u PMI_RANK -u PMI_SIZE ", variables, " ",
                     PRETRAIN_GPT_EXE, " ", tiny_flags(dir.path / "ckpt"), " ", flags));
}

TEST(TorchrunLaunch, InconsistentVariablesAreNamed) {
  const CommandResult r = pretrain_with("TORCHELASTIC_RUN_ID=t RANK=2 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_PORT=29500", "");
  EXPECT_EQ(r.status, 1) << r.output;
  for (const char* part : {"error starting the distributed runtime", "RANK=2 must be < WORLD_SIZE=2",
                           "MASTER_ADDR is not set"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << " in:\n" << r.output;
}

TEST(TorchrunLaunch, UnreachableRendezvousEndsWithinTheTimeout) {
  const int port = free_port_pair();  // nobody listens there
  const CommandResult r =
      pretrain_with(str_cat("RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=", port),
                    "--distributed-timeout-minutes 0.05");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find(str_cat("rank 1 could not reach the rendezvous of rank 0 at MASTER_ADDR=127.0.0.1 port ",
                                  port, " (MASTER_PORT) within --distributed-timeout-minutes 0.05")),
            std::string::npos)
      << r.output;
  EXPECT_GE(r.seconds, 3.0);
  EXPECT_LT(r.seconds, 30.0);
}

}  // namespace
}  // namespace megatron::trainer
