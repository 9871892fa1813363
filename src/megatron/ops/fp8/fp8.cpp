// Validation and dispatch of the fp8 family.
#include "megatron/ops/fp8/fp8.h"

#include <cmath>
#include <cstdint>
#include <string_view>

#include "megatron/ops/activation/activation.h"
#include "megatron/ops/dispatch.h"
#include "megatron/ops/fp8/cpu.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/fp8/cuda.h"
#endif

namespace megatron::ops {

namespace {

using enum DType;

// Whether the bytes of two defined tensors share an address (kernels write outputs while reading inputs,
// and the cast's blocks read `scale` while others update `amax`).
bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.nbytes() == 0 || b.nbytes() == 0) return false;
  auto begin_a = reinterpret_cast<uintptr_t>(a.data_ptr()), begin_b = reinterpret_cast<uintptr_t>(b.data_ptr());
  return begin_a < begin_b + b.nbytes() && begin_b < begin_a + a.nbytes();
}

// Every written tensor of `written` against every other tensor of `all` (undefined ones are skipped).
void check_no_overlap(OpCheck& check, std::initializer_list<NamedTensor> written,
                      std::initializer_list<NamedTensor> all) {
  for (const NamedTensor& w : written)
    for (const NamedTensor& t : all)
      check.that(std::string_view(w.name) == t.name || !overlaps(w.tensor, t.tensor), "argument ", w.name, " ",
                 w.tensor.describe(), " overlaps argument ", t.name, " ", t.tensor.describe(),
                 " in memory; it must be a separate buffer");
}

// fp8_max and margin of the scale ops; returns 2^margin, exact as a normal fp32.
float checked_pow2_margin(OpCheck& check, float fp8_max, int margin) {
  check.that(std::isfinite(fp8_max) && fp8_max > 0, "fp8_max must be a positive finite number (448 for E4M3, ",
             "57344 for E5M2), got ", fp8_max);
  check.that(margin >= -126 && margin <= 127, "margin must be in [-126, 127] (2^margin a normal fp32), got ",
             margin);
  return std::ldexp(1.0f, margin);
}

// The cast's outputs for a [rows, cols] source.
void check_cast_outputs(OpCheck& check, Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax,
                        int64_t rows, int64_t cols) {
  check.that(out.defined() || out_t.defined(), "at least one of out and out_t must be given (both are undefined)");
  if (out.defined())
    check.device(ctx, {{"out", out}}).dtype_in("out", out, {F8E4M3, F8E5M2}).shape("out", out, Shape{rows, cols});
  if (out_t.defined())
    check.device(ctx, {{"out_t", out_t}})
        .dtype_in("out_t", out_t, {F8E4M3, F8E5M2})
        .shape("out_t", out_t, Shape{cols, rows});
  if (out.defined() && out_t.defined()) check.same_dtype({{"out", out}, {"out_t", out_t}});
  if (amax.defined()) check.device(ctx, {{"amax", amax}}).dtype("amax", amax, F32).shape("amax", amax, Shape{1});
}

}  // namespace

void fp8_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax, const Tensor& in,
                        const Tensor& scale) {
  OpCheck check("fp8_cast_transpose");
  check.device(ctx, {{"in", in}, {"scale", scale}}).rank("in", in, 2);
  if (ctx.is_cuda()) check.dtype_in("in", in, {F32, BF16, F16});
  else check.dtype_in("in", in, {F64, F32, BF16, F16});
  check.dtype("scale", scale, F32).shape("scale", scale, Shape{1});
  check_cast_outputs(check, ctx, out, out_t, amax, in.dim(0), in.dim(1));
  check_no_overlap(check, {{"out", out}, {"out_t", out_t}, {"amax", amax}},
                   {{"out", out}, {"out_t", out_t}, {"amax", amax}, {"in", in}, {"scale", scale}});
  if (in.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::fp8_cast_transpose(ctx, out, out_t, amax, in, scale),
                    cpu::fp8_cast_transpose(out, out_t, amax, in, scale));
}

namespace {

// x [rows, 2F] of a SwiGLU cast, with `scale`; returns F.
int64_t check_swiglu_input(OpCheck& check, Context& ctx, const Tensor& x, const Tensor& scale) {
  check.device(ctx, {{"x", x}, {"scale", scale}}).rank("x", x, 2);
  if (ctx.is_cuda()) check.dtype_in("x", x, {F32, BF16, F16});
  else check.dtype_in("x", x, {F64, F32, BF16, F16});
  check.dtype("scale", scale, F32).shape("scale", scale, Shape{1});
  check.that(x.dim(1) % 2 == 0, "x ", x.describe(),
             " must be [rows, 2F] (SwiGLU's [gate | up]): its last dimension is odd");
  return x.dim(1) / 2;
}

}  // namespace

void fp8_swiglu_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax,
                               const Tensor& x, const Tensor& scale) {
  OpCheck check("fp8_swiglu_cast_transpose");
  const int64_t f = check_swiglu_input(check, ctx, x, scale);
  check_cast_outputs(check, ctx, out, out_t, amax, x.dim(0), f);
  check_no_overlap(check, {{"out", out}, {"out_t", out_t}, {"amax", amax}},
                   {{"out", out}, {"out_t", out_t}, {"amax", amax}, {"x", x}, {"scale", scale}});
  if (x.numel() == 0) return;
#if MEGATRON_WITH_CUDA
  if (ctx.is_cuda() && cuda::fp8_swiglu_cast_transpose(ctx, out, out_t, amax, x, scale)) return;
#endif
  Tensor y = ctx.empty({x.dim(0), f}, x.dtype());
  swiglu_forward(ctx, y, x);
  fp8_cast_transpose(ctx, out, out_t, amax, y, scale);
}

void fp8_swiglu_grad_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax,
                                    const Tensor& dy, const Tensor& x, const Tensor& scale) {
  OpCheck check("fp8_swiglu_grad_cast_transpose");
  const int64_t f = check_swiglu_input(check, ctx, x, scale);
  check.device(ctx, {{"dy", dy}}).same_dtype({{"x", x}, {"dy", dy}});
  check.shape("dy", dy, Shape{x.dim(0), f});
  check_cast_outputs(check, ctx, out, out_t, amax, x.dim(0), x.dim(1));
  check_no_overlap(check, {{"out", out}, {"out_t", out_t}, {"amax", amax}},
                   {{"out", out}, {"out_t", out_t}, {"amax", amax}, {"dy", dy}, {"x", x}, {"scale", scale}});
  if (x.numel() == 0) return;
#if MEGATRON_WITH_CUDA
  if (ctx.is_cuda() && cuda::fp8_swiglu_grad_cast_transpose(ctx, out, out_t, amax, dy, x, scale)) return;
#endif
  Tensor dx = ctx.empty(x.shape(), x.dtype());
  swiglu_backward(ctx, dx, dy, x);
  fp8_cast_transpose(ctx, out, out_t, amax, dx, scale);
}

void fp8_scale_from_amax(Context& ctx, const Tensor& scale, const Tensor& scale_inv, const Tensor& amax,
                         float fp8_max, int margin, bool keep_on_invalid) {
  OpCheck check("fp8_scale_from_amax");
  check.device(ctx, {{"scale", scale}, {"scale_inv", scale_inv}, {"amax", amax}})
      .rank("amax", amax, 1)
      .dtype("amax", amax, F32)
      .dtype("scale", scale, F32)
      .dtype("scale_inv", scale_inv, F32)
      .shape("scale", scale, amax.shape())
      .shape("scale_inv", scale_inv, amax.shape());
  const float pow2_margin = checked_pow2_margin(check, fp8_max, margin);
  // amax may alias scale: each element is read before it is written, by the same thread.
  check_no_overlap(check, {{"scale_inv", scale_inv}}, {{"scale", scale}, {"scale_inv", scale_inv}, {"amax", amax}});
  if (amax.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::fp8_scale_from_amax(ctx, scale, scale_inv, amax, fp8_max, pow2_margin, keep_on_invalid),
                    cpu::fp8_scale_from_amax(scale, scale_inv, amax, fp8_max, pow2_margin, keep_on_invalid));
}

void fp8_delayed_scaling_update(Context& ctx, const Tensor& history, const Tensor& scale, const Tensor& scale_inv,
                                float fp8_max, int margin, bool use_max) {
  OpCheck check("fp8_delayed_scaling_update");
  check.device(ctx, {{"history", history}, {"scale", scale}, {"scale_inv", scale_inv}})
      .rank("history", history, 2)
      .dtype("history", history, F32)
      .dtype("scale", scale, F32)
      .dtype("scale_inv", scale_inv, F32);
  check.that(history.dim(0) >= 1, "history ", history.describe(), " must have at least one row ([L, n], L >= 1)");
  const int64_t n = history.dim(1);
  check.shape("scale", scale, Shape{n}).shape("scale_inv", scale_inv, Shape{n});
  const float pow2_margin = checked_pow2_margin(check, fp8_max, margin);
  check_no_overlap(check, {{"history", history}, {"scale", scale}, {"scale_inv", scale_inv}},
                   {{"history", history}, {"scale", scale}, {"scale_inv", scale_inv}});
  if (n == 0) return;
  MEGATRON_DISPATCH(ctx,
                    cuda::fp8_delayed_scaling_update(ctx, history, scale, scale_inv, fp8_max, pow2_margin, use_max),
                    cpu::fp8_delayed_scaling_update(history, scale, scale_inv, fp8_max, pow2_margin, use_max));
}

}  // namespace megatron::ops
