// A tool run as a child process by the fault tests: started with its arguments, its output (stdout and
// stderr together) in a file, optionally under a file-size limit (a full disk: writes past the limit fail
// with EFBIG, SIGXFSZ is ignored); killed with any signal, waited for with a timeout.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace megatron::testing {

struct ChildOptions {
  std::filesystem::path output;             // stdout and stderr
  std::optional<uint64_t> max_file_bytes{};  // RLIMIT_FSIZE of the child
  std::vector<std::string> environment{};   // extra NAME=VALUE entries
};

class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const ChildOptions& options);
  ~ChildProcess();  // kills (SIGKILL) and reaps a child still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void kill(int signal);
  // Waits up to `timeout`; true when the child ended (then exited() / signal() say how).
  bool wait(std::chrono::milliseconds timeout);
  bool running();
  bool exited() const { return ended_ && exit_code_ >= 0; }
  int exit_code() const { return exit_code_; }   // -1 unless it exited
  int signal() const { return signal_; }         // 0 unless a signal ended it
  std::string output() const;                    // what it wrote so far

 private:
  void reap(int status);
  pid_t pid_ = -1;
  std::filesystem::path output_;
  bool ended_ = false;
  int exit_code_ = -1, signal_ = 0;
};

// The children of process `parent` (from /proc), e.g. the ranks mpiexec started.
std::vector<pid_t> child_pids(pid_t parent);
// Environment variable `name` of a running process (from /proc/<pid>/environ), or "" when absent.
std::string process_environment(pid_t pid, const std::string& name);

}  // namespace megatron::testing
