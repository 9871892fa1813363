// Philox4x32-10 against the Random123 known-answer vectors, and the properties the RNG contract promises.
#include <gtest/gtest.h>

#include <cmath>

#include "megatron/core/philox.h"

namespace megatron {
namespace {

TEST(Philox, KnownAnswerVectors) {
  Philox4x32 zero = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(zero.v[0], 0x6627e8d5u);
  EXPECT_EQ(zero.v[1], 0xe169c58du);
  EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.v[3], 0x9b00dbd8u);
  Philox4x32 ones = philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[1], 0x41c83b0eu);
  EXPECT_EQ(ones.v[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);
  Philox4x32 pi = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

TEST(Philox, ValuesDependOnlyOnSeedOffsetIndex) {
  // Drawing a shard [k, n) gives the same values as drawing the whole tensor and slicing.
  for (uint64_t i = 1000; i < 1100; ++i) {
    EXPECT_EQ(philox_u32(42, 7, i), philox_u32(42, 7, i));
    EXPECT_NE(philox_u32(42, 7, i), philox_u32(43, 7, i));
    EXPECT_NE(philox_u32(42, 7, i), philox_u32(42, 8, i));
  }
}

TEST(Philox, UniformMomentsAndRange) {
  const int n = 1 << 18;
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; ++i) {
    float u = philox_uniform(1234, 0, uint64_t(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    sum2 += double(u) * u;
  }
  double mean = sum / n, var = sum2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 4.0 * std::sqrt(1.0 / 12 / n));
  EXPECT_NEAR(var, 1.0 / 12, 2e-3);
}

TEST(Philox, NormalMoments) {
  const int n = 1 << 18;
  double sum = 0, sum2 = 0, sum4 = 0;
  for (int i = 0; i < n; ++i) {
    double z = philox_normal(99, 3, uint64_t(i));
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 4.0 / std::sqrt(double(n)));
  EXPECT_NEAR(sum2 / n, 1.0, 0.02);
  EXPECT_NEAR(sum4 / n, 3.0, 0.1);  // kurtosis of a Gaussian
}

}  // namespace
}  // namespace megatron
