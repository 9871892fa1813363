#include "megatron/nn/parameter.h"

#include "megatron/nn/parameter_shard.h"
#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::nn {

DType main_grad_dtype(DType param_dtype) {
  MEGATRON_CHECK(param_dtype == DType::F32 || param_dtype == DType::BF16 || param_dtype == DType::F16 ||
                     param_dtype == DType::F64,
                 "parameters are F32, BF16, F16 or F64; got ", dtype_name(param_dtype));
  return param_dtype == DType::F64 ? DType::F64 : DType::F32;
}

Parameter make_parameter(Context& ctx, std::string name, const Shape& shape, DType dtype, bool no_weight_decay,
                         Placement placement) {
  MEGATRON_CHECK(!name.empty(), "make_parameter: a parameter needs a name (its checkpoint key; an unnamed one "
                                "reads as absent, Parameter::defined)");
  Parameter p;
  const Shape local(local_shape(shape.dims(), placement, name));
  p.name = std::move(name);
  p.placement = placement;
  p.value = ctx.empty(local, dtype);
  p.main_grad = ctx.empty(local, main_grad_dtype(dtype));
  ops::fill(ctx, p.main_grad, 0.0);
  p.no_weight_decay = no_weight_decay;
  return p;
}

uint64_t parameter_name_hash(const std::string& name) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void init_normal(Context& ctx, Parameter& p, uint64_t seed, double std) {
  fill_parameter_normal(ctx, p, seed, parameter_name_hash(p.name), 0.0, std);
}

namespace {

// A box that is a block of columns of whole matrices (the last dimension cut, the one before it whole --
// a row-parallel weight, an expert fc2 under expert TP): per matrix, draw the whole [rows, cols] matrix at
// its place in the whole tensor once and keep this rank's columns (two transposes; init only).
void fill_column_block(Context& ctx, const Tensor& dst, const ShardBox& box, const std::vector<int64_t>& g,
                       uint64_t seed, uint64_t offset, double mean, double std) {
  const size_t nd = g.size();
  const int64_t rows = g[nd - 2], cols = g[nd - 1], c0 = box.global_offset[nd - 1], n = box.shape[nd - 1];
  const std::vector<int64_t> lead_shape(box.shape.begin(), box.shape.end() - 2);
  const std::vector<int64_t> lead_global(g.begin(), g.end() - 2);
  int64_t matrices = 1;
  for (int64_t x : lead_shape) matrices *= x;
  Tensor whole = ctx.empty({rows, cols}, dst.dtype()), whole_t = ctx.empty({cols, rows}, dst.dtype());
  for (int64_t m = 0; m < matrices; ++m) {
    std::vector<int64_t> at(lead_shape.size());
    int64_t r = m;
    for (size_t d = lead_shape.size(); d-- > 0;) {
      at[d] = box.global_offset[d] + r % lead_shape[d];
      r /= lead_shape[d];
    }
    const int64_t matrix = lead_global.empty() ? 0 : flat_index(at, lead_global);
    ops::fill_normal(ctx, whole, seed, offset, mean, std, uint64_t(matrix * rows * cols));
    ops::transpose(ctx, whole_t, whole);
    ops::transpose(ctx, dst.slice(m * rows * n, (m + 1) * rows * n).view({rows, n}), whole_t.slice(c0, c0 + n));
  }
}

}  // namespace

void fill_parameter_normal(Context& ctx, Parameter& p, uint64_t seed, uint64_t offset, double mean, double std) {
  const ParameterShard shard = describe_shard(p);
  const std::vector<int64_t>& g = shard.global_shape;
  const std::vector<int64_t>& local = p.value.shape().dims();
  if (shard.dim < 0) {
    ops::fill_normal(ctx, p.value, seed, offset, mean, std, 0);
    return;
  }
  const Tensor flat = p.value.view({p.value.numel()});
  for (const ShardBox& box : shard.boxes) {
    int64_t n = 1;
    for (int64_t x : box.shape) n *= x;
    const int64_t first = flat_index(box.local_start, local);  // every box is a run of the local tensor
    const Tensor dst = flat.slice(first, first + n);
    if (is_contiguous_run(box.shape, g)) {  // also a run of the whole tensor
      ops::fill_normal(ctx, dst, seed, offset, mean, std, uint64_t(flat_index(box.global_offset, g)));
      continue;
    }
    const size_t nd = g.size();
    MEGATRON_CHECK(nd >= 2 && box.shape[nd - 2] == g[nd - 2], "fill_parameter_normal: parameter ", p.name,
                   " has a piece that is neither a run of the whole tensor nor a block of columns of whole "
                   "matrices (split dimension ", shard.dim, " of ", nd, ")");
    fill_column_block(ctx, dst, box, g, seed, offset, mean, std);
  }
}

void init_constant(Context& ctx, Parameter& p, double value) { ops::fill(ctx, p.value, value); }

void zero_grads(Context& ctx, const ParameterList& params) {
  for (Parameter* p : params) ops::fill(ctx, p->main_grad, 0.0);
}

int64_t count_elements(const ParameterList& params) {
  int64_t n = 0;
  for (const Parameter* p : params) n += p->value.numel();
  return n;
}

}  // namespace megatron::nn
