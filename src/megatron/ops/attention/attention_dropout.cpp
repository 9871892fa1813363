#include "megatron/ops/attention/attention_dropout.h"

#include <algorithm>

#include "megatron/core/error.h"
#include "megatron/core/philox.h"

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
  if (d.head_offset < 0 || d.head_offset + H > heads)
    return str_cat("its ", H, " heads from head ", d.head_offset, " exceed P's ", heads, " heads");
  std::string v = runs_violation("queries", d.queries, Sq, seq);
  return v.empty() ? runs_violation("keys", d.keys, Skv, seq) : v;
}

void attention_dropout_factors(const AttentionDropout& d, int64_t H, int64_t Skv, int64_t b, int64_t h,
                               int64_t query_row, int64_t keys, double* factor) {
  const int64_t heads = d.heads > 0 ? d.heads : H, seq = d.seq > 0 ? d.seq : Skv;
  const uint64_t row = uint64_t(((b * heads + d.head_offset + h) * seq + position_of(d.queries, query_row)) * seq);
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

}  // namespace megatron::ops
