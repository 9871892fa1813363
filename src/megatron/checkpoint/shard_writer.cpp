#include "megatron/checkpoint/shard_writer.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>

#include "megatron/checkpoint/checkpoint_dir.h"
#include "megatron/core/crc32c.h"
#include "megatron/checkpoint/rank_exchange.h"
#include "megatron/checkpoint/safetensors.h"
#include "megatron/core/error.h"
#if MEGATRON_WITH_CUDA
#include <cuda_runtime.h>

#include "megatron/core/cuda_check.h"
#endif

namespace megatron::checkpoint {
namespace fs = std::filesystem;

std::vector<int> assign_writers(const std::vector<uint64_t>& bytes, int group_size) {
  MEGATRON_CHECK(group_size >= 1, "assign_writers: group size ", group_size);
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  std::vector<uint64_t> load(size_t(group_size), 0);
  std::vector<int> writer(bytes.size(), 0);
  for (size_t i : order) {
    const int r = int(std::min_element(load.begin(), load.end()) - load.begin());
    writer[i] = r;
    load[size_t(r)] += bytes[i];
  }
  return writer;
}

void validate_save_item(const SaveItem& item) {
  validate_shard(item.spec);
  MEGATRON_CHECK(item.data.defined() && item.data.numel() == item.spec.numel() && item.data.dtype() == item.spec.dtype,
                 "checkpoint: piece ", item.spec.describe(), " has ", item.spec.numel(), " elements but its data is ",
                 item.data.defined() ? item.data.describe() : std::string("undefined"));
}

HostSnapshot snapshot(Context& ctx, int rank, const std::vector<SaveItem>& items, bool copy_cpu_tensors) {
  HostSnapshot snap;
  snap.rank = rank;
  bool any_cuda = false;
  for (const SaveItem& item : items) {
    validate_save_item(item);
    if (item.spec.replica_id != 0) continue;
    Tensor host;
    if (item.data.is_cuda()) {
      host = Tensor::empty(item.data.shape(), item.data.dtype(), ctx.pinned_allocator());
#if MEGATRON_WITH_CUDA
      // Queued on ctx's stream; one synchronisation after the last piece.
      if (item.data.nbytes() > 0)
        CUDA_CHECK_MSG(cudaMemcpyAsync(host.data_ptr(), item.data.data_ptr(), item.data.nbytes(), cudaMemcpyDeviceToHost,
                                       ctx.stream()),
                       " (checkpoint snapshot of ", item.spec.describe(), ")");
      any_cuda = true;
#endif
    } else if (copy_cpu_tensors) {
      host = Tensor::empty(item.data.shape(), item.data.dtype(), ctx.allocator());
      copy_tensor(ctx, host, item.data);
    } else {
      host = item.data;
    }
    snap.specs.push_back(item.spec);
    snap.host.push_back(std::move(host));
  }
  if (any_cuda) ctx.synchronize();
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
  write_file_synced(tmp / kMetadataFile, metadata_to_json(m).dump(1) + "\n");
  options.hooks(kStageMetadataWritten);
  publish_directory(tmp, final_dir(root, iteration, options.release));
  options.hooks(kStagePublished);
  write_latest_iteration(root, options.release ? std::string("release") : std::to_string(iteration));
  apply_retention(root, options.keep_last);
}

namespace {

// After a failed save: its temporary directory goes (best effort), so that a partial shard does not keep
// holding the space of a full disk; the tracker and every published checkpoint are untouched.
void remove_failed_save(const fs::path& root, int64_t iteration, bool release) {
  std::error_code ignored;
  fs::remove_all(temporary_dir(root, iteration, release), ignored);
}

}  // namespace

void write_checkpoint(const fs::path& root, int64_t iteration, const HostSnapshot& snap, const nlohmann::json& state,
                      const SaveOptions& options) {
  const fs::path tmp = prepare_save_directory(root, iteration, options.hooks, options.release);
  try {
    std::vector<SavedPiece> pieces = write_rank_file(tmp, snap, iteration, options.hooks);
    publish_checkpoint(root, iteration, pieces, state, options);
  } catch (...) {
    remove_failed_save(root, iteration, options.release);
    throw;
  }
}

fs::path prepare_save_directory_on_all(comm::Communicator* world, const fs::path& root, int64_t iteration,
                                       const SaveOptions& options) {
  if (world == nullptr || world->size() == 1) return prepare_save_directory(root, iteration, options.hooks, options.release);
  std::exception_ptr error;
  if (world->rank() == 0) {
    try {
      prepare_save_directory(root, iteration, options.hooks, options.release);
    } catch (...) {
      error = std::current_exception();
    }
  }
  agree_on_failure(world, error, str_cat("checkpoint save of iteration ", iteration, " under ", root.string(),
                                         ": preparing the temporary directory"));
  return temporary_dir(root, iteration, options.release);
}

void gather_and_publish(Context& ctx, comm::Communicator* world, const fs::path& root, int64_t iteration,
                        const std::vector<SavedPiece>& mine, const nlohmann::json& state, const SaveOptions& options,
                        std::exception_ptr error) {
  const std::string what = str_cat("checkpoint save of iteration ", iteration, " under ", root.string());
  const int rank = world != nullptr ? world->rank() : 0;
  const auto agree = [&](std::exception_ptr failure, const std::string& step) {
    try {
      agree_on_failure(world, failure, what + step);
    } catch (...) {
      if (rank == 0) remove_failed_save(root, iteration, options.release);  // every rank is done with it
      throw;
    }
  };
  agree(error, ": writing the rank files");
  const std::vector<std::string> lists = all_gather_strings(ctx, world, saved_pieces_to_json(mine).dump());
  std::exception_ptr publish_error;
  if (rank == 0) {
    try {
      std::vector<SavedPiece> all;
      for (size_t r = 0; r < lists.size(); ++r) {
        std::vector<SavedPiece> theirs = lists.size() == 1 ? mine
                                                          : saved_pieces_from_json(nlohmann::json::parse(lists[r]),
                                                                                   str_cat("rank ", r));
        all.insert(all.end(), theirs.begin(), theirs.end());
      }
      publish_checkpoint(root, iteration, all, state, options);
    } catch (...) {
      publish_error = std::current_exception();
    }
  }
  agree(publish_error, ": publishing");
}

void save_checkpoint(Context& ctx, const fs::path& root, int64_t iteration, const std::vector<SaveItem>& items,
                     const nlohmann::json& state, const SaveOptions& options, comm::Communicator* world) {
  const int rank = world != nullptr ? world->rank() : 0;
  if (world == nullptr || world->size() == 1) {
    try {
      write_checkpoint(root, iteration, snapshot(ctx, rank, items, /*copy_cpu_tensors=*/false), state, options);
    } catch (const Error& e) {
      MEGATRON_FAIL("checkpoint save of iteration ", iteration, " under ", root.string(), ": ", e.what());
    }
    return;
  }
  const fs::path tmp = prepare_save_directory_on_all(world, root, iteration, options);
  std::vector<SavedPiece> mine;
  std::exception_ptr error;
  try {
    mine = write_rank_file(tmp, snapshot(ctx, rank, items, /*copy_cpu_tensors=*/false), iteration, options.hooks);
  } catch (...) {
    error = std::current_exception();
  }
  gather_and_publish(ctx, world, root, iteration, mine, state, options, error);
}

}  // namespace megatron::checkpoint
