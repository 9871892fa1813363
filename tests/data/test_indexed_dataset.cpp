// Megatron's .bin/.idx format: our writer's bytes equal those of an independent numpy writer built here
// from the format description; our reader reads numpy-written files (several sequences per document, a
// trailing sequence-modes array); every malformed input is an error naming the path; an interrupted writer
// leaves no .idx. Needs python3 with numpy (a missing one fails the tests).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/core/error.h"
#include "megatron/data/indexed_dataset.h"

namespace fs = std::filesystem;
using namespace megatron::data;

namespace {

using ::megatron::testing::make_temp_dir;
using ::megatron::testing::run_python;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// An independent writer of the format (megatron/core/datasets/indexed_dataset.py), in numpy.
constexpr const char* kNumpyWriter = R"PY(
import struct, sys
import numpy as np
tokens_file, prefix, code = sys.argv[1], sys.argv[2], int(sys.argv[3])
dtypes = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
dtype = dtypes[code]
# one line per sequence: "<doc end flag> tok tok ..."; a flag of 1 ends a document after this sequence
lengths, doc_indices, modes = [], [0], None
with open(prefix + ".bin", "wb") as bin_file:
    for line in open(tokens_file):
        fields = line.split()
        flag, toks = int(fields[0]), [int(t) for t in fields[1:]]
        bin_file.write(np.array(toks, dtype=dtype).tobytes(order="C"))
        lengths.append(len(toks))
        if flag:
            doc_indices.append(len(lengths))
if len(sys.argv) > 4:
    modes = np.arange(len(lengths), dtype=np.int8) % 3
itemsize = np.dtype(dtype).itemsize
pointers, ptr = [], 0
for n in lengths:
    pointers.append(ptr)
    ptr += n * itemsize
with open(prefix + ".idx", "wb") as idx:
    idx.write(b"MMIDIDX\x00\x00")
    idx.write(struct.pack("<Q", 1))
    idx.write(struct.pack("<B", code))
    idx.write(struct.pack("<Q", len(lengths)))
    idx.write(struct.pack("<Q", len(doc_indices)))
    idx.write(np.array(lengths, dtype=np.int32).tobytes(order="C"))
    idx.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
    idx.write(np.array(doc_indices, dtype=np.int64).tobytes(order="C"))
    if modes is not None:
        idx.write(modes.tobytes(order="C"))
)PY";

struct Sequence {
  std::vector<int64_t> tokens;
  bool ends_document = true;
};

std::vector<Sequence> random_sequences(uint64_t seed, int count, int64_t max_token, bool multi_sequence_docs) {
  std::mt19937_64 rng(seed);
  std::vector<Sequence> out(static_cast<size_t>(count));
  for (auto& s : out) {
    const int length = static_cast<int>(rng() % 40);  // includes empty sequences
    for (int i = 0; i < length; ++i) s.tokens.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(max_token)));
    s.ends_document = !multi_sequence_docs || rng() % 3 == 0;
  }
  out.back().ends_document = true;
  return out;
}

void write_tokens_file(const fs::path& path, const std::vector<Sequence>& sequences) {
  std::ofstream out(path);
  for (const auto& s : sequences) {
    out << (s.ends_document ? 1 : 0);
    for (int64_t t : s.tokens) out << ' ' << t;
    out << '\n';
  }
}

void write_with_ours(const std::string& prefix, TokenDType dtype, const std::vector<Sequence>& sequences) {
  IndexedDatasetWriter writer(prefix, dtype);
  for (const auto& s : sequences) {
    writer.add_sequence(std::span<const int64_t>(s.tokens));
    if (s.ends_document) writer.end_document();
  }
  writer.finalize();
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const megatron::Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(IndexedDataset, WriterBytesEqualNumpyWriter) {
  const fs::path dir = make_temp_dir("bytes");
  struct Case { TokenDType dtype; int64_t max_token; bool multi; };
  for (Case c : {Case{TokenDType::U16, 65535, false}, Case{TokenDType::I32, 2000000000, false},
                 Case{TokenDType::U8, 255, true}, Case{TokenDType::I64, int64_t{1} << 40, true},
                 Case{TokenDType::I16, 30000, false}}) {
    const auto sequences = random_sequences(static_cast<uint64_t>(c.dtype), 57, c.max_token, c.multi);
    const std::string ours = (dir / "ours").string(), theirs = (dir / "theirs").string();
    write_with_ours(ours, c.dtype, sequences);
    write_tokens_file(dir / "tokens.txt", sequences);
    run_python(dir, kNumpyWriter, (dir / "tokens.txt").string() + " " + theirs + " " + std::to_string(int(c.dtype)));
    EXPECT_EQ(read_file(ours + ".bin"), read_file(theirs + ".bin")) << token_dtype_name(c.dtype);
    EXPECT_EQ(read_file(ours + ".idx"), read_file(theirs + ".idx")) << token_dtype_name(c.dtype);
  }
  fs::remove_all(dir);
}

TEST(IndexedDataset, ReaderReadsNumpyWrittenFiles) {
  const fs::path dir = make_temp_dir("reader");
  for (bool with_modes : {false, true}) {
    const auto sequences = random_sequences(7, 80, 50000, true);
    write_tokens_file(dir / "tokens.txt", sequences);
    const std::string prefix = (dir / "np").string();
    run_python(dir, kNumpyWriter, (dir / "tokens.txt").string() + " " + prefix + " 8" + (with_modes ? " modes" : ""));
    IndexedDatasetReader reader(prefix);
    EXPECT_EQ(reader.dtype(), TokenDType::U16);
    ASSERT_EQ(reader.num_sequences(), 80);
    std::vector<int64_t> expected_documents = {0};
    for (size_t i = 0; i < sequences.size(); ++i)
      if (sequences[i].ends_document) expected_documents.push_back(static_cast<int64_t>(i) + 1);
    EXPECT_EQ(std::vector<int64_t>(reader.document_indices().begin(), reader.document_indices().end()),
              expected_documents);
    EXPECT_EQ(reader.num_documents(), static_cast<int64_t>(expected_documents.size()) - 1);
    for (int64_t s = 0; s < reader.num_sequences(); ++s) {
      const auto& tokens = sequences[static_cast<size_t>(s)].tokens;
      EXPECT_EQ(reader.sequence_lengths()[static_cast<size_t>(s)], static_cast<int32_t>(tokens.size()));
      EXPECT_EQ(reader.get(s), tokens);
      if (tokens.size() >= 5) {
        EXPECT_EQ(reader.get(s, 2, 3), std::vector<int64_t>(tokens.begin() + 2, tokens.begin() + 5));
        std::vector<int32_t> narrow(3);
        reader.read_tokens(s, 1, std::span<int32_t>(narrow));
        EXPECT_EQ(narrow, std::vector<int32_t>(tokens.begin() + 1, tokens.begin() + 4));
        EXPECT_EQ(reader.get_bytes(s, 1, 2).size(), 4u);
      }
    }
    const std::string error = error_of([&] { reader.get(0, 0, 1000); });
    EXPECT_NE(error.find("out of range"), std::string::npos) << error;
  }
  fs::remove_all(dir);
}

TEST(IndexedDataset, BadInputsNameThePath) {
  const fs::path dir = make_temp_dir("bad");
  const std::string prefix = (dir / "x_text_document").string();
  const auto sequences = random_sequences(3, 10, 1000, false);
  auto fresh = [&] { write_with_ours(prefix, TokenDType::U16, sequences); };
  fresh();
  const std::string good_idx = read_file(prefix + ".idx");
  const std::string good_bin = read_file(prefix + ".bin");
  ASSERT_NO_THROW(IndexedDatasetReader{prefix});

  auto expect_error = [&](const std::string& idx, const std::string& bin, const std::string& what,
                          const std::string& path_suffix) {
    write_file(prefix + ".idx", idx);
    write_file(prefix + ".bin", bin);
    const std::string error = error_of([&] { IndexedDatasetReader reader(prefix); });
    EXPECT_NE(error.find(prefix + path_suffix), std::string::npos) << what << ": " << error;
    EXPECT_NE(error.find(what), std::string::npos) << what << ": " << error;
  };
  std::string bad = good_idx;
  bad[0] = 'X';
  expect_error(bad, good_bin, "bad magic", ".idx");
  // Garbage in place of the magic (an escape sequence, NUL, bytes >= 0x80) is shown escaped: the message
  // never writes raw control bytes to the terminal.
  bad = good_idx;
  bad.replace(0, 9, std::string("\x1b[2J\0\xff\x01GZ", 9));
  expect_error(bad, good_bin, R"(bad magic at byte 0: expected "MMIDIDX\x00\x00")", ".idx");
  expect_error(bad, good_bin, R"(found "\x1b[2J\x00\xff\x01GZ")", ".idx");
  {
    const std::string garbage = error_of([&] { IndexedDatasetReader reader(prefix); });
    EXPECT_EQ(std::count_if(garbage.begin(), garbage.end(), [](char c) { return c >= 0 && c < 0x20 && c != '\n'; }), 0)
        << garbage;
  }
  bad = good_idx;
  bad[9] = 2;
  expect_error(bad, good_bin, "unsupported version: expected 1, found 2", ".idx");
  bad = good_idx;
  bad[17] = 9;
  expect_error(bad, good_bin, "bad dtype code", ".idx");
  expect_error(good_idx.substr(0, good_idx.size() - 5), good_bin, "truncated: expected", ".idx");
  expect_error(good_idx.substr(0, 20), good_bin, "truncated: expected at least 34 bytes", ".idx");
  expect_error(good_idx, good_bin.substr(0, good_bin.size() - 2), "shorter than the index says", ".bin");
  // Swap two pointers: non-monotone.
  bad = good_idx;
  const size_t pointers_at = 34 + 10 * 4;
  std::string p4 = bad.substr(pointers_at + 4 * 8, 8), p5 = bad.substr(pointers_at + 5 * 8, 8);
  bad.replace(pointers_at + 4 * 8, 8, p5);
  bad.replace(pointers_at + 5 * 8, 8, p4);
  if (p4 != p5) expect_error(bad, good_bin, "non-monotone sequence pointers", ".idx");
  // A pointer off by 2 bytes: inconsistent with the lengths.
  bad = good_idx;
  int64_t p;
  std::memcpy(&p, bad.data() + pointers_at + 9 * 8, 8);
  p += 2;
  bad.replace(pointers_at + 9 * 8, 8, std::string(reinterpret_cast<const char*>(&p), 8));
  expect_error(bad, good_bin, "inconsistent with the lengths", ".idx");
  // Last document index != N.
  bad = good_idx;
  int64_t last = 9;
  bad.replace(bad.size() - 8, 8, std::string(reinterpret_cast<const char*>(&last), 8));
  expect_error(bad, good_bin, "last document index", ".idx");
  // Missing files.
  fs::remove(prefix + ".idx");
  const std::string missing = error_of([&] { IndexedDatasetReader reader(prefix); });
  EXPECT_NE(missing.find(prefix + ".idx: cannot open"), std::string::npos) << missing;
  fs::remove_all(dir);
}

TEST(IndexedDataset, AnInterruptedWriterLeavesThePreviousDatasetIntact) {
  const fs::path dir = make_temp_dir("interrupted");
  const std::string prefix = (dir / "p").string();
  const auto previous = random_sequences(1, 5, 100, false);
  write_with_ours(prefix, TokenDType::U16, previous);
  const std::string idx_before = read_file(prefix + ".idx"), bin_before = read_file(prefix + ".bin");
  {
    IndexedDatasetWriter writer(prefix, TokenDType::U16);
    const std::vector<int32_t> doc = {1, 2, 3};
    writer.add_document(doc);
    EXPECT_TRUE(fs::exists(prefix + ".bin.tmp"));
    // destroyed without commit(): an interrupted run (a full disk, a bad line under --strict)
  }
  EXPECT_EQ(read_file(prefix + ".idx"), idx_before);
  EXPECT_EQ(read_file(prefix + ".bin"), bin_before);
  EXPECT_FALSE(fs::exists(prefix + ".idx.tmp"));
  EXPECT_FALSE(fs::exists(prefix + ".bin.tmp"));
  EXPECT_EQ(IndexedDatasetReader(prefix).num_sequences(), int64_t(previous.size()));
  {
    // Prepared but not committed: the same.
    IndexedDatasetWriter writer(prefix, TokenDType::U16);
    writer.add_document(std::vector<int32_t>{7});
    writer.prepare();
    EXPECT_TRUE(fs::exists(prefix + ".idx.tmp"));
    EXPECT_EQ(read_file(prefix + ".idx"), idx_before);
  }
  EXPECT_EQ(read_file(prefix + ".idx"), idx_before);
  EXPECT_FALSE(fs::exists(prefix + ".idx.tmp"));
  // A committed writer replaces the dataset.
  {
    IndexedDatasetWriter writer(prefix, TokenDType::U16);
    writer.add_document(std::vector<int32_t>{7});
    writer.finalize();
  }
  EXPECT_EQ(IndexedDatasetReader(prefix).get(0), std::vector<int64_t>{7});
  EXPECT_FALSE(fs::exists(prefix + ".bin.tmp"));
  fs::remove_all(dir);
}

TEST(IndexedDataset, TokenOutOfDtypeRangeIsAnError) {
  const fs::path dir = make_temp_dir("range");
  IndexedDatasetWriter writer((dir / "p").string(), TokenDType::U16);
  const std::vector<int64_t> doc = {1, 70000};
  const std::string error = error_of([&] { writer.add_document(doc); });
  EXPECT_NE(error.find("token 70000 at position 1"), std::string::npos) << error;
  EXPECT_NE(error.find("uint16"), std::string::npos) << error;
  fs::remove_all(dir);
}

TEST(IndexedDataset, MergeConcatenatesInOrder) {
  const fs::path dir = make_temp_dir("merge");
  const auto a = random_sequences(11, 13, 60000, true), b = random_sequences(12, 9, 60000, false);
  write_with_ours((dir / "a").string(), TokenDType::U16, a);
  write_with_ours((dir / "b").string(), TokenDType::U16, b);
  merge_indexed_datasets({(dir / "a").string(), (dir / "b").string()}, (dir / "ab").string());
  auto all = a;
  all.insert(all.end(), b.begin(), b.end());
  write_with_ours((dir / "direct").string(), TokenDType::U16, all);
  EXPECT_EQ(read_file(dir / "ab.bin"), read_file(dir / "direct.bin"));
  EXPECT_EQ(read_file(dir / "ab.idx"), read_file(dir / "direct.idx"));
  write_with_ours((dir / "c").string(), TokenDType::I32, b);
  const std::string error = error_of([&] {
    merge_indexed_datasets({(dir / "a").string(), (dir / "c").string()}, (dir / "ac").string());
  });
  EXPECT_NE(error.find("dtype int32 differs"), std::string::npos) << error;
  fs::remove_all(dir);
}

TEST(IndexedDataset, DtypeRule) {
  EXPECT_EQ(token_dtype_for_vocab_size(50257), TokenDType::U16);
  EXPECT_EQ(token_dtype_for_vocab_size(65499), TokenDType::U16);
  EXPECT_EQ(token_dtype_for_vocab_size(65500), TokenDType::I32);
  EXPECT_EQ(token_dtype_for_vocab_size(128256), TokenDType::I32);
}
