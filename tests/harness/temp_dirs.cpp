#include "temp_dirs.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <system_error>

namespace megatron::testing {
namespace fs = std::filesystem;
namespace {

fs::path roots_directory() {
  const char* tmpdir = std::getenv("TMPDIR");
  return fs::path(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp") / "megatron_tests";
}

std::string program_name() {
  std::ifstream comm("/proc/self/comm");
  std::string name;
  std::getline(comm, name);
  return name.empty() ? std::string("test") : name;
}

bool process_runs(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// Removes the roots of processes that no longer run (named <program>_<pid>).
void sweep_dead_roots(const fs::path& roots) {
  std::error_code ec;
  for (fs::directory_iterator it(roots, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t underscore = name.rfind('_');
    if (underscore == std::string::npos) continue;
    char* stop = nullptr;
    const long pid = std::strtol(name.c_str() + underscore + 1, &stop, 10);
    if (pid <= 0 || *stop != '\0' || process_runs(static_cast<pid_t>(pid))) continue;
    std::error_code ignored;
    fs::remove_all(it->path(), ignored);
  }
}

// Owns the root; a function-local static, so it lives from the first make_temp_dir() to the end of main().
class TempRoot {
 public:
  TempRoot() : owner_(::getpid()) {
    const fs::path roots = roots_directory();
    fs::create_directories(roots);
    sweep_dead_roots(roots);
    path_ = roots / (program_name() + "_" + std::to_string(owner_));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempRoot() {
    if (::getpid() != owner_) return;  // a forked child leaves its parent's files alone
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempRoot(const TempRoot&) = delete;
  TempRoot& operator=(const TempRoot&) = delete;
  const fs::path& path() const { return path_; }

 private:
  pid_t owner_;
  fs::path path_;
};

}  // namespace

fs::path temp_root() {
  static TempRoot root;
  return root.path();
}

fs::path make_temp_dir(const std::string& tag) {
  const fs::path dir = temp_root() / tag;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace megatron::testing
