// TFRecord framing, the container of TensorBoard's event files (TensorFlow's io/record_writer):
//   uint64 length | uint32 masked_crc32c(the 8 length bytes) | length bytes of data | uint32 masked_crc32c(data)
// little-endian, where masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 (so that a CRC of data that
// holds CRCs stays well distributed). TensorBoard's reader checks both CRCs and skips a record that fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace megatron::tensorboard {

uint32_t masked_crc32c(const void* data, size_t n);

// The framed record of `data`.
std::string tfrecord(std::string_view data);

}  // namespace megatron::tensorboard
