// What a long pretrain_gpt job shows and how it leaves, end to end (two CPU ranks under mpiexec):
//   - Megatron's defaults train: no dropout flag (attention and hidden dropout 0.1), an MoE model;
//   - TensorBoard: the event files, read back by the `tensorboard` package's EventAccumulator, hold every
//     scalar Megatron writes under its tag, at every step, with the log line's values (--log-interval 1);
//   - timers at --timing-log-level 2: Megatron's names and (min, max) format over the ranks (the slowed rank's
//     batch-generator the maximum), and the pipeline's send/receive timers at PP = 2 with --timing-log-option all;
//   - the straggler report names the rank MEGATRON_TEST_STRAGGLER slows down, with its layout position;
//   - --exit-signal-handler: SIGTERM sent to both ranks mid-run stops them after one agreed iteration, with a
//     checkpoint and status 0, from which the run resumes bit for bit; SIGUSR1 sent to mpirun itself (which
//     forwards it) does the same with --exit-signal SIGUSR1;
//   - on a GPU (label gpu): the device timers nest on the compute stream.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "harness.h"

extern char** environ;

namespace megatron {
namespace {

namespace fs = std::filesystem;

#if defined(PRETRAIN_GPT_EXE) && defined(MPIEXEC)

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

std::string two_ranks(const std::string& env = "") {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + env + " " + std::string(MPIEXEC) +
         " --oversubscribe -np 2 " + (env.empty() ? "" : "-x MEGATRON_TEST_STRAGGLER ") + PRETRAIN_GPT_EXE;
}

const std::string kModel =
    " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 "
    "--global-batch-size 8 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 1 --mock-data "
    "--vocab-size 4096 --device cpu --seed 3";

// A value of a log line ("lm loss: 6.123456E+00 |").
double field(const std::string& line, const std::string& name) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(line, m, std::regex(name + R"(: +([-+0-9.eE]+) \|)"))) << name << " in " << line;
  return m.size() > 1 ? std::stod(m[1]) : NAN;
}

// The log's iteration lines by iteration.
// --moe-per-layer-logging's text lines: (iteration, loss) -> the values per layer, from the lines that follow each
// iteration's log line.
std::map<std::pair<int64_t, std::string>, std::vector<double>> per_layer_lines(const std::string& log) {
  std::map<std::pair<int64_t, std::string>, std::vector<double>> out;
  std::istringstream in(log);
  const std::regex iteration(R"(\] iteration +(\d+)/ +\d+ \|)"), layers(R"(^  per-layer (\w+) \(layers 0-\d+\):(.*)$)");
  int64_t at = -1;
  for (std::string s; std::getline(in, s);) {
    std::smatch m;
    if (std::regex_search(s, m, iteration)) at = std::stoll(m[1]);
    if (!std::regex_match(s, m, layers)) continue;
    std::istringstream values(m[2].str());
    for (double v; values >> v;) out[{at, m[1].str()}].push_back(v);
  }
  return out;
}

std::map<int64_t, std::string> iteration_lines(const std::string& log) {
  std::map<int64_t, std::string> out;
  std::istringstream in(log);
  const std::regex line(R"(\] iteration +(\d+)/ +\d+ \|)");
  for (std::string s; std::getline(in, s);) {
    std::smatch m;
    if (std::regex_search(s, m, line)) out[std::stoll(m[1])] = s;
  }
  return out;
}

// Every timer report block's values: name -> (min, max) per block, in order.
std::vector<std::map<std::string, std::pair<double, double>>> timer_blocks(const std::string& log) {
  std::vector<std::map<std::string, std::pair<double, double>>> blocks;
  std::istringstream in(log);
  const std::regex entry(R"(^    ([a-z-]+) \.+: \((\d+\.\d\d), (\d+\.\d\d)\)$)");
  for (std::string s; std::getline(in, s);) {
    if (s == "(min, max) time across ranks (ms):") {
      blocks.emplace_back();
      continue;
    }
    std::smatch m;
    if (!blocks.empty() && std::regex_match(s, m, entry)) {
      EXPECT_EQ(s.find(':'), size_t(4 + 48)) << "the name padded with dots to 48 characters: " << s;
      blocks.back()[m[1]] = {std::stod(m[2]), std::stod(m[3])};
    }
  }
  return blocks;
}

#ifdef MEGATRON_TEST_TENSORBOARD
// The event files of `dir` as {tag: [[step, value], ...]}, read by TensorBoard's own reader.
nlohmann::json tensorboard_scalars(const fs::path& dir) {
  testing::run_python(dir, R"(
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
json.dump({t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}, open(sys.argv[2], "w"))
)", (dir / "tb").string() + " " + (dir / "scalars.json").string());
  std::ifstream f(dir / "scalars.json");
  return nlohmann::json::parse(f);
}

void expect_scalar(const nlohmann::json& tb, const std::string& tag, int64_t step, double want, double tolerance) {
  ASSERT_TRUE(tb.contains(tag)) << "no TensorBoard scalar '" << tag << "'";
  for (const auto& e : tb[tag])
    if (e[0].get<int64_t>() == step) {
      EXPECT_NEAR(e[1].get<double>(), want, tolerance) << tag << " at step " << step;
      return;
    }
  ADD_FAILURE() << tag << " has no step " << step << ": " << tb[tag].dump();
}

// Every validation block of the log ("lm loss value: X | lm loss PPL: Y") against TensorBoard's validation
// scalars; returns the number of blocks.
int expect_validation_scalars(const nlohmann::json& tb, const std::string& log, int64_t gbs) {
  std::istringstream in(log);
  int evaluated = 0;
  for (std::string s; std::getline(in, s);) {
    std::smatch m;
    if (!std::regex_search(s, m, std::regex(R"(validation loss at iteration (\d+) \|)"))) continue;
    const int64_t it = std::stoll(m[1]);
    const double loss = field(s, "lm loss value"), ppl = field(s, "lm loss PPL");
    expect_scalar(tb, "lm loss validation", it, loss, 1e-6 * loss);
    expect_scalar(tb, "lm loss validation vs samples", it * gbs, loss, 1e-6 * loss);
    expect_scalar(tb, "lm loss validation ppl", it, ppl, 1e-6 * ppl);
    ++evaluated;
  }
  return evaluated;
}

TEST(PretrainObservability, MegatronDefaultsTrainAndTensorBoardHoldsTheLogLinesValues) {
  const fs::path dir = testing::make_temp_dir("pretrain_tensorboard");
  const int64_t iters = 4, gbs = 8;
  const std::string cmd =
      two_ranks() + kModel + " --train-iters 4 --log-interval 1 --eval-interval 2 --eval-iters 1" +
      " --num-experts 2 --disable-bias-linear --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --moe-per-layer-logging" +
      " --timing-log-level 2 --tensorboard-dir " + (dir / "tb").string() +
      " --log-timers-to-tensorboard --log-throughput --log-params-norm --log-num-zeros-in-grad" +
      " --log-memory-to-tensorboard --log-validation-ppl-to-tensorboard --log-world-size-to-tensorboard > " +
      (dir / "log.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << read_file(dir / "log.txt");
  const std::string log = read_file(dir / "log.txt");
  for (const char* dropout : {"attention_dropout", "hidden_dropout"})  // Megatron's defaults: no flag given
    EXPECT_TRUE(std::regex_search(log, std::regex(std::string("\n  ") + dropout + R"( \.+ 0\.1
)"))) << dropout;
  const auto lines = iteration_lines(log);
  ASSERT_EQ(lines.size(), size_t(iters)) << log;
  auto per_layer = per_layer_lines(log);

  // Timers at level 2 on both ranks: Megatron's names, min <= max, every iteration.
  const auto blocks = timer_blocks(log);
  ASSERT_EQ(blocks.size(), size_t(iters)) << log;
  for (const auto& block : blocks)
    for (const char* name : {"forward-backward", "all-grads-sync", "optimizer-clip-main-grad", "optimizer-inner-step",
                             "optimizer", "batch-generator", "forward-compute", "backward-compute"}) {
      ASSERT_TRUE(block.count(name)) << name << " missing from a report:\n" << log;
      EXPECT_LE(block.at(name).first, block.at(name).second) << name;
    }

  const nlohmann::json tb = tensorboard_scalars(dir);
  std::set<std::string> tags;
  for (const auto& [tag, events] : tb.items()) tags.insert(tag);
  std::set<std::string> want = {"load_balancing_loss", "z_loss", "iteration-time", "throughput", "mem-reserved-bytes",
                                "mem-allocated-bytes", "mem-max-allocated-bytes"};
  for (const char* t : {"learning-rate", "batch-size", "lm loss", "loss-scale", "world-size", "grad-norm", "num-zeros",
                        "params-norm", "lm loss validation", "lm loss validation ppl"})
    want.insert(t), want.insert(std::string(t) + " vs samples");
  for (const char* loss : {"load_balancing_loss", "z_loss"})
    for (int layer : {0, 1}) want.insert(str_cat("moe/", loss, "_layer_", layer));
  for (const auto& [name, minmax] : blocks.front()) want.insert(name + "-time");
  EXPECT_EQ(tags, want);

  for (const auto& [it, line] : lines) {
    SCOPED_TRACE(line);
    const int64_t samples = it * gbs;
    auto both = [&](const std::string& tag, double value, double tolerance) {
      expect_scalar(tb, tag, it, value, tolerance);
      expect_scalar(tb, tag + " vs samples", samples, value, tolerance);
    };
    auto rel = [](double v) { return 1e-6 * std::fabs(v) + 1e-12; };
    both("lm loss", field(line, "lm loss"), rel(field(line, "lm loss")));
    both("learning-rate", field(line, "learning rate"), rel(field(line, "learning rate")));
    both("batch-size", field(line, "global batch size"), 0.0);
    both("loss-scale", field(line, "loss scale"), 0.0);
    both("world-size", 2.0, 0.0);
    both("grad-norm", field(line, "grad norm"), 6e-4);
    both("params-norm", field(line, "params norm"), 6e-4);
    both("num-zeros", field(line, "num zeros"), 0.0);
    for (const char* loss : {"load_balancing_loss", "z_loss"}) {
      expect_scalar(tb, loss, it, field(line, loss), rel(field(line, loss)));
      // The per-layer text line: TensorBoard's per-layer values, whose mean is the log line's.
      const std::vector<double>& layers = per_layer[{it, loss}];
      ASSERT_EQ(layers.size(), 2u) << loss << "\n" << log;
      for (int layer : {0, 1})
        expect_scalar(tb, str_cat("moe/", loss, "_layer_", layer), it, layers[size_t(layer)], rel(layers[size_t(layer)]));
      EXPECT_NEAR((layers[0] + layers[1]) / 2, field(line, loss), rel(field(line, loss)) + 1e-6 * std::fabs(layers[0]));
    }
    expect_scalar(tb, "iteration-time", it, field(line, "elapsed time per iteration \\(ms\\)") / 1e3, 6e-5);
    expect_scalar(tb, "throughput", it, field(line, "throughput per GPU \\(TFLOP/s/GPU\\)"), 0.06);
    for (const auto& [name, minmax] : blocks[size_t(it - 1)]) expect_scalar(tb, name + "-time", it, minmax.second / 1e3, 6e-6);
    expect_scalar(tb, "mem-allocated-bytes", it, tb["mem-allocated-bytes"][size_t(it - 1)][1].get<double>(), 0.0);
  }
  for (const auto& e : tb["mem-max-allocated-bytes"]) EXPECT_GT(e[1].get<double>(), 0.0);
  EXPECT_EQ(expect_validation_scalars(tb, log, gbs), 2) << "validation at iterations 2 and 4";
  for (const auto& [it, line] : lines) EXPECT_TRUE(std::isfinite(field(line, "lm loss")));
  fs::remove_all(dir);
}
#endif

TEST(PretrainObservability, PipelineTimersNameTheSendsAndReceivesOfEveryRank) {
  const fs::path dir = testing::make_temp_dir("pretrain_pp_timers");
  const std::string cmd = two_ranks() + kModel +
                          " --train-iters 2 --log-interval 2 --eval-iters 0 --pipeline-model-parallel-size 2 "
                          "--timing-log-level 2 --timing-log-option all > " +
                          (dir / "log.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << read_file(dir / "log.txt");
  const std::string log = read_file(dir / "log.txt");
  EXPECT_NE(log.find("times across ranks (ms):"), std::string::npos) << log;
  // The first stage sends activations and receives gradients, the last the reverse.
  for (const char* name : {"forward-send", "backward-recv", "forward-recv", "backward-send", "forward-compute"}) {
    const std::regex entry(std::string(R"(\n  )") + name + R"(:\n     rank +\d: \d+\.\d\d)");
    EXPECT_TRUE(std::regex_search(log, entry)) << name << " missing:\n" << log;
  }
  EXPECT_TRUE(std::regex_search(log, std::regex(R"(\n  forward-compute:\n     rank  0: \d+\.\d\d\n     rank  1: )")))
      << "every rank's time, by rank:\n" << log;
  fs::remove_all(dir);
}

// Expert parallelism with the alltoall dispatcher: the token exchanges have timers of their own at level 2,
// on every rank, inside the computes that run them; the allgather dispatcher has no such exchange.
TEST(PretrainObservability, MoeTimersTimeTheAllToAllExchanges) {
  const fs::path dir = testing::make_temp_dir("pretrain_moe_timers");
  const char* kExchanges[] = {"moe-tokens-per-expert", "moe-dispatch-all-to-all", "moe-combine-all-to-all"};
  for (const std::string dispatcher : {"alltoall", "allgather"}) {
    const std::string cmd = two_ranks() + kModel +
                            " --train-iters 2 --log-interval 2 --eval-iters 0 --num-experts 4 --moe-router-topk 2 "
                            "--expert-model-parallel-size 2 --disable-bias-linear --moe-token-dispatcher-type " + dispatcher +
                            " --timing-log-level 2 > " + (dir / "log.txt").string() + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << read_file(dir / "log.txt");
    const std::string log = read_file(dir / "log.txt");
    const auto blocks = timer_blocks(log);
    ASSERT_EQ(blocks.size(), 1u) << log;
    const auto& block = blocks.front();
    for (const char* name : kExchanges) {
      if (dispatcher == "allgather") {
        EXPECT_FALSE(block.count(name)) << name << " without an alltoall exchange:\n" << log;
        continue;
      }
      ASSERT_TRUE(block.count(name)) << name << " missing:\n" << log;  // recorded on some rank: present
      EXPECT_LE(block.at(name).second, block.at("forward-compute").second + block.at("backward-compute").second + 0.02)
          << name << " runs inside the forward and backward computes:\n" << log;
    }
  }
  fs::remove_all(dir);
}

TEST(PretrainObservability, StragglerReportNamesTheSlowRank) {
  const fs::path dir = testing::make_temp_dir("pretrain_straggler");
  // Rank 0 (not the last rank, which prints the log line) reads every sample 40 ms slower.
  const std::string cmd = two_ranks("MEGATRON_TEST_STRAGGLER=0:40") + kModel +
                          " --train-iters 4 --log-interval 2 --eval-iters 0 --log-straggler --timing-log-level 2 > " +
                          (dir / "log.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << read_file(dir / "log.txt");
  const std::string log = read_file(dir / "log.txt");
  // The slowed reader is the slowest in own work and in data time, and the lowest in throughput.
  const std::regex summary(R"(straggler report at iteration (\d+) \| MnRtt/Rnk: [0-9.]+ms/1 \| MxRtt/Rnk: [0-9.]+ms/0 \| )"
                           R"(MnDRtt/Rnk: [0-9.]+ms/1 \| MxDRtt/Rnk: [0-9.]+ms/0 \| )"
                           R"(MnEtpt/Rnk: [0-9.]+TF/0 \| MxEtpt/Rnk: [0-9.]+TF/1)");
  EXPECT_EQ(std::distance(std::sregex_iterator(log.begin(), log.end(), summary), std::sregex_iterator()), 2) << log;
  const std::regex slowest(R"(slowest 1 rank\(s\) \(own work: data, forward, backward\):\n    rank 0 \(tp 0, pp 0, dp 0, cp 0, )"
                           R"(host [^)]+\): [0-9.e+-]+ TFLOP/s, ([0-9.]+)% of the fastest)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, slowest)) << log;
  EXPECT_LT(std::stod(m[1]), 80.0) << "40 ms per sample slows rank 0 well below rank 1";
  EXPECT_TRUE(std::regex_search(log, std::regex(R"(fastest 1 rank\(s\):\n    rank 1 \(tp 0, pp 0, dp 1, cp 0, )"))) << log;
  // Timers at level 2 (Megatron's default option, minmax), over both ranks: the slow rank's batch-generator
  // is the maximum, the fast rank's the minimum.
  const auto blocks = timer_blocks(log);
  ASSERT_EQ(blocks.size(), 2u) << log;
  for (const auto& block : blocks) {
    for (const char* name : {"forward-backward", "all-grads-sync", "optimizer", "batch-generator", "forward-compute",
                             "backward-compute"})
      EXPECT_TRUE(block.count(name)) << name << " missing:\n" << log;
    EXPECT_GT(block.at("batch-generator").second, 10 * block.at("batch-generator").first) << log;
  }
  fs::remove_all(dir);
}

// On a GPU the timers are CUDA events on the compute stream: one rank at level 2 reports Megatron's names with
// device times, and the schedule's time (forward-backward) holds the forward and backward computes queued
// inside it on the same stream; the straggler detector reports too.
TEST(PretrainObservabilityGpu, DeviceTimersNestOnTheComputeStream) {
  if (!testing::have_gpu()) GTEST_SKIP() << "no CUDA device / CUDA backend";
  const fs::path dir = testing::make_temp_dir("pretrain_gpu_timers");
  const std::string model =  // head dimension 64, as cuDNN's fused attention likes it
      " --num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --micro-batch-size 2 "
      "--global-batch-size 8 --lr 1e-3 --mock-data --vocab-size 4096 --device cuda --bf16 --seed 3";
  const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(MPIEXEC) +
                          " -np 1 " + PRETRAIN_GPT_EXE + model +
                          " --attention-dropout 0 --train-iters 4 --log-interval 2 --eval-iters 0 --timing-log-level 2"
                          " --log-straggler --exit-signal-handler > " + (dir / "log.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << read_file(dir / "log.txt");
  const std::string log = read_file(dir / "log.txt");
  const auto blocks = timer_blocks(log);
  ASSERT_EQ(blocks.size(), 2u) << log;
  for (const auto& block : blocks) {
    for (const char* name : {"forward-backward", "optimizer", "optimizer-inner-step", "forward-compute", "backward-compute"})
      ASSERT_TRUE(block.count(name)) << name << " missing:\n" << log;
    const double computes = block.at("forward-compute").second + block.at("backward-compute").second;
    EXPECT_GT(block.at("forward-compute").second, 0.0) << log;
    EXPECT_GT(block.at("backward-compute").second, 0.0) << log;
    EXPECT_GE(block.at("forward-backward").second + 0.02, computes) << log;  // two decimals printed
    EXPECT_GE(block.at("optimizer").second + 0.02, block.at("optimizer-inner-step").second) << log;
  }
  EXPECT_NE(log.find("straggler report at iteration 4"), std::string::npos) << log;
  fs::remove_all(dir);
}

// Starts `command` (through /bin/sh) and returns its process id.
pid_t spawn_shell(const std::string& command) {
  pid_t pid = 0;
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  EXPECT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0) << command;
  return pid;
}

// The children of process `pid` (Linux /proc).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& task : fs::directory_iterator(str_cat("/proc/", pid, "/task"))) {
    std::ifstream f(task.path() / "children");
    for (pid_t child; f >> child;) out.push_back(child);
  }
  return out;
}

// Waits until `log` shows iteration `iteration`'s line (or the process ended, left unreaped); true when it does.
bool wait_for_iteration(const fs::path& log, int64_t iteration, pid_t pid) {
  for (int i = 0; i < 1200; ++i) {
    if (iteration_lines(read_file(log)).count(iteration)) return true;
    siginfo_t info{};
    if (waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// An mpiexec job started through spawn_shell; a test that leaves before reaping it ends the job (mpiexec
// answers SIGTERM by killing its ranks) and reaps it, so no run outlives its test.
class Job {
 public:
  explicit Job(const std::string& command) : pid_(spawn_shell(command)) {}
  ~Job() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  pid_t pid() const { return pid_; }
  // Waits for the job and returns its exit status (128 + the signal's number when a signal ended it).
  int wait() {
    int status = 0;
    EXPECT_EQ(waitpid(pid_, &status, 0), pid_);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_;
};

int64_t latest_checkpoint(const fs::path& dir) {
  std::ifstream f(dir / "latest_checkpointed_iteration.txt");
  int64_t it = -1;
  f >> it;
  return it;
}

// The flags of the runs that are signalled: far longer than the signal takes to arrive (Job ends a run that is
// never signalled), the schedule fixed by --lr-decay-iters so that a shorter reference run follows the same
// learning rates.
const std::string kSignalled = kModel + " --train-iters 20000 --lr-decay-iters 40 --log-interval 1 --eval-iters 0";

TEST(PretrainObservability, SigtermToBothRanksSavesExitsZeroAndResumesBitExact) {
  const fs::path dir = testing::make_temp_dir("pretrain_sigterm");
  const std::string ckpt = (dir / "ckpt").string();
  // mpiexec is exec'd by the shell: the job's process is mpiexec itself, its children the two ranks.
  Job job("exec env " + two_ranks() + kSignalled + " --save " + ckpt + " --exit-signal-handler > " +
          (dir / "signalled.log").string() + " 2>&1");
  ASSERT_TRUE(wait_for_iteration(dir / "signalled.log", 3, job.pid())) << read_file(dir / "signalled.log");
  const std::vector<pid_t> ranks = children_of(job.pid());
  ASSERT_EQ(ranks.size(), 2u);
  for (pid_t rank : ranks) kill(rank, SIGTERM);  // as Slurm signals every task of a step
  EXPECT_EQ(job.wait(), 0) << read_file(dir / "signalled.log");
  const std::string log = read_file(dir / "signalled.log");
  const int64_t k = latest_checkpoint(ckpt);
  ASSERT_GE(k, 3) << log;
  EXPECT_EQ(iteration_lines(log).rbegin()->first, k) << "the last iteration run is the one saved";
  EXPECT_NE(log.find(str_cat("exiting at iteration ", k, " after receiving SIGTERM (--exit-signal-handler)")),
            std::string::npos)
      << log;
  // The resumed run continues with the losses of a run that was never stopped.
  const std::string until = str_cat(" --exit-interval ", k + 3);
  ASSERT_EQ(std::system((two_ranks() + kSignalled + until + " > " + (dir / "full.log").string() + " 2>&1").c_str()), 0);
  ASSERT_EQ(std::system((two_ranks() + kSignalled + until + " --load " + ckpt + " > " + (dir / "resumed.log").string() +
                         " 2>&1").c_str()),
            0);
  const auto full = iteration_lines(read_file(dir / "full.log")), resumed = iteration_lines(read_file(dir / "resumed.log"));
  ASSERT_EQ(resumed.size(), 3u) << read_file(dir / "resumed.log");
  for (int64_t it = k + 1; it <= k + 3; ++it) {
    EXPECT_EQ(field(resumed.at(it), "lm loss"), field(full.at(it), "lm loss")) << "iteration " << it;
    EXPECT_EQ(field(resumed.at(it), "grad norm"), field(full.at(it), "grad norm")) << "iteration " << it;
  }
  fs::remove_all(dir);
}

// Open MPI's mpirun kills the job on SIGTERM (the ranks get SIGTERM a second before SIGKILL) and cannot forward
// it, but forwards SIGUSR1: --exit-signal SIGUSR1 sent to mpirun leaves cleanly too.
TEST(PretrainObservability, SigusrToMpirunIsForwardedAndLeavesCleanly) {
  const fs::path dir = testing::make_temp_dir("pretrain_sigusr1");
  const std::string ckpt = (dir / "ckpt").string();
  Job job("exec env " + two_ranks() + kSignalled + " --save " + ckpt + " --exit-signal-handler --exit-signal SIGUSR1 > " +
          (dir / "log.txt").string() + " 2>&1");
  ASSERT_TRUE(wait_for_iteration(dir / "log.txt", 2, job.pid())) << read_file(dir / "log.txt");
  kill(job.pid(), SIGUSR1);
  EXPECT_EQ(job.wait(), 0) << read_file(dir / "log.txt");
  const int64_t k = latest_checkpoint(ckpt);
  EXPECT_GE(k, 2);
  EXPECT_NE(read_file(dir / "log.txt").find("after receiving SIGUSR1"), std::string::npos) << read_file(dir / "log.txt");
  fs::remove_all(dir);
}

#endif

}  // namespace
}  // namespace megatron
