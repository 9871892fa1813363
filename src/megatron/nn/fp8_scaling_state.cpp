#include "megatron/nn/fp8_scaling_state.h"

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/fp8/fp8.h"

namespace megatron::nn {

float fp8_max(DType fp8) {
  switch (fp8) {
    case DType::F8E4M3: return 448.0f;
    case DType::F8E5M2: return 57344.0f;
    default: MEGATRON_FAIL("fp8_max: ", dtype_name(fp8), " is not an fp8 dtype");
  }
}

int Fp8ScalingState::add_linear(const std::string& name) {
  MEGATRON_CHECK(!fwd_history_.defined(), "Fp8ScalingState: linear '", name, "' registered after allocate()");
  names_.push_back(name);
  weights_.push_back(nullptr);
  return int(names_.size()) - 1;
}

void Fp8ScalingState::allocate(Context& ctx) {
  MEGATRON_CHECK(recipe_.amax_history_len >= 1, "Fp8ScalingState: amax history length ", recipe_.amax_history_len,
                 " must be >= 1");
  const int64_t n = size(), len = recipe_.amax_history_len;
  auto make = [&](Shape shape, double value) {
    Tensor t = ctx.empty(std::move(shape), DType::F32);
    ops::fill(ctx, t, value);
    return t;
  };
  fwd_history_ = make({len, 2 * n}, 0.0);
  fwd_scale_ = make({2 * n}, 1.0);
  fwd_scale_inv_ = make({2 * n}, 1.0);
  bwd_history_ = make({len, n}, 0.0);
  bwd_scale_ = make({n}, 1.0);
  bwd_scale_inv_ = make({n}, 1.0);
}

Fp8TensorScaling Fp8ScalingState::column(const Tensor& history, const Tensor& scale, const Tensor& scale_inv,
                                         int64_t c) {
  return {.amax = history.select(0).slice(c, c + 1),
          .scale = scale.slice(c, c + 1),
          .scale_inv = scale_inv.slice(c, c + 1)};
}

Fp8TensorScaling Fp8ScalingState::input(int linear) const {
  return column(fwd_history_, fwd_scale_, fwd_scale_inv_, 2 * int64_t(linear));
}
Fp8TensorScaling Fp8ScalingState::weight(int linear) const {
  return column(fwd_history_, fwd_scale_, fwd_scale_inv_, 2 * int64_t(linear) + 1);
}
Fp8TensorScaling Fp8ScalingState::grad(int linear) const {
  return column(bwd_history_, bwd_scale_, bwd_scale_inv_, linear);
}

const Fp8CastWeight* Fp8ScalingState::cast_weight(int linear) const { return weights_.at(size_t(linear)).get(); }

void Fp8ScalingState::set_cast_weight(int linear, Fp8CastWeight cast) {
  weights_.at(size_t(linear)) = std::make_unique<Fp8CastWeight>(std::move(cast));
}

Fp8Site register_fp8_linear(const std::shared_ptr<Fp8ScalingState>& state, const std::string& weight_name) {
  const std::string suffix = ".weight";
  MEGATRON_CHECK(weight_name.size() > suffix.size() && weight_name.ends_with(suffix), "FP8 linear: weight '",
                 weight_name, "' is not named <linear>.weight");
  return Fp8Site{.state = state, .index = state->add_linear(weight_name.substr(0, weight_name.size() - suffix.size()))};
}

void Fp8ScalingState::invalidate_weights() {
  for (auto& w : weights_) w.reset();
}

namespace {

// The (history or vector) element pieces of linear `i`'s packed state: where each of its three columns lives.
struct PackedColumn {
  const Tensor* history;
  const Tensor* scale;
  const Tensor* scale_inv;
  int64_t column;
};

// Copies between row `r` of a packed [L + 2, 3] state and the state's tensors (to_packed: state -> packed).
void copy_packed(Context& ctx, const Tensor& packed, const PackedColumn (&cols)[3], int64_t len, bool to_packed) {
  for (int64_t r = 0; r < len + 2; ++r)
    for (int64_t c = 0; c < 3; ++c) {
      const PackedColumn& pc = cols[c];
      const Tensor& src = r < len ? pc.history->select(r) : (r == len ? *pc.scale : *pc.scale_inv);
      const Tensor state_elem = src.slice(pc.column, pc.column + 1);
      const Tensor packed_elem = packed.select(r).slice(c, c + 1);
      if (to_packed) ops::copy(ctx, packed_elem, state_elem);
      else ops::copy(ctx, state_elem, packed_elem);
    }
}

}  // namespace

Tensor Fp8ScalingState::packed_linear_state(Context& ctx, int linear) const {
  const int64_t len = recipe_.amax_history_len;
  Tensor packed = ctx.empty({len + 2, 3}, DType::F32);
  const PackedColumn cols[3] = {{&fwd_history_, &fwd_scale_, &fwd_scale_inv_, 2 * int64_t(linear)},
                                {&fwd_history_, &fwd_scale_, &fwd_scale_inv_, 2 * int64_t(linear) + 1},
                                {&bwd_history_, &bwd_scale_, &bwd_scale_inv_, linear}};
  copy_packed(ctx, packed, cols, len, true);
  return packed;
}

void Fp8ScalingState::unpack_linear_state(Context& ctx, int linear, const Tensor& packed) {
  const int64_t len = recipe_.amax_history_len;
  MEGATRON_CHECK(packed.shape() == Shape({len + 2, 3}), "FP8 scaling state of ", name(linear), ": got ",
                 packed.describe(), ", expected [", len + 2, ", 3] (amax history length ", len, ")");
  const PackedColumn cols[3] = {{&fwd_history_, &fwd_scale_, &fwd_scale_inv_, 2 * int64_t(linear)},
                                {&fwd_history_, &fwd_scale_, &fwd_scale_inv_, 2 * int64_t(linear) + 1},
                                {&bwd_history_, &bwd_scale_, &bwd_scale_inv_, linear}};
  copy_packed(ctx, packed, cols, len, false);
  invalidate_weights();
}

void Fp8ScalingState::end_iteration(Context& ctx, comm::Communicator* amax_group) {
  invalidate_weights();
  if (recipe_.scaling != Fp8Scaling::Delayed || size() == 0) return;
  if (amax_group != nullptr && amax_group->size() > 1) {
    amax_group->all_reduce(fwd_history_, comm::ReduceOp::Max, ctx.stream());
    amax_group->all_reduce(bwd_history_, comm::ReduceOp::Max, ctx.stream());
  }
  ops::fp8_delayed_scaling_update(ctx, fwd_history_, fwd_scale_, fwd_scale_inv_, fp8_max(recipe_.forward_dtype()),
                                  recipe_.margin, recipe_.amax_compute_max);
  ops::fp8_delayed_scaling_update(ctx, bwd_history_, bwd_scale_, bwd_scale_inv_, fp8_max(recipe_.grad_dtype()),
                                  recipe_.margin, recipe_.amax_compute_max);
}

}  // namespace megatron::nn
