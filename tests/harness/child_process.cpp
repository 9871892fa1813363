#include "child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace megatron::testing {
namespace fs = std::filesystem;

namespace {

// In the forked child, before exec: output redirection, the file-size limit, the environment. Only
// async-signal-safe calls until exec (the parent may have threads).
[[noreturn]] void exec_child(const std::vector<char*>& argv, const std::vector<char*>& env, int out_fd,
                             const std::optional<uint64_t>& max_file_bytes) {
  ::dup2(out_fd, STDOUT_FILENO);
  ::dup2(out_fd, STDERR_FILENO);
  ::setpgid(0, 0);  // its own process group: a kill of the group reaches what it starts (mpiexec's ranks)
  if (max_file_bytes) {
    ::signal(SIGXFSZ, SIG_IGN);  // writes past the limit then fail with EFBIG, as a full disk fails with ENOSPC
    const struct rlimit limit = {*max_file_bytes, *max_file_bytes};
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ::execve(argv[0], argv.data(), env.data());
  ::_exit(127);
}

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& args, const ChildOptions& options) : output_(options.output) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.insert(env_strings.end(), options.environment.begin(), options.environment.end());
  std::vector<char*> argv, env;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env_strings) env.push_back(const_cast<char*>(e.c_str()));
  env.push_back(nullptr);
  const int out_fd = ::open(output_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0) throw std::runtime_error("cannot create " + output_.string());
  pid_ = ::fork();
  if (pid_ == 0) exec_child(argv, env, out_fd, options.max_file_bytes);
  ::close(out_fd);
  if (pid_ < 0) throw std::runtime_error("fork failed");
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !ended_) {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

void ChildProcess::kill(int signal) {
  if (pid_ > 0 && !ended_) ::kill(pid_, signal);
}

void ChildProcess::reap(int status) {
  ended_ = true;
  if (WIFEXITED(status)) exit_code_ = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) signal_ = WTERMSIG(status);
}

bool ChildProcess::running() {
  if (ended_) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) reap(status);
  return !ended_;
}

bool ChildProcess::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

std::string ChildProcess::output() const {
  std::ifstream in(output_, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<pid_t> child_pids(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');  // the command name may hold spaces
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

std::string process_environment(pid_t pid, const std::string& name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  const std::string prefix = name + "=";
  for (std::string entry; std::getline(in, entry, '\0');)
    if (entry.rfind(prefix, 0) == 0) return entry.substr(prefix.size());
  return "";
}

}  // namespace megatron::testing
