// .npy files as GPTDataset's and BlendedDataset's caches hold them: what numpy writes reads back, and every
// malformed file is refused naming the path, the byte offset and what was expected -- never an exception of
// another type, a read past the header or an allocation of what the header claims.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/data/npy_file.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;

void write_all(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

// A version 1.0 file with `header` (padded to 64 bytes as numpy pads) and `data`.
std::string npy(const std::string& header, const std::string& data) {
  std::string h = header;
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  out += char(h.size() & 0xff);
  out += char(h.size() >> 8);
  return out + h + data;
}

TEST(NpyFile, ReadsWhatItWritesInAnyKeyOrder) {
  const fs::path dir = testing::make_temp_dir("npy");
  const std::vector<int32_t> values = {1, -2, 3, 4, 5, 6};
  const int64_t shape[] = {3, 2};
  save_npy(dir / "a.npy", std::span<const int32_t>(values), shape);
  const NpyArray a = load_npy(dir / "a.npy");
  EXPECT_EQ(a.descr, "<i4");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a.to_int64(dir / "a.npy"), (std::vector<int64_t>{1, -2, 3, 4, 5, 6}));
  write_all(dir / "b.npy", npy("{'shape': (2,), \"fortran_order\": False, 'descr': '<u2', }", std::string("\1\0\2\0", 4)));
  EXPECT_EQ(load_npy(dir / "b.npy").to_int64(dir / "b.npy"), (std::vector<int64_t>{1, 2}));
  write_all(dir / "c.npy", npy("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 5), }", ""));
  EXPECT_EQ(load_npy(dir / "c.npy").bytes.size(), 0u);
}

TEST(NpyFile, MalformedFilesNameThePathTheOffsetAndTheConstraint) {
  const fs::path dir = testing::make_temp_dir("npy_bad");
  const fs::path p = dir / "x.npy";
  const std::string ok_header = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }";
  const std::string eight(16, '\1');
  const auto expect = [&](const std::string& bytes, std::vector<std::string> parts) {
    write_all(p, bytes);
    parts.push_back(p.string());
    testing::expect_error([&] { load_npy(p); }, parts);
  };
  expect("PK\3\4zip", {"not a .npy file (expected the magic \\x93NUMPY at byte 0, found \"PK\\x03\\x04zi\")"});
  std::string v9 = npy(ok_header, eight);
  v9[6] = 9;
  expect(v9, {"unsupported .npy version 9 at byte 6"});
  std::string long_header = npy(ok_header, eight);
  long_header[8] = '\xff';
  long_header[9] = '\xff';
  expect(long_header, {"the header length at byte 8 says 65535 bytes but", "truncated or corrupt"});
  expect(npy("{'descr': '<i8', 'fortran_order': True, 'shape': (2,), }", eight), {"fortran_order False"});
  expect(npy("{'descr': '>i8', 'fortran_order': False, 'shape': (2,), }", eight), {"unsupported .npy dtype \">i8\""});
  expect(npy("{'descr': 'abc', 'fortran_order': False, 'shape': (2,), }", eight), {"unsupported .npy dtype \"abc\""});
  expect(npy("{'descr': '<i8', 'shape': (2,), }", eight), {"expected the keys 'descr', 'fortran_order' and 'shape'"});
  expect(npy("{'descr': '<i8', 'descr': '<i4', 'fortran_order': False, 'shape': (2,)}", eight),
         {"malformed .npy header at byte", "one each of the keys"});
  expect(npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2, -1), }", eight),
         {"malformed .npy header at byte 64: expected a non-negative integer dimension, found \"-1), }"});
  expect(npy("{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387904, 8), }", eight),
         {"shape (4611686018427387904, 8) overflows"});
  expect(npy(ok_header, eight.substr(0, 15)), {"should be (2,) x 8 bytes but the file holds 15 (truncated)"});
  expect(npy(ok_header, eight + "x"), {"should be (2,) x 8 bytes but the file holds 17"});
  expect(npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), } trailing", eight),
         {"expected nothing after the dictionary but spaces"});
  write_all(p, npy(ok_header, eight));
  NpyArray floats = load_npy(p);
  floats.descr = "<f8";
  testing::expect_error([&] { floats.to_int64(p); }, {"expected an integer array, found dtype '<f8'"});
}

}  // namespace
}  // namespace megatron::data
