// Attention on CUDA through cuDNN's fused flash attention (cudnn-frontend graph API). Host code only
// (compiled by the C++ compiler, in CUDA builds): cudnn-frontend is a large header library.
//
// One graph per (direction, dtype, B, Sq, Skv, H, G, D, causal, scale[, deterministic]) is built on first use
// and kept in the context's plan cache; later calls only bind pointers and execute on the context's stream
// (the cuDNN handle is bound to it). The bshd layout is described to cuDNN as dims {B, heads, S, D} with
// strides {S*heads*D, D, heads*D, 1} (S = Sq for Q, O and their gradients, Skv for K, V and theirs); stats
// are dims {B, H, Sq, 1}, contiguous. The packed QKV layout ([B, S, H, 3, D]: q, k, v interleaved per head)
// is the same description with Q, K, V (and dQ, dK, dV) strides multiplied by 3 and the three base pointers
// D elements apart.
// Causal masks: Sq == Skv uses the top-left diagonal (the graphs self-attention always had); Sq < Skv the
// bottom-right one (cuDNN's DiagonalAlignment_t::BOTTOM_RIGHT with right bound 0: query i sees keys
// j <= i + Skv - Sq, attention.h). For Sq == Skv both are the same mask.
// cuDNN rejects the backward of a single token (s_q = s_kv = 1) and returns non-finite dq/dk for one key
// and more queries; Skv == 1 runs small kernels of ours (cuda.cu) in both directions, which compute the same
// formulas. One query over several keys goes to cuDNN like every other shape.
// Packed (THD) sequences: N sequences of a [T, heads, D] tensor are described as a batch of N windows of the
// longest sequence's length, each window starting where its ragged offset says (cu_seqlens * heads * D elements)
// and masked to its own length by seq_len_q / seq_len_kv (padding mask), so no score crosses two sequences. N and
// the window lengths are rounded up to powers of two (the extra sequences are empty) so that the graphs -- keyed by
// them, not by the lengths -- are reused across packed batches. cuDNN keeps such a graph's statistics token-major
// ([T, H], ragged by cu_seqlens * H); attention_varlen.h's stats are [H, T], so they pass through a transpose.
#include "megatron/ops/attention/cuda.h"

#include <cudnn_frontend.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/runtime/cuda_libraries.h"
#include "megatron/tensor/op_checks.h"

namespace megatron::ops::cuda {

namespace {

namespace fe = cudnn_frontend;

// Tensor uids of the graphs' variant packs.
enum : int64_t {
  kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV, kSeqLenQ, kSeqLenKv, kOffsetQ, kOffsetKv, kOffsetStats,
  kDropoutSeed, kDropoutOffset, kDropoutMask
};

struct SdpaPlan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

struct Problem {
  int64_t B, Sq, Skv, H, G, D;
  DType dtype;
  bool causal;
  float scale;
  int64_t qkv_interleave = 1;  // 3: Q, K, V (and their gradients) interleaved per head in one packed tensor
  float dropout_p = 0.0f;      // 0: no dropout
  bool dropout_by_index = false;  // a custom mask (attention_dropout_mask) instead of cuDNN's Philox

  std::string describe() const {
    return str_cat(dtype_name(dtype), " B=", B, " Sq=", Sq, " Skv=", Skv, " H=", H, " G=", G, " D=", D,
                   causal ? " causal" : " full", " scale=", scale, qkv_interleave > 1 ? " packed qkv" : "",
                   dropout_p > 0 ? str_cat(" dropout=", dropout_p, dropout_by_index ? " by index" : " cuDNN Philox") : "");
  }
  std::string key(const char* direction, bool deterministic) const {
    uint32_t scale_bits, dropout_bits;
    std::memcpy(&scale_bits, &scale, sizeof scale_bits);
    std::memcpy(&dropout_bits, &dropout_p, sizeof dropout_bits);
    return str_cat("attention_", direction, ":", dtype_name(dtype), ":", B, ":", Sq, ":", Skv, ":", H, ":", G, ":", D,
                   ":", int(causal), ":", scale_bits, ":", int(deterministic), ":", qkv_interleave, ":", dropout_bits,
                   ":", int(dropout_by_index));
  }
};

Problem with_dropout(Problem p, const AttentionDropout& dropout) {
  if (!dropout.enabled()) return p;
  p.dropout_p = dropout.p;
  p.dropout_by_index = dropout.masks == DropoutMasks::ByIndex;
  return p;
}

Problem problem_of(const Tensor& q, const Tensor& k, bool causal, float scale) {
  return {q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3), q.dtype(), causal, scale};
}

// The packed self-attention problem of out [B, S, H, D].
Problem packed_problem_of(const Tensor& out, bool causal, float scale) {
  return {out.dim(0), out.dim(1), out.dim(1), out.dim(2), out.dim(2), out.dim(3), out.dtype(), causal, scale, 3};
}

// The limits of cuDNN's fused kernels, checked before any graph is built so that the message is ours.
void check_cudnn_limits(const char* op, const Problem& p, std::initializer_list<NamedTensor> tensors) {
  OpCheck check(op);
  for (const auto& [name, t] : tensors) {
    if (std::string_view(name) == "stats") continue;
    check.dtype_in(name, t, {DType::BF16, DType::F16});
  }
  check.that(p.D % 8 == 0 && p.D <= 256, "on CUDA (cuDNN fused attention) the head dimension must be a multiple of 8 and at most 256, got D=",
             p.D, " (", p.describe(), ")");
  for (const auto& [name, t] : tensors)
    check.that(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "argument ", name, " (", t.describe(),
               ") must be 16-byte aligned for cuDNN fused attention");
}

void fe_check(fe::error_t status, const char* step, const char* op, const Problem& p) {
  if (status.is_bad())
    MEGATRON_FAIL(op, ": cudnn-frontend ", step, " failed for ", p.describe(), ": ", status.get_message());
}

fe::DataType_t fe_dtype(DType t) { return t == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF; }

// bshd strides; `f` > 1 spaces heads (and tokens) f times wider (the packed QKV layout).
std::vector<int64_t> bshd_strides(int64_t heads, int64_t S, int64_t D, int64_t f) {
  return {S * heads * D * f, D * f, heads * D * f, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> bshd_tensor(fe::graph::Graph& g, const char* name, int64_t uid,
                                                          int64_t B, int64_t heads, int64_t S, int64_t D,
                                                          int64_t f = 1) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({B, heads, S, D})
                      .set_stride(bshd_strides(heads, S, D, f)));
}

void set_bshd_output(fe::graph::Tensor_attributes& t, int64_t uid, int64_t B, int64_t heads, int64_t S, int64_t D,
                     int64_t f = 1) {
  t.set_output(true).set_uid(uid).set_dim({B, heads, S, D}).set_stride(bshd_strides(heads, S, D, f));
}

// The causal mask: right bound 0 on the diagonal, top-left aligned for self-attention (Sq == Skv, exactly
// the graph it always had) and bottom-right aligned otherwise (the caller checked Skv >= Sq).
template <class Attributes>
void set_causal(Attributes& options, const Problem& p) {
  if (!p.causal) return;
  const auto alignment = p.Sq == p.Skv ? fe::DiagonalAlignment_t::TOP_LEFT : fe::DiagonalAlignment_t::BOTTOM_RIGHT;
  options.set_diagonal_alignment(alignment).set_diagonal_band_right_bound(0);
}

std::shared_ptr<fe::graph::Graph> new_graph(const Problem& p) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe_dtype(p.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

// The graph's dropout inputs. ByIndex: the mask [B, H, Sq, Skv] in the I/O type with the scale 1 / (1 - p) passed
// by value; cuDNN Philox: the int64 seed and offset in device memory.
// cuDNN 9.14's backward with a custom mask leaves its inverse scale (Dropout_scale_inv, 1 - p, by which the
// frontend's graph multiplies rowsum(dO o O)) unapplied: its dQ and dK fit dS = P o (dP o M - rowsum(dO o O)) / (1 - p)
// (NMSE 6e-6 to 8e-6 against fp64 loops, 2.5e-3 to 3e-3 for the documented formula; dV is right; the Philox
// backward applies it). So the inverse scale is passed as 1 and the backward reads O * (1 - p) in place of O -- O
// enters it only through that row sum -- which gives the documented gradients whether or not a later cuDNN
// applies the inverse scale.
struct DropoutInputs {
  std::shared_ptr<fe::graph::Tensor_attributes> seed, offset, mask, scale, scale_inv;
};

DropoutInputs dropout_inputs(fe::graph::Graph& g, const Problem& p) {
  DropoutInputs in;
  if (p.dropout_p <= 0.0f) return in;
  if (p.dropout_by_index) {
    in.mask = g.tensor(fe::graph::Tensor_attributes()
                           .set_name("dropout_mask")
                           .set_uid(kDropoutMask)
                           .set_dim({p.B, p.H, p.Sq, p.Skv})
                           .set_stride({p.H * p.Sq * p.Skv, p.Sq * p.Skv, p.Skv, 1})
                           .set_data_type(fe_dtype(p.dtype)));
    in.scale = g.tensor(fe::graph::Tensor_attributes(float(1.0 / (1.0 - double(p.dropout_p)))));
    in.scale_inv = g.tensor(fe::graph::Tensor_attributes(1.0f));
    return in;
  }
  auto scalar = [&](const char* name, int64_t uid) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({1, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::INT64));
  };
  in.seed = scalar("dropout_seed", kDropoutSeed);
  in.offset = scalar("dropout_offset", kDropoutOffset);
  return in;
}

void set_dropout(fe::graph::SDPA_attributes& options, const Problem& p, const DropoutInputs& in) {
  if (p.dropout_p <= 0.0f) return;
  if (p.dropout_by_index) options.set_dropout(in.mask, in.scale);
  else options.set_dropout(p.dropout_p, in.seed, in.offset);
}

void set_dropout(fe::graph::SDPA_backward_attributes& options, const Problem& p, const DropoutInputs& in) {
  if (p.dropout_p <= 0.0f) return;
  if (p.dropout_by_index) options.set_dropout(in.mask, in.scale, in.scale_inv);
  else options.set_dropout(p.dropout_p, in.seed, in.offset);
}

// validate -> operation graph -> heuristics -> support check -> plan, each step's failure reported by name.
SdpaPlan finish_plan(Context& ctx, std::shared_ptr<fe::graph::Graph> graph, const char* op, const Problem& p) {
  cudnnHandle_t handle = ctx.cuda_libraries().cudnn;
  fe_check(graph->validate(), "validate", op, p);
  fe_check(graph->build_operation_graph(handle), "build_operation_graph", op, p);
  fe_check(graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", op, p);
  fe_check(graph->check_support(handle), "check_support", op, p);
  fe_check(graph->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans", op, p);
  SdpaPlan plan;
  plan.graph = std::move(graph);
  fe_check(plan.graph->get_workspace_size(plan.workspace_bytes), "get_workspace_size", op, p);
  return plan;
}

SdpaPlan build_forward(Context& ctx, const Problem& p) {
  auto graph = new_graph(p);
  const int64_t f = p.qkv_interleave;
  auto Q = bshd_tensor(*graph, "Q", kQ, p.B, p.H, p.Sq, p.D, f);
  auto K = bshd_tensor(*graph, "K", kK, p.B, p.G, p.Skv, p.D, f);
  auto V = bshd_tensor(*graph, "V", kV, p.B, p.G, p.Skv, p.D, f);
  auto options = fe::graph::SDPA_attributes().set_name("attention_forward").set_generate_stats(true).set_attn_scale(p.scale);
  set_causal(options, p);
  set_dropout(options, p, dropout_inputs(*graph, p));
  auto [O, Stats] = graph->sdpa(Q, K, V, options);
  set_bshd_output(*O, kO, p.B, p.H, p.Sq, p.D);
  Stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({p.B, p.H, p.Sq, 1})
      .set_stride({p.H * p.Sq, p.Sq, 1, 1});
  return finish_plan(ctx, std::move(graph), "attention_forward", p);
}

SdpaPlan build_backward(Context& ctx, const Problem& p, bool deterministic) {
  auto graph = new_graph(p);
  const int64_t f = p.qkv_interleave;
  auto Q = bshd_tensor(*graph, "Q", kQ, p.B, p.H, p.Sq, p.D, f);
  auto K = bshd_tensor(*graph, "K", kK, p.B, p.G, p.Skv, p.D, f);
  auto V = bshd_tensor(*graph, "V", kV, p.B, p.G, p.Skv, p.D, f);
  auto O = bshd_tensor(*graph, "O", kO, p.B, p.H, p.Sq, p.D);
  auto dO = bshd_tensor(*graph, "dO", kdO, p.B, p.H, p.Sq, p.D);
  auto Stats = graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name("Stats")
                                 .set_uid(kStats)
                                 .set_dim({p.B, p.H, p.Sq, 1})
                                 .set_stride({p.H * p.Sq, p.Sq, 1, 1})
                                 .set_data_type(fe::DataType_t::FLOAT));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_attn_scale(p.scale)
                     .set_deterministic_algorithm(deterministic);
  set_causal(options, p);
  set_dropout(options, p, dropout_inputs(*graph, p));
  auto [dQ, dK, dV] = graph->sdpa_backward(Q, K, V, O, dO, Stats, options);
  set_bshd_output(*dQ, kdQ, p.B, p.H, p.Sq, p.D, f);
  set_bshd_output(*dK, kdK, p.B, p.G, p.Skv, p.D, f);
  set_bshd_output(*dV, kdV, p.B, p.G, p.Skv, p.D, f);
  return finish_plan(ctx, std::move(graph), "attention_backward", p);
}

template <class Build>
SdpaPlan& cached_plan(Context& ctx, const std::string& key, Build&& build) {
  CudaLibraries& libs = ctx.cuda_libraries();
  if (SdpaPlan* plan = libs.get_plan<SdpaPlan>(key)) return *plan;
  return *libs.put_plan(key, std::make_shared<SdpaPlan>(build()));
}

void execute(Context& ctx, const SdpaPlan& plan, std::unordered_map<int64_t, void*>& pack, const char* op,
             const Problem& p) {
  Tensor workspace;
  void* workspace_ptr = nullptr;
  if (plan.workspace_bytes > 0) {
    workspace = ctx.empty(Shape{plan.workspace_bytes}, DType::U8);  // stream-ordered: freed after use is safe
    workspace_ptr = workspace.data_ptr();
  }
  fe_check(plan.graph->execute(ctx.cuda_libraries().cudnn, pack, workspace_ptr), "execute", op, p);
}

// The dropout inputs of one call, alive until its graph has been enqueued (stream-ordered frees).
struct DropoutBuffers {
  Tensor seed_offset, mask, scaled_out;
};

// `out`: a backward's forward output O (undefined for a forward), which a by-index backward reads scaled.
DropoutBuffers bind_dropout(Context& ctx, const Problem& p, const AttentionDropout& dropout,
                            std::unordered_map<int64_t, void*>& pack, const Tensor& out = Tensor()) {
  DropoutBuffers b;
  if (p.dropout_p <= 0.0f) return b;
  if (p.dropout_by_index) {
    try {
      b.mask = ctx.empty({p.B, p.H, p.Sq, p.Skv}, p.dtype);
    } catch (const std::exception& e) {
      MEGATRON_FAIL("attention dropout by index needs its mask [B, heads, Sq, Skv] = [", p.B, ", ", p.H, ", ", p.Sq,
                    ", ", p.Skv, "] of ", double(p.B * p.H * p.Sq * p.Skv) * double(dtype_size(p.dtype)) / double(1 << 30),
                    " GiB for ", p.describe(), ", which does not fit (", e.what(), "): use --attention-dropout-masks ",
                    "device (cuDNN's generator, no mask tensor) or a smaller micro-batch");
    }
    ops::attention_dropout_mask(ctx, b.mask, dropout, p.causal);
    pack[kDropoutMask] = b.mask.data_ptr();
    if (out.defined()) {  // a backward: O * (1 - p) for cuDNN's row sum (see DropoutInputs)
      b.scaled_out = ctx.empty(out.shape(), p.dtype);
      ops::scale(ctx, b.scaled_out, out, 1.0 - double(p.dropout_p));
      pack[kO] = b.scaled_out.data_ptr();
    }
    return b;
  }
  int64_t host[2] = {int64_t(attention_dropout_device_seed(dropout)), 0};
  b.seed_offset = ctx.empty({2}, DType::I64);
  copy_tensor(ctx, b.seed_offset, Tensor::from_blob(host, {2}, DType::I64, Device::cpu()));
  pack[kDropoutSeed] = b.seed_offset.data<int64_t>();
  pack[kDropoutOffset] = b.seed_offset.data<int64_t>() + 1;
  return b;
}

// ---- packed (THD) sequences ----

struct VarlenProblem {
  int64_t N, Sq, Skv, H, G, D;  // sequences and window lengths, each rounded up to a power of two
  DType dtype;
  bool causal, self;  // self: every sequence has as many keys as queries (top-left causal alignment)
  float scale;
  float dropout_p = 0.0f;  // cuDNN's Philox (no by-index masks over ragged sequences)

  Problem as_problem() const {
    Problem p{N, Sq, Skv, H, G, D, dtype, causal, scale};
    p.dropout_p = dropout_p;
    return p;
  }
  std::string key(const char* direction, bool deterministic) const {
    return str_cat(as_problem().key(direction, deterministic), ":varlen:", int(self));
  }
};

int64_t power_of_two_at_least(int64_t n, int64_t floor) {
  int64_t p = floor;
  while (p < n) p *= 2;
  return p;
}

// The ragged description's int32 index tensors, in one device buffer: seq_len_q [N], seq_len_kv [N], then the
// element offsets of Q/O rows, K/V rows and token-major stats rows [N + 1] each; padding sequences are empty and
// start at the end.
struct RaggedIndex {
  Tensor buffer;
  void *seq_q, *seq_kv, *offset_q, *offset_kv, *offset_stats;
};

RaggedIndex ragged_index(Context& ctx, const VarlenProblem& p, const Tensor& cu_q, const Tensor& cu_kv) {
  const int64_t n = cu_q.numel() - 1, N = p.N;
  const int64_t* oq = cu_q.data<int64_t>();
  const int64_t* ok = cu_kv.data<int64_t>();
  const int64_t Tq = oq[n], Tkv = ok[n];
  MEGATRON_CHECK(Tq * p.H * p.D < (int64_t(1) << 31) && Tkv * p.G * p.D < (int64_t(1) << 31),
                 "attention_varlen on CUDA: ", Tq, " x ", p.H, " x ", p.D, " elements exceed cuDNN's int32 ragged offsets");
  std::vector<int32_t> host(size_t(5 * N + 3), 0);
  int32_t* seq_q = host.data();
  int32_t* seq_kv = seq_q + N;
  int32_t* off_q = seq_kv + N;
  int32_t* off_kv = off_q + N + 1;
  int32_t* off_stats = off_kv + N + 1;
  for (int64_t i = 0; i <= N; ++i) {
    const int64_t q0 = oq[std::min(i, n)], k0 = ok[std::min(i, n)];
    off_q[i] = int32_t(q0 * p.H * p.D);
    off_kv[i] = int32_t(k0 * p.G * p.D);
    off_stats[i] = int32_t(q0 * p.H);
    if (i < N) {
      seq_q[i] = i < n ? int32_t(oq[i + 1] - q0) : 0;
      seq_kv[i] = i < n ? int32_t(ok[i + 1] - k0) : 0;
    }
  }
  RaggedIndex r;
  r.buffer = ctx.empty({int64_t(host.size())}, DType::I32);
  copy_tensor(ctx, r.buffer, Tensor::from_blob(host.data(), {int64_t(host.size())}, DType::I32, Device::cpu()));
  int32_t* base = r.buffer.data<int32_t>();
  r.seq_q = base;
  r.seq_kv = base + N;
  r.offset_q = base + 2 * N;
  r.offset_kv = base + 3 * N + 1;
  r.offset_stats = base + 4 * N + 2;
  return r;
}

VarlenProblem varlen_problem(const Tensor& q, const Tensor& k, const Tensor& cu_q, const Tensor& cu_kv, bool causal,
                             float scale, const AttentionDropout& dropout) {
  const int64_t n = cu_q.numel() - 1;
  const int64_t* oq = cu_q.data<int64_t>();
  const int64_t* ok = cu_kv.data<int64_t>();
  int64_t longest_q = 1, longest_kv = 1;
  bool self = true;
  for (int64_t i = 0; i < n; ++i) {
    longest_q = std::max(longest_q, oq[i + 1] - oq[i]);
    longest_kv = std::max(longest_kv, ok[i + 1] - ok[i]);
    self = self && oq[i + 1] - oq[i] == ok[i + 1] - ok[i];
  }
  MEGATRON_CHECK(!dropout.enabled() || dropout.masks == DropoutMasks::Device,
                 "attention_varlen on CUDA: by-index dropout masks are not supported over packed sequences");
  return {power_of_two_at_least(std::max<int64_t>(n, 1), 1),
          power_of_two_at_least(longest_q, 64),
          power_of_two_at_least(longest_kv, 64),
          q.dim(1),
          k.dim(1),
          q.dim(2),
          q.dtype(),
          causal,
          self,
          scale,
          dropout.enabled() ? dropout.p : 0.0f};
}

struct RaggedTensors {
  std::shared_ptr<fe::graph::Tensor_attributes> seq_q, seq_kv, offset_q, offset_kv, offset_stats;
};

RaggedTensors ragged_tensors(fe::graph::Graph& g, const VarlenProblem& p) {
  auto index = [&](const char* name, int64_t uid, int64_t n) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::INT32));
  };
  return {index("seq_len_q", kSeqLenQ, p.N), index("seq_len_kv", kSeqLenKv, p.N),
          index("offset_q", kOffsetQ, p.N + 1), index("offset_kv", kOffsetKv, p.N + 1),
          index("offset_stats", kOffsetStats, p.N + 1)};
}

// The graph's Q, K, V inputs as windows of the packed [T, heads, D] tensors at their ragged offsets.
std::array<std::shared_ptr<fe::graph::Tensor_attributes>, 3> ragged_qkv(fe::graph::Graph& g, const VarlenProblem& p,
                                                                         const RaggedTensors& r) {
  auto Q = bshd_tensor(g, "Q", kQ, p.N, p.H, p.Sq, p.D);
  auto K = bshd_tensor(g, "K", kK, p.N, p.G, p.Skv, p.D);
  auto V = bshd_tensor(g, "V", kV, p.N, p.G, p.Skv, p.D);
  Q->set_ragged_offset(r.offset_q);
  K->set_ragged_offset(r.offset_kv);
  V->set_ragged_offset(r.offset_kv);
  return {Q, K, V};
}

// Token-major statistics [T, H] as cuDNN's [N, H, Sq, 1] windows.
fe::graph::Tensor_attributes& varlen_stats(fe::graph::Tensor_attributes& t, const VarlenProblem& p,
                                           const RaggedTensors& r) {
  return t.set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({p.N, p.H, p.Sq, 1})
      .set_stride({p.Sq * p.H, 1, p.H, 1})
      .set_ragged_offset(r.offset_stats);
}

template <class Attributes>
void set_varlen_masks(Attributes& options, const VarlenProblem& p, const RaggedTensors& r) {
  options.set_padding_mask(true).set_seq_len_q(r.seq_q).set_seq_len_kv(r.seq_kv);
  if (p.causal)
    options.set_diagonal_alignment(p.self ? fe::DiagonalAlignment_t::TOP_LEFT : fe::DiagonalAlignment_t::BOTTOM_RIGHT)
        .set_diagonal_band_right_bound(0);
}

SdpaPlan build_varlen_forward(Context& ctx, const VarlenProblem& p) {
  const Problem shape = p.as_problem();
  auto graph = new_graph(shape);
  const RaggedTensors r = ragged_tensors(*graph, p);
  auto [Q, K, V] = ragged_qkv(*graph, p, r);
  auto options =
      fe::graph::SDPA_attributes().set_name("attention_forward_varlen").set_generate_stats(true).set_attn_scale(p.scale);
  set_varlen_masks(options, p, r);
  set_dropout(options, shape, dropout_inputs(*graph, shape));
  auto [O, Stats] = graph->sdpa(Q, K, V, options);
  set_bshd_output(*O, kO, p.N, p.H, p.Sq, p.D);
  O->set_ragged_offset(r.offset_q);
  varlen_stats(Stats->set_output(true), p, r);
  return finish_plan(ctx, std::move(graph), "attention_forward_varlen", shape);
}

SdpaPlan build_varlen_backward(Context& ctx, const VarlenProblem& p, bool deterministic) {
  const Problem shape = p.as_problem();
  auto graph = new_graph(shape);
  const RaggedTensors r = ragged_tensors(*graph, p);
  auto [Q, K, V] = ragged_qkv(*graph, p, r);
  auto O = bshd_tensor(*graph, "O", kO, p.N, p.H, p.Sq, p.D);
  auto dO = bshd_tensor(*graph, "dO", kdO, p.N, p.H, p.Sq, p.D);
  O->set_ragged_offset(r.offset_q);
  dO->set_ragged_offset(r.offset_q);
  auto Stats = graph->tensor(fe::graph::Tensor_attributes().set_name("Stats"));
  varlen_stats(*Stats, p, r);
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward_varlen")
                     .set_attn_scale(p.scale)
                     .set_deterministic_algorithm(deterministic);
  set_varlen_masks(options, p, r);
  set_dropout(options, shape, dropout_inputs(*graph, shape));
  auto [dQ, dK, dV] = graph->sdpa_backward(Q, K, V, O, dO, Stats, options);
  set_bshd_output(*dQ, kdQ, p.N, p.H, p.Sq, p.D);
  set_bshd_output(*dK, kdK, p.N, p.G, p.Skv, p.D);
  set_bshd_output(*dV, kdV, p.N, p.G, p.Skv, p.D);
  dQ->set_ragged_offset(r.offset_q);
  dK->set_ragged_offset(r.offset_kv);
  dV->set_ragged_offset(r.offset_kv);
  return finish_plan(ctx, std::move(graph), "attention_backward_varlen", shape);
}

void add_ragged(std::unordered_map<int64_t, void*>& pack, const RaggedIndex& r) {
  pack[kSeqLenQ] = r.seq_q;
  pack[kSeqLenKv] = r.seq_kv;
  pack[kOffsetQ] = r.offset_q;
  pack[kOffsetKv] = r.offset_kv;
  pack[kOffsetStats] = r.offset_stats;
}

}  // namespace

void attention_forward(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& q, const Tensor& k,
                       const Tensor& v, bool causal, float scale, const AttentionDropout& dropout) {
  const Problem p = with_dropout(problem_of(q, k, causal, scale), dropout);
  check_cudnn_limits("attention_forward", p, {{"out", out}, {"stats", stats}, {"q", q}, {"k", k}, {"v", v}});
  if (p.Skv == 1) {  // one key (see cuda.cu)
    attention_forward_single_token(ctx, out, stats, q, k, v, scale);
    return;
  }
  SdpaPlan& plan = cached_plan(ctx, p.key("forward", false), [&] { return build_forward(ctx, p); });
  std::unordered_map<int64_t, void*> pack = {
      {kQ, q.data_ptr()}, {kK, k.data_ptr()}, {kV, v.data_ptr()}, {kO, out.data_ptr()}, {kStats, stats.data_ptr()}};
  const DropoutBuffers buffers = bind_dropout(ctx, p, dropout, pack);
  execute(ctx, plan, pack, "attention_forward", p);
}

void attention_backward(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& stats,
                        bool causal, float scale, bool deterministic, const AttentionDropout& dropout) {
  const Problem p = with_dropout(problem_of(q, k, causal, scale), dropout);
  check_cudnn_limits("attention_backward", p,
                     {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dout", dout}, {"q", q}, {"k", k}, {"v", v}, {"out", out},
                      {"stats", stats}});
  if (p.Skv == 1) {  // cuDNN: "s_q = s_kv = 1 is not supported"; non-finite dq/dk for s_kv = 1 < s_q
    attention_backward_single_token(ctx, dq, dk, dv, dout, q, k, v, out, stats, scale);
    return;
  }
  SdpaPlan& plan =
      cached_plan(ctx, p.key("backward", deterministic), [&] { return build_backward(ctx, p, deterministic); });
  std::unordered_map<int64_t, void*> pack = {{kQ, q.data_ptr()},       {kK, k.data_ptr()},   {kV, v.data_ptr()},
                                             {kO, out.data_ptr()},     {kdO, dout.data_ptr()}, {kStats, stats.data_ptr()},
                                             {kdQ, dq.data_ptr()},     {kdK, dk.data_ptr()},   {kdV, dv.data_ptr()}};
  const DropoutBuffers buffers = bind_dropout(ctx, p, dropout, pack, out);
  execute(ctx, plan, pack, "attention_backward", p);
}

void attention_forward_packed(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& qkv, bool causal,
                              float scale, const AttentionDropout& dropout) {
  const Problem p = with_dropout(packed_problem_of(out, causal, scale), dropout);
  check_cudnn_limits("attention_forward_packed", p, {{"out", out}, {"stats", stats}, {"qkv", qkv}});
  char* base = static_cast<char*>(qkv.data_ptr());
  const int64_t head_bytes = p.D * int64_t(dtype_size(p.dtype));
  SdpaPlan& plan = cached_plan(ctx, p.key("forward", false), [&] { return build_forward(ctx, p); });
  std::unordered_map<int64_t, void*> pack = {{kQ, base},
                                             {kK, base + head_bytes},
                                             {kV, base + 2 * head_bytes},
                                             {kO, out.data_ptr()},
                                             {kStats, stats.data_ptr()}};
  const DropoutBuffers buffers = bind_dropout(ctx, p, dropout, pack);
  execute(ctx, plan, pack, "attention_forward_packed", p);
}

void attention_backward_packed(Context& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                               const Tensor& out, const Tensor& stats, bool causal, float scale, bool deterministic,
                               const AttentionDropout& dropout) {
  const Problem p = with_dropout(packed_problem_of(out, causal, scale), dropout);
  check_cudnn_limits("attention_backward_packed", p,
                     {{"dqkv", dqkv}, {"dout", dout}, {"qkv", qkv}, {"out", out}, {"stats", stats}});
  char* base = static_cast<char*>(qkv.data_ptr());
  char* dbase = static_cast<char*>(dqkv.data_ptr());
  const int64_t head_bytes = p.D * int64_t(dtype_size(p.dtype));
  SdpaPlan& plan =
      cached_plan(ctx, p.key("backward", deterministic), [&] { return build_backward(ctx, p, deterministic); });
  std::unordered_map<int64_t, void*> pack = {
      {kQ, base},          {kK, base + head_bytes},          {kV, base + 2 * head_bytes},
      {kO, out.data_ptr()}, {kdO, dout.data_ptr()},           {kStats, stats.data_ptr()},
      {kdQ, dbase},        {kdK, dbase + head_bytes},        {kdV, dbase + 2 * head_bytes}};
  const DropoutBuffers buffers = bind_dropout(ctx, p, dropout, pack, out);
  execute(ctx, plan, pack, "attention_backward_packed", p);
}

void attention_forward_varlen(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_kv, bool causal,
                              float scale, const AttentionDropout& dropout) {
  if (q.dim(0) == 0) return;
  const VarlenProblem p = varlen_problem(q, k, cu_seqlens_q, cu_seqlens_kv, causal, scale, dropout);
  check_cudnn_limits("attention_forward_varlen", p.as_problem(), {{"out", out}, {"q", q}, {"k", k}, {"v", v}});
  const RaggedIndex index = ragged_index(ctx, p, cu_seqlens_q, cu_seqlens_kv);
  Tensor token_major = ctx.empty({q.dim(0), p.H}, DType::F32);
  SdpaPlan& plan = cached_plan(ctx, p.key("forward", false), [&] { return build_varlen_forward(ctx, p); });
  std::unordered_map<int64_t, void*> pack = {{kQ, q.data_ptr()}, {kK, k.data_ptr()}, {kV, v.data_ptr()},
                                             {kO, out.data_ptr()}, {kStats, token_major.data_ptr()}};
  add_ragged(pack, index);
  const DropoutBuffers buffers = bind_dropout(ctx, p.as_problem(), dropout, pack);
  execute(ctx, plan, pack, "attention_forward_varlen", p.as_problem());
  ops::transpose(ctx, stats, token_major);
}

void attention_backward_varlen(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                               const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& stats, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_kv,
                               bool causal, float scale, bool deterministic, const AttentionDropout& dropout) {
  // Keys of sequences without queries get no gradient from cuDNN's windows: zero them all first.
  const int64_t n = cu_seqlens_q.numel() - 1;
  const int64_t* oq = cu_seqlens_q.data<int64_t>();
  const int64_t* ok = cu_seqlens_kv.data<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    if (oq[i + 1] == oq[i] && ok[i + 1] > ok[i]) {
      ops::fill(ctx, dk, 0.0);
      ops::fill(ctx, dv, 0.0);
      break;
    }
  if (q.dim(0) == 0) return;
  const VarlenProblem p = varlen_problem(q, k, cu_seqlens_q, cu_seqlens_kv, causal, scale, dropout);
  check_cudnn_limits("attention_backward_varlen", p.as_problem(),
                     {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dout", dout}, {"q", q}, {"k", k}, {"v", v}, {"out", out}});
  const RaggedIndex index = ragged_index(ctx, p, cu_seqlens_q, cu_seqlens_kv);
  Tensor token_major = ctx.empty({q.dim(0), p.H}, DType::F32);
  ops::transpose(ctx, token_major, stats);
  SdpaPlan& plan = cached_plan(ctx, p.key("backward", deterministic),
                               [&] { return build_varlen_backward(ctx, p, deterministic); });
  std::unordered_map<int64_t, void*> pack = {{kQ, q.data_ptr()},    {kK, k.data_ptr()},     {kV, v.data_ptr()},
                                             {kO, out.data_ptr()},  {kdO, dout.data_ptr()}, {kStats, token_major.data_ptr()},
                                             {kdQ, dq.data_ptr()},  {kdK, dk.data_ptr()},   {kdV, dv.data_ptr()}};
  add_ragged(pack, index);
  const DropoutBuffers buffers = bind_dropout(ctx, p.as_problem(), dropout, pack, out);
  execute(ctx, plan, pack, "attention_backward_varlen", p.as_problem());
}

}  // namespace megatron::ops::cuda
