#include "megatron/distributed/finalize_model_grads.h"

#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::distributed {

namespace {

// Sums `grads` over `group` with one all-reduce: they are views scattered over the gradient buffers, so they
// are packed, reduced once and unpacked.
void all_reduce_packed(Context& ctx, const std::vector<Tensor>& grads, comm::Communicator& group) {
  if (grads.empty() || group.size() == 1) return;
  int64_t total = 0;
  for (const Tensor& g : grads) total += g.numel();
  Tensor packed = ctx.empty({total}, grads.front().dtype());
  int64_t at = 0;
  for (const Tensor& g : grads) {
    if (g.numel() > 0) ops::copy(ctx, packed.slice(at, at + g.numel()), g.view({g.numel()}));
    at += g.numel();
  }
  group.all_reduce(packed, comm::ReduceOp::Sum, ctx.stream());
  at = 0;
  for (const Tensor& g : grads) {
    if (g.numel() > 0) ops::copy(ctx, g.view({g.numel()}), packed.slice(at, at + g.numel()));
    at += g.numel();
  }
}

std::vector<Tensor> held_grads(const DistributedDataParallel& ddp, const nn::ParameterList& params) {
  std::vector<Tensor> grads;
  for (const nn::Parameter* p : params) grads.push_back(ddp.held_grad(p));
  return grads;
}

}  // namespace

void all_reduce_grads(Context& ctx, const nn::ParameterList& params, comm::Communicator& group) {
  std::vector<Tensor> grads;
  for (const nn::Parameter* p : params) grads.push_back(p->main_grad);
  all_reduce_packed(ctx, grads, group);
}

void finalize_model_grads(Context& ctx, DistributedDataParallel& ddp, const nn::ParameterList& params,
                          const ModelGradGroups& groups) {
  ddp.finish_grad_sync(ctx);
  nn::ParameterList partial_over_tp, shared_embedding;
  for (nn::Parameter* p : params) {
    if (p->placement.grad_partial_over_tp) partial_over_tp.push_back(p);
    if (p->placement.shared_embedding) shared_embedding.push_back(p);
  }
  if (!partial_over_tp.empty()) {
    MEGATRON_CHECK(groups.tensor_parallel != nullptr, "finalize_model_grads: ", partial_over_tp.size(),
                   " parameters have gradients that are partial over TP (", partial_over_tp.front()->name,
                   ", ...) but no tensor-parallel group was given");
    all_reduce_packed(ctx, held_grads(ddp, partial_over_tp), *groups.tensor_parallel);
  }
  if (!shared_embedding.empty()) {
    MEGATRON_CHECK(groups.embedding != nullptr, "finalize_model_grads: ", shared_embedding.front()->name,
                   " is shared between pipeline stages but this rank is in no embedding group");
    all_reduce_packed(ctx, held_grads(ddp, shared_embedding), *groups.embedding);
  }
}

}  // namespace megatron::distributed
