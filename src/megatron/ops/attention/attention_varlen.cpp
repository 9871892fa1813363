// Packed attention. CPU: each sequence runs the blocked reference (cpu.cpp) on views of its rows as a batch of one;
// its log-sum-exp rows go through a small buffer into their columns of stats [H, Tq]. CUDA: cuDNN's fused attention
// with ragged offsets (cudnn_sdpa.cpp).
#include "megatron/ops/attention/attention_varlen.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "megatron/ops/attention/cpu.h"
#include "megatron/ops/dispatch.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/attention/cuda.h"
#endif

namespace megatron::ops {

namespace {

using enum DType;

// The rows of one sequence: q rows [q0, q1), k/v rows [k0, k1).
struct SequenceRows {
  int64_t q0, q1, k0, k1;
};

std::span<const int64_t> offsets(const Tensor& cu) { return {cu.data<int64_t>(), size_t(cu.numel())}; }

// Dropout's addressing of packed rows (attention_varlen.h): every sequence inside one of P's sequences.
void check_dropout_layout(OpCheck& check, const AttentionDropout& d, const std::vector<SequenceRows>& rows) {
  if (!d.enabled()) return;
  check.that(d.p < 1.0f, "the dropout probability ", d.p, " must be in [0, 1)");
  check.that(d.seq > 0, "dropout over packed sequences needs dropout.seq, the length of P's sequences, got ", d.seq);
  check.that(d.queries.empty() && d.keys.empty() && d.batch_offset == 0, "dropout over packed sequences addresses "
             "rows by their index (row r is position r % seq of sequence r / seq): leave dropout.queries, keys and "
             "batch_offset empty");
  if (d.seq <= 0) return;
  for (size_t i = 0; i < rows.size(); ++i) {
    const SequenceRows& r = rows[i];
    if (r.q1 == r.q0) continue;
    const int64_t b = r.q0 / d.seq;
    check.that((r.q1 - 1) / d.seq == b && r.k0 / d.seq == b && (r.k1 - 1) / d.seq == b, "with dropout, sequence ", i,
               " (query rows [", r.q0, ", ", r.q1, "), key rows [", r.k0, ", ", r.k1, ")) must lie inside one of P's ",
               "sequences of ", d.seq, " rows");
  }
}

// The dropout addressing of one packed sequence's call (a batch of one), placed where its rows sit in P.
AttentionDropout sequence_dropout(const AttentionDropout& d, const SequenceRows& r) {
  if (!d.enabled()) return AttentionDropout{};
  AttentionDropout s = d;
  s.batch_offset = r.q0 / d.seq;
  s.queries = {{0, r.q0 % d.seq, r.q1 - r.q0}};
  s.keys = {{0, r.k0 % d.seq, r.k1 - r.k0}};
  return s;
}

// Validates the packed problem and returns its sequences.
std::vector<SequenceRows> check_varlen(OpCheck& check, const Context& ctx, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& cu_q, const Tensor& cu_kv,
                                       const AttentionOptions& options) {
  check.rank("q", q, 3).rank("k", k, 3).shape("v", v, k.shape());
  check.that(k.dim(2) == q.dim(2) && k.dim(1) > 0 && q.dim(1) % k.dim(1) == 0, "k ", k.describe(),
             " must be [Tkv, G, D] with the head dimension of q ", q.describe(), " = [Tq, H, D] and H % G == 0");
  check.dtype_in("q", q, {F64, F32, BF16, F16}).same_dtype({{"q", q}, {"k", k}, {"v", v}});
  for (const Tensor* cu : {&cu_q, &cu_kv})
    check.that(cu->defined() && cu->device().is_cpu() && cu->dtype() == I64 && cu->rank() == 1 && cu->numel() >= 1,
               "cu_seqlens must be host i64[N + 1] tensors, got ", cu->describe());
  check.that(cu_q.numel() == cu_kv.numel(), "cu_seqlens_q ", cu_q.describe(), " and cu_seqlens_kv ", cu_kv.describe(),
             " must describe the same number of sequences");
  const std::span<const int64_t> oq = offsets(cu_q), ok = offsets(cu_kv);
  check.that(oq.front() == 0 && oq.back() == q.dim(0) && ok.front() == 0 && ok.back() == k.dim(0),
             "cu_seqlens must run from 0 to the token counts: q has ", q.dim(0), " rows, cu_seqlens_q ends at ",
             oq.back(), "; k has ", k.dim(0), " rows, cu_seqlens_kv ends at ", ok.back());
  std::vector<SequenceRows> rows;
  for (size_t i = 0; i + 1 < oq.size(); ++i) {
    const SequenceRows r{oq[i], oq[i + 1], ok[i], ok[i + 1]};
    check.that(r.q1 >= r.q0 && r.k1 >= r.k0, "cu_seqlens must not decrease (sequence ", i, ")");
    const int64_t lq = r.q1 - r.q0, lk = r.k1 - r.k0;
    check.that(lq == 0 || lk > 0, "sequence ", i, " has ", lq, " queries but no keys");
    check.that(!options.causal || lk >= lq, "causal attention needs at least as many keys as queries in every ",
               "sequence (bottom-right alignment): sequence ", i, " has ", lq, " queries and ", lk, " keys");
    rows.push_back(r);
  }
  check.that(std::isfinite(options.scale), "options.scale must be finite, got ", options.scale);
  check_dropout_layout(check, options.dropout, rows);
  if (ctx.is_cuda() && options.dropout.enabled()) {
    check.that(options.dropout.masks != DropoutMasks::ByIndex, "by-index dropout masks over packed sequences are not "
               "supported on CUDA (cuDNN's ragged layout takes no custom mask here): use the device generator "
               "(--attention-dropout-masks device)");
    const bool self = std::all_of(rows.begin(), rows.end(),
                                  [](const SequenceRows& r) { return r.q1 - r.q0 == r.k1 - r.k0; });
    check.that(!options.causal || self, "causal dropout over packed sequences with fewer queries than keys "
               "(bottom-right alignment) has no cuDNN path, as for dense attention");
  }
  return rows;
}


// One sequence's rows of a [T, heads, D] tensor as a [1, L, heads, D] batch.
Tensor rows_of(const Tensor& t, int64_t begin, int64_t end) {
  return t.slice(begin, end).view({1, end - begin, t.dim(1), t.dim(2)});
}

// stats [H, Tq] columns [q0, q1) <-> a sequence's [1, H, L, 1] buffer.
void stats_columns(const Tensor& stats, std::vector<float>& buffer, int64_t q0, int64_t q1, bool to_stats) {
  const int64_t H = stats.dim(0), T = stats.dim(1), L = q1 - q0;
  float* s = stats.data<float>();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < L; ++j) {
      float& packed = s[h * T + q0 + j];
      float& own = buffer[size_t(h * L + j)];
      if (to_stats) packed = own;
      else own = packed;
    }
}

void forward_on_cpu(const Tensor& out, const Tensor& stats, const Tensor& q, const Tensor& k, const Tensor& v,
                    const std::vector<SequenceRows>& rows, bool causal, double scale, const AttentionDropout& dropout) {
  std::vector<float> buffer;
  for (const SequenceRows& r : rows) {
    if (r.q1 == r.q0) continue;
    buffer.assign(size_t(q.dim(1) * (r.q1 - r.q0)), 0.0f);
    const Tensor own = Tensor::from_blob(buffer.data(), {1, q.dim(1), r.q1 - r.q0, 1}, F32, Device::cpu());
    cpu::attention_forward(rows_of(out, r.q0, r.q1), own, rows_of(q, r.q0, r.q1), rows_of(k, r.k0, r.k1),
                           rows_of(v, r.k0, r.k1), causal, scale, sequence_dropout(dropout, r));
    stats_columns(stats, buffer, r.q0, r.q1, /*to_stats=*/true);
  }
}

void backward_on_cpu(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                     const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& stats,
                     const std::vector<SequenceRows>& rows, bool causal, double scale,
                     const AttentionDropout& dropout) {
  std::vector<float> buffer;
  for (const SequenceRows& r : rows) {
    if (r.q1 == r.q0) {  // keys that no query sees
      const size_t row_bytes = size_t(k.dim(1) * k.dim(2)) * dtype_size(k.dtype());
      std::memset(static_cast<char*>(dk.data_ptr()) + size_t(r.k0) * row_bytes, 0, size_t(r.k1 - r.k0) * row_bytes);
      std::memset(static_cast<char*>(dv.data_ptr()) + size_t(r.k0) * row_bytes, 0, size_t(r.k1 - r.k0) * row_bytes);
      continue;
    }
    buffer.assign(size_t(q.dim(1) * (r.q1 - r.q0)), 0.0f);
    stats_columns(stats, buffer, r.q0, r.q1, /*to_stats=*/false);
    const Tensor own = Tensor::from_blob(buffer.data(), {1, q.dim(1), r.q1 - r.q0, 1}, F32, Device::cpu());
    cpu::attention_backward(rows_of(dq, r.q0, r.q1), rows_of(dk, r.k0, r.k1), rows_of(dv, r.k0, r.k1),
                            rows_of(dout, r.q0, r.q1), rows_of(q, r.q0, r.q1), rows_of(k, r.k0, r.k1),
                            rows_of(v, r.k0, r.k1), rows_of(out, r.q0, r.q1), own, causal, scale,
                            sequence_dropout(dropout, r));
  }
}

}  // namespace

void attention_forward_varlen(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_kv,
                              const AttentionOptions& options) {
  OpCheck check("attention_forward_varlen");
  check.device(ctx, {{"out", out}, {"stats", stats}, {"q", q}, {"k", k}, {"v", v}});
  const std::vector<SequenceRows> rows = check_varlen(check, ctx, q, k, v, cu_seqlens_q, cu_seqlens_kv, options);
  check.shape("out", out, q.shape()).same_dtype({{"q", q}, {"out", out}});
  check.shape("stats", stats, Shape{q.dim(1), q.dim(0)}).dtype("stats", stats, F32);
  const float scale = attention_scale(options, q.dim(2));
  MEGATRON_DISPATCH(ctx,
                    cuda::attention_forward_varlen(ctx, out, stats, q, k, v, cu_seqlens_q, cu_seqlens_kv,
                                                   options.causal, scale, options.dropout),
                    forward_on_cpu(out, stats, q, k, v, rows, options.causal, scale, options.dropout));
}

void attention_backward_varlen(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                               const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& stats, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_kv,
                               const AttentionOptions& options) {
  OpCheck check("attention_backward_varlen");
  check.device(ctx, {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dout", dout}, {"q", q}, {"k", k}, {"v", v}, {"out", out},
                     {"stats", stats}});
  const std::vector<SequenceRows> rows = check_varlen(check, ctx, q, k, v, cu_seqlens_q, cu_seqlens_kv, options);
  check.shape("out", out, q.shape()).shape("dout", dout, q.shape()).shape("dq", dq, q.shape());
  check.shape("dk", dk, k.shape()).shape("dv", dv, k.shape());
  check.same_dtype({{"q", q}, {"out", out}, {"dout", dout}, {"dq", dq}, {"dk", dk}, {"dv", dv}});
  check.shape("stats", stats, Shape{q.dim(1), q.dim(0)}).dtype("stats", stats, F32);
  const float scale = attention_scale(options, q.dim(2));
  MEGATRON_DISPATCH(ctx,
                    cuda::attention_backward_varlen(ctx, dq, dk, dv, dout, q, k, v, out, stats, cu_seqlens_q,
                                                    cu_seqlens_kv, options.causal, scale, options.deterministic,
                                                    options.dropout),
                    backward_on_cpu(dq, dk, dv, dout, q, k, v, out, stats, rows, options.causal, scale,
                                    options.dropout));
}

double attention_varlen_pairs(const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_kv, bool causal) {
  const std::span<const int64_t> oq = offsets(cu_seqlens_q), ok = offsets(cu_seqlens_kv);
  double pairs = 0;
  for (size_t i = 0; i + 1 < oq.size() && i + 1 < ok.size(); ++i) {
    const double lq = double(oq[i + 1] - oq[i]), lk = double(ok[i + 1] - ok[i]);
    pairs += causal ? lq * (lq + 1) / 2 + lq * (lk - lq) : lq * lk;
  }
  return pairs;
}

}  // namespace megatron::ops
