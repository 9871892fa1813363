// .npy files (numpy's format, https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html):
// save_npy writes version 1.0 byte-for-byte as numpy.save does (numpy >= 1.24 header padding: the dict,
// room for 21 digits on the growth axis, spaces and '\n' up to a 64-byte boundary); load_npy reads versions
// 1, 2 and 3 of little-endian, C-ordered arrays. Errors name the path and what was wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace megatron::data {

struct NpyArray {
  std::string descr;               // numpy dtype string, e.g. "<i4", "<u4", "<i8", "<i2"
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;    // C order

  int64_t num_elements() const;
  // The elements widened to int64; the descr must be an integer type.
  std::vector<int64_t> to_int64(const std::filesystem::path& where_from) const;
};

// The descr numpy uses for T (int16/32/64, uint16/32/64, uint8, int8).
template <class T>
std::string npy_descr();

void save_npy(const std::filesystem::path& path, const std::string& descr, std::span<const int64_t> shape,
              std::span<const std::byte> bytes);

template <class T>
void save_npy(const std::filesystem::path& path, std::span<const T> values, std::span<const int64_t> shape) {
  save_npy(path, npy_descr<T>(), shape, std::as_bytes(values));
}

NpyArray load_npy(const std::filesystem::path& path);

}  // namespace megatron::data
