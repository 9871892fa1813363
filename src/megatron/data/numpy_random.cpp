#include "megatron/data/numpy_random.h"

#include <numeric>

#include "megatron/core/error.h"

namespace megatron::data {
namespace {
constexpr int kShift = 397;
constexpr uint32_t kMatrixA = 0x9908b0dfU;
constexpr uint32_t kUpperMask = 0x80000000U;
constexpr uint32_t kLowerMask = 0x7fffffffU;
}  // namespace

NumpyRandomState::NumpyRandomState(uint64_t seed) {
  MEGATRON_CHECK(seed <= 0xffffffffULL, "numpy RandomState seed ", seed, " out of range: must be in [0, 2^32)");
  uint32_t s = static_cast<uint32_t>(seed);
  for (int i = 0; i < kStateSize; ++i) {
    key_[i] = s;
    s = 1812433253U * (s ^ (s >> 30)) + static_cast<uint32_t>(i + 1);
  }
  position_ = kStateSize;
}

void NumpyRandomState::refill() {
  int i = 0;
  for (; i < kStateSize - kShift; ++i) {
    uint32_t y = (key_[i] & kUpperMask) | (key_[i + 1] & kLowerMask);
    key_[i] = key_[i + kShift] ^ (y >> 1) ^ (-(y & 1) & kMatrixA);
  }
  for (; i < kStateSize - 1; ++i) {
    uint32_t y = (key_[i] & kUpperMask) | (key_[i + 1] & kLowerMask);
    key_[i] = key_[i + (kShift - kStateSize)] ^ (y >> 1) ^ (-(y & 1) & kMatrixA);
  }
  uint32_t y = (key_[kStateSize - 1] & kUpperMask) | (key_[0] & kLowerMask);
  key_[kStateSize - 1] = key_[kShift - 1] ^ (y >> 1) ^ (-(y & 1) & kMatrixA);
  position_ = 0;
}

uint32_t NumpyRandomState::next_uint32() {
  if (position_ == kStateSize) refill();
  uint32_t y = key_[position_++];
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= (y >> 18);
  return y;
}

uint64_t NumpyRandomState::next_uint64() {
  uint64_t high = next_uint32();
  uint64_t low = next_uint32();
  return high << 32 | low;
}

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffULL) {
    while ((value = (next_uint32() & mask)) > max) {
    }
  } else {
    while ((value = (next_uint64() & mask)) > max) {
    }
  }
  return value;
}

std::vector<int64_t> NumpyRandomState::permutation(int64_t n) {
  std::vector<int64_t> values(static_cast<size_t>(n));
  std::iota(values.begin(), values.end(), int64_t{0});
  shuffle(std::span<int64_t>(values));
  return values;
}

}  // namespace megatron::data
