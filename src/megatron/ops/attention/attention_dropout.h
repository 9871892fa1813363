// Dropout on the attention probabilities (Megatron's --attention-dropout), addressed so that every parallel
// layout draws the masks of one rank.
//
// A micro-batch's attention probabilities form, in the whole model (TP = 1, CP = 1), the tensor
// P [B, heads, seq, seq]: element (b, h, i, j) is the probability with which query position i of head h of
// sequence b attends key position j. Its mask is a function of that index alone:
//   keep(b, h, i, j)  iff  philox_uniform(seed, offset, ((b * heads + h) * seq + i) * seq + j) >= p
// (core/philox.h: identical on every device), and kept probabilities are scaled by 1 / (1 - p), in double, as
// torch.nn.Dropout does on Megatron's softmax output. Dropped ones are exactly 0.
//
// An attention call computes a part of P -- a tensor-parallel rank's heads, a context-parallel rank's query and
// key positions, one block of ring attention -- and says where its rows and columns sit in P:
//   head_offset  P's head of the call's head 0 (a call's heads are consecutive heads of P);
//   queries      runs of the call's query rows that sit at consecutive positions of P (empty: row r is position r);
//   keys         the same for the call's key rows.
// Attention applies the mask to the normalised probabilities: out = (P o M / (1 - p)) V, while the log-sum-exp
// statistics stay those of the undropped scores. So partial results over blocks of keys still merge exactly
// through their statistics (context parallelism), and the backward, which regenerates the mask, has
// dS = P o (dP o M / (1 - p) - rowsum(dO o O)) with the dropped output O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron::ops {

// Rows [row, row + count) of a call's queries (or keys) sit at positions [position, position + count) of P.
struct PositionRun {
  int64_t row = 0, position = 0, count = 0;
};

struct AttentionDropout {
  float p = 0.0f;                   // 0: no dropout (every other field is then ignored)
  uint64_t seed = 0, offset = 0;    // the Philox stream of this call site and micro-batch
  int64_t heads = 0;                // P's heads (0: the call's own head count)
  int64_t head_offset = 0;
  int64_t seq = 0;                  // P's sequence length (0: the call's own key count)
  std::vector<PositionRun> queries, keys;

  bool enabled() const { return p > 0.0f; }
};

// The position of row `row` under `runs` (row itself when runs are empty).
int64_t position_of(const std::vector<PositionRun>& runs, int64_t row);
// The runs of rows [first, first + count) of `runs`, renumbered from 0 (a slice of a call's rows).
std::vector<PositionRun> slice_runs(const std::vector<PositionRun>& runs, int64_t first, int64_t count);
// Context parallelism's load-balanced layout: rank `rank` of `ranks` holds chunks rank and 2 * ranks - 1 - rank
// of `chunk` positions each, back to back.
std::vector<PositionRun> two_chunk_runs(int ranks, int rank, int64_t chunk);
// Every problem with `dropout`'s addressing of a call with H heads, Sq queries and Skv keys (the runs cover
// the rows once, in order; everything inside P); empty when it is consistent.
std::string attention_dropout_violation(const AttentionDropout& dropout, int64_t H, int64_t Sq, int64_t Skv);

// The dropout factors of one query row of a call with H heads and Skv keys: factor[j] = keep ? 1 / (1 - p) : 0
// for the call's first `keys` keys, of sequence b, the call's head h and query row `query_row`.
void attention_dropout_factors(const AttentionDropout& dropout, int64_t H, int64_t Skv, int64_t b, int64_t h,
                               int64_t query_row, int64_t keys, double* factor);

}  // namespace megatron::ops
