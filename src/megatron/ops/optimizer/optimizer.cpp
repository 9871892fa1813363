#include "megatron/ops/optimizer/optimizer.h"

#include <cmath>
#include <string>

#include "megatron/ops/optimizer/cpu.h"
#include "megatron/ops/dispatch.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/optimizer/cuda.h"
#endif

namespace megatron::ops {
namespace {

void check_float(OpCheck& check, const Context& ctx, const std::string& name, const Tensor& t) {
  if (ctx.is_cuda()) check.dtype_in(name.c_str(), t, {DType::F32, DType::BF16, DType::F16});
  else check.dtype_in(name.c_str(), t, {DType::F32, DType::BF16, DType::F16, DType::F64});
}

void check_stat(OpCheck& check, const Context& ctx, const std::string& name, const Tensor& t) {
  if (ctx.is_cuda()) check.dtype(name.c_str(), t, DType::F32);
  else check.dtype_in(name.c_str(), t, {DType::F32, DType::F64});
}

}  // namespace

void adamw_step(Context& ctx, const std::vector<AdamParamGroupTensors>& tensors, const AdamWConfig& config) {
  OpCheck check("adamw_step");
  check.that(config.step >= 1, "step is ", config.step, " but must be >= 1 (1-based)")
      .that(config.beta1 >= 0 && config.beta1 < 1, "beta1 is ", config.beta1, " but must be in [0, 1)")
      .that(config.beta2 >= 0 && config.beta2 < 1, "beta2 is ", config.beta2, " but must be in [0, 1)")
      .that(std::isfinite(config.lr) && std::isfinite(config.eps) && std::isfinite(config.grad_scale),
            "lr (", config.lr, "), eps (", config.eps, ") and grad_scale (", config.grad_scale, ") must be finite");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamParamGroupTensors& e = tensors[i];
    const std::string at = str_cat("tensors[", i, "].");
    const std::string param = at + "param", m = at + "exp_avg", v = at + "exp_avg_sq", g = at + "grad",
                      out = at + "model_param";
    check.device(ctx, {{param.c_str(), e.param}, {m.c_str(), e.exp_avg}, {v.c_str(), e.exp_avg_sq}, {g.c_str(), e.grad}});
    check_stat(check, ctx, param, e.param);
    check.dtype(m.c_str(), e.exp_avg, e.param.dtype()).dtype(v.c_str(), e.exp_avg_sq, e.param.dtype());
    check_float(check, ctx, g, e.grad);
    const int64_t n = e.param.numel();
    check.numel(m.c_str(), e.exp_avg, n).numel(v.c_str(), e.exp_avg_sq, n).numel(g.c_str(), e.grad, n);
    if (e.model_param.defined()) {
      check.device(ctx, {{out.c_str(), e.model_param}}).numel(out.c_str(), e.model_param, n);
      check_float(check, ctx, out, e.model_param);
    }
    if (e.weight_decay) check.that(std::isfinite(*e.weight_decay), at, "weight_decay is ", *e.weight_decay);
  }
  MEGATRON_DISPATCH(ctx, cuda::adamw_step(ctx, tensors, config), cpu::adamw_step(tensors, config));
}

void multi_tensor_l2_norm(Context& ctx, const Tensor& out, const Tensor& per_tensor_out,
                          const std::vector<Tensor>& tensors) {
  OpCheck check("multi_tensor_l2_norm");
  check.device(ctx, {{"out", out}}).shape("out", out, Shape{1});
  check_stat(check, ctx, "out", out);
  if (per_tensor_out.defined()) {
    check.device(ctx, {{"per_tensor_out", per_tensor_out}})
        .shape("per_tensor_out", per_tensor_out, Shape{int64_t(tensors.size())});
    check_stat(check, ctx, "per_tensor_out", per_tensor_out);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string name = str_cat("tensors[", i, "]");
    check.device(ctx, {{name.c_str(), tensors[i]}});
    check_float(check, ctx, name, tensors[i]);
  }
  MEGATRON_DISPATCH(ctx,
                    cuda::multi_tensor_l2_norm(ctx, out, per_tensor_out, tensors),
                    cpu::multi_tensor_l2_norm(out, per_tensor_out, tensors));
}

void multi_tensor_count_zeros(Context& ctx, const Tensor& out, const std::vector<Tensor>& tensors) {
  OpCheck check("multi_tensor_count_zeros");
  check.device(ctx, {{"out", out}}).shape("out", out, Shape{1}).dtype("out", out, DType::I64);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string name = str_cat("tensors[", i, "]");
    check.device(ctx, {{name.c_str(), tensors[i]}});
    check_float(check, ctx, name, tensors[i]);
  }
  MEGATRON_DISPATCH(ctx, cuda::multi_tensor_count_zeros(ctx, out, tensors), cpu::multi_tensor_count_zeros(out, tensors));
}

void multi_tensor_scale(Context& ctx, const std::vector<Tensor>& outs, const Tensor& found_inf,
                        const std::vector<Tensor>& ins, float scale) {
  OpCheck check("multi_tensor_scale");
  check.that(outs.size() == ins.size(), "got ", outs.size(), " outputs for ", ins.size(), " inputs");
  if (found_inf.defined())
    check.device(ctx, {{"found_inf", found_inf}})
        .shape("found_inf", found_inf, Shape{1})
        .dtype_in("found_inf", found_inf, {DType::F32, DType::I32});
  for (size_t i = 0; i < ins.size(); ++i) {
    const std::string in = str_cat("ins[", i, "]"), out = str_cat("outs[", i, "]");
    check.device(ctx, {{in.c_str(), ins[i]}, {out.c_str(), outs[i]}});
    check_float(check, ctx, in, ins[i]);
    check_float(check, ctx, out, outs[i]);
    check.numel(out.c_str(), outs[i], ins[i].numel());
    // In place only as an exact alias of the same dtype.
    check.that(outs[i].storage() != ins[i].storage() ||
                   (outs[i].data_ptr() == ins[i].data_ptr() && outs[i].dtype() == ins[i].dtype()),
               out, " (", outs[i].describe(), ") overlaps ", in, " (", ins[i].describe(),
               ") without being the same tensor");
  }
  MEGATRON_DISPATCH(ctx,
                    cuda::multi_tensor_scale(ctx, outs, found_inf, ins, scale),
                    cpu::multi_tensor_scale(outs, found_inf, ins, scale));
}

}  // namespace megatron::ops
