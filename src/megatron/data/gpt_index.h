// Megatron's GPTDataset index building (megatron/core/datasets/gpt_dataset.py and helpers.cpp), pure
// functions of the sequence lengths, bit for bit:
// - epochs: the fewest E >= 1 with E * tokens_per_epoch >= num_samples * seq_len + add_extra_token;
// - separate final epoch when E > 1 and the samples wanted from the last epoch are fewer than
//   int(0.80 * samples per epoch);
// - document index (int32): the split's sequence ids tiled E times and shuffled with
//   numpy RandomState(seed); with a separate final epoch the first E-1 tilings and the last are shuffled
//   separately (same RandomState, in that order) and concatenated;
// - sample index [S+1, 2]: (position in the document index, token offset) where each sample starts;
//   S = (E * tokens - add_extra) // seq_len (ceil in float32 when the last partial sample is kept);
//   int32 when max(len(document index), max sequence length) fits int32, else int64;
// - shuffle index: a permutation of [0, S) by the same RandomState (uint32, int64 when S >= 2^32 - 2);
//   with a separate final epoch [0, S_first) and [S_first, S) are permuted separately.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "megatron/data/dataset_split.h"
#include "megatron/data/numpy_random.h"

namespace megatron::data {

struct GptIndexRequest {
  std::span<const int32_t> sequence_lengths;  // every sequence of the low-level dataset
  SequenceRange sequences;                    // the split's sequences
  std::optional<int64_t> num_samples;         // nullopt: one epoch
  int64_t sequence_length = 0;
  uint64_t random_seed = 0;
  bool add_extra_token_to_sequence = true;
  bool drop_last_partial_sequence = true;     // Megatron: true except for valid with the option off
};

struct GptIndices {
  std::vector<int32_t> document_index;
  std::vector<int64_t> sample_index;          // row-major [num_samples() + 1][2]
  bool sample_index_is_int64 = false;         // the dtype Megatron stores it in
  std::vector<int64_t> shuffle_index;
  bool shuffle_index_is_int64 = false;        // else uint32
  int64_t num_epochs = 0;
  bool separate_final_epoch = false;
  int64_t tokens_per_epoch = 0;

  int64_t num_samples() const { return static_cast<int64_t>(sample_index.size() / 2) - 1; }
};

int64_t count_tokens(std::span<const int32_t> sequence_lengths, SequenceRange sequences);
int64_t num_epochs_for(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, int64_t sequence_length,
                       bool add_extra_token);
std::vector<int32_t> build_document_index(SequenceRange sequences, int64_t num_epochs, NumpyRandomState& random,
                                          bool separate_final_epoch);
std::vector<int64_t> build_sample_index(std::span<const int32_t> sequence_lengths,
                                        std::span<const int32_t> document_index, int64_t sequence_length,
                                        int64_t num_epochs, int64_t tokens_per_epoch,
                                        bool drop_last_partial_sequence, bool add_extra_token);
std::vector<int64_t> build_shuffle_index(int64_t num_samples, int64_t total_size, NumpyRandomState& random);

// All three indices. Throws when the split holds no tokens while samples are asked of it (Megatron would
// loop forever); `what` names the dataset and split in that message.
GptIndices build_gpt_indices(const GptIndexRequest& request, const std::string& what);

// Checks indices read from a cache (files anyone may have written or cut short) against what the dataset
// reads through them: every document index entry is a sequence of the split; the sample index starts at
// (0, 0) and never goes back; every sample's token windows lie inside their sequences and hold exactly
// sequence_length + add_extra tokens (the last may hold fewer only when it is kept partial); the shuffle
// index is a permutation of the samples; there are at least the samples requested. Throws naming `what`,
// the array and the entry. Linear in the sizes of the indices.
void check_gpt_indices(const GptIndices& indices, const GptIndexRequest& request, const std::string& what);

}  // namespace megatron::data
