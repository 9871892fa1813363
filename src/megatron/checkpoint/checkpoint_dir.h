// The checkpoint root directory: Megatron's layout plus the crash-safety primitives.
//
//   <root>/latest_checkpointed_iteration.txt   the iteration number (or "release"), nothing else
//   <root>/iter_0000100/                       one directory per saved iteration (7 digits, Megatron's)
//   <root>/.iter_0000100.tmp/                  a save in progress (never read; removed by the next save)
//
// Publishing protocol (publish_directory + write_latest_iteration): every file of a save is written and
// fsynced inside the temporary directory, the directory itself is fsynced, then it is renamed to its final
// name (atomically; an existing directory of the same iteration is swapped out with renameat2's
// RENAME_EXCHANGE and deleted afterwards), the root is fsynced, and only then the tracker file is replaced
// (written to a temporary file, fsynced, renamed, root fsynced). A crash at any point leaves the tracker
// pointing at a complete checkpoint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace megatron::checkpoint {

inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";

// "iter_0000100"
std::string iteration_dir_name(int64_t iteration);
std::filesystem::path iteration_dir(const std::filesystem::path& root, int64_t iteration);
std::filesystem::path temporary_iteration_dir(const std::filesystem::path& root, int64_t iteration);

// What the tracker says: an iteration, or "release" (a converted or released model, loaded as --finetune).
struct LatestCheckpoint {
  bool release = false;
  int64_t iteration = 0;
  std::filesystem::path dir;  // the directory it names
};
// std::nullopt when the root has no tracker file; throws megatron::Error (naming the file and its text)
// when the tracker is malformed or names a directory that does not exist.
std::optional<LatestCheckpoint> read_latest_checkpoint(const std::filesystem::path& root);
// Atomically replaces the tracker with `text` ("100" or "release").
void write_latest_iteration(const std::filesystem::path& root, const std::string& text);

// fsync of a file or a directory; throws naming the path.
void fsync_path(const std::filesystem::path& path);
// Writes `text` to `path` (replacing it) and fsyncs it; throws naming the path and the system's reason
// (e.g. "No space left on device").
void write_file_synced(const std::filesystem::path& path, const std::string& text);
// Renames the complete temporary directory `tmp` to `final` (see above). Both in the same root.
void publish_directory(const std::filesystem::path& tmp, const std::filesystem::path& final);

// The iterations with a published iter_* directory under root, ascending.
std::vector<int64_t> saved_iterations(const std::filesystem::path& root);
// What --load and --ckpt-step name: `load` itself when step is 0 (a root with a tracker, or an iteration
// directory), else load's iteration directory for `step`, which must exist (the error lists the saved ones).
std::filesystem::path checkpoint_to_load(const std::filesystem::path& load, int64_t step);
// Deletes all but the newest `keep_last` iter_* directories (never the one the tracker names) and any
// leftover temporary directories; keep_last <= 0 keeps everything. Returns the iterations deleted. Each is
// renamed to a hidden .tmp name before its files go, so an iter_* directory is always complete.
std::vector<int64_t> apply_retention(const std::filesystem::path& root, int keep_last);

}  // namespace megatron::checkpoint
