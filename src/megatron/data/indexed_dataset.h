// Megatron's indexed dataset, `<prefix>.bin` + `<prefix>.idx` (megatron/core/datasets/indexed_dataset.py).
//
// .idx, little-endian: magic "MMIDIDX\0\0" (9 bytes), uint64 version = 1, uint8 dtype code, uint64 sequence
// count N, uint64 document-index count D (= documents + 1); then int32 sequence lengths [N], int64 byte
// pointers into .bin [N], int64 document indices [D] (0, then the sequence index where each document
// ends; last == N); optionally int8 sequence modes [N] (multimodal files; ignored here).
// .bin: the tokens of every sequence back to back in the dtype.
//
// IndexedDatasetReader maps both files and validates everything up front (magic, version, dtype code, the
// .idx size, pointers monotone and contiguous with the lengths, the .bin size, the document indices); every
// failure is a megatron::Error naming the path, what was expected and what was found.
// IndexedDatasetWriter streams tokens to <prefix>.bin.tmp (memory: the int arrays only); prepare() writes
// <prefix>.idx.tmp and fsyncs both; commit() puts them in place: it removes an existing <prefix>.idx, renames
// the .bin, then the .idx, and fsyncs the directory. So a dataset already at <prefix> stays readable until
// the new one is complete, a run that fails (a full disk, a bad input line) leaves it untouched and removes
// its temporary files, and a crash never pairs a .idx with a .bin it does not describe (in the instant of the
// renames there is no .idx at all). finalize() is prepare() then commit(); several writers whose outputs
// belong together (preprocess_data's keys) prepare all, then commit all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "megatron/data/token_sequences.h"

namespace megatron::data {

enum class TokenDType : uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, F64 = 6, F32 = 7, U16 = 8 };

size_t token_dtype_size(TokenDType dtype);
const char* token_dtype_name(TokenDType dtype);
bool is_valid_token_dtype_code(uint8_t code);
// preprocess_data's rule: uint16 when the vocabulary has fewer than 65500 entries, else int32.
TokenDType token_dtype_for_vocab_size(int64_t vocab_size);

std::filesystem::path idx_path(const std::string& prefix);  // <prefix>.idx
std::filesystem::path bin_path(const std::string& prefix);  // <prefix>.bin
// Where IndexedDatasetWriter writes before commit(): <prefix>.idx.tmp, <prefix>.bin.tmp.
std::filesystem::path temporary_idx_path(const std::string& prefix);
std::filesystem::path temporary_bin_path(const std::string& prefix);

class IndexedDatasetReader final : public TokenSequences {
 public:
  explicit IndexedDatasetReader(std::string prefix);
  ~IndexedDatasetReader() override;
  IndexedDatasetReader(const IndexedDatasetReader&) = delete;
  IndexedDatasetReader& operator=(const IndexedDatasetReader&) = delete;

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return static_cast<int64_t>(sequence_lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(document_indices_.size()) - 1; }
  std::span<const int32_t> sequence_lengths() const override { return sequence_lengths_; }
  // Byte offset of a sequence in .bin (read from the mapped .idx; validated to be contiguous).
  int64_t sequence_pointer(int64_t sequence) const;
  std::span<const int64_t> document_indices() const { return document_indices_; }

  // Raw bytes of tokens [offset, offset + length) of `sequence` (length < 0: to the end of the sequence).
  std::span<const std::byte> get_bytes(int64_t sequence, int64_t offset = 0, int64_t length = -1) const;
  // The same tokens widened to int64 (integer dtypes only).
  std::vector<int64_t> get(int64_t sequence, int64_t offset = 0, int64_t length = -1) const;
  void read_tokens(int64_t sequence, int64_t offset, std::span<int64_t> dst) const override;
  void read_tokens(int64_t sequence, int64_t offset, std::span<int32_t> dst) const;

 private:
  struct Mapping;
  std::pair<int64_t, int64_t> checked_window(int64_t sequence, int64_t offset, int64_t length) const;

  std::string prefix_;
  TokenDType dtype_ = TokenDType::U16;
  std::unique_ptr<Mapping> idx_map_, bin_map_;
  // Copied out of the mapping: the .idx arrays start at unaligned offsets (34 + ...).
  std::vector<int32_t> sequence_lengths_;
  std::vector<int64_t> document_indices_;
  const std::byte* pointers_ = nullptr;  // int64 [N] inside the .idx mapping, unaligned
};

class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, TokenDType dtype);
  ~IndexedDatasetWriter();  // without commit(): the temporary files are removed, <prefix> is left as it was
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One sequence; values must fit the dtype.
  void add_sequence(std::span<const int32_t> tokens);
  void add_sequence(std::span<const int64_t> tokens);
  // Ends the current document after the sequences added since the previous end_document().
  void end_document();
  // add_sequence + end_document: one document of one sequence (preprocess_data without --split-sentences).
  void add_document(std::span<const int32_t> tokens) { add_sequence(tokens); end_document(); }
  void add_document(std::span<const int64_t> tokens) { add_sequence(tokens); end_document(); }
  // Appends every sequence and document of another dataset of the same dtype.
  void append(const IndexedDatasetReader& other);
  // Flushes and fsyncs the .bin, writes and fsyncs the .idx, both under temporary names; nothing more can be
  // added afterwards.
  void prepare();
  // Replaces <prefix>.{bin,idx} with the prepared files (see the top of this file).
  void commit();
  void finalize() {
    prepare();
    commit();
  }

  int64_t num_sequences() const { return static_cast<int64_t>(sequence_lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(document_indices_.size()) - 1; }

 private:
  template <class T>
  void add_sequence_impl(std::span<const T> tokens);
  void write_bin(const void* data, size_t bytes);
  void flush_bin();

  void write_idx(int fd, const std::filesystem::path& path) const;

  std::string prefix_;
  TokenDType dtype_;
  int bin_fd_ = -1;
  std::unique_ptr<std::byte[]> buffer_;
  size_t buffered_ = 0;
  int64_t bin_bytes_ = 0;
  bool prepared_ = false, committed_ = false;
  std::vector<int32_t> sequence_lengths_;
  std::vector<int64_t> document_indices_{0};
};

// Concatenates datasets (documents in the order given) into <output_prefix>.{bin,idx}; all inputs must
// share one dtype.
void merge_indexed_datasets(const std::vector<std::string>& input_prefixes, const std::string& output_prefix);

}  // namespace megatron::data
