#include "megatron/trainer/model_chunks.h"

#include "megatron/parallel/ring_attention.h"

namespace megatron::trainer {

std::vector<std::unique_ptr<nn::GPTModel>> build_model_chunks(Context& ctx, const nn::TransformerConfig& config,
                                                              const parallel::TensorParallel& tp,
                                                              const parallel::ContextParallel& cp,
                                                              const train::Arguments& args, int pipeline_rank,
                                                              const nn::MoeParallel& moe) {
  const parallel::PipelineSplitConfig split_config = train::pipeline_split_config(args);
  const parallel::PipelineSplit split = parallel::split_layers(split_config);
  const int P = split_config.pipeline_size, V = split_config.virtual_size;
  MEGATRON_CHECK(pipeline_rank >= 0 && pipeline_rank < P, "build_model_chunks: pipeline rank ", pipeline_rank, " of ", P);
  std::vector<std::unique_ptr<nn::GPTModel>> chunks;
  for (int c = 0; c < V; ++c) {
    const parallel::ChunkLayers& layers = split.chunks[size_t(pipeline_rank)][size_t(c)];
    const nn::StageLayout layout{.first_layer = layers.first_layer,
                                 .num_layers = layers.num_layers,
                                 .pre_process = pipeline_rank == 0 && c == 0,
                                 .post_process = pipeline_rank == P - 1 && c == V - 1};
    chunks.push_back(std::make_unique<nn::GPTModel>(ctx, config, tp, layout, cp, moe));
  }
  return chunks;
}

parallel::ContextParallel context_parallel(const parallel::ParallelContext& parallel, const train::Arguments& args) {
  parallel::ContextParallel cp{.group = parallel.cp().comm};
  if (!args.parallel.cp_comm_type.empty()) {
    cp.comm_types.clear();
    for (const std::string& type : args.parallel.cp_comm_type) cp.comm_types.push_back(parallel::parse_cp_comm_type(type));
  }
  if (args.parallel.cp_comm_transport == "copy-engine") cp.ring_peers = std::make_shared<parallel::RingPeers>();
  const std::vector<parallel::ProcessGroup>& levels = parallel.hierarchical_cp();
  if (levels.size() == 2) {
    cp.a2a_group = levels[0].comm;
    cp.p2p_group = levels[1].comm;
  }
  return cp;
}

parallel::TensorParallel tensor_parallel(Context& ctx, const parallel::ParallelContext& parallel,
                                         const train::Arguments& args) {
  parallel::TensorParallel tp = parallel::TensorParallel::create(ctx, parallel.tp().comm, args.parallel.sequence_parallel);
  const train::ParallelArguments& p = args.parallel;
  if (p.tp_comm_overlap) {
    tp.comm_overlap = {.pipelined_ag = !p.disable_tp_comm_overlap_ag && !p.disable_tp_comm_split_ag,
                       .pipelined_rs = !p.disable_tp_comm_overlap_rs && !p.disable_tp_comm_split_rs,
                       .rs_dgrad = p.tp_comm_overlap_rs_dgrad,
                       .bulk_dgrad = !p.disable_tp_comm_bulk_dgrad,
                       .bulk_wgrad = !p.disable_tp_comm_bulk_wgrad,
                       .copy_engine = p.tp_comm_overlap_transport == "copy-engine"};
  }
  return tp;
}

nn::MoeParallel moe_parallel(const parallel::ParallelContext& parallel) {
  nn::MoeParallel m;
  m.experts = {.ep_rank = std::max(0, parallel.ep().rank()),
               .ep_size = parallel.ep().size(),
               .etp_rank = std::max(0, parallel.expert_tp().rank()),
               .etp_size = parallel.expert_tp().size()};
  m.dispatch = parallel.expert_tp_ep().comm.get();
  m.ep = parallel.ep().comm.get();
  m.expert_tp = parallel.expert_tp().comm.get();
  m.router.tp_cp = parallel.tp_cp().comm.get();
  m.router.tp_cp_size = parallel.tp_cp().size();
  m.router.cp_size = parallel.cp().size();
  // The global aux loss counts over TP x DP x CP: every rank of this pipeline stage.
  m.router.tp_dp_cp = parallel.tp_dp_cp().comm.get();
  m.router.tp_dp_cp_size = parallel.tp_dp_cp().size();
  return m;
}

std::vector<nn::GPTModel*> chunk_pointers(const std::vector<std::unique_ptr<nn::GPTModel>>& chunks) {
  std::vector<nn::GPTModel*> out;
  for (const auto& c : chunks) out.push_back(c.get());
  return out;
}

}  // namespace megatron::trainer
