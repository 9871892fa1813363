// Parameter: one trainable tensor of a module, its gradient buffer, and what the optimizer needs to know.
//
// Contract:
// - `value` holds the weights in the parameter dtype (F32, BF16, F16, or F64 for CPU gradient checks).
// - `main_grad` has value's shape and is F32 (F64 when the parameter is F64). Backward passes accumulate
//   into it (+=) across micro-batches; zero_grad() assigns zeros (the trainer calls it once per iteration).
// - `name` is Megatron-core's state-dict key ("decoder.layers.3.self_attention.linear_qkv.weight"), so
//   checkpoints and logs line up with Megatron.
// - `no_weight_decay` follows Megatron's rule: biases and 1-D parameters (norm weights) are not decayed.
// - `placement` (placement.h) says where it lives in the parallel layout and how its gradient is completed;
//   with a tensor-parallel (or, for an expert parameter, expert-parallel and expert-TP) split, `value` is this
//   rank's piece of the whole (TP = EP = 1) parameter, and its initial values equal that piece of the
//   TP = EP = 1 initialisation.
// Modules own their Parameters as members; ParameterList is a view (pointers) the optimizer walks. A tied
// weight appears once in the list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/nn/placement.h"
#include "megatron/runtime/context.h"

namespace megatron::nn {

struct Parameter {
  std::string name;
  Tensor value;
  Tensor main_grad;
  bool no_weight_decay = false;
  Placement placement;

  // --fp8-param-gather: an FP8 linear's weight, which the distributed optimizer keeps in FP8. The model marks it
  // (keep_in_fp8) before the gradient buffers are built; those then make `value` an F8E4M3 view of their FP8
  // buffer, `fp8_scale_inv` (F32 [1]) the factor that dequantises it (value * fp8_scale_inv ~ the weight), and
  // `fp8_stands_for` the parameter dtype it replaces (what checkpoints save it as). The fp32 master weights the
  // optimizer updates are the only high-precision copy (optim/distributed_optimizer.h).
  bool keep_in_fp8 = false;
  Tensor fp8_scale_inv;
  DType fp8_stands_for = DType::F32;

  // The dtype the parameter stands for: value's, or for a weight kept in FP8 the parameter dtype it replaces.
  bool stored_in_fp8() const { return value.defined() && is_fp8(value.dtype()); }
  DType dtype() const { return stored_in_fp8() ? fp8_stands_for : value.dtype(); }

  // Whether the module has this (optional) parameter at all -- not whether its value is bound: under FSDP's
  // sharded parameters (distributed/distributed_data_parallel.h) the value exists only while its module group
  // runs. make_parameter names every parameter it makes.
  bool defined() const { return !name.empty(); }
};

using ParameterList = std::vector<Parameter*>;

// Allocates value and main_grad (zeroed) on ctx's device; `value` is left uninitialised. `shape` is the whole
// (TP = EP = 1) shape; with a sharded placement.tp the tensors get this rank's piece of it (the split dimension
// divided by tp.size, which must divide it into tp.blocks equal parts of equal slices), and an expert
// parameter's dimension 0 is further divided by placement.ep.size (parameter_shard.h).
Parameter make_parameter(Context& ctx, std::string name, const Shape& shape, DType dtype, bool no_weight_decay,
                         Placement placement = {});

// F32 for BF16/F16/F32 parameters, F64 for F64 parameters.
DType main_grad_dtype(DType param_dtype);

// Megatron's init, drawn from Philox so the values do not depend on device or layout:
// value = normal(0, std) with offset = parameter_name_hash(name), addressed by the element's index in the
// whole (TP = EP = 1) tensor, so every rank's piece equals the same piece of the TP = EP = 1 initialisation
// (EP = 1 and EP = 4 initialise every expert identically).
void init_normal(Context& ctx, Parameter& p, uint64_t seed, double std);
// value = normal(mean, std) from Philox (seed, offset), addressed by whole-tensor element index (as above).
void fill_parameter_normal(Context& ctx, Parameter& p, uint64_t seed, uint64_t offset, double mean, double std);
// value = constant (norm weights 1, biases 0).
void init_constant(Context& ctx, Parameter& p, double value);

// A stable 64-bit hash of a parameter name (FNV-1a), the Philox offset of its init.
uint64_t parameter_name_hash(const std::string& name);

void zero_grads(Context& ctx, const ParameterList& params);
int64_t count_elements(const ParameterList& params);

}  // namespace megatron::nn
