// metadata.json of a sharded checkpoint: what every saved piece is and where it lives.
//
// {
//   "format": "megatron.cpp/sharded", "version": 1, "iteration": 100,
//   "tensors": {
//     "<key>": {"global_shape": [..], "dtype": "bf16",
//               "pieces": [{"file": "rank_00000.safetensors", "name": "<name in that file>",
//                           "global_offset": [..], "local_shape": [..]      (box pieces)
//                           | "flat_range": [begin, end],                   (flat ranges of the tensor)
//                           | "global_offset", "local_shape", "flat_range"  (a flat range of a block)
//                           "replica_id": 0, "bytes": 1234, "crc32c": "0x1a2b3c4d"}, ...]}, ...},
//   "state": { ... }   the non-tensor state (iteration counters, schedules, RNG, args), free-form JSON
// }
// Only replica-0 pieces are listed; together they cover every tensor exactly once (checked when written
// and when read).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron/checkpoint/sharded_tensor.h"

namespace megatron::checkpoint {

inline constexpr const char* kMetadataFile = "metadata.json";
inline constexpr const char* kFormatName = "megatron.cpp/sharded";
inline constexpr int kFormatVersion = 1;

// One piece as stored: its place in the global tensor and in a file.
struct SavedPiece {
  ShardSpec spec;
  std::string file;  // relative to the iteration directory
  std::string name;  // tensor name inside the safetensors file
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct TensorEntry {
  std::vector<int64_t> global_shape;
  DType dtype = DType::F32;
  std::vector<SavedPiece> pieces;
};

struct CheckpointMetadata {
  int64_t iteration = 0;
  std::map<std::string, TensorEntry> tensors;
  nlohmann::json state = nlohmann::json::object();
};

// Groups the pieces by key (checking that every piece of a key agrees on shape and dtype and that they
// cover it exactly once); throws naming the key otherwise.
CheckpointMetadata make_metadata(int64_t iteration, const std::vector<SavedPiece>& pieces, nlohmann::json state);

nlohmann::json metadata_to_json(const CheckpointMetadata& m);
// Throws megatron::Error naming `where` (the file) and the field on anything malformed.
CheckpointMetadata metadata_from_json(const nlohmann::json& j, const std::string& where);

// One rank's pieces as JSON (each with its key, global shape and dtype), for gathering them to rank 0.
nlohmann::json saved_pieces_to_json(const std::vector<SavedPiece>& pieces);
// Throws naming `where` (e.g. "rank 3") on anything malformed.
std::vector<SavedPiece> saved_pieces_from_json(const nlohmann::json& j, const std::string& where);

// Reads <dir>/metadata.json.
CheckpointMetadata read_metadata(const std::filesystem::path& dir);

}  // namespace megatron::checkpoint
