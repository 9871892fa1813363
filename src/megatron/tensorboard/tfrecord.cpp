#include "megatron/tensorboard/tfrecord.h"

#include "megatron/core/crc32c.h"

namespace megatron::tensorboard {
namespace {

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((value >> (8 * i)) & 0xFFu));
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  append_le(out, data.size(), 8);
  append_le(out, masked_crc32c(out.data(), 8), 4);
  out.append(data);
  append_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

}  // namespace megatron::tensorboard
