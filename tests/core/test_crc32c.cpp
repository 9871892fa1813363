// CRC-32C (core/crc32c.h): the standard check values and incremental updates.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/crc32c.h"

namespace megatron {
namespace {

TEST(Crc32c, KnownValuesAndIncrementalUpdates) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // RFC 3720 (iSCSI) test vector: 32 bytes of zeros.
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 31 + 7);
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t cut : {size_t(0), size_t(1), size_t(7), size_t(500), size_t(999)})
    EXPECT_EQ(crc32c_update(crc32c(data.data(), cut), data.data() + cut, data.size() - cut), whole);
  data[500] ^= 1;
  EXPECT_NE(crc32c(data.data(), data.size()), whole);
}

}  // namespace
}  // namespace megatron
