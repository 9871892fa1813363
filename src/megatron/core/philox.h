// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011), identical on CPU and GPU.
//
// Contract: a draw is addressed by (seed, offset, index). `seed` is the run's seed, `offset` separates
// independent draws (one per tensor initialisation, one per dropout call, ...), and `index` is the element's
// position in the *global* (unsharded) tensor. Because a value depends on nothing else, a tensor initialised
// whole on one rank and the same tensor initialised shard by shard on N ranks hold the same numbers, and a
// dropout mask does not depend on the device or on the layout.
//
// philox_u32 is bit-identical everywhere. philox_normal runs Box-Muller in fp64 and rounds to fp32, so CPU
// and GPU agree unless their fp64 log/cos differ across a float rounding boundary (~2^-29 per element).
#pragma once

#include <cmath>
#include <cstdint>

#include "megatron/core/float_types.h"  // MEGATRON_HD

namespace megatron {

struct Philox4x32 {
  uint32_t v[4];
};

MEGATRON_HD Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(kM0) * c0;
    uint64_t p1 = uint64_t(kM1) * c2;
    uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    k0 += kW0; k1 += kW1;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// One 32-bit random word per (seed, offset, index); four consecutive indices share one Philox block.
MEGATRON_HD uint32_t philox_u32(uint64_t seed, uint64_t offset, uint64_t index) {
  uint64_t block = index >> 2;
  Philox4x32 r = philox4x32_10(uint32_t(block), uint32_t(block >> 32), uint32_t(offset), uint32_t(offset >> 32),
                               uint32_t(seed), uint32_t(seed >> 32));
  return r.v[index & 3u];
}

// A 32-bit word as a uniform in [0, 1) with 24 random bits (exactly representable in fp32).
MEGATRON_HD float philox_word_uniform(uint32_t word) { return float(word >> 8) * (1.0f / 16777216.0f); }

// Uniform in [0, 1): philox_word_uniform of philox_u32. Code that draws runs of consecutive indices may call
// philox4x32_10 once per block of four and convert each word with philox_word_uniform: the same numbers.
MEGATRON_HD float philox_uniform(uint64_t seed, uint64_t offset, uint64_t index) {
  return philox_word_uniform(philox_u32(seed, offset, index));
}

// Standard normal. Element i uses Philox block i/2 (two words for the radius, two for the angle): the
// even element takes the cosine branch, the odd one the sine branch of the same pair.
MEGATRON_HD float philox_normal(uint64_t seed, uint64_t offset, uint64_t index) {
  uint64_t block = index >> 1;
  Philox4x32 r = philox4x32_10(uint32_t(block), uint32_t(block >> 32), uint32_t(offset), uint32_t(offset >> 32),
                               uint32_t(seed), uint32_t(seed >> 32));
  // 53-bit uniforms from two words each; u1 in (0, 1] so log(u1) is finite.
  double u1 = (double((uint64_t(r.v[0]) << 21) ^ r.v[1]) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = double((uint64_t(r.v[2]) << 21) ^ r.v[3]) * (1.0 / 9007199254740992.0);
  u1 = u1 > 1.0 ? 1.0 : u1;
  double radius = sqrt(-2.0 * log(u1));
  double angle = 6.283185307179586 * u2;
  return float((index & 1u) ? radius * sin(angle) : radius * cos(angle));
}

}  // namespace megatron
