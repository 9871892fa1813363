#include "megatron/ops/gemm/gemm.h"

#include <cmath>

#include "megatron/ops/gemm/cpu.h"
#include "megatron/ops/gemm/dims.h"
#include "megatron/ops/dispatch.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/gemm/cuda.h"
#endif

namespace megatron::ops {

const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::None: return "none";
    case GemmEpilogue::Bias: return "bias";
    case GemmEpilogue::Gelu: return "gelu";
    case GemmEpilogue::BiasGelu: return "bias+gelu";
    case GemmEpilogue::DGelu: return "dgelu";
  }
  return "?";
}

const char* fp8_scale_layout_name(Fp8ScaleLayout layout) {
  switch (layout) {
    case Fp8ScaleLayout::Tensor: return "tensor";
    case Fp8ScaleLayout::Rows1x128: return "1x128 rows";
    case Fp8ScaleLayout::Blocks128x128: return "128x128 blocks";
  }
  return "?";
}

Shape fp8_scale_shape(Fp8ScaleLayout layout, int64_t rows, int64_t k) {
  constexpr int64_t kBlock = 128;
  auto blocks = [](int64_t n) { return (n + kBlock - 1) / kBlock; };
  auto pad4 = [](int64_t n) { return (n + 3) / 4 * 4; };
  switch (layout) {
    case Fp8ScaleLayout::Tensor: return Shape{1};
    case Fp8ScaleLayout::Rows1x128: return Shape{blocks(k), pad4(rows)};
    case Fp8ScaleLayout::Blocks128x128: return Shape{blocks(rows), pad4(blocks(k))};
  }
  MEGATRON_FAIL("fp8_scale_shape: unknown layout ", int(layout));
}

double gelu_tanh(double x) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

double gelu_tanh_grad(double x) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
  double th = std::tanh(u);
  double du = kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * x * x);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
}

namespace {

bool is_scalar_f32(const Tensor& t) { return t.dtype() == DType::F32 && t.numel() == 1; }

// "A bf16[8, 16] on cuda:0 (transposed), B ..., D ..." for error messages.
std::string describe_call(const Tensor& d, const Tensor& a, const Tensor& b, const GemmOptions& opt) {
  return str_cat("A ", a.describe(), opt.transpose_a ? " (transposed)" : "", ", B ", b.describe(),
                 opt.transpose_b ? " (transposed)" : "", ", D ", d.describe());
}

// Ranks and shapes of A, B and D; the problem's dimensions.
GemmDims check_shapes(OpCheck& check, const Tensor& d, const Tensor& a, const Tensor& b, const GemmOptions& opt,
                      const std::string& call) {
  check.that(a.rank() == 2 || a.rank() == 3, "A must be 2-D [M, K] or 3-D [batch, M, K]; got ", call);
  check.that(d.rank() == a.rank(), "D must have the rank of A; got ", call);
  check.that(b.rank() == 2 || (b.rank() == 3 && a.rank() == 3),
             "B must be 2-D, or 3-D when A is 3-D; got ", call);
  GemmDims g;
  g.batched = a.rank() == 3;
  g.batch = g.batched ? a.dim(0) : 1;
  g.b_shared = g.batched && b.rank() == 2;
  g.m = opt.transpose_a ? a.dim(-1) : a.dim(-2);
  g.k = opt.transpose_a ? a.dim(-2) : a.dim(-1);
  int64_t kb = opt.transpose_b ? b.dim(-1) : b.dim(-2);
  g.n = opt.transpose_b ? b.dim(-2) : b.dim(-1);
  g.lda = a.dim(-1);
  g.ldb = b.dim(-1);
  check.that(kb == g.k, "inner dimensions differ: op(A) is [", g.m, ", ", g.k, "] but op(B) is [", kb, ", ", g.n,
             "] (", call, ")");
  if (g.batched && !g.b_shared)
    check.that(b.dim(0) == g.batch, "batch sizes differ between A and B (", call, ")");
  Shape d_shape = g.batched ? Shape{g.batch, g.m, g.n} : Shape{g.m, g.n};
  check.that(d.shape() == d_shape, "D must have shape ", d_shape, " for op(A) [", g.m, ", ", g.k, "] @ op(B) [",
             g.k, ", ", g.n, "]; got ", call);
  return g;
}

// Block-scaled fp8 operands: both operands block-scaled, not both 128x128, the scale tensors' shapes, and
// what cuBLASLt's block-scaled kernels support (no batch, fast accumulation, GELU or fp8 output).
void check_fp8_block_scaling(OpCheck& check, const Tensor& d, const GemmOptions& opt, const GemmDims& g,
                             const std::string& call) {
  check.that(opt.a_scale_layout != Fp8ScaleLayout::Tensor && opt.b_scale_layout != Fp8ScaleLayout::Tensor,
             "fp8 block scaling needs both operands block-scaled; got a_scale_layout ",
             fp8_scale_layout_name(opt.a_scale_layout), ", b_scale_layout ", fp8_scale_layout_name(opt.b_scale_layout));
  check.that(!(opt.a_scale_layout == Fp8ScaleLayout::Blocks128x128 &&
               opt.b_scale_layout == Fp8ScaleLayout::Blocks128x128),
             "fp8 block scaling supports 1x128 x 1x128, 1x128 x 128x128 and 128x128 x 1x128 operands, not 128x128 on "
             "both (cuBLASLt has no such kernel)");
  check.shape("a_scale", opt.a_scale, fp8_scale_shape(opt.a_scale_layout, g.m, g.k));
  check.shape("b_scale", opt.b_scale, fp8_scale_shape(opt.b_scale_layout, g.n, g.k));
  check.dtype("a_scale", opt.a_scale, DType::F32);
  check.dtype("b_scale", opt.b_scale, DType::F32);
  check.that(!g.batched, "fp8 block scaling takes 2-D operands only; got ", call);
  check.that(!opt.fp8_fast_accum, "fp8 block scaling needs the promoted accumulators (fp8_fast_accum off)");
  check.that(opt.epilogue == GemmEpilogue::None || opt.epilogue == GemmEpilogue::Bias,
             "fp8 block scaling supports the none and bias epilogues only, got ", gemm_epilogue_name(opt.epilogue));
  check.that(!is_fp8(d.dtype()), "fp8 block scaling writes a BF16, F16 or F32 D, not fp8; got ", call);
  check.that(!opt.bias_grad_out.defined(), "fp8 block scaling has no bias gradient output; got ", call);
}

// fp8 inputs: both operands fp8, the TN layout, dimensions in multiples of 16, the inverse scales.
void check_fp8_inputs(Context& ctx, OpCheck& check, const Tensor& d, const Tensor& a, const Tensor& b,
                      const GemmOptions& opt, const GemmDims& g, const std::string& call) {
  check.that(is_fp8(a.dtype()) && is_fp8(b.dtype()), "fp8 needs both A and B in fp8; got ", call);
  check.that(!(a.dtype() == DType::F8E5M2 && b.dtype() == DType::F8E5M2),
             "f8e5m2 x f8e5m2 is not supported by cuBLASLt (one operand must be f8e4m3); got ", call);
  check.dtype_in("d", d, {DType::BF16, DType::F16, DType::F32, DType::F64, DType::F8E4M3, DType::F8E5M2});
  // An F64 D (the CPU's emulation of FP8 training at double precision: products of FP8 values summed with
  // ~1e-16 rounding, so reordered sums round to the same FP8 values downstream).
  check.that(d.dtype() != DType::F64 || !ctx.is_cuda(), "f64 runs on the CPU only; got ", call);
  check.that(!opt.transpose_a && opt.transpose_b,
             "fp8 inputs need A as [M, K] and B as [N, K] (transpose_a = false, transpose_b = true: the only "
             "layout, 'TN', that cuBLASLt's fp8 kernels support); got ", call);
  check.that(g.m % 16 == 0 && g.n % 16 == 0 && g.k % 16 == 0,
             "fp8 needs M, N and K to be multiples of 16; got M=", g.m, " N=", g.n, " K=", g.k, " (", call, ")");
  check.device(ctx, {{"a_scale", opt.a_scale}, {"b_scale", opt.b_scale}});
  const bool blocks_a = opt.a_scale_layout != Fp8ScaleLayout::Tensor;
  const bool blocks_b = opt.b_scale_layout != Fp8ScaleLayout::Tensor;
  if (!blocks_a && !blocks_b) {
    check.that(is_scalar_f32(opt.a_scale) && is_scalar_f32(opt.b_scale),
               "fp8 inputs need a_scale and b_scale as f32[1] tensors (inverse scales); got a_scale ",
               opt.a_scale.describe(), ", b_scale ", opt.b_scale.describe());
  } else {
    check_fp8_block_scaling(check, d, opt, g, call);
  }
  if (is_fp8(d.dtype())) {
    check.that(opt.beta == 0.0f, "fp8 output D cannot accumulate (beta must be 0, got ", opt.beta, ")");
    check.that(opt.epilogue == GemmEpilogue::None || opt.epilogue == GemmEpilogue::Bias,
               "fp8 output D supports the none and bias epilogues only, got ", gemm_epilogue_name(opt.epilogue));
  }
}

// Non-fp8 inputs: one floating dtype for A and B, D in it or f32, f64 on the CPU only, no fp8 scaling.
void check_plain_inputs(Context& ctx, OpCheck& check, const Tensor& d, const Tensor& a, const Tensor& b,
                        const GemmOptions& opt, const std::string& call) {
  check.dtype_in("a", a, {DType::F32, DType::F16, DType::BF16, DType::F64});
  check.same_dtype({{"a", a}, {"b", b}});
  if (a.dtype() == DType::F64) {
    check.dtype("d", d, DType::F64);
    check.that(!ctx.is_cuda(), "f64 runs on the CPU only; got ", call);
  } else if (d.dtype() != a.dtype()) {
    check.dtype("d", d, DType::F32);
  }
  check.that(!opt.a_scale.defined() && !opt.b_scale.defined() && opt.a_scale_layout == Fp8ScaleLayout::Tensor &&
                 opt.b_scale_layout == Fp8ScaleLayout::Tensor,
             "a_scale / b_scale and their layouts are for fp8 inputs only; got ", call);
  check.that(!opt.d_amax_out.defined(), "d_amax_out is for fp8 inputs only; got ", call);
}

// d_scale and d_amax_out: for an fp8 D only, each an f32[1] on the op's device.
void check_fp8_output(Context& ctx, OpCheck& check, const Tensor& d, const GemmOptions& opt,
                      const std::string& call) {
  if (opt.d_scale.defined()) {
    check.that(is_fp8(d.dtype()), "d_scale is for an fp8 output D only; got ", call);
    check.device(ctx, {{"d_scale", opt.d_scale}});
    check.that(is_scalar_f32(opt.d_scale), "d_scale must be f32[1], got ", opt.d_scale.describe());
  }
  if (opt.d_amax_out.defined()) {
    // cuBLASLt computes amax(D) only for fp8 outputs of fp8 inputs (other outputs are rejected).
    check.that(is_fp8(d.dtype()), "d_amax_out is for an fp8 output D only; got ", call);
    check.device(ctx, {{"d_amax_out", opt.d_amax_out}});
    check.that(is_scalar_f32(opt.d_amax_out), "d_amax_out must be f32[1], got ", opt.d_amax_out.describe());
  }
}

// The bias, gelu_input_out and gelu_input tensors against the epilogue that reads or writes them.
void check_epilogue_tensors(Context& ctx, OpCheck& check, const Tensor& d, const GemmOptions& opt, const GemmDims& g,
                            bool fp8, const std::string& call) {
  const bool has_bias = opt.epilogue == GemmEpilogue::Bias || opt.epilogue == GemmEpilogue::BiasGelu;
  const bool has_gelu = opt.epilogue == GemmEpilogue::Gelu || opt.epilogue == GemmEpilogue::BiasGelu;
  if (has_bias) {
    check.device(ctx, {{"bias", opt.bias}});
    check.shape("bias", opt.bias, Shape{g.n});
    DType bias_dtype = !fp8 ? d.dtype() : (d.dtype() == DType::F16 ? DType::F16 : DType::BF16);
    check.dtype("bias", opt.bias, bias_dtype);
  } else {
    check.that(!opt.bias.defined(), "a bias tensor was given but the epilogue is ",
               gemm_epilogue_name(opt.epilogue), " (use Bias or BiasGelu)");
  }
  if (opt.gelu_input_out.defined()) {
    check.that(has_gelu, "gelu_input_out needs the gelu or bias+gelu epilogue, got ", gemm_epilogue_name(opt.epilogue));
    check.device(ctx, {{"gelu_input_out", opt.gelu_input_out}});
    check.shape("gelu_input_out", opt.gelu_input_out, d.shape());
    check.dtype("gelu_input_out", opt.gelu_input_out, d.dtype());
  }
  if (opt.epilogue == GemmEpilogue::DGelu) {
    check.that(!fp8 && opt.beta == 0.0f, "the dgelu epilogue needs non-fp8 inputs and beta == 0; got beta ", opt.beta,
               ", ", call);
    check.defined("gelu_input", opt.gelu_input);
    check.device(ctx, {{"gelu_input", opt.gelu_input}});
    check.shape("gelu_input", opt.gelu_input, d.shape());
    check.dtype("gelu_input", opt.gelu_input, d.dtype());
  } else {
    check.that(!opt.gelu_input.defined(), "gelu_input is read by the dgelu epilogue only, got ",
               gemm_epilogue_name(opt.epilogue));
  }
}

// bias_grad_out: a 2-D, non-fp8 call with alpha 1 and the none epilogue; shape [M], D's dtype.
void check_bias_grad(Context& ctx, OpCheck& check, const Tensor& d, const GemmOptions& opt, const GemmDims& g,
                     bool fp8, const std::string& call) {
  check.device(ctx, {{"bias_grad_out", opt.bias_grad_out}});
  check.that(opt.epilogue == GemmEpilogue::None, "bias_grad_out needs the none epilogue, got ",
             gemm_epilogue_name(opt.epilogue));
  check.that(!g.batched && !fp8 && opt.alpha == 1.0f,
             "bias_grad_out needs a 2-D, non-fp8 call with alpha == 1; got alpha ", opt.alpha, ", ", call);
  check.that(g.n >= 1 && g.k >= 1, "bias_grad_out needs N >= 1 and K >= 1; got ", call);
  check.shape("bias_grad_out", opt.bias_grad_out, Shape{g.m});
  check.dtype("bias_grad_out", opt.bias_grad_out, d.dtype());
}

GemmDims validate(Context& ctx, const Tensor& d, const Tensor& a, const Tensor& b, const GemmOptions& opt) {
  OpCheck check("gemm");
  check.device(ctx, {{"d", d}, {"a", a}, {"b", b}});
  const std::string call = describe_call(d, a, b, opt);
  GemmDims g = check_shapes(check, d, a, b, opt, call);

  const bool fp8 = is_fp8(a.dtype()) || is_fp8(b.dtype());
  if (fp8) check_fp8_inputs(ctx, check, d, a, b, opt, g, call);
  else check_plain_inputs(ctx, check, d, a, b, opt, call);
  check_fp8_output(ctx, check, d, opt, call);

  check_epilogue_tensors(ctx, check, d, opt, g, fp8, call);
  if (opt.bias_grad_out.defined()) check_bias_grad(ctx, check, d, opt, g, fp8, call);
  if (g.k == 0) {
    check.that(opt.epilogue == GemmEpilogue::None && !fp8 && (opt.beta == 0.0f || opt.beta == 1.0f),
               "K == 0 is supported only with the none epilogue, non-fp8 inputs and beta 0 or 1; got ", call);
  }
  check.that(g.batch <= INT32_MAX, "batch ", g.batch, " exceeds the int32 batch count of cuBLASLt");
  return g;
}

}  // namespace

void gemm(Context& ctx, const Tensor& d, const Tensor& a, const Tensor& b, const GemmOptions& opt) {
  GemmDims g = validate(ctx, d, a, b, opt);
  MEGATRON_DISPATCH(ctx, cuda::gemm(ctx, d, a, b, opt, g), cpu::gemm(ctx, d, a, b, opt, g));
}

}  // namespace megatron::ops
