#include "megatron/ops/microscaling/microscaling.h"

#include <utility>
#include <vector>

#include "megatron/ops/microscaling/cpu.h"
#include "megatron/tensor/op_checks.h"

namespace megatron::ops {

namespace {

using enum DType;

// Checks shared by both directions: the CPU, the [rows, cols] view of the float tensor `x` (cols a multiple
// of 32), and codes / scales against it.
void check_mx_args(Context& ctx, OpCheck& check, const char* x_name, const Tensor& x, const Tensor& codes,
                   const Tensor& scales, MxElement element) {
  check.that(!ctx.is_cuda(), "runs on the CPU only: MX block scaling (MXFP8, MXFP4) is a Blackwell (sm_100) "
             "tensor-core format that Hopper cannot run, so there are no CUDA kernels for it; got a context on ",
             ctx.device());
  check.device(ctx, {{x_name, x}, {"codes", codes}, {"scales", scales}});
  check.that(element == MxElement::E4M3 || element == MxElement::E5M2 || element == MxElement::E2M1,
             "invalid MxElement code ", int(element));
  check.dtype_in(x_name, x, {F32, F64, BF16, F16});
  check.that(x.rank() >= 1 && x.shape().cols() % kMxBlock == 0, "argument ", x_name, " is ", x.describe(),
             ": its last dimension must be a multiple of the MX block size ", kMxBlock);
  check.dtype("codes", codes, mx_codes_dtype(element));
  check.dtype("scales", scales, U8);
  auto check_shape = [&](const char* name, const Tensor& t, const Shape& want) {
    check.that(t.rank() >= 1 && t.shape().cols() == want.cols() && t.numel() == want.numel(), "argument ", name,
               " is ", t.describe(), " but must be ", want, " (or any leading dimensions whose product is ",
               want.rows(), ") for ", x_name, " ", x.describe(), " with ", mx_element_name(element), " elements");
  };
  check_shape("codes", codes, mx_codes_shape(x.shape(), element));
  check_shape("scales", scales, mx_scales_shape(x.shape()));
}

}  // namespace

DType mx_codes_dtype(MxElement element) {
  return element == MxElement::E4M3 ? F8E4M3 : element == MxElement::E5M2 ? F8E5M2 : U8;
}

Shape mx_codes_shape(const Shape& in, MxElement element) {
  std::vector<int64_t> dims = in.dims();
  MEGATRON_CHECK(!dims.empty(), "mx_codes_shape: a rank-0 shape has no last dimension to block");
  if (element == MxElement::E2M1) dims.back() /= 2;
  return Shape(std::move(dims));
}

Shape mx_scales_shape(const Shape& in) {
  std::vector<int64_t> dims = in.dims();
  MEGATRON_CHECK(!dims.empty(), "mx_scales_shape: a rank-0 shape has no last dimension to block");
  dims.back() /= kMxBlock;
  return Shape(std::move(dims));
}

void mx_quantize(Context& ctx, const Tensor& codes, const Tensor& scales, const Tensor& in, MxElement element) {
  OpCheck check("mx_quantize");
  check_mx_args(ctx, check, "in", in, codes, scales, element);
  if (in.numel() == 0) return;
  cpu::mx_quantize(codes, scales, in, element);
}

void mx_dequantize(Context& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales, MxElement element) {
  OpCheck check("mx_dequantize");
  check_mx_args(ctx, check, "out", out, codes, scales, element);
  if (out.numel() == 0) return;
  cpu::mx_dequantize(out, codes, scales, element);
}

}  // namespace megatron::ops
