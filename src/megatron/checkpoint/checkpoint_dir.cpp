#include "megatron/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "megatron/core/error.h"

namespace megatron::checkpoint {
namespace fs = std::filesystem;
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::optional<int64_t> parse_iteration_dir(const std::string& name) {
  if (name.rfind("iter_", 0) != 0 || name.size() < 6) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

}  // namespace

std::string iteration_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

fs::path iteration_dir(const fs::path& root, int64_t iteration) { return root / iteration_dir_name(iteration); }

fs::path temporary_iteration_dir(const fs::path& root, int64_t iteration) {
  std::string name = iteration_dir_name(iteration);
  name.insert(name.begin(), '.');
  name.append(".tmp");
  return root / name;
}

std::optional<LatestCheckpoint> read_latest_checkpoint(const fs::path& root) {
  const fs::path tracker = root / kTrackerFile;
  if (!fs::exists(tracker)) return std::nullopt;
  std::ifstream f(tracker);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = trim(ss.str());
  LatestCheckpoint latest;
  if (text == "release") {
    latest.release = true;
    latest.dir = root / "release";
  } else {
    MEGATRON_CHECK(!text.empty() && text.find_first_not_of("0123456789") == std::string::npos, "checkpoint tracker ",
                   tracker.string(), " holds '", text, "'; expected an iteration number or 'release'");
    latest.iteration = std::stoll(text);
    latest.dir = iteration_dir(root, latest.iteration);
  }
  MEGATRON_CHECK(fs::is_directory(latest.dir), "checkpoint tracker ", tracker.string(), " names '", text,
                 "' but ", latest.dir.string(), " does not exist");
  return latest;
}

void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) MEGATRON_FAIL("checkpoint: cannot open ", path.string(), " to fsync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) MEGATRON_FAIL("checkpoint: fsync of ", path.string(), " failed: ", std::strerror(err));
}

void write_latest_iteration(const fs::path& root, const std::string& text) {
  const fs::path tracker = root / kTrackerFile;
  const fs::path tmp = root / (std::string(kTrackerFile) + ".tmp");
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text << "\n";
    f.close();
    MEGATRON_CHECK(f.good(), "checkpoint: cannot write ", tmp.string());
  }
  fsync_path(tmp);
  std::error_code ec;
  fs::rename(tmp, tracker, ec);
  MEGATRON_CHECK(!ec, "checkpoint: cannot rename ", tmp.string(), " to ", tracker.string(), ": ", ec.message());
  fsync_path(root);
}

void publish_directory(const fs::path& tmp, const fs::path& final) {
  fsync_path(tmp);
  if (fs::exists(final)) {
    // Swap atomically, then delete the old contents (now at `tmp`).
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final.c_str(), RENAME_EXCHANGE) != 0)
      MEGATRON_FAIL("checkpoint: cannot swap ", tmp.string(), " with the existing ", final.string(), ": ",
                    std::strerror(errno));
    fsync_path(final.parent_path());
    fs::remove_all(tmp);
  } else {
    std::error_code ec;
    fs::rename(tmp, final, ec);
    MEGATRON_CHECK(!ec, "checkpoint: cannot rename ", tmp.string(), " to ", final.string(), ": ", ec.message());
  }
  fsync_path(final.parent_path());
}

std::vector<int64_t> saved_iterations(const fs::path& root) {
  std::vector<int64_t> out;
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory())
      if (auto it = parse_iteration_dir(e.path().filename().string())) out.push_back(*it);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int64_t> apply_retention(const fs::path& root, int keep_last) {
  std::vector<int64_t> deleted;
  if (!fs::is_directory(root)) return deleted;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.size() > 4 && name[0] == '.' && name.rfind(".tmp") == name.size() - 4)
      fs::remove_all(e.path());
  }
  if (keep_last <= 0) return deleted;
  std::optional<int64_t> protected_iteration;
  if (auto latest = read_latest_checkpoint(root); latest && !latest->release) protected_iteration = latest->iteration;
  std::vector<int64_t> its = saved_iterations(root);
  if (its.size() <= size_t(keep_last)) return deleted;
  for (size_t i = 0; i + size_t(keep_last) < its.size(); ++i) {
    if (protected_iteration && its[i] == *protected_iteration) continue;
    fs::remove_all(iteration_dir(root, its[i]));
    deleted.push_back(its[i]);
  }
  return deleted;
}

}  // namespace megatron::checkpoint
