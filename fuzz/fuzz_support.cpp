#include "fuzz_support.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <system_error>

namespace megatron::fuzz {
namespace fs = std::filesystem;
namespace {

// Owns the scratch directory; a function-local static, removed at exit by the process that made it.
class Scratch {
 public:
  Scratch() : owner_(::getpid()) {
    const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    remove_stale(base);
    path_ = base / ("megatron_fuzz_" + std::to_string(owner_));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Scratch() {
    if (::getpid() != owner_) return;
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  const fs::path& path() const { return path_; }

 private:
  // libFuzzer ends some runs with _Exit (time limits, findings), which skips the destructor: the next
  // target removes the directories of processes that no longer run.
  static void remove_stale(const fs::path& base) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(base, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("megatron_fuzz_", 0) != 0) continue;
      const long pid = std::strtol(name.c_str() + 14, nullptr, 10);
      if (pid > 0 && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH) fs::remove_all(entry.path(), ec);
    }
  }

  pid_t owner_;
  fs::path path_;
};

}  // namespace

std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

std::vector<std::string_view> split_parts(std::string_view input, size_t count) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < count) {
    const size_t at = input.find(kPartSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(input.substr(0, at));
    input.remove_prefix(at + kPartSeparator.size());
  }
  parts.push_back(input);
  parts.resize(count);
  return parts;
}

const fs::path& scratch_dir() {
  static Scratch scratch;
  return scratch.path();
}

void write_file(const fs::path& path, std::string_view bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out.good()) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
}

void check_message(const char* what) {
  for (const char* p = what; *p != '\0'; ++p) {
    const auto c = static_cast<unsigned char>(*p);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) {
      std::fprintf(stderr, "fuzz finding: an error message holds the raw byte 0x%02x at offset %zu:\n%s\n", c,
                   static_cast<size_t>(p - what), what);
      std::abort();
    }
  }
}

}  // namespace megatron::fuzz
