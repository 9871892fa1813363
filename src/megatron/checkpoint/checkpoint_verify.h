// Is a checkpoint intact, and which is the newest intact one under a root? Read before anything is loaded, so
// that a run restarted after a crash (a shard cut short by a full disk, a corrupted byte) can be told which
// checkpoint to resume from, or (pretrain_gpt --load-fallback-to-intact) resume from it on its own.
//
// A checkpoint is intact when its metadata.json reads (every tensor covered exactly once by its pieces) and
// every piece it lists is in its shard file, a valid safetensors file, with the recorded size and CRC-32C.
// Checking reads every byte of the checkpoint. Several ranks share the reading: rank r of n checks the shard
// files whose position in the sorted list of files is r modulo n, and the ranks agree on the verdict.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "megatron/comm/communicator.h"

namespace megatron::checkpoint {

// What is wrong with the checkpoint in `dir` (an iteration directory), one sentence per problem naming the
// file and, for a piece, the tensor and the byte range; empty when the part this rank checks is intact.
std::vector<std::string> checkpoint_problems(const std::filesystem::path& dir, int part = 0, int parts = 1);

// Whether every part of the checkpoint in `dir` is intact, agreed over `world` (nullptr: one rank checks it
// all); `problems` receives what this rank's part has.
bool checkpoint_is_intact(const std::filesystem::path& dir, comm::Communicator* world = nullptr,
                          std::vector<std::string>* problems = nullptr);

struct IntactCheckpoint {
  int64_t iteration = 0;
  std::filesystem::path dir;
};
// The newest published iter_* checkpoint under `root` older than `below` (every one when nullopt) that is
// intact; nullopt when there is none. Collective over `world` (nullptr: one rank checks everything).
std::optional<IntactCheckpoint> newest_intact_checkpoint(const std::filesystem::path& root,
                                                         std::optional<int64_t> below,
                                                         comm::Communicator* world = nullptr);

// The sentence an error about a bad checkpoint under `root` ends with: the newest intact one (older than
// `below`) and how to resume from it, or that there is none. One rank reads every older checkpoint.
std::string intact_checkpoint_hint(const std::filesystem::path& root, std::optional<int64_t> below);

}  // namespace megatron::checkpoint
