// Where a tensor-parallel rank's piece of a parameter sits in the whole (TP = 1) parameter: the global shape
// and the boxes (global offset + extent) its local tensor is made of, as checkpoints describe shards
// (docs/checkpoint.md: a piece is global_offset + local_shape). A plain split is one box; SwiGLU's fc1
// (blocks = 2) is two: [gate_r; up_r]. A replicated parameter is one box covering everything, with
// `replica` true on TP ranks other than 0 (the checkpoint's replica_id > 0: not saved twice).
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/nn/parameter.h"

namespace megatron::nn {

struct ShardBox {
  int64_t local_offset = 0;              // first index along the split dimension in the local tensor
  std::vector<int64_t> global_offset;    // per dimension, in the whole tensor
  std::vector<int64_t> shape;            // extent per dimension
};

struct ParameterShard {
  std::vector<int64_t> global_shape;
  int dim = -1;                          // the split dimension (-1: replicated)
  std::vector<ShardBox> boxes;           // in local order along `dim`; together they are the local tensor
  bool replica = false;                  // a replicated parameter on TP rank > 0
};

// The whole (TP = 1) shape of a parameter with split `tp` whose local shape is `local`.
std::vector<int64_t> global_shape(const std::vector<int64_t>& local, const TensorParallelSplit& tp);
// This rank's piece of a whole shape (throws when the split does not divide it evenly).
std::vector<int64_t> local_shape(const std::vector<int64_t>& global, const TensorParallelSplit& tp,
                                 const std::string& name = "");

ParameterShard describe_shard(const Parameter& p);

// True for a replicated parameter on a TP rank other than 0: its gradient equals rank 0's, so norms and
// checkpoints count it once (Megatron's param_is_not_tensor_parallel_duplicate, negated).
bool is_tensor_parallel_duplicate(const Parameter& p);

}  // namespace megatron::nn
