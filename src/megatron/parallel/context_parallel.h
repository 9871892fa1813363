// ContextParallel: what a context-parallel module needs to know about its group, as a value (no globals):
// the CP communicator (ParallelContext::cp()), the hierarchical sub-groups for a2a+p2p, and the
// communication type of each layer.
//
// The load-balanced causal split (Megatron's get_batch_on_this_cp_rank): each sequence of length S is cut
// into 2 * CP chunks of c = S / (2 CP) tokens, and CP rank r holds chunks r and 2 CP - 1 - r, back to back:
// its local sequence of S / CP tokens is [chunk r ; chunk 2CP-1-r]. Under a causal mask the early chunk
// sees few keys and the late one many, so every rank does the same attention work. Tokens, labels, the loss
// mask and the positions (RoPE angles, learned position rows, dropout addressing) all follow this split;
// local token i of a sequence sits at global_position(i).
//
// Communication types (--cp-comm-type, Megatron's and Transformer Engine's names):
//   p2p       ring attention: K/V blocks travel around the CP ring while the current block is computed,
//             partial results merged by their log-sum-exp (parallel/ring_attention.h).
//   a2a       all-to-all over heads (Ulysses): every rank gets the whole sequence for 1/CP of the heads,
//             runs ordinary causal attention, and sends the outputs back (needs heads divisible by CP).
//   all_gather the keys and values of the whole sequence are all-gathered; each rank attends its two
//             query chunks over the prefixes they see; the K/V gradients are reduce-scattered.
//   a2a+p2p   hierarchical: all-to-all inside groups of the first --hierarchical-context-parallel-sizes
//             entry (consecutive CP ranks), then the ring across the second level.
// One type for every layer, or one per layer (Megatron's list form).
//
// A ContextParallel of size 1 (the default value) means no context parallelism: nothing is split and no
// communicator is called.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/comm/communicator.h"

namespace megatron::parallel {

enum class CpCommType { P2P, A2A, AllGather, A2AP2P };

struct RingPeers;  // ring_attention.h: the ring's copy-engine transport

// "p2p", "a2a", "all_gather" (or "allgather"), "a2a+p2p"; throws naming the accepted spellings otherwise.
CpCommType parse_cp_comm_type(std::string_view name);
const char* cp_comm_type_name(CpCommType type);

// Where CP rank `rank` of `size` finds its tokens in sequences of `seq` tokens (the split above).
struct SequenceSplit {
  int size = 1, rank = 0;
  int64_t seq = 0;  // the whole sequence's length

  int64_t local_seq() const { return seq / size; }
  int64_t chunk() const { return seq / (2 * int64_t(size)); }
  // The global position of local token i (0 <= i < local_seq()).
  int64_t global_position(int64_t i) const;
  // global_position(i) for every local token.
  std::vector<int64_t> positions() const;
};

// A run of `rows` consecutive rows of an activation, from its row `row` on, that sit at consecutive rows
// from `global_row` on in the whole micro-batch's [b * S] token order.
struct RowRun {
  int64_t row = 0, global_row = 0, rows = 0;
};

// The runs of an activation holding local token rows [first, first + count) of the b * local_seq local
// token rows (all of them, or a sequence-parallel shard), under `split`; `row` counts from `first`. The
// addressing that lets every layout draw the dropout masks of one rank.
std::vector<RowRun> global_row_runs(const SequenceSplit& split, int64_t batch, int64_t first, int64_t count);

struct ContextParallel {
  std::shared_ptr<comm::Communicator> group;  // null: no context parallelism
  // a2a+p2p: the all-to-all level (consecutive CP ranks) and the ring level; null otherwise.
  std::shared_ptr<comm::Communicator> a2a_group, p2p_group;
  std::vector<CpCommType> comm_types = {CpCommType::P2P};  // one, or one per layer
  // CUDA, --cp-comm-transport copy-engine: the p2p ring's blocks by the copy engines; null: NCCL.
  std::shared_ptr<RingPeers> ring_peers;

  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
  bool enabled() const { return size() > 1; }
  // The communication type of layer `layer` (its global number).
  CpCommType comm_type(int layer) const;
  SequenceSplit split(int64_t seq) const { return {size(), rank(), seq}; }
};

}  // namespace megatron::parallel
