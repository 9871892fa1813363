// numpy's numpy.random.default_rng(seed) for a non-negative integer seed: SeedSequence(seed) -> PCG64
// (128-bit LCG, XSL-RR output), 32-bit draws as the low then the high half of one 64-bit draw, and
// Generator.integers(low, high, dtype=int32) by Lemire's multiply-and-reject. Enough for Megatron's mock
// dataset (default_rng(0).integers(1, 4096, 100000, dtype=int32)); bit-identical to numpy.
#pragma once

#include <cstdint>
#include <vector>

namespace megatron::data {

class NumpyGenerator {
 public:
  explicit NumpyGenerator(uint64_t seed);

  uint64_t next_uint64();
  uint32_t next_uint32();
  // Generator.integers(low, high, size, dtype=numpy.int32), high exclusive.
  std::vector<int32_t> integers_int32(int32_t low, int32_t high, int64_t size);

 private:
  unsigned __int128 state_ = 0;
  unsigned __int128 increment_ = 0;
  bool has_uint32_ = false;
  uint32_t uint32_ = 0;
};

}  // namespace megatron::data
