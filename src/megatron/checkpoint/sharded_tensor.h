// Sharded tensors: the resharding rule of the checkpoint format.
//
// A global tensor (key, global shape, dtype) is held by ranks as pieces. A piece is one of
//   - a box: global_offset[d] .. global_offset[d] + local_shape[d] in every dimension d, stored row-major in
//     the box's own shape (how tensor parallelism splits weights: row or column blocks);
//   - a flat range: elements [flat_begin, flat_end) of the tensor flattened row-major, stored contiguously
//     (how the distributed optimizer splits its fp32 state: ranges of a flat buffer, mapped per tensor by
//     split_flat_range()).
// replica_id says which copy a piece is when several ranks hold the same elements (data parallelism):
// only replica 0 is saved.
//
// Rule: a saved tensor is covered exactly once by its replica-0 pieces (checked on save). Any piece can be
// loaded, at any layout, by copying from every saved piece its intersection with the requested piece;
// every element must be found (checked on load). Both forms reduce to regions: a box with a row-major
// layout of its own, at a base position of the piece's buffer. A box piece is one region; a flat range is
// at most 2 * rank + 1 regions (partial rows, then whole blocks), each contiguous in global order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "megatron/core/dtype.h"

namespace megatron::checkpoint {

struct ShardSpec {
  std::string key;                     // global tensor name ("decoder.layers.3.mlp.linear_fc1.weight")
  std::vector<int64_t> global_shape;
  DType dtype = DType::F32;
  // Box form (flat == false): one offset and one extent per dimension of global_shape.
  std::vector<int64_t> global_offset;
  std::vector<int64_t> local_shape;
  // Flat form (flat == true): [flat_begin, flat_end) of the row-major flattening.
  bool flat = false;
  int64_t flat_begin = 0, flat_end = 0;
  int replica_id = 0;

  int64_t numel() const;  // elements of this piece
  std::string describe() const;  // "key [0:4, 2:5] of [8, 6] f32" or "key flat [10, 30) of [8, 6] f32"
};

// The whole tensor as one box piece.
ShardSpec whole_tensor(std::string key, std::vector<int64_t> global_shape, DType dtype);
// Box piece along one dimension: block `index` of `count` equal blocks of dim `dim` (extent divisible).
ShardSpec block_piece(std::string key, std::vector<int64_t> global_shape, DType dtype, int dim, int64_t index,
                      int64_t count, int replica_id = 0);
// Flat-range piece.
ShardSpec flat_piece(std::string key, std::vector<int64_t> global_shape, DType dtype, int64_t begin, int64_t end,
                     int replica_id = 0);

// Throws megatron::Error naming the key when offsets/extents do not fit inside the global shape.
void validate_shard(const ShardSpec& s);

// A box of the global index space with the row-major layout of its own extent, starting at element
// `base` of the piece's buffer.
struct Region {
  std::vector<int64_t> offset, shape;
  int64_t base = 0;
};
std::vector<Region> regions_of(const ShardSpec& s);

// Copies into `dst` (laid out as `dst_spec`) every element it shares with `src` (laid out as `src_spec`);
// both share key, global shape and element size. Returns the number of elements copied.
int64_t copy_overlap(const ShardSpec& dst_spec, void* dst, const ShardSpec& src_spec, const void* src,
                     size_t element_size);

// Elements `dst_spec` shares with `src_spec` (no copying).
int64_t overlap_elements(const ShardSpec& a, const ShardSpec& b);

// Throws megatron::Error, naming the key and the offending pieces, unless `pieces` (same key and global
// shape) cover the tensor exactly once: no overlap between two pieces and every element present.
void check_exact_cover(std::span<const ShardSpec> pieces);

// A range [begin, end) of a flat buffer that concatenates tensors of `sizes` elements (the distributed
// optimizer's buffer), split into per-tensor ranges.
struct TensorRange {
  size_t tensor = 0;
  int64_t begin = 0, end = 0;  // within that tensor's flattening
};
std::vector<TensorRange> split_flat_range(std::span<const int64_t> sizes, int64_t begin, int64_t end);

}  // namespace megatron::checkpoint
