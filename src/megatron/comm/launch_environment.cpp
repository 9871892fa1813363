#include "megatron/comm/launch_environment.h"

#include <charconv>
#include <cstdlib>
#include <vector>

#include "megatron/core/error.h"

namespace megatron::comm {
namespace {

bool is_set(const EnvironmentLookup& env, const char* name) { return env(name).has_value(); }

bool is_true(const std::optional<std::string>& value) {
  return value && (*value == "True" || *value == "true" || *value == "1" || *value == "yes");
}

// Reads the integer variable `name` into `out` if it is set and parses; otherwise records why not.
class VariableReader {
 public:
  explicit VariableReader(const EnvironmentLookup& env) : env_(env) {}

  // Required variable: missing or malformed is a problem.
  std::optional<long> integer(const char* name, long min, long max, const char* meaning) {
    const std::optional<std::string> value = env_(name);
    if (!value) {
      problems_.push_back(str_cat(name, " is not set (", meaning, ")"));
      return std::nullopt;
    }
    return parse(name, *value, min, max, meaning);
  }
  // Optional variable: nullopt when unset.
  std::optional<long> optional_integer(const char* name, long min, long max, const char* meaning) {
    const std::optional<std::string> value = env_(name);
    return value ? parse(name, *value, min, max, meaning) : std::nullopt;
  }
  std::string text(const char* name, const char* meaning) {
    const std::optional<std::string> value = env_(name);
    if (!value || value->empty())
      problems_.push_back(str_cat(name, value ? " is empty (" : " is not set (", meaning, ")"));
    return value.value_or("");
  }
  void problem(std::string text) { problems_.push_back(std::move(text)); }
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::optional<long> parse(const char* name, const std::string& value, long min, long max, const char* meaning) {
    long x = 0;
    const char* end = value.data() + value.size();
    const auto [at, error] = std::from_chars(value.data(), end, x);
    if (value.empty() || error != std::errc() || at != end || x < min || x > max) {
      problems_.push_back(str_cat(name, "=", value, " must be an integer in [", min, ", ", max, "] (", meaning, ")"));
      return std::nullopt;
    }
    return x;
  }

  const EnvironmentLookup& env_;
  std::vector<std::string> problems_;
};

constexpr long kMaxRanks = 1L << 24;

TorchrunEnvironment read_torchrun(const EnvironmentLookup& env) {
  VariableReader read(env);
  TorchrunEnvironment t;
  const auto world = read.integer("WORLD_SIZE", 1, kMaxRanks, "the number of processes of the job");
  const auto rank = read.integer("RANK", 0, kMaxRanks, "this process's rank, 0 .. WORLD_SIZE - 1");
  const auto local = read.integer("LOCAL_RANK", 0, kMaxRanks, "this process's rank on its node; it picks the GPU");
  const auto local_world = read.optional_integer("LOCAL_WORLD_SIZE", 1, kMaxRanks, "the processes on this node");
  t.master_addr = read.text("MASTER_ADDR", "the host of rank 0, where the ranks meet");
  const auto master_port = read.integer("MASTER_PORT", 1, 65535, "the job's port on MASTER_ADDR");
  const auto own_port =
      read.optional_integer("MEGATRON_RENDEZVOUS_PORT", 1, 65535, "the rendezvous port on MASTER_ADDR");
  if (rank && world && *rank >= *world)
    read.problem(str_cat("RANK=", *rank, " must be < WORLD_SIZE=", *world));
  if (local_world && world && *local_world > *world)
    read.problem(str_cat("LOCAL_WORLD_SIZE=", *local_world, " must be <= WORLD_SIZE=", *world));
  if (local && local_world && *local >= *local_world)
    read.problem(str_cat("LOCAL_RANK=", *local, " must be < LOCAL_WORLD_SIZE=", *local_world));
  if (local && rank && *local > *rank)
    read.problem(str_cat("LOCAL_RANK=", *local, " must be <= RANK=", *rank, " (ranks count nodes' processes in turn)"));
  const bool agent_store = is_true(env("TORCHELASTIC_USE_AGENT_STORE"));
  if (!own_port && agent_store && master_port && *master_port == 65535)
    read.problem("MASTER_PORT=65535 leaves no MASTER_PORT + 1 for the rendezvous (torchrun's agent holds "
                 "MASTER_PORT); set MEGATRON_RENDEZVOUS_PORT or another --master_port");
  if (!read.problems().empty()) {
    std::string text = "torchrun (env://) launch: inconsistent environment:";
    for (const std::string& p : read.problems()) text += "\n  - " + p;
    throw Error(text);
  }
  t.world_size = int(*world);
  t.rank = int(*rank);
  t.local_rank = int(*local);
  t.local_world_size = int(local_world.value_or(1));
  t.master_port = int(*master_port);
  if (own_port) {
    t.rendezvous_port = int(*own_port);
    t.rendezvous_port_origin = "MEGATRON_RENDEZVOUS_PORT";
  } else if (agent_store) {
    t.rendezvous_port = t.master_port + 1;
    t.rendezvous_port_origin = "MASTER_PORT + 1 (torchrun's agent holds MASTER_PORT)";
  } else {
    t.rendezvous_port = t.master_port;
    t.rendezvous_port_origin = "MASTER_PORT";
  }
  t.job_id = str_cat(t.master_addr, ":", t.master_port, "/", t.world_size, "/", env("TORCHELASTIC_RUN_ID").value_or(""),
                     "/", env("TORCHELASTIC_RESTART_COUNT").value_or("0"));
  return t;
}

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::None: return "none";
    case Launcher::Mpi: return "mpi";
    case Launcher::Torchrun: return "torchrun";
  }
  return "?";
}

LaunchEnvironment detect_launch(const EnvironmentLookup& env) {
  LaunchEnvironment launch;
  const bool torchrun_worker = is_set(env, "TORCHELASTIC_RUN_ID");
  bool mpi = false;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) mpi = mpi || is_set(env, name);
  if (torchrun_worker || (!mpi && is_set(env, "RANK") && is_set(env, "WORLD_SIZE"))) {
    launch.launcher = Launcher::Torchrun;
    launch.torchrun = read_torchrun(env);
  } else if (mpi) {
    launch.launcher = Launcher::Mpi;
  }
  return launch;
}

LaunchEnvironment detect_launch() {
  return detect_launch([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  });
}

}  // namespace megatron::comm
