#include "megatron/nn/parameter.h"

#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::nn {

DType main_grad_dtype(DType param_dtype) {
  MEGATRON_CHECK(param_dtype == DType::F32 || param_dtype == DType::BF16 || param_dtype == DType::F16 ||
                     param_dtype == DType::F64,
                 "parameters are F32, BF16, F16 or F64; got ", dtype_name(param_dtype));
  return param_dtype == DType::F64 ? DType::F64 : DType::F32;
}

Parameter make_parameter(Context& ctx, std::string name, const Shape& shape, DType dtype, bool no_weight_decay) {
  Parameter p;
  p.name = std::move(name);
  p.value = ctx.empty(shape, dtype);
  p.main_grad = ctx.empty(shape, main_grad_dtype(dtype));
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
  ops::fill_normal(ctx, p.value, seed, parameter_name_hash(p.name), 0.0, std, 0);
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
