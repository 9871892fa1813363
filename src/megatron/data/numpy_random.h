// numpy's legacy numpy.random.RandomState, bit for bit, for what Megatron's dataset indices use:
// MT19937 seeded like RandomState(seed) for an integer seed in [0, 2^32) (init_genrand), 32-bit draws,
// 64-bit draws as (first draw << 32 | second draw), random_interval(max) (uniform in [0, max] by rejection on
// the smallest all-ones bit mask >= max, 32-bit draws when max fits 32 bits, else 64-bit draws), shuffle of
// a 1-D array (Fisher-Yates from the last element down to index 1, j = random_interval(i)) and permutation.
// The same sequence of calls on the same seed gives the same numbers as numpy.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace megatron::data {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint64_t seed);  // seed must be < 2^32, as numpy requires

  uint32_t next_uint32();
  uint64_t next_uint64();
  // Uniform integer in [0, max] (numpy's random_interval).
  uint64_t random_interval(uint64_t max);

  // numpy.random.RandomState.shuffle of a 1-D array.
  template <class T>
  void shuffle(std::span<T> values) {
    for (size_t i = values.size(); i-- > 1;) {
      size_t j = static_cast<size_t>(random_interval(i));
      std::swap(values[i], values[j]);
    }
  }

  // numpy.random.RandomState.permutation(n): arange(n) shuffled.
  std::vector<int64_t> permutation(int64_t n);

 private:
  void refill();

  static constexpr int kStateSize = 624;
  std::array<uint32_t, kStateSize> key_{};
  int position_ = kStateSize;
};

}  // namespace megatron::data
