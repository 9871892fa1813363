// Norm: LayerNorm or RMSNorm over the hidden dimension (Megatron's --normalization), eps = --norm-epsilon.
//
// Parameters: "<name>.weight" [h] (init 1) and, for LayerNorm, "<name>.bias" [h] (init 0); both exempt from
// weight decay. Kept in the parameter dtype. With config.norm_zero_centered_gamma (--apply-layernorm-1p,
// Transformer Engine's zero_centered_gamma) the weight w is initialised to 0 and the norm scales by 1 + w,
// formed in fp32 (fp64 for F64 parameters) at every call, so a bf16 w keeps its precision around the scale 1;
// w's gradient is the scale's.
// forward(ctx, y, x): x [..., h] -> y assigned. Returns what backward needs: x and the statistics (mean,
//   rstd: F32, F64 for F64).
// forward(ctx, y, sum, x, residual): the pre-norm "add then norm" in one pass: sum = x + residual (assigned,
//   rounded to x's dtype), y = norm(sum); the saved input is the sum. The backward is the same: the gradient
//   of the sum reaches both addends unchanged.
// backward(ctx, saved, dx, dy, dresidual): dx = the input gradient + dresidual (when defined: the residual
//   stream's gradient, added in the same pass) assigned; weight/bias main grads accumulated (+=). Consumes
//   `saved`.
// Tensor parallelism: the parameters are replicated over TP. Without sequence parallelism every TP rank
// normalises the same whole tensor and gets the same gradients. Under sequence parallelism each rank
// normalises its token rows only, so the weight/bias gradients accumulate partial sums: the model sums them
// over TP once per iteration (finalize_model_grads, Megatron's all-reduce of
// sequence-parallel gradients) instead of once per norm and micro-batch; their placement says so
// (grad_partial_over_tp).
// Per-head norms (NormShape::per_head, --qk-layernorm's q_layernorm and k_layernorm): the width is the head
// dimension and every head's channels are one row; each TP rank normalises its own heads, so the gradients
// are partial over TP whenever TP > 1, summed the same way (Megatron sums q_layernorm/k_layernorm gradients
// over TP in finalize_model_grads).
#pragma once

#include <string>

#include "megatron/nn/transformer_config.h"
#include "megatron/nn/parameter.h"
#include "megatron/parallel/tensor_parallel.h"

namespace megatron::nn {

// What a norm's forward leaves for its backward.
struct NormSaved {
  Tensor x;           // what was normalised (the sum, for the fused variant)
  Tensor mean, rstd;  // per row; mean only for LayerNorm
};

// What a norm normalises: rows of the hidden size, or (per_head) rows of `width` channels, one per head.
struct NormShape {
  bool per_head = false;
  int64_t width = 0;  // per_head: the head dimension
};

class Norm {
 public:
  Norm() = default;
  Norm(Context& ctx, const std::string& name, const TransformerConfig& config, const parallel::TensorParallel& tp = {},
       NormShape shape = {});
  bool defined() const { return weight.defined(); }

  void init(Context& ctx);
  [[nodiscard]] NormSaved forward(Context& ctx, const Tensor& y, const Tensor& x) const;
  [[nodiscard]] NormSaved forward(Context& ctx, const Tensor& y, const Tensor& sum, const Tensor& x,
                                  const Tensor& residual) const;
  void backward(Context& ctx, NormSaved&& saved, const Tensor& dx, const Tensor& dy,
                const Tensor& dresidual = Tensor());
  void collect_parameters(ParameterList& out);

  Parameter weight;
  Parameter bias;  // LayerNorm only

 private:
  // What the norm kernels take: (weight, bias) as they are, or with a zero-centred weight (1 + weight, bias) in
  // fp32 (the kernels want the two in one dtype).
  struct Affine {
    Tensor scale, bias;
  };
  Affine affine(Context& ctx) const;

  parallel::TensorParallel tp_;
  bool zero_centered_ = false;
  Normalization kind_ = Normalization::LayerNorm;
  float eps_ = 1e-5f;
  DType stats_dtype_ = DType::F32;
};

}  // namespace megatron::nn
