#include "megatron/parallel/tensor_parallel.h"

namespace megatron::parallel {

TensorParallel TensorParallel::create(Context& ctx, std::shared_ptr<comm::Communicator> group, bool sequence_parallel) {
  TensorParallel tp;
  if (group) {
    MEGATRON_CHECK(group->device() == ctx.device(), "TensorParallel: the tensor-parallel ", group->describe(),
                   " works on ", group->device(), " tensors but the model lives on ", ctx.device());
  }
  tp.group = std::move(group);
  tp.sequence_parallel = sequence_parallel;
  if (tp.enabled() && ctx.is_cuda()) {
    tp.overlap = std::make_shared<StreamFork>(ctx);
    tp.peers = std::make_shared<PeerExchangeCache>();
    tp.bulk_peers = std::make_shared<PeerExchangeCache>();
  }
  return tp;
}

}  // namespace megatron::parallel
