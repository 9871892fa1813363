#include "megatron/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"

namespace megatron::checkpoint {
namespace fs = std::filesystem;
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// Decimal digits only, without overflow.
std::optional<int64_t> parse_digits(std::string_view text) {
  int64_t v = 0;
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<int64_t> parse_iteration_dir(const std::string& name) {
  if (name.rfind("iter_", 0) != 0) return std::nullopt;
  return parse_digits(std::string_view(name).substr(5));
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
    const std::optional<int64_t> iteration = parse_digits(text);
    MEGATRON_CHECK(iteration.has_value(), "checkpoint tracker ", tracker.string(), " holds ", quoted_bytes(text),
                   "; expected an iteration number or 'release'");
    latest.iteration = *iteration;
    latest.dir = iteration_dir(root, latest.iteration);
  }
  MEGATRON_CHECK(fs::is_directory(latest.dir), "checkpoint tracker ", tracker.string(), " names ", quoted_bytes(text),
                 " but ", latest.dir.string(), " does not exist");
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

void write_file_synced(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) MEGATRON_FAIL("checkpoint: cannot create ", path.string(), ": ", std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      MEGATRON_FAIL("checkpoint: writing ", path.string(), " failed after ", done, " of ", text.size(),
                    " bytes: ", std::strerror(err));
    }
    done += size_t(n);
  }
  const int synced = ::fsync(fd), err = errno;
  ::close(fd);
  if (synced != 0) MEGATRON_FAIL("checkpoint: fsync of ", path.string(), " failed: ", std::strerror(err));
}

void write_latest_iteration(const fs::path& root, const std::string& text) {
  const fs::path tracker = root / kTrackerFile;
  const fs::path tmp = root / (std::string(kTrackerFile) + ".tmp");
  write_file_synced(tmp, text + "\n");
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

fs::path checkpoint_to_load(const fs::path& load, int64_t step) {
  if (step == 0) return load;
  const fs::path dir = iteration_dir(load, step);
  if (fs::is_directory(dir)) return dir;  // published iter_* directories are complete (publish_directory)
  std::string saved;
  for (int64_t it : saved_iterations(load)) saved += str_cat(saved.empty() ? "" : ", ", it);
  MEGATRON_FAIL("--ckpt-step ", step, ": ", dir.string(), " holds no checkpoint (",
                saved.empty() ? std::string("--load has no saved iteration") : "--load's saved iterations: " + saved, ")");
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
    // Renamed first (one atomic step), then deleted: a crash in the middle of the deletion leaves a hidden
    // .tmp directory, which the next save removes, never an iter_* directory with files missing.
    const fs::path doomed = root / str_cat(".", iteration_dir_name(its[i]), ".deleted.tmp");
    std::error_code ec;
    fs::rename(iteration_dir(root, its[i]), doomed, ec);
    MEGATRON_CHECK(!ec, "checkpoint: cannot rename ", iteration_dir(root, its[i]).string(), " to ", doomed.string(),
                   " to delete it (--keep-last): ", ec.message());
    fs::remove_all(doomed);
    deleted.push_back(its[i]);
  }
  return deleted;
}

}  // namespace megatron::checkpoint
