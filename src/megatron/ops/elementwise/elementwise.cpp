// Validation and dispatch of the elementwise family.
#include "megatron/ops/elementwise/elementwise.h"

#include "megatron/ops/elementwise/cpu.h"
#include "megatron/ops/dispatch.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/elementwise/cuda.h"
#endif

namespace megatron::ops {

namespace {

using enum DType;

constexpr std::initializer_list<DType> kArith = {F32, F16, BF16, F64};
constexpr std::initializer_list<DType> kFloat = {F32, F16, BF16, F64, F8E4M3, F8E5M2};

bool is_integer(DType t) { return !is_floating(t); }

// [B, M, N] or [M, N] -> (B, M, N)
struct Batched2d {
  int64_t batch, m, n;
};
Batched2d batched_2d(const Tensor& t) {
  if (t.rank() == 2) return {1, t.dim(0), t.dim(1)};
  return {t.dim(0), t.dim(1), t.dim(2)};
}

}  // namespace

void cast(Context& ctx, const Tensor& out, const Tensor& in) {
  OpCheck check("cast");
  check.device(ctx, {{"out", out}, {"in", in}}).same_shape({{"out", out}, {"in", in}});
  bool ok = (is_floating(in.dtype()) && is_floating(out.dtype())) ||
            (is_integer(in.dtype()) && out.dtype() == F32) || (in.dtype() == F32 && is_integer(out.dtype()));
  check.that(ok, "cannot cast ", in.describe(), " to ", out.describe(),
             ": casts go between float dtypes, or between an integer dtype and f32");
  check.that(dtype_size(in.dtype()) == dtype_size(out.dtype()) || in.numel() == 0 || in.data_ptr() != out.data_ptr(),
             "in-place cast from ", in.describe(), " to ", out.describe(), " needs equal element sizes");
  if (in.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::cast(ctx, out, in), cpu::cast(out, in));
}

void cast_scaled(Context& ctx, const Tensor& out, const Tensor& amax, const Tensor& in, float scale) {
  OpCheck check("cast_scaled");
  check.device(ctx, {{"out", out}, {"amax", amax}, {"in", in}})
      .same_shape({{"out", out}, {"in", in}})
      .dtype_in("in", in, kArith)
      .dtype_in("out", out, kFloat)
      .dtype("amax", amax, F32)
      .shape("amax", amax, Shape{1});
  MEGATRON_DISPATCH(ctx, cuda::cast_scaled(ctx, out, amax, in, scale), cpu::cast_scaled(out, amax, in, scale));
}

void copy(Context& ctx, const Tensor& out, const Tensor& in) {
  OpCheck check("copy");
  check.defined("out", out).defined("in", in).same_dtype({{"out", out}, {"in", in}}).same_shape({{"out", out}, {"in", in}});
  for (const NamedTensor& nt : {NamedTensor{"out", out}, NamedTensor{"in", in}})
    check.that(nt.tensor.device().is_cpu() || nt.tensor.device() == ctx.device(), "argument ", nt.name, " is ",
               nt.tensor.describe(), " but the op runs on ", ctx.device(), " (host tensors are allowed too)");
  copy_tensor(ctx, out, in);
}

void fill(Context& ctx, const Tensor& out, double value) {
  OpCheck("fill").device(ctx, {{"out", out}});
  if (out.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::fill(ctx, out, value), cpu::fill(out, value));
}

void fill_uniform(Context& ctx, const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi,
                  uint64_t index_base) {
  OpCheck("fill_uniform").device(ctx, {{"out", out}}).dtype_in("out", out, kFloat).that(lo <= hi, "lo ", lo, " > hi ", hi);
  if (out.numel() == 0) return;
  MEGATRON_DISPATCH(ctx,
                    cuda::fill_uniform(ctx, out, seed, offset, lo, hi, index_base),
                    cpu::fill_uniform(out, seed, offset, lo, hi, index_base));
}

void fill_normal(Context& ctx, const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std,
                 uint64_t index_base) {
  OpCheck("fill_normal").device(ctx, {{"out", out}}).dtype_in("out", out, kFloat);
  if (out.numel() == 0) return;
  MEGATRON_DISPATCH(ctx,
                    cuda::fill_normal(ctx, out, seed, offset, mean, std, index_base),
                    cpu::fill_normal(out, seed, offset, mean, std, index_base));
}

void transpose(Context& ctx, const Tensor& out, const Tensor& in) {
  OpCheck check("transpose");
  check.device(ctx, {{"out", out}, {"in", in}}).same_dtype({{"out", out}, {"in", in}});
  check.that(in.rank() == 2 || in.rank() == 3, "argument in is ", in.describe(), " but must have rank 2 or 3");
  Batched2d d = batched_2d(in);
  Shape want = in.rank() == 2 ? Shape{d.n, d.m} : Shape{d.batch, d.n, d.m};
  check.shape("out", out, want);
  check.that(in.numel() == 0 || out.data_ptr() != in.data_ptr(), "out must not alias in");
  if (in.numel() == 0) return;
  MEGATRON_DISPATCH(ctx,
                    cuda::transpose(ctx, out, in, d.batch, d.m, d.n),
                    cpu::transpose(out, in, d.batch, d.m, d.n));
}

namespace {
void check_binary(const char* op, Context& ctx, const Tensor& out, const Tensor& a, const char* an, const Tensor& b,
                  const char* bn) {
  OpCheck(op)
      .device(ctx, {{"out", out}, {an, a}, {bn, b}})
      .dtype_in(an, a, kArith)
      .same_dtype({{an, a}, {bn, b}, {"out", out}})
      .same_shape({{an, a}, {bn, b}, {"out", out}});
}
}  // namespace

void add(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  check_binary("add", ctx, out, a, "a", b, "b");
  if (out.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::add(ctx, out, a, b), cpu::add(out, a, b));
}

void mul(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  check_binary("mul", ctx, out, a, "a", b, "b");
  if (out.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::mul(ctx, out, a, b), cpu::mul(out, a, b));
}

void scale(Context& ctx, const Tensor& out, const Tensor& in, double alpha) {
  check_binary("scale", ctx, out, in, "in", in, "in");
  if (out.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::axpby(ctx, out, in, in, alpha, 0.0), cpu::axpby(out, in, in, alpha, 0.0));
}

void scale_rows(Context& ctx, const Tensor& out, const Tensor& in, const Tensor& s) {
  OpCheck check("scale_rows");
  check.device(ctx, {{"out", out}, {"in", in}, {"s", s}})
      .dtype_in("in", in, kArith)
      .same_dtype({{"in", in}, {"out", out}})
      .same_shape({{"in", in}, {"out", out}})
      .dtype("s", s, in.dtype() == F64 ? F64 : F32)
      .shape("s", s, Shape{in.shape().rows()});
  if (out.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::scale_rows(ctx, out, in, s), cpu::scale_rows(out, in, s));
}

void axpby(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& y, double alpha, double beta) {
  check_binary("axpby", ctx, out, x, "x", y, "y");
  if (out.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::axpby(ctx, out, x, y, alpha, beta), cpu::axpby(out, x, y, alpha, beta));
}

namespace {
void check_reduction(const char* op, Context& ctx, const Tensor& out, const Tensor& in, std::initializer_list<DType> in_dtypes) {
  OpCheck(op).device(ctx, {{"out", out}, {"in", in}}).dtype_in("in", in, in_dtypes).dtype("out", out, F32);
}
}  // namespace

void sum_rows(Context& ctx, const Tensor& out, const Tensor& in) {
  check_reduction("sum_rows", ctx, out, in, kArith);
  OpCheck("sum_rows").rank("in", in, 2).shape("out", out, Shape{in.dim(0)});
  if (out.numel() == 0) return;
  MEGATRON_DISPATCH(ctx,
                    cuda::sum_rows(ctx, out, in, in.dim(0), in.dim(1)),
                    cpu::sum_rows(out, in, in.dim(0), in.dim(1)));
}

void sum_columns(Context& ctx, const Tensor& out, const Tensor& in) {
  check_reduction("sum_columns", ctx, out, in, kArith);
  OpCheck("sum_columns").rank("in", in, 2).shape("out", out, Shape{in.dim(1)});
  if (out.numel() == 0) return;
  MEGATRON_DISPATCH(ctx,
                    cuda::sum_columns(ctx, out, in, in.dim(0), in.dim(1)),
                    cpu::sum_columns(out, in, in.dim(0), in.dim(1)));
}

void sum_all(Context& ctx, const Tensor& out, const Tensor& in) {
  check_reduction("sum_all", ctx, out, in, kArith);
  OpCheck("sum_all").shape("out", out, Shape{1});
  MEGATRON_DISPATCH(ctx, cuda::sum_all(ctx, out, in), cpu::sum_all(out, in));
}

void amax(Context& ctx, const Tensor& out, const Tensor& in) {
  check_reduction("amax", ctx, out, in, kFloat);
  OpCheck("amax").shape("out", out, Shape{1});
  MEGATRON_DISPATCH(ctx, cuda::amax(ctx, out, in), cpu::amax(out, in));
}

}  // namespace megatron::ops
