"""FP8 linear for the PyTorch peer: torchao's float8 training recipe with dynamic tensorwise scaling
(torchao.float8's default Float8LinearConfig, recipe "tensorwise"), written out with torch._scaled_mm.

For y = x W^T (x [..., K], W [N, K]) the three GEMMs of forward + backward run in FP8:

  forward   y  = _scaled_mm(x8,            W8^T (column-major view),   1/s_x, 1/s_w)   fast accumulation on
  dgrad     dx = _scaled_mm(g8,            W8 made column-major,       1/s_g, 1/s_w)   fast accumulation off
  wgrad     dW = _scaled_mm((g8^T) row-major, x8 made column-major,    1/s_g, 1/s_x)   fast accumulation off

x8 and W8 are float8_e4m3fn, g8 (the gradient of y) float8_e5m2. Each has its own scale, computed afresh every
call from the whole tensor (dynamic tensorwise): s = finfo(fp8).max / max(amax, 1e-12), amax = max |t|,
computed in float64 and rounded to float32 (torchao does so to get the same number in eager and compiled
code); the cast is t.float() * s clamped to +-finfo(fp8).max (saturating), then rounded to the fp8 type.
_scaled_mm multiplies its result by scale_a * scale_b, so it gets the reciprocals 1/s. Its first operand must
be row-major and its second column-major: the forward's W8^T is a free transposed view of the row-major W8;
dgrad and wgrad need copies (W8^T materialised, g8^T and x8^T materialised), as torchao's preprocess_addmm
makes them (under torch.compile inductor writes those layouts straight from the cast kernels).

Dtypes, as torchao gives a user of a model with fp32 parameters under bf16 autocast:
  - x is cast to the autocast dtype first (Float8Linear repeats F.linear's autocast cast), so amax/scale are
    taken over the bf16 activation;
  - W is the fp32 parameter itself: torchao scales and casts the fp32 weight straight to fp8 (its amax over
    the fp32 values); autocast only relabels the float8 weight's "original dtype", it does not round W to bf16
    first;
  - the outputs (y, dx, dW) are in the dtype of the GEMM's first operand before quantisation: bf16 under
    autocast (fp32 without it); dW is handed back to the fp32 parameter's gradient (autograd widens it).
  - a bias (if any) is added afterwards in the output dtype: y + b.to(y.dtype).

Backward reuses the forward's x8 and W8 (torchao saves bf16 x and W8 and casts x again: with one scale per
tensor that gives the same fp8 values; under torch.compile the partitioner picks what to keep anyway).
Under torch.compile with inductor's default settings the fused cast kernel skips the bf16 rounding of the
autocast copy of x (x fp32 -> bf16 -> fp32 * s becomes x fp32 * s), so x8 can differ from eager's by an fp8
rounding step here and there (torchao's Float8Linear gets the same; emulate_precision_casts=True restores
eager's numbers exactly; check_fp8_linear.py --compile shows both). Needs torch >= 2.4 (the float8 dtypes,
torch._scaled_mm's current signature, torch.get_autocast_dtype).
"""
import torch

E4M3 = torch.float8_e4m3fn  # input and weight (torchao's default for both)
E5M2 = torch.float8_e5m2  # grad_output (torchao's default)
EPS = 1e-12  # torchao.float8.float8_utils.EPS: the floor on amax


def tensorwise_scale(t: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """finfo(fp8_dtype).max / max(amax(t), EPS) as a float32 scalar tensor (the amax in float64, then rounded)."""
    amax = t.detach().abs().max().to(torch.float64)
    return (torch.finfo(fp8_dtype).max / torch.clamp(amax, min=EPS)).to(torch.float32)


def to_float8(t: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """t * scale in fp32, saturated to the fp8 type's finite range, rounded to fp8 (nearest even)."""
    fmax = torch.finfo(fp8_dtype).max
    return (t.detach().to(torch.float32) * scale).clamp(min=-fmax, max=fmax).to(fp8_dtype)


def _column_major(t: torch.Tensor) -> torch.Tensor:
    """The same matrix laid out column-major (a copy unless it already is)."""
    return t.t().contiguous().t()


class Fp8TensorwiseMatmul(torch.autograd.Function):
    """y = x W^T with the three GEMMs in FP8 (see the module docstring); x [..., K] in the compute dtype, W [N, K]
    in any float dtype. Returns y [..., N] in x's dtype; gradients in x's and W's dtypes."""

    @staticmethod
    def forward(ctx, x, w):
        with torch.autocast(device_type=x.device.type, enabled=False):  # _scaled_mm takes its dtypes as given
            out_dtype = x.dtype
            x2 = x.reshape(-1, x.shape[-1])
            s_x, s_w = tensorwise_scale(x2, E4M3), tensorwise_scale(w, E4M3)
            x8, w8 = to_float8(x2, s_x, E4M3), to_float8(w, s_w, E4M3)
            y = torch._scaled_mm(x8, w8.t(), scale_a=s_x.reciprocal(), scale_b=s_w.reciprocal(),
                                 out_dtype=out_dtype, use_fast_accum=True)
        ctx.save_for_backward(x8, w8, s_x, s_w)
        ctx.x_shape, ctx.w_dtype = x.shape, w.dtype
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, grad_y):
        x8, w8, s_x, s_w = ctx.saved_tensors
        with torch.autocast(device_type=grad_y.device.type, enabled=False):
            g2 = grad_y.reshape(-1, grad_y.shape[-1])
            s_g = tensorwise_scale(g2, E5M2)
            g8 = to_float8(g2, s_g, E5M2)
            inv_g = s_g.reciprocal()
            grad_x = grad_w = None
            if ctx.needs_input_grad[0]:  # dx [M, K] = g [M, N] @ W [N, K]
                grad_x = torch._scaled_mm(g8, _column_major(w8), scale_a=inv_g, scale_b=s_w.reciprocal(),
                                          out_dtype=grad_y.dtype, use_fast_accum=False).reshape(ctx.x_shape)
            if ctx.needs_input_grad[1]:  # dW [N, K] = g^T [N, M] @ x [M, K]
                grad_w = torch._scaled_mm(g8.t().contiguous(), _column_major(x8), scale_a=inv_g,
                                          scale_b=s_x.reciprocal(), out_dtype=grad_y.dtype,
                                          use_fast_accum=False).to(ctx.w_dtype)
        return grad_x, grad_w


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) with torchao's dynamic tensorwise FP8 recipe. Under autocast x is first cast
    to the autocast dtype (as F.linear would be); the weight goes to fp8 from its own dtype (the fp32 parameter)."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        x = x.to(torch.get_autocast_dtype(dev))
    y = Fp8TensorwiseMatmul.apply(x, weight)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y

