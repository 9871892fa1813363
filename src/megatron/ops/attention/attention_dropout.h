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
// key positions, one block of ring attention, one packed document -- and says where its rows and columns sit
// in P:
//   batch_offset P's sequence of the call's batch row 0 (a call's batch rows are consecutive sequences of P);
//   head_offset  P's head of the call's head 0 (a call's heads are consecutive heads of P);
//   queries      runs of the call's query rows that sit at consecutive positions of P (empty: row r is position r);
//   keys         the same for the call's key rows.
// Attention applies the mask to the normalised probabilities: out = (P o M / (1 - p)) V, while the log-sum-exp
// statistics stay those of the undropped scores. So partial results over blocks of keys still merge exactly
// through their statistics (context parallelism), and the backward, which regenerates the mask, has
// dS = P o (dP o M / (1 - p) - rowsum(dO o O)) with the dropped output O.
//
// Which generator draws M (AttentionDropout::masks):
//   ByIndex  the addressing above, on every device: a CUDA call writes M [B, H, Sq, Skv] with
//            attention_dropout_mask and hands it to cuDNN's fused attention as a custom mask, so GPU runs
//            draw the CPU reference's masks bit for bit and every TP/CP layout the whole model's. The mask
//            costs B*H*Sq*Skv elements of the I/O type per call, and cuDNN with a custom mask runs attention's
//            forward + backward about 6x slower than without dropout (bench_ops --only attention).
//   Device   (the default) the device's own fused generator where it has one: on CUDA cuDNN's Philox,
//            keyed by attention_dropout_device_seed (a hash of seed, offset and the call's addressing, so
//            every layer, micro-batch, TP rank and CP block draws an independent stream and the backward
//            regenerates the forward's mask). Its masks depend on cuDNN's kernel layout, not on the element
//            index: they are Bernoulli(1 - p) like the reference's, but not the CPU's bits, and another
//            layout draws other masks (as Megatron's per-rank RNG trackers do). The CPU has no other
//            generator and always draws by index.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/runtime/context.h"

namespace megatron::ops {

// Rows [row, row + count) of a call's queries (or keys) sit at positions [position, position + count) of P.
struct PositionRun {
  int64_t row = 0, position = 0, count = 0;
};

enum class DropoutMasks { Device, ByIndex };

struct AttentionDropout {
  float p = 0.0f;                   // 0: no dropout (every other field is then ignored)
  DropoutMasks masks = DropoutMasks::Device;
  uint64_t seed = 0, offset = 0;    // the Philox stream of this call site and micro-batch
  int64_t heads = 0;                // P's heads (0: the call's own head count)
  int64_t batch_offset = 0;
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

// The key of the Device generator's stream: a hash of seed, offset, heads, batch_offset, head_offset, seq and the
// query and key runs (two calls share it only when they address the same part of P).
uint64_t attention_dropout_device_seed(const AttentionDropout& dropout);

// Writes M: mask [B, H, Sq, Skv] (F32, BF16 or F16) = 1 where the by-index addressing keeps the probability of
// (b, the call's head h, query row i, key row j), 0 where it drops it -- and 0 above the causal diagonal when
// `causal` (bottom-right aligned, attention.h), where nothing is drawn. The same bits on every device (the CPU
// fills them with attention_dropout_factors). `dropout` must be enabled and consistent with the shape.
void attention_dropout_mask(Context& ctx, const Tensor& mask, const AttentionDropout& dropout, bool causal);

}  // namespace megatron::ops
