#include "megatron/trainer/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/parallel/pipeline_split.h"
#include "megatron/pipeline/schedule.h"
#include "megatron/tensor/caching_pool.h"
#include "megatron/train/fp8_arguments.h"
#include "megatron/train/model_config.h"
#include "megatron/train/recompute_arguments.h"
#include "megatron/trainer/model_chunks.h"

namespace megatron::trainer {

namespace {

// The numbers the formulas use; bytes per element e, token rows T of one micro-batch on this rank (its
// sequence part under CP), region: the rows of the sequence-parallel region (T / TP under SP). cuda: tensors
// are counted as the CUDA caching allocator counts them, each rounded to its size class (tensor/caching_pool.h:
// up to 25% for large blocks); the CPU allocator rounds to 64 bytes.
struct Dims {
  double h = 0, n = 0, g = 0, d = 0, F = 0, k = 1, V = 0, e = 2, t = 1, T = 0, region = 0;
  bool bias = false, layernorm = false, packed_qkv = false, cuda = true;
  bool qk_norm = false;       // --qk-layernorm: per-head norms of q and k
  double position_table = 0;  // learned positions: max_position_embeddings x h

  double bytes(double b) const {  // one tensor of b bytes, as the allocator counts it
    if (!cuda) return std::ceil(b / 64) * 64;
    return double(CachingPool::size_class(size_t(b)));
  }
  double tensor(double rows, double cols, double element_bytes) const { return bytes(rows * cols * element_bytes); }
};

Dims dims_of(const train::Arguments& a) {
  const train::ModelArguments& m = a.model;
  const train::ParallelArguments& p = a.parallel;
  Dims x;
  x.h = m.hidden_size;
  x.n = m.num_attention_heads;
  x.g = m.num_query_groups;
  x.d = m.kv_channels;
  x.F = m.ffn_hidden_size;
  x.k = m.swiglu ? 2 : 1;
  x.V = a.padded_vocab_size();
  x.e = a.training.bf16 || a.training.fp16 ? 2 : 4;
  x.t = p.tensor_model_parallel_size;
  // Hybrid CP may run a micro-batch on a single rank (its longest document within the per-rank budget): its
  // activations are then the whole rows', so they are planned at CP 1.
  x.T = double(a.training.micro_batch_size) * m.seq_length / (p.hybrid_context_parallel ? 1 : p.context_parallel_size);
  x.region = p.sequence_parallel ? x.T / x.t : x.T;
  x.bias = !m.disable_bias_linear;
  x.layernorm = m.normalization != "RMSNorm";
  x.qk_norm = m.qk_layernorm;
  x.packed_qkv = x.g == x.n && m.position_embedding_type != "rope" && !x.qk_norm;
  x.cuda = a.training.device != "cpu";
  if (m.position_embedding_type == "learned_absolute") x.position_table = double(m.max_position_embeddings) * x.h;
  return x;
}

// An MoE layer on this rank, with the routing even (the tensors are sized by the routed rows, T x topk in all,
// however the experts share them; only capacity dropping, not modelled, changes that).
struct MoeDims {
  nn::MoeConfig config;
  double experts = 0;      // local experts: E / EP
  double topk = 0, F = 0;  // each expert's width on this rank: --moe-ffn-hidden-size / expert TP
  double shared_F = 0;     // the shared experts' width on this rank (/ TP)
  double etp = 1;
  double expert_dp = 1;    // the expert-data-parallel ranks their gradients and optimizer state are sharded over
  bool recompute_act = false;
  bool recompute_layer = false;  // selective "moe": the layer keeps its input and runs again in the backward
  bool recompute_shared = false;  // selective "shared_experts"
  int aux_losses = 0;
};

MoeDims moe_dims_of(const train::Arguments& a, const Dims& x) {
  MoeDims m;
  m.config = train::moe_config(a.moe, a.model);
  if (!m.config.enabled()) return m;
  const train::ParallelArguments& p = a.parallel;
  const double ep = p.expert_model_parallel_size;
  m.etp = p.expert_tensor_parallel_size > 0 ? p.expert_tensor_parallel_size : p.tensor_model_parallel_size;
  m.experts = m.config.num_experts / ep;
  m.topk = m.config.topk;
  m.F = double(m.config.ffn_hidden_size) / m.etp;
  m.shared_F = double(m.config.shared_expert_ffn) / x.t;
  m.expert_dp = std::max(1.0, double(p.world_size) / (p.pipeline_model_parallel_size * ep * m.etp));
  m.recompute_act = train::recompute_config(a).selective_moe_act();
  m.recompute_layer = train::recompute_config(a).selective_moe();
  m.recompute_shared = train::recompute_config(a).selective_shared_experts();
  m.aux_losses = int(m.config.aux_losses.size());
  return m;
}

// A parameter tensor on this rank: its elements, and whether it is a routed expert's (in the expert buffers,
// sharded over the expert-data-parallel ranks).
struct ParamTensor {
  double elements = 0;
  bool expert = false;
};

// The parameter tensors of one transformer layer on a TP rank. In the model's order (collect_parameters):
// input norm, QKV, projection (with --qk-layernorm the q and k norms), pre-MLP norm, then fc1 and fc2 (each weight
// followed by its bias) -- or, in an
// MoE layer, the router (and its expert bias), the shared experts' fc1 and fc2, the routed experts' stacked
// fc1 and fc2 (no biases).
std::vector<ParamTensor> layer_param_tensors(const Dims& x, const MoeDims& moe, bool moe_layer) {
  std::vector<ParamTensor> p;
  auto norm = [&] { p.insert(p.end(), x.layernorm ? 2 : 1, {x.h}); };
  auto linear = [&](double weight, double bias) {
    p.push_back({weight});
    if (x.bias) p.push_back({bias});
  };
  norm();
  linear(x.h * (x.n + 2 * x.g) * x.d / x.t, (x.n + 2 * x.g) * x.d / x.t);
  linear(x.n * x.d / x.t * x.h, x.h);
  if (x.qk_norm) p.insert(p.end(), 2 * (x.layernorm ? 2 : 1), {x.d});
  norm();
  if (!moe_layer) {
    linear(x.h * x.k * x.F / x.t, x.k * x.F / x.t);
    linear(x.F / x.t * x.h, x.h);
    return p;
  }
  p.push_back({moe.config.num_experts * x.h});
  if (moe.config.expert_bias) p.push_back({double(moe.config.num_experts)});
  if (moe.shared_F > 0) {
    linear(x.h * x.k * moe.shared_F, x.k * moe.shared_F);
    linear(moe.shared_F * x.h, x.h);
    if (moe.config.shared_expert_gate) p.push_back({x.h});
  }
  p.push_back({moe.experts * x.k * moe.F * x.h, true});
  p.push_back({moe.experts * x.h * moe.F, true});
  return p;
}
double linear_weights(const Dims& x) {
  return (x.h * (x.n + 2 * x.g) * x.d + x.n * x.d * x.h + x.h * x.k * x.F + x.F * x.h) / x.t;
}

// The norms' statistics of one pass: rstd (and LayerNorm's mean) per row, F32.
double norm_stats(const Dims& x) { return (x.layernorm ? 2 : 1) * x.tensor(x.region, 1, 4); }

// What one layer keeps for the backward of one micro-batch (transformer_layer.h's TransformerLayerSaved), up to
// the MLP: the norms' inputs and statistics, QKV's input, q/k/v, the attention output and its statistics.
// recompute_norms: selective "layernorm", the norms' outputs not kept as QKV's and fc1's (or the MLP's) input.
double attention_saved(const Dims& x, bool fp8, bool recompute_norms) {
  const double hidden = x.tensor(x.region, x.h, x.e);
  double b = 2 * hidden + 2 * norm_stats(x);                             // the norms' inputs (x, h) and statistics
  b += fp8 ? x.tensor(x.T, x.h, 1) : (recompute_norms ? 0 : hidden);     // QKV's input (FP8: its whole transpose)
  if (x.packed_qkv) b += x.tensor(x.T, 3 * x.n * x.d / x.t, x.e);         // the packed projection
  else b += x.tensor(x.T, x.n * x.d / x.t, x.e) + 2 * x.tensor(x.T, x.g * x.d / x.t, x.e);  // q, k, v
  if (x.qk_norm) {  // the q and k norms' inputs and statistics
    const double stats = x.layernorm ? 2 : 1;
    b += x.tensor(x.T, x.n * x.d / x.t, x.e) + x.tensor(x.T, x.g * x.d / x.t, x.e);
    b += stats * (x.tensor(x.T * x.n / x.t, 1, 4) + x.tensor(x.T * x.g / x.t, 1, 4));
  }
  b += x.tensor(x.T, x.n * x.d / x.t, x.e) + x.tensor(x.T, x.n / x.t, 4);  // attention output and log-sum-exp
  if (fp8) b += x.tensor(x.T, x.n * x.d / x.t, 1);                       // the projection's FP8 input
  return b;
}

// What a dense layer's MLP keeps; its input is the pre-MLP norm's output (`norm_output` bytes, 0 when dropped).
double mlp_saved(const Dims& x, bool fp8, double norm_output) {
  double b = fp8 ? x.tensor(x.T, x.h, 1) : norm_output;                 // fc1's input
  b += x.tensor(x.T, x.k * x.F / x.t, x.e);                              // fc1's output (pre-activation)
  b += x.tensor(x.T, x.F / x.t, fp8 ? 1 : x.e);                          // fc2's input (the activation)
  return b;
}

// What an MoE layer keeps (moe_layer.h's MoESaved) for its token rows T' (the SP region): the router's input
// (the pre-MLP norm's output) and its logits and scores (fp32 [T', E]); the routing's indices, probabilities and
// row map ([T', k]); the routed rows R = T' k x expert TP (the experts' input, fc1's output, the activation
// unless "moe_act" recomputes it, the experts' output) and the shared experts' fc1 output and activation.
double moe_saved(const Dims& x, const MoeDims& m) {
  const double T = x.region, R = T * m.topk * m.etp, E = m.config.num_experts;
  double b = x.tensor(T, x.h, x.e) + 2 * x.tensor(T, E, 4) + 3 * x.tensor(T, m.topk, 4) + m.aux_losses * x.tensor(1, E, 4);
  b += x.tensor(R, x.h, x.e) + x.tensor(R, x.k * m.F, x.e) + (m.recompute_act ? 0 : x.tensor(R, m.F, x.e));
  b += x.tensor(T * m.topk, x.h, x.e);
  if (m.shared_F > 0 && !m.recompute_shared) b += x.tensor(T, x.k * m.shared_F, x.e) + x.tensor(T, m.shared_F, x.e);
  if (m.shared_F > 0 && m.config.shared_expert_gate) {  // the gate's logits and scores, the pre-gate output
    b += x.tensor(T, 1, x.e) + x.tensor(T, 1, 4);
    if (!m.recompute_shared) b += x.tensor(T, x.h, x.e);
  }
  return b;
}

double layer_saved(const Dims& x, const MoeDims& moe, bool moe_layer, bool fp8, bool recompute_mlp,
                   bool recompute_norms) {
  const double b = attention_saved(x, fp8, recompute_norms);
  if (moe_layer && moe.recompute_layer) return b + x.tensor(x.region, x.h, x.e);  // selective "moe": its input
  if (moe_layer) return b + moe_saved(x, moe);
  const double norm_output = recompute_norms ? 0 : x.tensor(x.region, x.h, x.e);
  if (recompute_mlp) return b + norm_output;  // the MLP's input only
  return b + mlp_saved(x, fp8, norm_output);
}

// The backward's working tensors of one layer beyond the saved ones: the MLP's activation gradients and a few
// hidden-state gradients (the gathered input under SP); in an MoE layer the routed rows' gradients (the
// experts' output and input gradients, the activation's and fc1's output's).
double layer_backward_working(const Dims& x, const MoeDims& moe, bool moe_layer) {
  const double hidden = 3 * x.tensor(x.T, x.h, x.e);
  if (!moe_layer) return x.tensor(x.T, x.k * x.F / x.t, x.e) + x.tensor(x.T, x.F / x.t, x.e) + hidden;
  const double R = x.region * moe.topk * moe.etp;
  double rebuilt = moe.recompute_layer ? moe_saved(x, moe) - x.tensor(x.region, x.h, x.e) : 0;  // selective "moe"
  if (moe.recompute_shared && moe.shared_F > 0)  // selective "shared_experts": their fc1 output and activation
    rebuilt += x.tensor(x.region, x.k * moe.shared_F, x.e) + x.tensor(x.region, moe.shared_F, x.e);
  return 2 * x.tensor(R, x.h, x.e) + x.tensor(R, x.k * moe.F, x.e) + x.tensor(R, moe.F, x.e) + hidden + rebuilt;
}

// The loss head of a micro-batch: the final norm's input and output, the logits (their gradient in place), the
// per-token losses.
double head_saved(const Dims& x) {
  return 2 * x.tensor(x.region, x.h, x.e) + norm_stats(x) + x.tensor(x.T, x.V / x.t, x.e) + 3 * x.tensor(x.T, 1, 4);
}

struct ChunkCost {
  double saved = 0;      // per micro-batch, between its forward and its backward (the head included)
  double head = 0;       // the last chunk's loss head, which its backward consumes first
  double rebuilt = 0;    // full recomputation: the largest unit's activations, rebuilt in the backward
  double working = 0;    // the layers' backward working tensors
  double head_backward = 0;  // the head's backward: a hidden-state gradient, and on CUDA the first iteration's
                             // GEMM-autotuning scratch of the output layer's weight gradient (fp32 [V / TP, h])
  std::vector<ParamTensor> params;  // every parameter tensor
  double largest_group = 0;    // elements of the largest module group (embedding, a layer, the head): FSDP's unit
  double fp8_params = 0;
};

ChunkCost chunk_cost(const train::Arguments& a, const Dims& x, const MoeDims& moe, const parallel::ChunkLayers& layers,
                     bool first, bool last, const nn::Fp8Recipe& fp8, const nn::RecomputeConfig& recompute) {
  ChunkCost c;
  const int L = a.model.num_layers;
  if (first) {  // the embedding's parameters come first in the model's order
    c.params.push_back({x.V / x.t * x.h});
    if (x.position_table > 0) c.params.push_back({x.position_table});
    c.largest_group = x.V / x.t * x.h + x.position_table;
  }
  std::vector<double> saved(size_t(layers.num_layers));
  for (int i = 0; i < layers.num_layers; ++i) {
    const bool in_fp8 = fp8.enabled && fp8.fp8_layer(layers.first_layer + i, L);
    const bool moe_layer = moe.config.is_moe_layer(layers.first_layer + i);
    saved[size_t(i)] =
        layer_saved(x, moe, moe_layer, in_fp8, recompute.selective_mlp(), recompute.selective_layernorm());
    c.working = std::max(c.working, layer_backward_working(x, moe, moe_layer));
    double layer = 0;
    for (const ParamTensor& p : layer_param_tensors(x, moe, moe_layer)) {
      c.params.push_back(p);
      layer += p.elements;
    }
    c.largest_group = std::max(c.largest_group, layer);
    if (in_fp8) c.fp8_params += linear_weights(x);
  }
  std::vector<bool> recomputed(saved.size(), false);
  for (const auto& [unit_first, count] : recompute.units(layers.num_layers)) {
    double unit = 0;
    for (int i = unit_first; i < unit_first + count; ++i) {
      unit += saved[size_t(i)];
      recomputed[size_t(i)] = true;
    }
    // The unit's input (--distribute-saved-activations: 1/TP of it; with SP the region is split already).
    c.saved += x.tensor(x.region, x.h, x.e) / (recompute.distribute_saved_activations && x.region == x.T ? x.t : 1);
    c.rebuilt = std::max(c.rebuilt, unit);
  }
  for (size_t i = 0; i < saved.size(); ++i)
    if (!recomputed[i]) c.saved += saved[i];
  if (first) c.saved += x.tensor(x.T, 1, 8);  // the token ids
  if (last) {
    c.head = head_saved(x);
    c.saved += c.head;
    c.params.insert(c.params.end(), x.layernorm ? 2 : 1, {x.h});
    const bool own_output = a.model.untie_embeddings_and_output_weights || !first;
    if (own_output) c.params.push_back({x.V / x.t * x.h});
    c.largest_group = std::max(c.largest_group, (x.layernorm ? 2 : 1) * x.h + x.V / x.t * x.h);
    c.head_backward = x.tensor(x.T, x.h, x.e);
    if (x.cuda && !a.training.deterministic_mode) c.head_backward += x.tensor(x.V / x.t, x.h, 4);
  }
  return c;
}

// The model state of a rank as the allocator counts it: the parameters' values and main gradients in the
// data-parallel buffers (one allocation each; per-parameter values without the distributed optimizer; FSDP's
// sharded strategies keep 1/DP of them plus one module group's whole values, and its gradients in the backward,
// while it runs), the optimizer's fp32 masters (bf16/fp16 parameters) and two moments per parameter (its shard's
// range with the distributed optimizer; one buffer of each on the device, and for the offloaded fraction one of
// each in host memory with the staging copies), cuBLASLt's workspace on CUDA.
struct ModelState {
  double weights = 0, main_grads = 0, optimizer = 0, optimizer_host = 0;
};

ModelState model_state(const train::Arguments& a, const Dims& x, const std::vector<ParamTensor>& params, int dp_cp,
                       double expert_dp, double largest_group) {
  ModelState m;
  double dense = 0, experts = 0;
  for (const ParamTensor& p : params) (p.expert ? experts : dense) += p.elements;
  const double total = dense + experts;
  const bool distributed = a.parallel.use_distributed_optimizer;
  const double shard = distributed ? double(dp_cp) : 1.0, expert_shard = distributed ? expert_dp : 1.0;
  // The routed experts' parameters have buffers of their own (their expert-data-parallel group).
  auto buffers = [&](double element_bytes) {
    return x.bytes(element_bytes * dense) + (experts > 0 ? x.bytes(element_bytes * experts) : 0.0);
  };
  m.main_grads = a.fsdp_shards_grads() ? x.bytes(4 * total / shard) + x.bytes(4 * largest_group) : buffers(4);
  if (a.fsdp_shards_params()) {
    m.weights = x.bytes(x.e * total / shard) + x.bytes(x.e * largest_group);
  } else if (distributed) {
    m.weights = buffers(x.e);
  } else {
    for (const ParamTensor& p : params) m.weights += x.bytes(x.e * p.elements);
  }
  const double offload = a.training.optimizer_cpu_offload ? a.training.optimizer_offload_fraction : 0.0;
  const int per_param = x.e < 4 ? 3 : 2;  // master (bf16/fp16 parameters) and two moments
  double offloaded = 0, on_device = 0, on_host = 0;
  // The optimizer's entries: model order, or the data-parallel buffer's (reverse model order) for the
  // distributed optimizer, which decides which tensors the offloaded fraction takes.
  std::vector<ParamTensor> order = params;
  if (distributed) std::reverse(order.begin(), order.end());
  for (const ParamTensor& p : order) {
    const double local = std::ceil(p.elements / (p.expert ? expert_shard : shard));
    const double aligned = std::ceil(local / 64) * 64;  // each entry's start aligned to 64 elements in its buffers
    if (offloaded < offload * total) {  // Megatron's rule: whole tensors, in order (optim/adamw.h)
      offloaded += p.elements;
      on_host += aligned;
    } else {
      on_device += aligned;
    }
  }
  // One buffer per kind (optim/adamw.h); on the host also the gradient's and the updated parameter's staging.
  if (on_device > 0) m.optimizer = per_param * x.bytes(4 * on_device);
  // An offloaded entry always has a host master (even for fp32 parameters: the device copy is not the master).
  if (on_host > 0) m.optimizer_host = 3 * x.bytes(4 * on_host) + x.bytes(4 * on_host) + x.bytes(x.e * on_host);
  if (x.cuda) m.weights += double(64u << 20);  // cuBLASLt's workspace, allocated with the context
  return m;
}

// Walks the rank's schedule: the live activations after each forward, and at each backward the rebuilt unit
// and the working tensors on top.
void simulate(RankMemory& r, const std::vector<ChunkCost>& chunks, const std::vector<pipeline::Step>& steps,
              double baseline) {
  double live = 0;
  int in_flight = 0;
  for (const pipeline::Step& s : steps) {
    const ChunkCost& c = chunks[size_t(s.chunk)];
    if (s.action == pipeline::Action::Forward) {
      live += c.saved;
      r.max_in_flight = std::max(r.max_in_flight, ++in_flight);
      r.peak_activations = std::max(r.peak_activations, baseline + live);
    } else if (s.action == pipeline::Action::Backward) {
      // The head's backward (its gradients of the final hidden state) runs with everything live; the layers'
      // backwards (and a recomputed unit) after the head is released.
      r.peak_activations = std::max(r.peak_activations, baseline + live + c.head_backward);
      r.peak_activations = std::max(r.peak_activations, baseline + live - c.head + c.rebuilt + c.working);
      live -= c.saved;
      --in_flight;
    }
  }
}

double gib(double bytes) { return bytes / double(1ull << 30); }

}  // namespace

const RankMemory& MemoryPlan::worst() const {
  MEGATRON_CHECK(!ranks.empty(), "MemoryPlan: no ranks");
  return *std::max_element(ranks.begin(), ranks.end(),
                           [](const RankMemory& a, const RankMemory& b) { return a.peak < b.peak; });
}

double MemoryPlan::most_host_bytes() const {
  double most = 0;
  for (const RankMemory& r : ranks) most = std::max(most, r.optimizer_host);
  return most;
}

// What the copy-engine transports allocate per rank with cudaMalloc, beside the caching allocator (on GPUs
// only): --tp-comm-overlap's two exchanges (the pipelined and the bulk collectives), a slot per TP rank of one
// sequence-parallel chunk [T / TP, h] each, and --cp-comm-transport copy-engine's two ring exchanges (key/value
// blocks, gradients), two slots of a block [T, 2 G d / TP] each; every slot rounded up to 1 MiB.
double copy_engine_staging(const train::Arguments& a, const Dims& x) {
  const train::ParallelArguments& p = a.parallel;
  if (!x.cuda) return 0;
  auto slot = [](double bytes) { return std::ceil(bytes / double(1 << 20)) * double(1 << 20); };
  double total = 0;
  if (p.tp_comm_overlap && p.sequence_parallel && p.tensor_model_parallel_size > 1 &&
      p.tp_comm_overlap_transport == "copy-engine")
    total += 2 * (x.t * slot(x.T / x.t * x.h * x.e) + 4096);
  if (p.context_parallel_size > 1 && p.cp_comm_transport == "copy-engine")
    total += 2 * (2 * slot(x.T * 2 * x.g / x.t * x.d * x.e) + 4096);
  return total;
}

MemoryPlan plan_memory(const train::Arguments& a) {
  MemoryPlan plan;
  if (a.moe.num_experts > 0 && a.moe.moe_expert_capacity_factor > 0)
    plan.notes.push_back("MoE layers are planned with every routed row kept: capacity dropping, which keeps fewer, "
                         "is not modelled");
  if (a.parallel.hybrid_context_parallel)
    plan.notes.push_back("--hybrid-context-parallel: activations planned for a micro-batch on one CP rank (the whole "
                         "rows), the most a run can hold");
  const Dims x = dims_of(a);
  const MoeDims moe = moe_dims_of(a, x);
  const train::ParallelArguments& p = a.parallel;
  if (const double staging = copy_engine_staging(a, x); staging > 0)
    plan.notes.push_back(str_cat("the copy engines' staging buffers (parallel/peer_exchange.h): ",
                                 std::llround(staging / double(1 << 20)), " MiB a rank, allocated outside the "
                                 "caching allocator, so in no peak above"));
  const parallel::PipelineSplitConfig split_config = train::pipeline_split_config(a);
  const parallel::PipelineSplit split = parallel::split_layers(split_config);
  const int P = split_config.pipeline_size, V = split_config.virtual_size;
  const int dp_cp = std::max(1, p.world_size / (p.tensor_model_parallel_size * P));
  const nn::Fp8Recipe fp8 = train::fp8_recipe(a);
  const nn::RecomputeConfig recompute = train::recompute_config(a);
  const int group = p.microbatch_group_size_per_virtual_pipeline_stage > 0
                        ? p.microbatch_group_size_per_virtual_pipeline_stage
                        : P;
  for (int rank = 0; rank < P; ++rank) {
    RankMemory r;
    r.pipeline_rank = rank;
    std::vector<ChunkCost> chunks;
    std::vector<ParamTensor> params;
    double fp8_params = 0, largest_group = 0;
    for (int c = 0; c < V; ++c) {
      chunks.push_back(chunk_cost(a, x, moe, split.chunks[size_t(rank)][size_t(c)], rank == 0 && c == 0,
                                  rank == P - 1 && c == V - 1, fp8, recompute));
      params.insert(params.end(), chunks.back().params.begin(), chunks.back().params.end());
      fp8_params += chunks.back().fp8_params;
      largest_group = std::max(largest_group, chunks.back().largest_group);
      r.activations_per_microbatch += chunks.back().saved;
    }
    const ModelState m = model_state(a, x, params, dp_cp, moe.expert_dp, largest_group);
    r.weights = m.weights;
    r.main_grads = m.main_grads;
    r.optimizer = m.optimizer;
    r.optimizer_host = m.optimizer_host;
    r.fp8_weights = 2 * fp8_params;  // W and its transpose in FP8, cast once per iteration
    if (a.fp8.fp8_param_gather) {
      // The FP8 linears' weights are kept in FP8 (1 byte, not e; fp32 masters in the distributed optimizer,
      // separate ones even for fp32 parameters); per iteration only their transposes are made.
      r.weights -= x.bytes((x.e - 1) * fp8_params);
      if (x.e == 4) r.optimizer += x.bytes(4 * fp8_params / dp_cp);
      r.fp8_weights = fp8_params;
    }
    r.model_state = r.weights + r.main_grads + r.optimizer;
    const int microbatches = a.num_micro_batches();
    simulate(r, chunks, pipeline::schedule_for({.size = P, .rank = rank, .virtual_size = V}, microbatches, group),
             r.fp8_weights);
    r.peak = r.model_state + r.peak_activations;
    plan.ranks.push_back(r);
  }
  if (a.training.fp16) plan.notes.push_back("fp16's loss-scaling buffers are not counted (small)");
  return plan;
}

std::string describe(const MemoryPlan& plan, const train::Arguments& args) {
  std::ostringstream out;
  out << "memory plan per rank (GiB; activations walked through the pipeline schedule of "
      << args.num_micro_batches() << " micro-batches per iteration):\n";
  char line[320];
  std::snprintf(line, sizeof line, "  %-8s %9s %9s %11s %9s %12s %10s %13s %9s\n", "pp rank", "weights", "grads",
                "optimizer", "fp8 W", "act/microb.", "in flight", "peak activ.", "peak");
  out << line;
  for (const RankMemory& r : plan.ranks) {
    std::snprintf(line, sizeof line, "  %-8d %9.3f %9.3f %11.3f %9.3f %12.3f %10d %13.3f %9.3f\n", r.pipeline_rank,
                  gib(r.weights), gib(r.main_grads), gib(r.optimizer), gib(r.fp8_weights),
                  gib(r.activations_per_microbatch), r.max_in_flight, gib(r.peak_activations), gib(r.peak));
    out << line;
  }
  const RankMemory& w = plan.worst();
  out << "predicted peak allocated: " << gib(w.peak) << " GiB (pipeline rank " << w.pipeline_rank << ")";
  if (plan.most_host_bytes() > 0) {
    const int node_ranks = std::min(args.parallel.world_size, std::max(1, args.training.dry_run_gpus_per_node));
    out << "; optimizer state in pinned host memory: " << gib(plan.most_host_bytes()) << " GiB per rank, up to "
        << gib(plan.most_host_bytes() * node_ranks) << " GiB on a node of " << node_ranks
        << " ranks (--dry-run-gpus-per-node)";
  }
  out << "\n";
  for (const std::string& n : plan.notes) out << "note: " << n << "\n";
  return out.str();
}

}  // namespace megatron::trainer
