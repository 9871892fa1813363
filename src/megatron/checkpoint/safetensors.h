// safetensors: Hugging Face's tensor container (https://huggingface.co/docs/safetensors), read and written.
//
// File layout: u64 little-endian N; N bytes of UTF-8 JSON (the header), padded with trailing spaces;
// the byte buffer. The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the buffer) plus an optional "__metadata__" string->string map.
//
// Writing (write_safetensors): tensors are laid out in the order given, back to back, the header is padded
// with spaces to a multiple of 8 bytes (so the buffer starts 8-byte aligned, as the reference writer does),
// "__metadata__" comes first. The reference implementation (the `safetensors` PyPI package) orders tensors
// by dtype (widest first, its enum order) then by name: canonical_order() gives that order, and with it and
// at most one metadata entry (the reference keeps metadata in a hash map) our bytes are identical.
//
// Reading (SafetensorsFile): the file is memory-mapped read-only; open() validates everything before any
// tensor is handed out: header length within the file, valid JSON object, known dtypes, non-negative
// shapes, data_offsets within the buffer, byte size == numel x element size, offsets contiguous from 0 and
// covering the whole buffer (what the reference also requires; a truncated file fails here). Every error
// names the path and, where it applies, the tensor, the offsets and what was expected.
//
// DTypes: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U16 U8 map to megatron::DType; BOOL is read and
// written as U8 bytes (the entry keeps `is_bool`). U32/U64 entries are listed but tensor() refuses them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "megatron/tensor/tensor.h"

namespace megatron::checkpoint {

// One tensor to write: raw host bytes (row-major, little-endian) and how to describe them.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;  // shape.numel() * dtype_size(dtype) bytes
  bool is_bool = false;        // write dtype "BOOL" (dtype must be U8)
};

// One tensor as listed in a file's header.
struct SafetensorsEntry {
  std::string name;
  std::string file_dtype;        // as written in the header: "F32", "BOOL", "U32", ...
  std::optional<DType> dtype;    // none for dtypes without a megatron::DType (U32, U64)
  bool is_bool = false;
  Shape shape;
  uint64_t begin = 0, end = 0;   // data_offsets, relative to the byte buffer
};

// "F32", "BF16", ... for a DType (throws for none).
const char* safetensors_dtype_name(DType dtype);

// The order in which the reference writer lays out these tensors: dtype descending in its enum order
// (U64 I64 F64 F32 U32 I32 BF16 F16 U16 I16 F8_E4M3 F8_E5M2 I8 U8 BOOL), then name ascending.
std::vector<size_t> canonical_order(std::span<const SafetensorsTensor> tensors);

struct SafetensorsWriteOptions {
  bool fsync = false;  // fsync the file before closing (crash-safe checkpoints)
};

// Writes `tensors` in the given order. Throws megatron::Error naming the path on any I/O failure and the
// tensor on a bad description (duplicate name, BOOL on a non-U8 dtype, null data with non-zero size).
void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsTensor> tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const SafetensorsWriteOptions& options = {});

// The header JSON plus padding, exactly as write_safetensors writes it (after the 8-byte length).
std::string safetensors_header(std::span<const SafetensorsTensor> tensors,
                               const std::map<std::string, std::string>& metadata);

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws megatron::Error on anything malformed (see the top of this file).
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // In header order (as the JSON lists them).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // Throws naming the path and the tensor when absent.
  const SafetensorsEntry& entry(const std::string& name) const;
  // The tensor's bytes inside the mapping (valid while this object lives).
  std::span<const std::byte> bytes(const std::string& name) const;
  // A CPU tensor borrowing the mapping (read only in spirit: do not write through it). The returned
  // tensor keeps this file mapped for as long as it lives.
  Tensor tensor(const std::string& name) const;
  // Offset of the byte buffer in the file (8 + header length).
  uint64_t data_start() const { return data_start_; }

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  const std::byte* map_ = nullptr;
  size_t map_size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::weak_ptr<SafetensorsFile> self_;
};

}  // namespace megatron::checkpoint
