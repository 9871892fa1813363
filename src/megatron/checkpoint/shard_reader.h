// Loading from a sharded checkpoint at any layout.
//
// CheckpointReader::open(root) follows the tracker (latest_checkpointed_iteration.txt) or takes an
// iteration directory; it reads metadata.json. load(want, dst) fills the local piece `want` of a tensor
// from every saved piece that overlaps it (sharded_tensor.h's rule) and refuses to return until every
// element was found. Each saved piece's bytes are checked against its CRC-32C the first time they are read;
// a shard file that is missing, truncated or corrupt fails with an error naming the file and the tensor.
// `dst` may live on CUDA (assembled on the host, then copied) and may have another float dtype than the
// saved one (converted through fp32/fp64 with CUDA's rounding: bf16 weights load into an fp32 model).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "megatron/checkpoint/checkpoint_metadata.h"
#include "megatron/runtime/context.h"

namespace megatron::checkpoint {

class SafetensorsFile;

class CheckpointReader {
 public:
  // `path` is a checkpoint root (the tracker names the directory) or an iteration directory itself.
  static CheckpointReader open(const std::filesystem::path& path);

  const std::filesystem::path& directory() const { return dir_; }
  const CheckpointMetadata& metadata() const { return metadata_; }
  int64_t iteration() const { return metadata_.iteration; }
  bool is_release() const { return release_; }
  const nlohmann::json& state() const { return metadata_.state; }
  bool has(const std::string& key) const { return metadata_.tensors.count(key) != 0; }
  // Throws naming the checkpoint and the key when absent.
  const TensorEntry& tensor(const std::string& key) const;

  // Fills `dst` (contiguous, want.numel() elements, any device) with the piece `want`.
  void load(Context& ctx, const ShardSpec& want, const Tensor& dst);
  // The whole tensor `key` into `dst` (its global shape's numel).
  void load_whole(Context& ctx, const std::string& key, const Tensor& dst);
  // Bytes of saved pieces read so far (each piece counted once per load call that used it).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  const SafetensorsFile& file(const SavedPiece& piece);
  std::filesystem::path dir_;
  bool release_ = false;
  CheckpointMetadata metadata_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files_;
  std::set<std::string> verified_;  // "file/name" whose checksum was checked
  uint64_t bytes_read_ = 0;
};

}  // namespace megatron::checkpoint
