#include "megatron/checkpoint/shard_writer.h"

#include <cstdio>
#include <fstream>
#include <map>

#include "megatron/checkpoint/checkpoint_dir.h"
#include "megatron/checkpoint/crc32c.h"
#include "megatron/checkpoint/safetensors.h"
#include "megatron/core/error.h"

namespace megatron::checkpoint {
namespace fs = std::filesystem;

HostSnapshot snapshot(Context& ctx, int rank, const std::vector<SaveItem>& items, bool copy_cpu_tensors) {
  HostSnapshot snap;
  snap.rank = rank;
  for (const SaveItem& item : items) {
    validate_shard(item.spec);
    MEGATRON_CHECK(item.data.defined() && item.data.numel() == item.spec.numel() && item.data.dtype() == item.spec.dtype,
                   "checkpoint: piece ", item.spec.describe(), " has ", item.spec.numel(), " elements but its data is ",
                   item.data.defined() ? item.data.describe() : std::string("undefined"));
    if (item.spec.replica_id != 0) continue;
    Tensor host;
    if (item.data.is_cuda()) {
      host = Tensor::empty(item.data.shape(), item.data.dtype(), ctx.pinned_allocator());
      copy_tensor(ctx, host, item.data);
    } else if (copy_cpu_tensors) {
      host = Tensor::empty(item.data.shape(), item.data.dtype(), ctx.allocator());
      copy_tensor(ctx, host, item.data);
    } else {
      host = item.data;
    }
    snap.specs.push_back(item.spec);
    snap.host.push_back(std::move(host));
  }
  return snap;
}

namespace {
fs::path final_dir(const fs::path& root, int64_t iteration, bool release) {
  return release ? root / "release" : iteration_dir(root, iteration);
}
fs::path temporary_dir(const fs::path& root, int64_t iteration, bool release) {
  return release ? root / ".release.tmp" : temporary_iteration_dir(root, iteration);
}
}  // namespace

fs::path prepare_save_directory(const fs::path& root, int64_t iteration, const SaveHooks& hooks, bool release) {
  fs::create_directories(root);
  const fs::path tmp = temporary_dir(root, iteration, release);
  fs::remove_all(tmp);  // a crashed save of the same iteration
  fs::create_directory(tmp);
  hooks(kStageTemporaryDirectoryReady);
  return tmp;
}

std::vector<SavedPiece> write_rank_file(const fs::path& tmp_dir, const HostSnapshot& snap, int64_t iteration,
                                        const SaveHooks& hooks) {
  char file[40];
  std::snprintf(file, sizeof file, "rank_%05d.safetensors", snap.rank);
  std::vector<SafetensorsTensor> tensors;
  std::vector<SavedPiece> pieces;
  std::map<std::string, int> uses;  // a rank holding several pieces of one key names them key#1, key#2, ...
  for (size_t i = 0; i < snap.specs.size(); ++i) {
    const ShardSpec& spec = snap.specs[i];
    const Tensor& t = snap.host[i];
    SavedPiece p;
    p.spec = spec;
    p.file = file;
    const int n = uses[spec.key]++;
    p.name = n == 0 ? spec.key : str_cat(spec.key, "#", n);
    p.bytes = t.nbytes();
    p.crc32c = crc32c(t.data_ptr(), t.nbytes());
    pieces.push_back(p);
    const Shape shape = spec.flat ? Shape{t.numel()} : Shape(spec.local_shape);
    tensors.push_back({p.name, t.dtype(), shape, t.data_ptr(), false});
  }
  write_safetensors(tmp_dir / file, tensors,
                    {{"format", kFormatName}, {"iteration", std::to_string(iteration)}, {"rank", std::to_string(snap.rank)}},
                    {.fsync = true});
  hooks(kStageRankFileWritten);
  return pieces;
}

void publish_checkpoint(const fs::path& root, int64_t iteration, const std::vector<SavedPiece>& pieces,
                        const nlohmann::json& state, const SaveOptions& options) {
  const fs::path tmp = temporary_dir(root, iteration, options.release);
  const CheckpointMetadata m = make_metadata(iteration, pieces, state);
  {
    std::ofstream f(tmp / kMetadataFile, std::ios::trunc);
    f << metadata_to_json(m).dump(1) << "\n";
    f.close();
    MEGATRON_CHECK(f.good(), "checkpoint: cannot write ", (tmp / kMetadataFile).string());
  }
  fsync_path(tmp / kMetadataFile);
  options.hooks(kStageMetadataWritten);
  publish_directory(tmp, final_dir(root, iteration, options.release));
  options.hooks(kStagePublished);
  write_latest_iteration(root, options.release ? std::string("release") : std::to_string(iteration));
  apply_retention(root, options.keep_last);
}

void write_checkpoint(const fs::path& root, int64_t iteration, const HostSnapshot& snap, const nlohmann::json& state,
                      const SaveOptions& options) {
  const fs::path tmp = prepare_save_directory(root, iteration, options.hooks, options.release);
  std::vector<SavedPiece> pieces = write_rank_file(tmp, snap, iteration, options.hooks);
  publish_checkpoint(root, iteration, pieces, state, options);
}

void save_checkpoint(Context& ctx, const fs::path& root, int64_t iteration, const std::vector<SaveItem>& items,
                     const nlohmann::json& state, const SaveOptions& options) {
  write_checkpoint(root, iteration, snapshot(ctx, 0, items, /*copy_cpu_tensors=*/false), state, options);
}

}  // namespace megatron::checkpoint
