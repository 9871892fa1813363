// The resharding rule on synthetic layouts: a tensor saved as pieces of one layout (row blocks with
// data-parallel replicas, column blocks, flat ranges of a concatenated buffer) and loaded as pieces of
// another gives back exactly the original elements; gaps and overlaps are refused.
#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "harness.h"
#include "megatron/checkpoint/sharded_tensor.h"

namespace megatron::checkpoint {
namespace {

// The global tensor: element i holds i (as a float), so a misplaced copy shows.
std::vector<float> iota_tensor(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

// What `piece` holds of the global tensor `global` (computed independently of copy_overlap: by walking
// every element's global index).
std::vector<float> expected_piece(const ShardSpec& piece, const std::vector<float>& global) {
  std::vector<float> out;
  if (piece.flat) {  // elements [begin, end) of the box
    ShardSpec box = piece;
    box.flat = false;
    const std::vector<float> all = expected_piece(box, global);
    return std::vector<float>(all.begin() + piece.flat_begin, all.begin() + piece.flat_end);
  }
  const size_t r = piece.global_shape.size();
  std::vector<int64_t> idx(r, 0);
  for (int64_t k = 0; k < piece.numel(); ++k) {
    int64_t rest = k, flat = 0;
    for (size_t d = r; d-- > 0;) {
      idx[d] = piece.global_offset[d] + rest % piece.local_shape[d];
      rest /= piece.local_shape[d];
    }
    for (size_t d = 0; d < r; ++d) flat = flat * piece.global_shape[d] + idx[d];
    out.push_back(global[size_t(flat)]);
  }
  return out;
}

// Saves `global` under `saved` pieces (replicas skipped, as the saver does), loads every `wanted` piece
// from all of them, and checks each is exactly right.
void reshard_and_check(const std::vector<float>& global, const std::vector<ShardSpec>& saved,
                       const std::vector<ShardSpec>& wanted) {
  std::vector<ShardSpec> stored;
  std::vector<std::vector<float>> buffers;
  for (const ShardSpec& s : saved) {
    if (s.replica_id != 0) continue;
    stored.push_back(s);
    buffers.push_back(expected_piece(s, global));
  }
  check_exact_cover(stored);
  for (const ShardSpec& w : wanted) {
    SCOPED_TRACE(w.describe());
    std::vector<float> got(size_t(w.numel()), -1.0f);
    int64_t copied = 0;
    for (size_t i = 0; i < stored.size(); ++i)
      copied += copy_overlap(w, got.data(), stored[i], buffers[i].data(), sizeof(float));
    EXPECT_EQ(copied, w.numel());
    EXPECT_EQ(got, expected_piece(w, global));
  }
}

TEST(ShardedTensor, RowBlocksWithReplicasLoadAsColumnBlocks) {
  const std::vector<int64_t> shape = {6, 9};
  const auto global = iota_tensor(54);
  // Saved at "TP=2 x DP=2": two row blocks, each held by two replicas.
  std::vector<ShardSpec> saved;
  for (int tp = 0; tp < 2; ++tp)
    for (int dp = 0; dp < 2; ++dp) saved.push_back(block_piece("w", shape, DType::F32, 0, tp, 2, dp));
  // Loaded at "TP=3" along columns, and as the whole tensor.
  std::vector<ShardSpec> wanted;
  for (int tp = 0; tp < 3; ++tp) wanted.push_back(block_piece("w", shape, DType::F32, 1, tp, 3));
  wanted.push_back(whole_tensor("w", shape, DType::F32));
  reshard_and_check(global, saved, wanted);
  // And back: column blocks saved, row blocks loaded.
  reshard_and_check(global, wanted.size() ? std::vector<ShardSpec>(wanted.begin(), wanted.end() - 1) : wanted,
                    {block_piece("w", shape, DType::F32, 0, 0, 2), block_piece("w", shape, DType::F32, 0, 1, 2)});
}

TEST(ShardedTensor, ThreeDimensionalBoxesAndFlatRanges) {
  const std::vector<int64_t> shape = {4, 5, 6};
  const auto global = iota_tensor(120);
  // Saved as 2 blocks of dim 1?  5 is odd: use dim 0 (2 blocks) x dim 2 (3 blocks) = 6 boxes.
  std::vector<ShardSpec> saved;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b) {
      ShardSpec s = whole_tensor("t", shape, DType::F32);
      s.global_offset = {a * 2, 0, b * 2};
      s.local_shape = {2, 5, 2};
      saved.push_back(s);
    }
  // Loaded as flat ranges that cut rows anywhere (what a distributed optimizer's DP ranges do), including
  // empty and whole ranges.
  std::vector<ShardSpec> wanted;
  const int64_t cuts[] = {0, 1, 7, 29, 30, 61, 119, 120};
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) wanted.push_back(flat_piece("t", shape, DType::F32, cuts[i], cuts[i + 1]));
  wanted.push_back(flat_piece("t", shape, DType::F32, 0, 120));
  wanted.push_back(flat_piece("t", shape, DType::F32, 50, 50));
  reshard_and_check(global, saved, wanted);
  // Flat ranges saved, boxes loaded.
  std::vector<ShardSpec> flat_saved(wanted.begin(), wanted.begin() + 7);
  reshard_and_check(global, flat_saved, saved);
}

TEST(ShardedTensor, FlatRangesOfTensorParallelBlocks) {
  // Tensor parallelism x distributed optimizer: each "TP rank" holds a column block of [6, 9] (3 columns),
  // and its optimizer state is split in flat ranges of that block (cutting its rows anywhere), as
  // Megatron's flattened_range does. Saved that way; loaded whole, as row blocks, and as flat ranges of the
  // whole tensor.
  const std::vector<int64_t> shape = {6, 9};
  const auto global = iota_tensor(54);
  std::vector<ShardSpec> saved;
  for (int tp = 0; tp < 3; ++tp) {
    const ShardSpec block = block_piece("m", shape, DType::F32, 1, tp, 3);
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 5}, {5, 13}, {13, 18}}) saved.push_back(flat_piece_of_box(block, b, e));
  }
  EXPECT_EQ(saved[4].describe(), "m [0:6, 3:6] flat [5, 13) of [6, 9] f32");
  EXPECT_EQ(flat_piece("m", shape, DType::F32, 2, 7).describe(), "m flat [2, 7) of [6, 9] f32");
  reshard_and_check(global, saved,
                    {whole_tensor("m", shape, DType::F32), block_piece("m", shape, DType::F32, 0, 1, 2),
                     flat_piece("m", shape, DType::F32, 4, 40), flat_piece_of_box(block_piece("m", shape, DType::F32, 0, 1, 3), 1, 17)});
  ShardSpec bad = flat_piece_of_box(block_piece("m", shape, DType::F32, 1, 0, 3), 10, 19);
  testing::expect_error([&] { validate_shard(bad); }, {"m [0:6, 0:3] flat [10, 19)", "18 elements of its block"});
}

TEST(ShardedTensor, FlatRegionsAreFewAndContiguous) {
  // [3, 1000) of [10, 10, 10]: a partial row, partial plane, whole planes, then nothing left.
  ShardSpec s = flat_piece("t", {10, 10, 10}, DType::F32, 3, 1000);
  std::vector<Region> r = regions_of(s);
  EXPECT_LE(r.size(), 2u * 3 + 1);
  int64_t base = 0;
  for (const Region& x : r) {
    EXPECT_EQ(x.base, base);
    int64_t n = 1;
    for (int64_t d : x.shape) n *= d;
    base += n;
  }
  EXPECT_EQ(base, 997);
}

TEST(ShardedTensor, DistributedOptimizerBufferRangesMapToTensors) {
  // Three tensors concatenated into one flat buffer, split into 4 equal data-parallel ranges (one range
  // spans a tensor boundary, one tensor lies in three ranges); saved that way, loaded whole per tensor.
  const std::vector<std::vector<int64_t>> shapes = {{3, 4}, {10}, {2, 3, 3}};
  const std::vector<int64_t> sizes = {12, 10, 18};
  const int64_t total = 40, dp = 4;
  std::vector<std::vector<float>> globals;
  int64_t start = 0;
  for (int64_t n : sizes) {
    std::vector<float> g(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) g[size_t(i)] = float(start + i) * 0.5f;
    globals.push_back(g);
    start += n;
  }
  auto key = [](size_t t) { return str_cat("p", t); };
  std::vector<std::vector<ShardSpec>> saved(shapes.size());
  for (int64_t rank = 0; rank < dp; ++rank)
    for (const TensorRange& tr : split_flat_range(sizes, rank * total / dp, (rank + 1) * total / dp))
      saved[tr.tensor].push_back(flat_piece(key(tr.tensor), shapes[tr.tensor], DType::F32, tr.begin, tr.end));
  EXPECT_EQ(saved[2].size(), 2u);
  EXPECT_EQ(split_flat_range(sizes, 10, 30).size(), 3u);
  for (size_t t = 0; t < shapes.size(); ++t)
    reshard_and_check(globals[t], saved[t], {whole_tensor(key(t), shapes[t], DType::F32)});
  testing::expect_error([&] { split_flat_range(sizes, 30, 41); }, {"[30, 41)", "40 elements"});
}

TEST(ShardedTensor, CoverageErrorsNameTheTensorAndThePieces) {
  const std::vector<int64_t> shape = {4, 4};
  std::vector<ShardSpec> gap = {block_piece("w", shape, DType::F32, 0, 0, 2)};
  testing::expect_error([&] { check_exact_cover(gap); }, {"'w'", "hold 8 of its 16 elements"});
  std::vector<ShardSpec> overlap = {whole_tensor("w", shape, DType::F32), block_piece("w", shape, DType::F32, 1, 1, 2)};
  testing::expect_error([&] { check_exact_cover(overlap); }, {"'w'", "overlap in 8 elements", "w [0:4, 2:4]"});
  ShardSpec bad = block_piece("w", shape, DType::F32, 0, 0, 2);
  bad.global_offset[0] = 3;
  testing::expect_error([&] { validate_shard(bad); }, {"w [3:5, 0:4]", "dimension 0"});
  testing::expect_error([&] { block_piece("w", {5, 4}, DType::F32, 0, 0, 2); }, {"'w'", "2 blocks"});
}

TEST(ShardedTensor, ScalarsAreOneElement) {
  const std::vector<float> global = {42.0f};
  reshard_and_check(global, {whole_tensor("s", {}, DType::F32)}, {whole_tensor("s", {}, DType::F32)});
}

}  // namespace
}  // namespace megatron::checkpoint
