#include "megatron/parallel/cp_packed_attention.h"

#include <algorithm>
#include <span>
#include <vector>

#include "megatron/ops/attention/attention_varlen.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/parallel/cp_all_gather_attention.h"

namespace megatron::parallel {
namespace {

// One local chunk's packed problem: its queries are global positions [a0, a1) of a row, its keys [key0, a1);
// offsets_q and offsets_kv their documents (relative to a0 and key0), seen by the op through cu_q and cu_kv.
struct ChunkDocuments {
  int64_t a0 = 0, a1 = 0, key0 = 0;
  std::vector<int64_t> offsets_q = {0}, offsets_kv = {0};
  Tensor cu_q() { return Tensor::from_blob(offsets_q.data(), {int64_t(offsets_q.size())}, DType::I64, Device::cpu()); }
  Tensor cu_kv() { return Tensor::from_blob(offsets_kv.data(), {int64_t(offsets_kv.size())}, DType::I64, Device::cpu()); }
};

// The documents of row `row` (length S) that chunk [a0, a1) overlaps.
ChunkDocuments chunk_documents(std::span<const int64_t> cu, int64_t row, int64_t S, int64_t a0, int64_t a1) {
  std::vector<int64_t> bounds;  // the row's document boundaries, 0 .. S
  for (int64_t o : cu)
    if (o >= row * S && o <= (row + 1) * S) bounds.push_back(o - row * S);
  MEGATRON_CHECK(bounds.size() >= 2 && bounds.front() == 0 && bounds.back() == S, "context-parallel packed attention: ",
                 "cu_seqlens must contain every row boundary (row ", row, " of ", S, " tokens)");
  ChunkDocuments c{.a0 = a0, .a1 = a1};
  size_t first = size_t(std::upper_bound(bounds.begin(), bounds.end(), a0) - bounds.begin()) - 1;
  c.key0 = bounds[first];
  for (size_t i = first; i + 1 < bounds.size() && bounds[i] < a1; ++i) {
    const int64_t end = std::min(bounds[i + 1], a1);
    c.offsets_q.push_back(end - a0);
    c.offsets_kv.push_back(end - c.key0);
  }
  return c;
}

// The chunk (row b, local half) of a local [B, 2c, heads, D] tensor as packed rows [c, heads, D].
Tensor local_chunk(const Tensor& x, int64_t b, int half) {
  const int64_t c = x.dim(1) / 2;
  return x.select(b).slice(half * c, (half + 1) * c);
}

std::span<const int64_t> offsets(const Tensor& cu) { return {cu.data<int64_t>(), size_t(cu.numel())}; }

void check_inputs(const ContextParallel& cp, const Tensor& q, const Tensor& k, const Tensor& cu_seqlens,
                  const ops::AttentionOptions& options) {
  MEGATRON_CHECK(options.causal, "context-parallel packed attention computes causal attention");
  MEGATRON_CHECK(q.rank() == 4 && k.rank() == 4 && q.dim(1) == k.dim(1) && q.dim(1) % 2 == 0,
                 "context-parallel packed attention: q ", q.describe(), " and k ", k.describe(),
                 " must hold the same even number of tokens (two chunks)");
  MEGATRON_CHECK(cu_seqlens.defined() && cu_seqlens.device().is_cpu() && cu_seqlens.dtype() == DType::I64 &&
                     offsets(cu_seqlens).back() == q.dim(0) * q.dim(1) * cp.size(),
                 "context-parallel packed attention: cu_seqlens ", cu_seqlens.describe(), " must be host i64 offsets ",
                 "ending at the ", q.dim(0), " whole rows' ", q.dim(0) * q.dim(1) * cp.size(), " tokens");
}

}  // namespace

CpAttentionSaved cp_packed_attention_forward(Context& ctx, const ContextParallel& cp, const Tensor& out, const Tensor& q,
                                             const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                                             const ops::AttentionOptions& options) {
  check_inputs(cp, q, k, cu_seqlens, options);
  comm::Communicator& group = *cp.group;
  const int P = group.size(), r = group.rank();
  const int64_t B = q.dim(0), c = q.dim(1) / 2, S = 2 * c * P, H = q.dim(2);
  CpAttentionSaved saved{.q = q, .k = k, .v = v, .out = out, .stats = ctx.empty({B, 2, H, c}, DType::F32)};
  const Tensor k_all = gather_sequence(ctx, group, k), v_all = gather_sequence(ctx, group, v);
  for (int64_t b = 0; b < B; ++b)
    for (int half = 0; half < 2; ++half) {
      const int64_t a0 = chunk_of(r, half, P) * c;
      ChunkDocuments d = chunk_documents(offsets(cu_seqlens), b, S, a0, a0 + c);
      ops::attention_forward_varlen(ctx, local_chunk(out, b, half), saved.stats.select(b).select(half),
                                    local_chunk(q, b, half), k_all.select(b).slice(d.key0, d.a1),
                                    v_all.select(b).slice(d.key0, d.a1), d.cu_q(), d.cu_kv(), options);
    }
  return saved;
}

void cp_packed_attention_backward(Context& ctx, const ContextParallel& cp, CpAttentionSaved&& saved, const Tensor& dq,
                                  const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& cu_seqlens,
                                  const ops::AttentionOptions& options) {
  const CpAttentionSaved s = std::move(saved);
  check_inputs(cp, s.q, s.k, cu_seqlens, options);
  comm::Communicator& group = *cp.group;
  const int P = group.size(), r = group.rank();
  const int64_t B = s.q.dim(0), c = s.q.dim(1) / 2, S = 2 * c * P;
  const Tensor k_all = gather_sequence(ctx, group, s.k), v_all = gather_sequence(ctx, group, s.v);
  Tensor dk_all = ctx.empty(k_all.shape(), s.k.dtype()), dv_all = ctx.empty(v_all.shape(), s.v.dtype());
  ops::fill(ctx, dk_all, 0.0);
  ops::fill(ctx, dv_all, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int half = 0; half < 2; ++half) {
      const int64_t a0 = chunk_of(r, half, P) * c;
      ChunkDocuments d = chunk_documents(offsets(cu_seqlens), b, S, a0, a0 + c);
      const Tensor keys = k_all.select(b).slice(d.key0, d.a1), values = v_all.select(b).slice(d.key0, d.a1);
      Tensor dk_part = ctx.empty(keys.shape(), keys.dtype()), dv_part = ctx.empty(values.shape(), values.dtype());
      ops::attention_backward_varlen(ctx, local_chunk(dq, b, half), dk_part, dv_part, local_chunk(dout, b, half),
                                     local_chunk(s.q, b, half), keys, values, local_chunk(s.out, b, half),
                                     s.stats.select(b).select(half), d.cu_q(), d.cu_kv(), options);
      const Tensor dk_rows = dk_all.select(b).slice(d.key0, d.a1), dv_rows = dv_all.select(b).slice(d.key0, d.a1);
      ops::add(ctx, dk_rows, dk_rows, dk_part);
      ops::add(ctx, dv_rows, dv_rows, dv_part);
    }
  reduce_scatter_sequence(ctx, group, dk, dk_all);
  reduce_scatter_sequence(ctx, group, dv, dv_all);
}

}  // namespace megatron::parallel
