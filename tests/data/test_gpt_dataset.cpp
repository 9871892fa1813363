// GPTDataset sample order against references written here in plain Python + numpy (not our code):
// numpy RandomState shuffles and bounded draws, document/sample/shuffle indices and the tokens of samples
// for several (seed, seq_len, num_samples, split) including a separate final epoch, the cache files
// (names, description text, .npy dtypes), blending indices, the mock dataset's lengths, and the error for
// a split that gets no documents. Needs python3 with numpy (a missing one fails the tests).
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/core/error.h"
#include "megatron/data/blended_dataset.h"
#include "megatron/data/dataset_split.h"
#include "megatron/data/gpt_dataset.h"
#include "megatron/data/indexed_dataset.h"
#include "megatron/data/md5.h"
#include "megatron/data/mock_gpt_dataset.h"
#include "megatron/data/npy_file.h"
#include "megatron/data/numpy_random.h"
#include "megatron/data/python_json.h"

namespace fs = std::filesystem;
using namespace megatron::data;

namespace {

using ::megatron::testing::make_temp_dir;
using ::megatron::testing::run_python;

std::vector<int64_t> load_ints(const fs::path& path) { return load_npy(path).to_int64(path); }

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const megatron::Error& e) {
    return e.what();
  }
  return "<no error>";
}

// A corpus with lengths 0..max_length (some empty documents), tokens i*7 + position.
std::string write_corpus(const fs::path& dir, int documents, int max_length, uint64_t seed) {
  const std::string prefix = (dir / "corpus_text_document").string();
  IndexedDatasetWriter writer(prefix, TokenDType::U16);
  std::mt19937_64 rng(seed);
  for (int d = 0; d < documents; ++d) {
    std::vector<int32_t> tokens(static_cast<size_t>(rng() % static_cast<uint64_t>(max_length + 1)));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((d * 7 + i) % 60000);
    writer.add_document(tokens);
  }
  writer.finalize();
  return prefix;
}

}  // namespace

// ------------------------------------------------------------------------------------- numpy RandomState

TEST(NumpyRandomState, ShuffleAndDrawsEqualNumpy) {
  const fs::path dir = make_temp_dir("random");
  run_python(dir, R"PY(
import sys, os
import numpy as np
out = sys.argv[1]
for seed in (0, 1, 1234, 4294967295):
    for size in (1, 2, 10, 1000, 70001):
        a = np.arange(size, dtype=np.int64)
        np.random.RandomState(seed).shuffle(a)
        np.save(os.path.join(out, f"shuffle_{seed}_{size}.npy"), a)
# two shuffles in a row share one state, as Megatron's document and shuffle indices do
rs = np.random.RandomState(7)
a = np.arange(500, dtype=np.int32); rs.shuffle(a)
b = np.arange(300, dtype=np.uint32); rs.shuffle(b)
np.save(os.path.join(out, "chain.npy"), np.concatenate([a.astype(np.int64), b.astype(np.int64)]))
# bounds above 2^32 use 64-bit draws (legacy randint takes the same masked-rejection path)
np.save(os.path.join(out, "big.npy"), np.random.RandomState(99).randint(0, 6000000000 + 1, size=50, dtype=np.int64))
np.save(os.path.join(out, "perm.npy"), np.random.RandomState(5).permutation(1000))
np.save(os.path.join(out, "raw.npy"), np.random.RandomState(42).randint(0, 2**32, size=1000, dtype=np.uint64))
)PY", dir.string());
  for (uint64_t seed : {0ULL, 1ULL, 1234ULL, 4294967295ULL})
    for (int64_t size : {1, 2, 10, 1000, 70001}) {
      std::vector<int64_t> values(static_cast<size_t>(size));
      for (int64_t i = 0; i < size; ++i) values[static_cast<size_t>(i)] = i;
      NumpyRandomState(seed).shuffle(std::span<int64_t>(values));
      EXPECT_EQ(values, load_ints(dir / ("shuffle_" + std::to_string(seed) + "_" + std::to_string(size) + ".npy")))
          << "seed " << seed << " size " << size;
    }
  NumpyRandomState chain(7);
  std::vector<int32_t> a(500);
  std::vector<uint32_t> b(300);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint32_t>(i);
  chain.shuffle(std::span<int32_t>(a));
  chain.shuffle(std::span<uint32_t>(b));
  std::vector<int64_t> chained(a.begin(), a.end());
  chained.insert(chained.end(), b.begin(), b.end());
  EXPECT_EQ(chained, load_ints(dir / "chain.npy"));
  NumpyRandomState big(99);
  std::vector<int64_t> draws;
  for (int i = 0; i < 50; ++i) draws.push_back(static_cast<int64_t>(big.random_interval(6000000000ULL)));
  EXPECT_EQ(draws, load_ints(dir / "big.npy"));
  EXPECT_EQ(NumpyRandomState(5).permutation(1000), load_ints(dir / "perm.npy"));
  NumpyRandomState raw(42);
  std::vector<int64_t> words;
  for (int i = 0; i < 1000; ++i) words.push_back(raw.next_uint32());
  EXPECT_EQ(words, load_ints(dir / "raw.npy"));
  fs::remove_all(dir);
}

// ------------------------------------------------------------------------------------- GPT indices

namespace {

// The reference: Megatron's algorithm restated in plain Python + numpy; reads the .idx itself, compares
// with our cache files and our sample tokens, and exits non-zero on any difference.
constexpr const char* kGptReference = R"PY(
import sys, os, re, json, hashlib, collections
import numpy as np
prefix, cache, seed, seq_len, num_samples, split_str, split_name, samples_file = sys.argv[1:9]
seed, seq_len = int(seed), int(seq_len)
num_samples = None if num_samples == "none" else int(num_samples)
raw = open(prefix + ".idx", "rb").read()
n = int.from_bytes(raw[18:26], "little")
lengths = np.frombuffer(raw, dtype=np.int32, count=n, offset=34)
pointers = np.frombuffer(raw, dtype=np.int64, count=n, offset=34 + 4 * n)
tokens_bin = np.fromfile(prefix + ".bin", dtype=np.uint16)

w = [float(x) for x in re.findall(r"[.0-9]+", split_str)]
w = w + [0.0] * (3 - len(w))
w = (np.array(w, dtype=np.float64) / np.sum(np.array(w, dtype=np.float64))).tolist()
expansion = [0]
for x in w:
    expansion.append(expansion[-1] + x)
matrix = [(expansion[i], expansion[i + 1]) if expansion[i + 1] > expansion[i] else None for i in range(3)]
which = ["train", "valid", "test"].index(split_name)
beg = int(round(matrix[which][0] * float(n)))
end = int(round(matrix[which][1] * float(n)))
docs = np.arange(beg, end, dtype=np.int32)

tokens_per_epoch = int(np.sum(lengths[docs]))
epochs, total = 1, tokens_per_epoch
if num_samples is not None:
    while total < num_samples * seq_len + 1:
        epochs += 1
        total += tokens_per_epoch
separate = False
if epochs > 1:
    sans = ((epochs - 1) * tokens_per_epoch - 1) // seq_len
    per_epoch = (tokens_per_epoch - 1) // seq_len
    separate = (num_samples - sans) < int(0.80 * per_epoch)
rs = np.random.RandomState(seed)
def tiled(e):
    d = np.array(list(docs) * e, dtype=np.int32)
    rs.shuffle(d)
    return d
doc_index = np.concatenate([tiled(epochs - 1), tiled(1)]) if separate else tiled(epochs)

count = (epochs * tokens_per_epoch - 1) // seq_len
rows, d, off = [(0, 0)], 0, 0
for s in range(count):
    need = seq_len + 1
    while need != 0:
        avail = int(lengths[doc_index[d]]) - off
        if avail >= need:
            off += need - 1
            need = 0
        else:
            need -= avail
            d += 1
            off = 0
    rows.append((d, off))
sample_index = np.array(rows, dtype=np.int32)

first = ((epochs - 1) * tokens_per_epoch - 1) // seq_len if separate else count
shuffle_index = np.arange(count, dtype=np.uint32)
rs.shuffle(shuffle_index[:first])
rs.shuffle(shuffle_index[first:])

desc = collections.OrderedDict()
desc["class"] = "GPTDataset"
desc["dataset_path"] = prefix
desc["num_samples"] = num_samples
desc["index_split"] = split_name
desc["random_seed"] = seed
desc["sequence_length"] = seq_len
desc["split"] = split_str
desc["split_matrix"] = matrix
desc["tokenizer"] = collections.OrderedDict([("class", "NullTokenizer"), ("vocab_size", 60001), ("paths", ["a", "\u00e9"])])
text = json.dumps(desc, indent=4)
md5 = hashlib.md5(text.encode("utf-8")).hexdigest()
base = os.path.join(cache, f"{md5}-GPTDataset-{split_name}-")
fail = []
if open(base + "description.txt").read() != text:
    fail.append("description")
for name, ref in (("document_index", doc_index), ("sample_index", sample_index), ("shuffle_index", shuffle_index)):
    got = np.load(base + name + ".npy")
    if got.dtype != ref.dtype or got.shape != ref.shape or not np.array_equal(got, ref):
        fail.append(f"{name}: got {got.dtype} {got.shape}, expected {ref.dtype} {ref.shape}")
    with open(base + name + ".npy", "rb") as f, open(base + name + ".ref.npy", "wb") as g:
        np.save(g, ref)
    if open(base + name + ".npy", "rb").read() != open(base + name + ".ref.npy", "rb").read():
        fail.append(f"{name}: .npy bytes differ from numpy.save")
ours = np.load(samples_file)
for i in range(ours.shape[0]):
    j = shuffle_index[i]
    (d0, o0), (d1, o1) = sample_index[j], sample_index[j + 1]
    parts = []
    for k in range(d0, d1 + 1):
        s = doc_index[k]
        a = o0 if k == d0 else 0
        b = o1 + 1 if k == d1 else lengths[s]
        start = pointers[s] // 2
        parts.append(tokens_bin[start + a: start + b])
    ref = np.concatenate(parts).astype(np.int64)
    if not np.array_equal(ref, ours[i]):
        fail.append(f"sample {i}")
        break
print("reference:", split_name, "epochs", epochs, "separate", separate, "samples", count)
if fail:
    print("MISMATCH:", fail)
    sys.exit(1)
)PY";

struct GptCase {
  uint64_t seed;
  int64_t seq_len;
  std::optional<int64_t> num_samples;
  std::string split;
  Split which;
  bool expect_separate_final_epoch;
};

}  // namespace

TEST(GptIndices, EqualPythonReference) {
  const fs::path dir = make_temp_dir("indices");
  const std::string prefix = write_corpus(dir, 300, 60, 3);
  IndexedDatasetReader reader(prefix);
  const int64_t tokens = count_tokens(reader.sequence_lengths(), {0, reader.num_sequences()});
  const int64_t per_epoch_16 = (tokens - 1) / 16;
  const std::vector<GptCase> cases = {
      {1234, 16, 200, "969,30,1", Split::train, false},
      {1234, 16, 2 * per_epoch_16 + 40, "100,0,0", Split::train, true},   // 3 epochs, small last one: separate
      {77, 16, 2 * per_epoch_16 + per_epoch_16 * 9 / 10, "1", Split::train, false},  // 3 epochs, last >= 80%
      {5, 100, 500, "80,15,5", Split::valid, true},                       // 35 epochs of a small split
      {9, 7, std::nullopt, "80,15,5", Split::test, false},                // one epoch
      {4242, 33, 90, "0.7, 0.2, 0.1", Split::valid, true},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const GptCase& gc = cases[c];
    GPTDatasetConfig config;
    config.random_seed = gc.seed;
    config.sequence_length = gc.seq_len;
    config.split = gc.split;
    config.path_to_cache = (dir / ("cache" + std::to_string(c))).string();
    config.tokenizer = PyJson::Object{{"class", "NullTokenizer"}, {"vocab_size", 60001}, {"paths", PyJson::Array{"a", "\xc3\xa9"}}};
    auto bookends = split_bookends(gc.split);
    const SequenceRange range = split_range(*bookends[static_cast<int>(gc.which)], reader.num_sequences());
    GPTDataset dataset(reader, prefix, range, gc.num_samples, gc.which, config);
    EXPECT_TRUE(dataset.built_anew_on_cache_miss());
    if (gc.num_samples) {
      EXPECT_GE(dataset.size(), *gc.num_samples);
    }
    EXPECT_EQ(dataset.indices().separate_final_epoch, gc.expect_separate_final_epoch) << "case " << c;
    const int64_t shown = std::min<int64_t>(dataset.size(), 64);
    std::vector<int64_t> samples;
    for (int64_t i = 0; i < shown; ++i) {
      auto s = dataset.sample(i);
      samples.insert(samples.end(), s.begin(), s.end());
    }
    const int64_t shape[] = {shown, dataset.sample_tokens()};
    save_npy(dir / "samples.npy", std::span<const int64_t>(samples), shape);
    run_python(dir, kGptReference,
               prefix + " " + *config.path_to_cache + " " + std::to_string(gc.seed) + " " + std::to_string(gc.seq_len) +
                   " " + (gc.num_samples ? std::to_string(*gc.num_samples) : "none") + " '" + gc.split + "' " +
                   split_name(gc.which) + " " + (dir / "samples.npy").string());
    // A second construction finds the cache and gives the same indices.
    GPTDataset again(reader, prefix, range, gc.num_samples, gc.which, config);
    EXPECT_FALSE(again.built_anew_on_cache_miss());
    EXPECT_EQ(again.indices().shuffle_index, dataset.indices().shuffle_index);
    EXPECT_EQ(again.indices().sample_index, dataset.indices().sample_index);
    EXPECT_EQ(again.indices().document_index, dataset.indices().document_index);
  }
  fs::remove_all(dir);
}

// The checks a cache must pass accept every index the builder makes (else a valid cache would be refused).
TEST(GptIndices, BuiltIndicesPassTheCacheChecks) {
  std::mt19937_64 rng(17);
  for (int c = 0; c < 60; ++c) {
    std::vector<int32_t> lengths(size_t(1 + rng() % 40));
    for (int32_t& l : lengths) l = int32_t(rng() % 30);  // empty sequences included
    lengths[0] = 5;
    GptIndexRequest r;
    r.sequence_lengths = lengths;
    r.sequences = {int64_t(rng() % 2), int64_t(lengths.size())};
    r.sequence_length = int64_t(1 + rng() % 12);
    r.random_seed = rng();
    r.add_extra_token_to_sequence = rng() % 4 != 0;
    r.drop_last_partial_sequence = rng() % 3 != 0;
    if (rng() % 3 != 0) r.num_samples = int64_t(rng() % 200);
    const std::string what = "case " + std::to_string(c);
    GptIndices x;
    try {
      x = build_gpt_indices(r, what);
    } catch (const megatron::Error&) {
      continue;  // a split without tokens
    }
    EXPECT_NO_THROW(check_gpt_indices(x, r, what)) << what << ": " << error_of([&] { check_gpt_indices(x, r, what); });
  }
}

TEST(GptIndices, ACorruptCacheIsRefusedNamingTheArrayAndTheEntry) {
  const std::vector<int32_t> lengths = {5, 3, 0, 7, 4};
  GptIndexRequest r;
  r.sequence_lengths = lengths;
  r.sequences = {0, 5};
  r.sequence_length = 4;
  r.num_samples = 6;
  const GptIndices good = build_gpt_indices(r, "x");
  ASSERT_NO_THROW(check_gpt_indices(good, r, "x"));
  const auto expect = [&](auto corrupt, const std::vector<std::string>& parts) {
    GptIndices bad = good;
    corrupt(bad);
    std::vector<std::string> all = parts;
    all.push_back("the cache");
    megatron::testing::expect_error([&] { check_gpt_indices(bad, r, "the cache"); }, all);
  };
  expect([](GptIndices& x) { x.document_index[2] = 9; }, {"document_index[2] = 9 is not a sequence of the split [0, 5)"});
  expect([](GptIndices& x) { x.sample_index[0] = 1; }, {"sample_index must start with the row (0, 0)"});
  expect([](GptIndices& x) { x.sample_index[4] = 1000; }, {"sample_index row 2 (1000,", "outside the"});
  expect(
      [](GptIndices& x) {
        // A row past the end of its sequence (one whose next row is in a later document): the sample ending
        // there or the one starting there is refused.
        for (size_t i = 1; i + 1 < x.sample_index.size() / 2; ++i)
          if (x.sample_index[2 * i + 2] > x.sample_index[2 * i]) {
            x.sample_index[2 * i + 1] = 1000;
            return;
          }
      },
      {"sample_index row", "reads tokens [", "of sequence", ", which has "});
  expect([](GptIndices& x) { x.sample_index[2] = int64_t(x.document_index.size()) - 1, x.sample_index[3] = 0; },
         {"sample_index row 2", "goes back from row 1"});
  expect([](GptIndices& x) { x.shuffle_index[1] = x.shuffle_index[0]; }, {"shuffle_index[1] =", "appears twice"});
  expect([](GptIndices& x) { x.shuffle_index[0] = -1; }, {"shuffle_index[0] = -1 is outside [0, "});
  expect([](GptIndices& x) { x.shuffle_index.pop_back(); }, {"the shuffle index has"});
  expect([](GptIndices& x) { x.sample_index.resize(4); x.shuffle_index.resize(1); }, {"fewer than the 6 requested"});
}

TEST(GptIndices, EmptySplitIsAnErrorNamingTheSplit) {
  const fs::path dir = make_temp_dir("empty");
  const std::string prefix = write_corpus(dir, 20, 30, 4);
  IndexedDatasetReader reader(prefix);
  GPTDatasetConfig config;
  config.sequence_length = 8;
  config.split = "969,30,1";
  config.path_to_cache = (dir / "cache").string();
  const std::string error = error_of([&] {
    build_gpt_dataset_splits(reader, prefix, {int64_t{100}, int64_t{10}, int64_t{10}}, config);
  });
  EXPECT_NE(error.find("split 'test'"), std::string::npos) << error;
  EXPECT_NE(error.find("0 sequences"), std::string::npos) << error;
  EXPECT_NE(error.find("[20, 20) of 20"), std::string::npos) << error;
  EXPECT_NE(error.find("10 samples"), std::string::npos) << error;
  fs::remove_all(dir);
}

TEST(DatasetSplit, ReadsMegatronsFormsAndNamesAnItemThatIsNotANumber) {
  EXPECT_EQ(parse_and_normalize_split("969,30,1"), (std::array<double, 3>{0.969, 0.03, 0.001}));
  EXPECT_EQ(parse_and_normalize_split("0.7, 0.2, 0.1"), parse_and_normalize_split("0.7/0.2/0.1"));
  EXPECT_EQ(parse_and_normalize_split(" 1 "), (std::array<double, 3>{1.0, 0.0, 0.0}));
  // Megatron's regex found no numbers in these and trained on weights 0, 0, 0.
  const std::string letters = error_of([] { parse_and_normalize_split("a,b,c"); });
  EXPECT_NE(letters.find("--split \"a,b,c\": item 1 (\"a\") is not a number"), std::string::npos) << letters;
  const std::string exponent = error_of([] { parse_and_normalize_split("98,1e-3,2"); });
  EXPECT_NE(exponent.find("item 2 (\"1e-3\") is not a number"), std::string::npos) << exponent;
  const std::string empty = error_of([] { parse_and_normalize_split("98,,2"); });
  EXPECT_NE(empty.find("item 2 (\"\") is not a number"), std::string::npos) << empty;
  EXPECT_NE(error_of([] { parse_and_normalize_split("1.2.3"); }).find("is not a number"), std::string::npos);
  EXPECT_NE(error_of([] { parse_and_normalize_split("1,2,3,4"); }).find("at most 3 weights"), std::string::npos);
  EXPECT_NE(error_of([] { parse_and_normalize_split("0,0,0"); }).find("must not all be zero"), std::string::npos);
}

TEST(GptIndices, MockDatasetLengthsEqualNumpyDefaultRng) {
  const fs::path dir = make_temp_dir("mock");
  run_python(dir, R"PY(
import sys, os
import numpy as np
rng = np.random.default_rng(seed=0)
np.save(os.path.join(sys.argv[1], "mock.npy"), rng.integers(low=1, high=4096, size=100000, dtype=np.int32))
)PY", dir.string());
  MockGPTLowLevelDataset mock(50256);
  const auto expected = load_ints(dir / "mock.npy");
  ASSERT_EQ(expected.size(), mock.sequence_lengths().size());
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), mock.sequence_lengths().begin()));
  GPTDatasetConfig config;
  config.sequence_length = 64;
  auto splits = build_mock_gpt_datasets(mock, {int64_t{1000}, int64_t{10}, int64_t{10}}, config);
  ASSERT_TRUE(splits[0].has_value());
  EXPECT_GE(splits[0]->size(), 1000);
  auto tokens = splits[0]->sample(0);
  EXPECT_EQ(tokens.size(), 65u);
  fs::remove_all(dir);
}

// ------------------------------------------------------------------------------------- blending

TEST(Blending, IndicesEqualPythonReference) {
  const fs::path dir = make_temp_dir("blend");
  run_python(dir, R"PY(
import sys, os
import numpy as np
out = sys.argv[1]
cases = [([0.7, 0.3], 1000), ([1, 2, 3], 777), ([0.05, 0.5, 0.05, 0.1, 0.1, 0.1, 0.05, 0.03, 0.02], 5000), ([3.0], 10)]
for c, (weights, size) in enumerate(cases):
    w = np.array(weights, dtype=np.float64); w = (w / np.sum(w)).tolist()
    w = np.array(w, dtype=np.float64); w = (w / np.sum(w)).tolist()
    counts = [0] * len(w)
    di = np.zeros(size, dtype=np.int16); dsi = np.zeros(size, dtype=np.int64)
    for i in range(size):
        x = max(float(i), 1.0)
        best, err = 0, w[0] * x - counts[0]
        for d in range(1, len(w)):
            e = w[d] * x - counts[d]
            if e > err:
                best, err = d, e
        di[i] = best; dsi[i] = counts[best]; counts[best] += 1
    np.save(os.path.join(out, f"di{c}.npy"), di)
    np.save(os.path.join(out, f"dsi{c}.npy"), dsi)
    np.save(os.path.join(out, f"w{c}.npy"), np.array(w))
    import math
    np.save(os.path.join(out, f"sizes{c}.npy"), np.array([int(math.ceil(math.ceil(size * x) * (1 + 0.005))) for x in w]))
)PY", dir.string());
  const std::vector<std::pair<std::vector<double>, int64_t>> cases = {
      {{0.7, 0.3}, 1000}, {{1, 2, 3}, 777}, {{0.05, 0.5, 0.05, 0.1, 0.1, 0.1, 0.05, 0.03, 0.02}, 5000}, {{3.0}, 10}};
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto weights = numpy_normalize(numpy_normalize(cases[c].first));
    const NpyArray w = load_npy(dir / ("w" + std::to_string(c) + ".npy"));
    ASSERT_EQ(w.bytes.size(), weights.size() * 8);
    EXPECT_EQ(std::memcmp(w.bytes.data(), weights.data(), w.bytes.size()), 0) << "normalised weights, case " << c;
    const auto indices = build_blending_indices(weights, cases[c].second);
    std::vector<int64_t> ids(indices.dataset_index.begin(), indices.dataset_index.end());
    EXPECT_EQ(ids, load_ints(dir / ("di" + std::to_string(c) + ".npy"))) << "case " << c;
    EXPECT_EQ(indices.dataset_sample_index, load_ints(dir / ("dsi" + std::to_string(c) + ".npy"))) << "case " << c;
    EXPECT_EQ(blend_sizes_per_dataset(weights, cases[c].second, kMidLevelDatasetSurplus),
              load_ints(dir / ("sizes" + std::to_string(c) + ".npy")));
  }
  fs::remove_all(dir);
}

TEST(Blending, BlendedDatasetDrawsFromComponents) {
  const fs::path dir = make_temp_dir("blended");
  const std::string prefix = write_corpus(dir, 200, 50, 8);
  IndexedDatasetReader reader(prefix);
  GPTDatasetConfig config;
  config.sequence_length = 16;
  config.split = "1";
  config.path_to_cache = (dir / "cache").string();
  const std::vector<double> weights = {0.25, 0.75};
  const int64_t size = 100;
  auto sizes = blend_sizes_per_dataset(numpy_normalize(weights), size, kMidLevelDatasetSurplus);
  GPTDatasetConfig other = config;
  other.random_seed = 99;
  GPTDataset a(reader, prefix, {0, 200}, sizes[0], Split::train, config);
  GPTDataset b(reader, prefix, {0, 200}, sizes[1], Split::train, other);
  BlendedDataset blend({&a, &b}, weights, size, (dir / "cache").string());
  for (int64_t i = 0; i < size; ++i) {
    auto [d, s] = blend.locate(i);
    std::vector<int64_t> got(17), expected(17);
    blend.sample(i, got);
    (d == 0 ? a : b).sample(s, expected);
    EXPECT_EQ(got, expected);
  }
  BlendedDataset cached({&a, &b}, weights, size, (dir / "cache").string());
  EXPECT_EQ(cached.indices().dataset_index, blend.indices().dataset_index);
  // Megatron's names: <md5 of the description>-BlendedDataset-<split>-<suffix>, the split in the description
  // between the datasets and the weights.
  for (const char* suffix : {"description.txt", "dataset_index.npy", "dataset_sample_index.npy"})
    EXPECT_TRUE(fs::exists(dir / "cache" / (blend.unique_description_hash() + "-BlendedDataset-train-" + suffix))) << suffix;
  EXPECT_EQ(blend.unique_description_hash(), md5_hex(blend.unique_description()));
  const std::string& text = blend.unique_description();
  const size_t at_datasets = text.find("\n    \"datasets\": ["),
               at_split = text.find("\n    \"split\": \"train\",\n"), at_weights = text.find("\n    \"weights\": [");
  ASSERT_NE(at_split, std::string::npos) << text;
  EXPECT_LT(at_datasets, at_split);
  EXPECT_LT(at_split, at_weights);
  fs::remove_all(dir);
}

// ------------------------------------------------------------------------------------- text helpers

TEST(PythonText, Md5AndFloatReprEqualPython) {
  EXPECT_EQ(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(md5_hex("abc"), "900150983cd24fb0d6963f7d28e17f72");
  const fs::path dir = make_temp_dir("text");
  const std::vector<double> values = {0.969, 0.999, 1.0, 1e-5, 1e-4, 1e16, 1e15, 123456789012345678.0, 0.1 + 0.2,
                                      -2.5, 3.0, 1.0 / 3.0, 5e-324, 1.7976931348623157e308, 0.001};
  std::ofstream(dir / "values.txt") << [&] {
    std::string s;
    for (double v : values) s += python_float_repr(v) + "\n";
    return s;
  }();
  std::string md5s;
  for (int n : {0, 55, 56, 63, 64, 65, 1000}) md5s += md5_hex(std::string(static_cast<size_t>(n), 'q')) + "\n";
  std::ofstream(dir / "md5.txt") << md5s;
  run_python(dir, R"PY(
import sys, os, hashlib
d = sys.argv[1]
values = [0.969, 0.999, 1.0, 1e-5, 1e-4, 1e16, 1e15, 123456789012345678.0, 0.1 + 0.2, -2.5, 3.0, 1.0 / 3.0, 5e-324, 1.7976931348623157e308, 0.001]
got = open(os.path.join(d, "values.txt")).read().split("\n")[:-1]
want = [repr(v) for v in values]
assert got == want, (got, want)
got = open(os.path.join(d, "md5.txt")).read().split("\n")[:-1]
want = [hashlib.md5(b"q" * n).hexdigest() for n in (0, 55, 56, 63, 64, 65, 1000)]
assert got == want, (got, want)
)PY", dir.string());
  fs::remove_all(dir);
}

// ------------------------------------------------------------------------------------- performance

namespace {
class SyntheticLengths final : public TokenSequences {
 public:
  explicit SyntheticLengths(std::vector<int32_t> lengths) : lengths_(std::move(lengths)) {}
  std::span<const int32_t> sequence_lengths() const override { return lengths_; }
  void read_tokens(int64_t, int64_t, std::span<int64_t> dst) const override { std::fill(dst.begin(), dst.end(), 0); }

 private:
  std::vector<int32_t> lengths_;
};
}  // namespace

// 1B tokens (250k documents of about 4000 tokens), seq 4096, all of it requested: index building only.
TEST(GptIndexPerf, DISABLED_OneBillionTokens) {
  std::mt19937 rng(1);
  std::vector<int32_t> lengths(250000);
  for (auto& l : lengths) l = 3000 + static_cast<int32_t>(rng() % 2001);  // mean 4000
  SyntheticLengths source(lengths);
  const int64_t tokens = count_tokens(lengths, {0, 250000});
  GptIndexRequest request;
  request.sequence_lengths = source.sequence_lengths();
  request.sequences = {0, 250000};
  request.sequence_length = 4096;
  request.random_seed = 1234;
  for (int64_t epochs : {1, 3}) {
    request.num_samples = (epochs * tokens - 1) / 4096 - (epochs > 1 ? 1000 : 0);
    const auto start = std::chrono::steady_clock::now();
    GptIndices indices = build_gpt_indices(request, "perf");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("GptIndexPerf: %.3f B tokens x %lld epochs, seq 4096: %lld samples, %zu document-index entries, "
                "indices built in %.3f s\n",
                static_cast<double>(tokens) / 1e9, static_cast<long long>(indices.num_epochs),
                static_cast<long long>(indices.num_samples()), indices.document_index.size(), seconds);
    EXPECT_GE(indices.num_samples(), *request.num_samples);
  }
}
