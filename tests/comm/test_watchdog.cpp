// The watchdog end to end: a real `mpiexec` job (watchdog_helper) in which rank 0 skips an all-reduce, or
// never sends what the other ranks receive in a point-to-point batch. The waiting ranks must print the
// report (rank, group, operation, sizes, time waited) and the job must end with a non-zero status soon
// after the timeout, instead of hanging. CPU ranks (MPI) in CI; NCCL on the GPU machine (suite
// WatchdogGpu, two GPUs). The same helper launched the torchrun way (torch's variables set, no mpiexec; this
// test plays the agent, which stops the other workers once one fails) checks the socket engine: the same
// report and exit status, and a rank that dies makes the others fail at once naming it.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "megatron/comm/communicator.h"
#include "megatron/comm/tcp_socket.h"
#include "megatron/runtime/context.h"

namespace {

struct JobResult {
  int status = -1;  // exit status of mpiexec
  std::string output;
  double seconds = 0;
};

JobResult run_job(int ranks, const std::string& args) {
  // `timeout` guards the test itself should the watchdog fail to end the job.
  const std::string command = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 ") +
                              "timeout -k 5 90 " + MPIEXEC + " --oversubscribe -n " + std::to_string(ranks) + " " +
                              WATCHDOG_HELPER_EXE + " " + args + " 2>&1";
  JobResult r;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buffer;
  while (fgets(buffer.data(), int(buffer.size()), pipe) != nullptr) r.output += buffer.data();
  const int raw = pclose(pipe);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return r;
}

// `operation` and `sizes`: how the report names the stuck operation ("all_reduce on group 'dp'") and its data.
void expect_watchdog_report(const JobResult& r, int ranks, double timeout_seconds,
                            const std::string& operation = "all_reduce on group 'dp'",
                            const std::string& sizes = "1000 f32 elements (4000 bytes)") {
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "the job had to be killed by `timeout`: the watchdog did not end it\n" << r.output;
  EXPECT_EQ(r.output.find("UNEXPECTED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("first all_reduce done"), std::string::npos) << r.output;
  // The report of a waiting rank (1 or 2), with everything a person needs.
  EXPECT_NE(r.output.find("[megatron watchdog]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(operation), std::string::npos) << r.output;
  bool named_rank = false;
  for (int k = 1; k < ranks; ++k) named_rank |= r.output.find("(rank " + std::to_string(k) + " of " + std::to_string(ranks)) != std::string::npos;
  EXPECT_TRUE(named_rank) << r.output;
  EXPECT_NE(r.output.find(sizes), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("has waited"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--distributed-timeout-minutes"), std::string::npos) << r.output;
  // It waited for the timeout, then ended promptly (job start-up included).
  EXPECT_GE(r.seconds, timeout_seconds) << r.output;
  EXPECT_LT(r.seconds, timeout_seconds + 30) << r.output;
}

TEST(Watchdog, SkippedCollectiveEndsTheJobWithAReport) {
  JobResult r = run_job(3, "0.05");  // 3 seconds
  expect_watchdog_report(r, 3, 3.0);
}

TEST(Watchdog, UnmatchedReceiveEndsTheJobWithAReport) {
  JobResult r = run_job(3, "0.05 p2p warm");
  expect_watchdog_report(r, 3, 3.0, "batch_send_recv on group 'dp'", "recv 1000 f32 elements (4000 bytes) from rank 0");
  EXPECT_NE(r.output.find("did not post the matching send or receive"), std::string::npos) << r.output;
}

// Starts `ranks` helpers with torch's env:// variables (as torchrun's agent does), their output in one file.
// With `stop_on_failure` the first rank to fail stops the others (the agent's rule); the job's status is
// that rank's. 90 s at most.
JobResult run_env_job(int ranks, const std::vector<std::string>& args, bool stop_on_failure,
                      std::vector<int>* statuses = nullptr) {
  const std::filesystem::path dir = megatron::testing::make_temp_dir("watchdog_env");
  const std::string log = (dir / "output.txt").string();
  int port = 0;
  {
    megatron::comm::Socket probe = megatron::comm::listen_on(0, "port probe");
    port = megatron::comm::bound_port(probe);
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) ::unsetenv(name);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<std::string> words = {WATCHDOG_HELPER_EXE};
      words.insert(words.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (std::string& w : words) argv.push_back(w.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      std::_Exit(127);
    }
    children.push_back(pid);
  }
  JobResult r;
  std::vector<int> status(size_t(ranks), -1);
  for (int running = ranks; running > 0;) {
    int raw = 0;
    const pid_t pid = ::waitpid(-1, &raw, WNOHANG);
    const bool late = std::chrono::steady_clock::now() - start > std::chrono::seconds(90);
    if (pid <= 0 && !late) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (pid <= 0) {  // the job hangs: what the watchdog exists to prevent
      for (pid_t c : children) ::kill(c, SIGKILL);
      r.status = 124;
      stop_on_failure = false;
      continue;
    }
    const size_t rank = size_t(std::find(children.begin(), children.end(), pid) - children.begin());
    status[rank] = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
    --running;
    if (status[rank] != 0 && r.status <= 0) r.status = status[rank];
    if (status[rank] != 0 && stop_on_failure)
      for (size_t k = 0; k < children.size(); ++k)
        if (status[k] < 0) ::kill(children[k], SIGTERM);
  }
  if (r.status < 0) r.status = 0;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ifstream f(log);
  r.output.assign(std::istreambuf_iterator<char>(f), {});
  std::filesystem::remove_all(dir);
  if (statuses != nullptr) *statuses = status;
  return r;
}

TEST(Watchdog, SocketEngineSkippedCollectiveEndsTheJobWithAReport) {
  JobResult r = run_env_job(3, {"0.05"}, true);
  expect_watchdog_report(r, 3, 3.0, "all_reduce on group 'dp'");
  EXPECT_EQ(r.status, megatron::comm::kWatchdogExitCode) << r.output;
  EXPECT_NE(r.output.find(", socket) with sum of 1000 f32 elements (4000 bytes)"), std::string::npos) << r.output;
}

TEST(Watchdog, SocketEngineUnmatchedReceiveEndsTheJobWithAReport) {
  JobResult r = run_env_job(3, {"0.05", "p2p", "warm"}, true);
  expect_watchdog_report(r, 3, 3.0, "batch_send_recv on group 'dp'", "recv 1000 f32 elements (4000 bytes) from rank 0");
  EXPECT_EQ(r.status, megatron::comm::kWatchdogExitCode) << r.output;
  EXPECT_NE(r.output.find("did not post the matching send or receive"), std::string::npos) << r.output;
}

// Rank 0 exits after the first all-reduce; the others must not wait for the (one minute) timeout.
TEST(Watchdog, SocketEngineRankThatDiesIsNamedAtOnce) {
  std::vector<int> statuses;
  JobResult r = run_env_job(3, {"1", "die"}, false, &statuses);
  ASSERT_EQ(statuses.size(), 3u);
  EXPECT_EQ(statuses[0], 3) << r.output;
  EXPECT_EQ(statuses[1], 1) << r.output;
  EXPECT_EQ(statuses[2], 1) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_NE(r.output.find("all_reduce on group 'dp' (rank 1 of 3, socket) with sum of 1000 f32 elements"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the connection to world rank 0 ended"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("UNEXPECTED"), std::string::npos) << r.output;
}

TEST(WatchdogGpu, SkippedNcclCollectiveEndsTheJobWithAReport) {
  if (!megatron::cuda_backend_compiled() || megatron::cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  JobResult r = run_job(2, "0.1 nccl");  // 6 seconds
  expect_watchdog_report(r, 2, 6.0);
}

// The first batch between two ranks connects them inside ncclGroupEnd (the host waits there); later ones
// hang on the GPU. Both must end in the report.
TEST(WatchdogGpu, UnmatchedNcclReceiveEndsTheJobWithAReport) {
  if (!megatron::cuda_backend_compiled() || megatron::cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  for (const char* args : {"0.1 nccl p2p", "0.1 nccl p2p warm"}) {
    JobResult r = run_job(2, args);
    SCOPED_TRACE(args);
    expect_watchdog_report(r, 2, 6.0, "batch_send_recv on group 'dp'", "recv 1000 f32 elements (4000 bytes) from rank 0");
  }
}

// A wait queued on the GPU outside NCCL and put under the watchdog (Communicator::watch_stream) is reported
// like a collective: one rank on one GPU.
TEST(WatchdogGpu, StreamWaitOutsideNcclEndsTheJobWithAReport) {
  if (!megatron::cuda_backend_compiled() || megatron::cuda_device_count() < 1) GTEST_SKIP() << "needs a GPU";
  JobResult r = run_job(1, "0.1 nccl stream");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "the job had to be killed by `timeout`: the watchdog did not end it\n" << r.output;
  EXPECT_EQ(r.output.find("UNEXPECTED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[megatron watchdog] world rank 0: peer exchange wait on group 'dp'"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("push 1 from rank 0 (copy engines) has waited"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did not make the matching push or release"), std::string::npos) << r.output;
  EXPECT_GE(r.seconds, 6.0) << r.output;
  EXPECT_LT(r.seconds, 6.0 + 30) << r.output;
}

// A copy-engine exchange (parallel/peer_exchange.h) waits on the GPU, outside NCCL: its waits join the group's
// watchdog, so a push that never comes ends the job with a report naming the rank and the push.
TEST(WatchdogGpu, MissingCopyEnginePushEndsTheJobWithAReport) {
  if (!megatron::cuda_backend_compiled() || megatron::cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  JobResult r = run_job(2, "0.1 nccl peer");
  expect_watchdog_report(r, 2, 6.0, "peer exchange wait on group 'dp'", "push 1 from rank 0 (copy engines)");
  EXPECT_NE(r.output.find("did not make the matching push or release"), std::string::npos) << r.output;
}

}  // namespace
