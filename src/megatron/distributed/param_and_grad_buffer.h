// ParamAndGradBuffer: Megatron's contiguous gradient buffer (megatron/core/distributed/param_and_grad_buffer.py).
//
// Every parameter's main_grad becomes a view of one flat buffer (F32, or F64 for F64 parameters: the
// gradients are accumulated and reduced in fp32 whatever the parameter dtype, which is what Megatron's
// --accumulate-allreduce-grads-in-fp32 asks for). With the distributed optimizer the parameter values
// move into a second flat buffer of the parameter dtype with the same layout, so the updated shards can
// be all-gathered in place.
//
// Layout (plan_buffer_layout): parameters in *reverse* model order (backward produces the last layers'
// gradients first), packed back to back; a bucket closes once it holds >= bucket_size elements
// (bucket_size 0: one bucket). With the distributed optimizer a pipeline's shared word embeddings
// (placement.shared_embedding) get a bucket of their own, as in Megatron: the first and the last stage then
// shard that tensor identically over DP, so summing the two copies' reduced gradients over the embedding
// group adds the same elements on both. With the distributed optimizer each parameter starts at a multiple of 64
// elements and each bucket is padded to a multiple of lcm(DP, 128) elements, so it splits into DP equal,
// aligned shards: rank r owns elements [offset + r * numel / DP, offset + (r + 1) * numel / DP) of a
// bucket. Padding is zero and belongs to no parameter.
//
// Construction copies the current values and gradients into the buffers and rebinds the Parameters
// (value and main_grad are reassigned to views; nothing else may hold the old tensors). Buffers live on
// ctx's device; all work is queued on ctx's stream.
//
// Sharded storage (Megatron FSDP, BufferSharding): what persists of the gradients (sharding.grads) and/or the
// values (sharding.params) is only this rank's shard of every bucket, the shards stored back to back in bucket
// order; the whole bucket exists only while it is in use, as a tensor the caller allocates and binds
// (bind_values / bind_grads make the bucket's Parameters' value / main_grad views of it; unbind_* leaves them
// undefined). The ranges below map a global element range inside this rank's shard to its storage either way.
// FP8 storage (--fp8-param-gather): a buffer whose parameters are all keep_in_fp8 (nn/parameter.h) holds its
// values as F8E4M3, which only the distributed optimizer writes (it quantises its fp32 masters into this rank's
// shards and all-gathers them). Construction then copies no values: the parameters' tensors from before the move
// stay here (initial_value) until the optimizer has taken its masters from them.
// Units: with `unit_of_param` given, a bucket never spans two units (an FSDP unit: the parameters one
// module group uses together), whatever bucket_size says.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "megatron/nn/parameter.h"

namespace megatron::distributed {

struct BufferLayout {
  struct Entry {
    size_t param = 0;     // index in the parameter list given to plan_buffer_layout (model order)
    int64_t offset = 0;   // first element in the buffer
    int64_t numel = 0;
    size_t bucket = 0;
  };
  struct Bucket {
    int64_t offset = 0;   // first element
    int64_t numel = 0;    // padded size
    std::vector<size_t> entries;  // indices into `entries`
  };
  std::vector<Entry> entries;  // in buffer order (reverse model order)
  std::vector<Bucket> buckets;
  int64_t numel = 0;           // the buffer's size, padding included
};

// numels: elements of each parameter in model order. bucket_size: elements per bucket, 0 = one bucket.
// shard_for_dp: DP size when the distributed optimizer shards the buckets (adds the padding), else 1.
// own_bucket (per parameter, may be empty): with shard_for_dp > 1, the parameter gets a bucket of its own.
// unit_of_param (per parameter, may be empty): a bucket closes where the unit changes.
BufferLayout plan_buffer_layout(const std::vector<int64_t>& numels, int64_t bucket_size, int shard_for_dp,
                                const std::vector<bool>& own_bucket = {}, const std::vector<int>& unit_of_param = {});

// What persists only as this rank's shard of each bucket (see above); both need the distributed optimizer's
// sharded buckets.
struct BufferSharding {
  bool grads = false;
  bool params = false;
};

class ParamAndGradBuffer {
 public:
  // All `params` share one dtype. distributed_optimizer: also move the values (see above). `rank`: this rank's
  // shard (sharded storage only). unit_of_param: as plan_buffer_layout's, parallel to `params`.
  ParamAndGradBuffer(Context& ctx, std::vector<nn::Parameter*> params, int64_t bucket_size, int dp_size,
                     bool distributed_optimizer, BufferSharding sharding = {}, int rank = 0,
                     const std::vector<int>& unit_of_param = {});

  const BufferLayout& layout() const { return layout_; }
  const std::vector<nn::Parameter*>& params() const { return params_; }
  DType param_dtype() const { return param_dtype_; }  // what the parameters stand for (FP8 storage: before it)
  const BufferSharding& sharding() const { return sharding_; }
  // The whole buffers: [numel] (not with the corresponding sharded storage); values() is undefined without the
  // distributed optimizer.
  const Tensor& grads() const;
  const Tensor& values() const;
  int dp_size() const { return dp_size_; }

  Tensor bucket_grads(size_t bucket) const;
  Tensor bucket_values(size_t bucket) const;
  // Elements [begin, end) of the buffer owned by DP rank `rank` in `bucket`.
  std::pair<int64_t, int64_t> shard(size_t bucket, int rank) const;
  // Global elements [lo, hi) of the gradients / values, a view of where they persist: the whole buffer, or with
  // sharded storage a range inside this rank's shard of one bucket (checked).
  Tensor grads_range(int64_t lo, int64_t hi) const;
  Tensor values_range(int64_t lo, int64_t hi) const;
  // This rank's shard of a bucket: grads_range / values_range of shard(bucket, rank).
  Tensor grad_shard(size_t bucket) const;
  Tensor value_shard(size_t bucket) const;

  // Sharded storage: the bucket's Parameters' values / main grads become views of `whole` ([bucket numel]), or
  // undefined again.
  void bind_values(size_t bucket, const Tensor& whole);
  void unbind_values(size_t bucket);
  void bind_grads(size_t bucket, const Tensor& whole);
  void unbind_grads(size_t bucket);

  void zero_grads(Context& ctx);

  // FP8 storage (see above): whether this buffer has it; parameter i's values from before the move (its own
  // shape and dtype), until release_initial_values().
  bool fp8_values() const { return fp8_values_; }
  const Tensor& initial_value(size_t param) const;
  void release_initial_values();

 private:
  Tensor storage_range(const Tensor& storage, bool sharded, int64_t lo, int64_t hi, const char* what) const;

  std::vector<nn::Parameter*> params_;
  std::vector<std::vector<int64_t>> dims_;  // per parameter: its shape (its value may be unbound)
  DType param_dtype_ = DType::F32;
  int dp_size_ = 1;
  int rank_ = 0;
  BufferSharding sharding_;
  bool fp8_values_ = false;
  std::vector<Tensor> initial_values_;  // FP8 storage: per parameter, until released
  BufferLayout layout_;
  Tensor grads_, values_;  // whole, or this rank's shards back to back (sharded storage)
};

}  // namespace megatron::distributed
