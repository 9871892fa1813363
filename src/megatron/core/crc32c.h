// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF): the
// checksum of every checkpoint shard and of TensorBoard's records. crc32c("123456789") == 0xE3069283.
//
// crc32c_update(crc, data) continues a running checksum, so crc32c(a + b) == crc32c_update(crc32c(a), b).
// Uses the SSE4.2 crc32 instruction when the CPU has it (several GB/s), a table otherwise; both give the
// same value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megatron {

uint32_t crc32c_update(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_update(0, data, n); }

}  // namespace megatron
