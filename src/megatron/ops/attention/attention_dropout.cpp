#include "megatron/ops/attention/attention_dropout.h"

#include <algorithm>

#include "megatron/core/error.h"
#include "megatron/core/philox.h"
#include "megatron/ops/dispatch.h"
#include "megatron/ops/elementwise/cpu.h"
#include "megatron/tensor/op_checks.h"
#if MEGATRON_WITH_CUDA
#include "megatron/ops/attention/cuda.h"
#endif

namespace megatron::ops {
namespace {

// Whether `runs` number rows [0, rows) once, in order, at positions inside [0, seq).
std::string runs_violation(const char* what, const std::vector<PositionRun>& runs, int64_t rows, int64_t seq) {
  if (runs.empty()) return rows <= seq ? "" : str_cat("its ", rows, " ", what, " exceed P's ", seq, " positions");
  int64_t next = 0;
  for (const PositionRun& r : runs) {
    if (r.row != next || r.count < 0 || r.position < 0 || r.position + r.count > seq)
      return str_cat("the run of ", what, " {row ", r.row, ", position ", r.position, ", count ", r.count,
                     "} does not continue at row ", next, " inside P's ", seq, " positions");
    next += r.count;
  }
  return next == rows ? "" : str_cat("its runs number ", next, " ", what, " but the call has ", rows);
}

// factor[t] = keep ? scale : 0 for the Philox indices first .. first + n - 1, one Philox block per four.
void fill_factors(uint64_t seed, uint64_t offset, uint64_t first, int64_t n, float p, double scale, double* factor) {
  int64_t t = 0;
  while (t < n) {
    const uint64_t index = first + uint64_t(t), block = index >> 2;
    const Philox4x32 r = philox4x32_10(uint32_t(block), uint32_t(block >> 32), uint32_t(offset),
                                       uint32_t(offset >> 32), uint32_t(seed), uint32_t(seed >> 32));
    for (uint64_t lane = index & 3u; lane < 4 && t < n; ++lane, ++t)
      factor[t] = philox_word_uniform(r.v[lane]) >= p ? scale : 0.0;
  }
}

// SplitMix64's finaliser: every input bit moves every output bit.
uint64_t mix(uint64_t h, uint64_t value) {
  uint64_t z = h + 0x9E3779B97F4A7C15ull + value;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t mix_runs(uint64_t h, const std::vector<PositionRun>& runs) {
  h = mix(h, runs.size());
  for (const PositionRun& r : runs) h = mix(mix(mix(h, uint64_t(r.row)), uint64_t(r.position)), uint64_t(r.count));
  return h;
}

// The CPU fill: each query row's factors over its visible keys, 1 or 0, zero above the causal diagonal.
void cpu_dropout_mask(const Tensor& mask, const AttentionDropout& d, bool causal) {
  const int64_t B = mask.dim(0), H = mask.dim(1), Sq = mask.dim(2), Skv = mask.dim(3);
  std::vector<double> values(size_t(mask.numel()));
  double* m = values.data();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        double* row = m + ((b * H + h) * Sq + i) * Skv;
        const int64_t visible = causal ? std::min(Skv, i + (Skv - Sq) + 1) : Skv;
        attention_dropout_factors(d, H, Skv, b, h, i, visible, row);
        for (int64_t j = 0; j < Skv; ++j) row[j] = j < visible && row[j] != 0.0 ? 1.0 : 0.0;
      }
  cpu::cast(mask, Tensor::from_blob(values.data(), mask.shape(), DType::F64, Device::cpu()));
}

}  // namespace

int64_t position_of(const std::vector<PositionRun>& runs, int64_t row) {
  for (const PositionRun& r : runs)
    if (row >= r.row && row < r.row + r.count) return r.position + (row - r.row);
  return row;
}

std::vector<PositionRun> slice_runs(const std::vector<PositionRun>& runs, int64_t first, int64_t count) {
  if (runs.empty()) return {{0, first, count}};
  std::vector<PositionRun> out;
  for (const PositionRun& r : runs) {
    const int64_t begin = std::max(first, r.row), end = std::min(first + count, r.row + r.count);
    if (begin < end) out.push_back({begin - first, r.position + (begin - r.row), end - begin});
  }
  return out;
}

std::vector<PositionRun> two_chunk_runs(int ranks, int rank, int64_t chunk) {
  return {{0, int64_t(rank) * chunk, chunk}, {chunk, int64_t(2 * ranks - 1 - rank) * chunk, chunk}};
}

std::string attention_dropout_violation(const AttentionDropout& d, int64_t H, int64_t Sq, int64_t Skv) {
  if (!d.enabled()) return "";
  if (!(d.p < 1.0f)) return str_cat("the dropout probability ", d.p, " must be in [0, 1)");
  const int64_t heads = d.heads > 0 ? d.heads : H, seq = d.seq > 0 ? d.seq : Skv;
  if (d.batch_offset < 0) return str_cat("its batch offset ", d.batch_offset, " must be >= 0");
  if (d.head_offset < 0 || d.head_offset + H > heads)
    return str_cat("its ", H, " heads from head ", d.head_offset, " exceed P's ", heads, " heads");
  std::string v = runs_violation("queries", d.queries, Sq, seq);
  return v.empty() ? runs_violation("keys", d.keys, Skv, seq) : v;
}

void attention_dropout_factors(const AttentionDropout& d, int64_t H, int64_t Skv, int64_t b, int64_t h,
                               int64_t query_row, int64_t keys, double* factor) {
  const int64_t heads = d.heads > 0 ? d.heads : H, seq = d.seq > 0 ? d.seq : Skv;
  const uint64_t row =
      uint64_t((((d.batch_offset + b) * heads + d.head_offset + h) * seq + position_of(d.queries, query_row)) * seq);
  const double scale = 1.0 / (1.0 - double(d.p));
  if (d.keys.empty()) {
    fill_factors(d.seed, d.offset, row, keys, d.p, scale, factor);
    return;
  }
  for (const PositionRun& r : d.keys) {
    const int64_t n = std::min(r.count, keys - r.row);
    if (n <= 0) break;
    fill_factors(d.seed, d.offset, row + uint64_t(r.position), n, d.p, scale, factor + r.row);
  }
}

uint64_t attention_dropout_device_seed(const AttentionDropout& d) {
  uint64_t h = mix(mix(mix(0, d.seed), d.offset), uint64_t(d.heads));
  h = mix(mix(mix(h, uint64_t(d.batch_offset)), uint64_t(d.head_offset)), uint64_t(d.seq));
  return mix_runs(mix_runs(h, d.queries), d.keys);
}

void attention_dropout_mask(Context& ctx, const Tensor& mask, const AttentionDropout& dropout, bool causal) {
  OpCheck check("attention_dropout_mask");
  check.device(ctx, {{"mask", mask}});
  check.rank("mask", mask, 4).dtype_in("mask", mask, {DType::F32, DType::BF16, DType::F16});
  const int64_t H = mask.dim(1), Sq = mask.dim(2), Skv = mask.dim(3);
  check.that(dropout.enabled(), "dropout.p must be > 0, got ", dropout.p);
  check.that(!causal || Skv >= Sq, "a causal mask needs Skv >= Sq: mask ", mask.describe());
  const std::string violation = attention_dropout_violation(dropout, H, Sq, Skv);
  check.that(violation.empty(), "dropout: ", violation);
  if (mask.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::attention_dropout_mask(ctx, mask, dropout, causal),
                    cpu_dropout_mask(mask, dropout, causal));
}

}  // namespace megatron::ops
