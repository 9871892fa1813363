// This pipeline rank's part of the model: one GPTModel stage per virtual pipeline stage it holds, with the
// layer ranges of the run's split flags (parallel/pipeline_split.h). Chunk c of pipeline rank r is virtual
// stage c * PP + r; the embedding lives on rank 0's chunk 0, the output layer and loss on the last rank's last
// chunk (with tied embeddings that chunk holds its own copy of the word embeddings). Without pipelining: one
// chunk, the whole model.
#pragma once

#include <memory>
#include <vector>

#include "megatron/nn/gpt_model.h"
#include "megatron/parallel/parallel_context.h"
#include "megatron/parallel/pipeline_split.h"
#include "megatron/train/arguments.h"

namespace megatron::trainer {

std::vector<std::unique_ptr<nn::GPTModel>> build_model_chunks(Context& ctx, const nn::TransformerConfig& config,
                                                              const parallel::TensorParallel& tp,
                                                              const parallel::ContextParallel& cp,
                                                              const train::Arguments& args, int pipeline_rank,
                                                              const nn::MoeParallel& moe = {});

// The expert layout and groups of this rank's MoE layers: EP and expert-TP ranks, the dispatch group
// (expert TP x EP) and the router's statistics groups (TP x CP; the world of the pipeline stage's DP x TP x
// CP for the global aux loss).
nn::MoeParallel moe_parallel(const parallel::ParallelContext& parallel);

// The context-parallel group of this rank as the model needs it: the CP communicator, the hierarchical
// levels (a2a+p2p) and the communication type of each layer (--cp-comm-type, default p2p).
parallel::ContextParallel context_parallel(const parallel::ParallelContext& parallel, const train::Arguments& args);

// The tensor-parallel value of this rank: its TP group, sequence parallelism and --tp-comm-overlap's parts.
parallel::TensorParallel tensor_parallel(Context& ctx, const parallel::ParallelContext& parallel,
                                         const train::Arguments& args);

// Non-owning views, in chunk order.
std::vector<nn::GPTModel*> chunk_pointers(const std::vector<std::unique_ptr<nn::GPTModel>>& chunks);

}  // namespace megatron::trainer
