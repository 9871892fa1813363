#include "megatron/checkpoint/checkpoint_verify.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "megatron/checkpoint/checkpoint_dir.h"
#include "megatron/checkpoint/checkpoint_metadata.h"
#include "megatron/core/crc32c.h"
#include "megatron/checkpoint/safetensors.h"
#include "megatron/core/error.h"

namespace megatron::checkpoint {
namespace fs = std::filesystem;
namespace {

std::string hex32(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

// The problems of one shard file holding `pieces`.
void check_file(const fs::path& path, const std::vector<const SavedPiece*>& pieces, std::vector<std::string>& problems) {
  std::shared_ptr<SafetensorsFile> file;
  try {
    file = SafetensorsFile::open(path);
  } catch (const Error& e) {
    problems.push_back(e.what());
    return;
  }
  for (const SavedPiece* piece : pieces) {
    if (!file->contains(piece->name)) {
      problems.push_back(str_cat(path.string(), " lacks tensor '", piece->name, "' (", piece->spec.describe(), ")"));
      continue;
    }
    const SafetensorsEntry& e = file->entry(piece->name);
    const std::span<const std::byte> bytes = file->bytes(piece->name);
    const std::string where = str_cat(path.string(), ": tensor '", piece->name, "' (bytes ", file->data_start() + e.begin,
                                      "..", file->data_start() + e.end, " of the file)");
    if (bytes.size() != piece->bytes) {
      problems.push_back(str_cat(where, " holds ", bytes.size(), " bytes, metadata.json says ", piece->bytes));
      continue;
    }
    const uint32_t crc = crc32c(bytes.data(), bytes.size());
    if (crc != piece->crc32c)
      problems.push_back(str_cat(where, " is corrupt: CRC-32C ", hex32(crc), ", metadata.json says ", hex32(piece->crc32c)));
  }
}

}  // namespace

bool checkpoint_is_intact(const fs::path& dir, comm::Communicator* world, std::vector<std::string>* problems) {
  const int rank = world != nullptr ? world->rank() : 0, size = world != nullptr ? world->size() : 1;
  std::vector<std::string> mine = checkpoint_problems(dir, rank, size);
  double bad[1] = {mine.empty() ? 0.0 : 1.0};
  if (world != nullptr && size > 1) world->all_reduce_host(bad, comm::ReduceOp::Max);
  if (problems != nullptr) *problems = std::move(mine);
  return bad[0] == 0.0;
}

std::vector<std::string> checkpoint_problems(const fs::path& dir, int part, int parts) {
  std::vector<std::string> problems;
  CheckpointMetadata metadata;
  try {
    metadata = read_metadata(dir);
  } catch (const Error& e) {
    problems.push_back(e.what());
    return problems;
  }
  std::map<std::string, std::vector<const SavedPiece*>> by_file;  // sorted: every rank sees the same order
  for (const auto& [key, entry] : metadata.tensors)
    for (const SavedPiece& piece : entry.pieces) by_file[piece.file].push_back(&piece);
  int index = 0;
  for (const auto& [file, pieces] : by_file)
    if (index++ % parts == part) check_file(dir / file, pieces, problems);
  return problems;
}

std::optional<IntactCheckpoint> newest_intact_checkpoint(const fs::path& root, std::optional<int64_t> below,
                                                         comm::Communicator* world) {
  std::vector<int64_t> iterations = saved_iterations(root);
  std::reverse(iterations.begin(), iterations.end());
  for (int64_t iteration : iterations) {
    if (below && iteration >= *below) continue;
    const fs::path dir = iteration_dir(root, iteration);
    if (checkpoint_is_intact(dir, world)) return IntactCheckpoint{iteration, dir};
  }
  return std::nullopt;
}

std::string intact_checkpoint_hint(const fs::path& root, std::optional<int64_t> below) {
  std::optional<IntactCheckpoint> intact;
  try {
    intact = newest_intact_checkpoint(root, below);
  } catch (const std::exception& e) {
    return str_cat("(looking for an older intact checkpoint failed: ", e.what(), ")");
  }
  if (intact)
    return str_cat("the newest intact checkpoint in ", root.string(), " is ", intact->dir.filename().string(),
                   " (iteration ", intact->iteration, "): pass --load-fallback-to-intact to resume from it");
  const std::vector<int64_t> all = saved_iterations(root);
  const auto older = std::count_if(all.begin(), all.end(), [&](int64_t i) { return !below || i < *below; });
  return str_cat("no intact checkpoint to fall back to in ", root.string(), " (", older,
                 older == 1 ? " older iter_* directory, not intact)" : " older iter_* directories, none intact)");
}

}  // namespace megatron::checkpoint
