// ColumnParallelLinear: Megatron's column-parallel linear layer (tensor_parallel/layers.py), y = x W^T + b with
// W [out, in] split by output rows over the TP ranks: rank r holds W_r [out / TP, in] and b_r [out / TP]
// (with `blocks` > 1, the r-th slice of each of the blocks, e.g. SwiGLU's [gate_r; up_r]), and computes
// y_r = x W_r^T + b_r, its columns of y.
//
// Collectives (parallel/mappings.h):
//   without sequence parallelism: x is the whole input on every rank (copy_to_tp: identity forward); backward
//     all-reduces dx (overlapped with the weight-gradient GEMM on CUDA);
//   with sequence parallelism: x is this rank's token rows; forward all-gathers them (gather_from_sp) before
//     the GEMM; backward re-gathers the saved shard (overlapped with the dx GEMM: only the shard is kept for
//     backward, as Megatron does) and reduce-scatters dx (overlapped with the weight-gradient GEMM);
//   gather_output: y is all-gathered along its last dimension (gather_from_tp), so every rank gets [rows, out].
// At TP = 1 the layer is exactly linear_forward/linear_backward: no collective, copy or extra pass.
//
// forward(ctx, y, x, gelu_input_out): x [rows_x, in] (rows_x = rows / TP under SP, else rows), y [rows, out / TP]
//   ([rows, out] with gather_output); gelu_input_out as in linear.h (not with gather_output). Returns what
//   backward needs: x (under SP only this rank's shard, re-gathered in backward, as Megatron does).
// backward(ctx, saved, dx, dy): dy like y, dx like x (assigned; undefined: not wanted, no collective either);
//   main grads accumulated (+=). Consumes `saved` and `dy`. dy may be a produced operand (linear_operand.h,
//   e.g. SwiGLU's input gradient): an FP8 layer computes it inside the gradient's cast and drops the op's
//   inputs before its GEMMs; any other layer materialises it.
// enable_fp8(state): the layer's three GEMMs run in FP8 from now on (fp8_linear.h), registered with the model
//   chunk's scaling state; under sequence parallelism the forward gathers the input in the parameter dtype and
//   keeps the whole input's FP8 transpose for the backward (no re-gather). Not with gather_output.
// column_parallel_linear_forward/backward: the same on borrowed parameters (the output layer, whose weight may
// be the tied word embeddings' shard).
#pragma once

#include <memory>
#include <string>

#include "megatron/nn/fp8_linear.h"
#include "megatron/nn/linear.h"
#include "megatron/parallel/tensor_parallel.h"

namespace megatron::nn {

void column_parallel_linear_forward(Context& ctx, const parallel::TensorParallel& tp, const Tensor& y, const Tensor& x,
                                    const Parameter& weight, const Parameter* bias,
                                    const Tensor& gelu_input_out = Tensor());
void column_parallel_linear_backward(Context& ctx, const parallel::TensorParallel& tp, const Tensor& dx,
                                     const Tensor& dy, const Tensor& x, Parameter& weight, Parameter* bias);

struct ColumnParallelOptions {
  bool gather_output = false;
  int blocks = 1;  // Megatron's partition_stride: the output rows are `blocks` parts, each split over TP
};

class ColumnParallelLinear {
 public:
  ColumnParallelLinear() = default;
  // in_features, out_features: the whole layer's. Parameters "<name>.weight" [out / TP, in], "<name>.bias" [out / TP].
  ColumnParallelLinear(Context& ctx, const std::string& name, int64_t in_features, int64_t out_features, bool bias,
                       DType dtype, const parallel::TensorParallel& tp, ColumnParallelOptions options = {});

  // weight ~ normal(0, std) by whole-tensor element index (this rank's rows of the TP = 1 init), bias = 0.
  void init(Context& ctx, uint64_t seed, double std);
  [[nodiscard]] LinearSaved forward(Context& ctx, const Tensor& y, const Tensor& x,
                                    const Tensor& gelu_input_out = Tensor()) const;
  void backward(Context& ctx, LinearSaved&& saved, const Tensor& dx, LinearOperand dy);
  void collect_parameters(ParameterList& out);
  // sequence_group: the CP group when the activations are split along the sequence (else null).
  void enable_fp8(const std::shared_ptr<Fp8ScalingState>& state, comm::Communicator* sequence_group = nullptr);
  bool fp8() const { return fp8_.enabled(); }

  int64_t in_features() const { return weight.value.dim(1); }
  int64_t out_features() const { return weight.value.dim(0); }  // this rank's (out / TP)

  Parameter weight;
  Parameter bias;  // undefined without bias

 private:
  LinearSaved fp8_forward(Context& ctx, const Tensor& y, const Tensor& x, const Tensor& gelu_input_out) const;
  void fp8_backward(Context& ctx, const LinearSaved& saved, const Tensor& dx, LinearOperand&& dy);
  // The weight and the output gradient are split over TP; the input is whole.
  Fp8TensorSplit fp8_split() const {
    return {.group = tp_.group.get(), .input = false, .weight = true, .grad = true, .sequence_group = sequence_group_};
  }

  parallel::TensorParallel tp_;
  ColumnParallelOptions options_;
  Fp8Site fp8_;
  comm::Communicator* sequence_group_ = nullptr;  // FP8 under context parallelism: the CP group
};

}  // namespace megatron::nn
