#include "megatron/data/numpy_generator.h"

#include <array>

#include "megatron/core/error.h"

namespace megatron::data {
namespace {

// numpy/random/bit_generator.pyx: SeedSequence hashing constants.
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr int kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

// SeedSequence(seed).generate_state(n_words, uint32).
std::vector<uint32_t> seed_sequence_state(uint64_t seed, int n_words) {
  std::vector<uint32_t> entropy;
  do {  // the integer as little-endian 32-bit words; 0 -> [0]
    entropy.push_back(static_cast<uint32_t>(seed));
    seed >>= 32;
  } while (seed != 0);
  std::array<uint32_t, kPoolSize> pool{};
  uint32_t hash_const = kInitA;
  for (int i = 0; i < kPoolSize; ++i)
    pool[i] = hashmix(i < static_cast<int>(entropy.size()) ? entropy[i] : 0, hash_const);
  for (int src = 0; src < kPoolSize; ++src)
    for (int dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  for (size_t src = kPoolSize; src < entropy.size(); ++src)
    for (int dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));

  std::vector<uint32_t> state(static_cast<size_t>(n_words));
  uint32_t hash_b = kInitB;
  for (int i = 0; i < n_words; ++i) {
    uint32_t value = pool[i % kPoolSize];
    value ^= hash_b;
    hash_b *= kMultB;
    value *= hash_b;
    value ^= value >> kXShift;
    state[i] = value;
  }
  return state;
}

constexpr unsigned __int128 kPcgMultiplier =
    (static_cast<unsigned __int128>(2549297995355413924ULL) << 64) | 4865540595714422341ULL;

}  // namespace

NumpyGenerator::NumpyGenerator(uint64_t seed) {
  auto words = seed_sequence_state(seed, 8);
  uint64_t v[4];
  for (int i = 0; i < 4; ++i) v[i] = static_cast<uint64_t>(words[2 * i]) | static_cast<uint64_t>(words[2 * i + 1]) << 32;
  const unsigned __int128 init_state = (static_cast<unsigned __int128>(v[0]) << 64) | v[1];
  const unsigned __int128 init_sequence = (static_cast<unsigned __int128>(v[2]) << 64) | v[3];
  state_ = 0;
  increment_ = (init_sequence << 1) | 1;
  state_ = state_ * kPcgMultiplier + increment_;
  state_ += init_state;
  state_ = state_ * kPcgMultiplier + increment_;
}

uint64_t NumpyGenerator::next_uint64() {
  state_ = state_ * kPcgMultiplier + increment_;
  const uint64_t folded = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rotation = static_cast<unsigned>(state_ >> 122);
  return (folded >> rotation) | (folded << ((64 - rotation) & 63));
}

uint32_t NumpyGenerator::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uint32_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uint32_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next & 0xffffffffU);
}

std::vector<int32_t> NumpyGenerator::integers_int32(int32_t low, int32_t high, int64_t size) {
  MEGATRON_CHECK(low < high, "integers: low ", low, " must be below high ", high);
  const uint32_t range = static_cast<uint32_t>(static_cast<int64_t>(high) - 1 - low);  // inclusive span
  std::vector<int32_t> out(static_cast<size_t>(size));
  for (auto& value : out) {
    uint32_t draw;
    if (range == 0) {
      draw = 0;
    } else if (range == 0xffffffffU) {
      draw = next_uint32();
    } else {
      const uint32_t range_exclusive = range + 1;
      uint64_t m = static_cast<uint64_t>(next_uint32()) * range_exclusive;
      uint32_t leftover = static_cast<uint32_t>(m);
      if (leftover < range_exclusive) {
        const uint32_t threshold = (0xffffffffU - range) % range_exclusive;
        while (leftover < threshold) {
          m = static_cast<uint64_t>(next_uint32()) * range_exclusive;
          leftover = static_cast<uint32_t>(m);
        }
      }
      draw = static_cast<uint32_t>(m >> 32);
    }
    value = static_cast<int32_t>(static_cast<int64_t>(low) + draw);
  }
  return out;
}

}  // namespace megatron::data
