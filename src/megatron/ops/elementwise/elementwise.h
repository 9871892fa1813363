// Elementwise ops: dtype casts, copies and fills (constant, Philox uniform/normal), batched transpose,
// add/mul/scale/axpby, and the reductions training needs (row sums, column sums = bias gradients, total
// sum, amax).
//
// Contract, for every op here:
// - Every output is assigned (=), never accumulated. Outputs are preallocated by the caller; all tensors
//   live on ctx's device (copy also accepts host tensors). `out` may alias an input of add, mul, scale,
//   axpby, and of cast / cast_scaled when both element types have the same size; transpose and the
//   reductions need a separate output.
// - Float dtypes: F32, F16, BF16 and F64 (F64 is for the CPU reference and finite differences but runs on
//   CUDA too); cast, fill and amax also take F8E4M3 / F8E5M2.
// - Narrow values are widened to fp32, computed in fp32 (fp64 for F64 tensors) and rounded once to the
//   output dtype with the conversions of core/float_types.h (round to nearest even, fp8 saturating). The
//   CPU reference accumulates in fp64; CUDA reductions accumulate in fp32 in a fixed order, so they are
//   deterministic run to run (no float atomics).
// - cast between float dtypes, copy, fill, fill_uniform, transpose and amax give bit-identical results on
//   CPU and CUDA. fill_normal agrees to ~1 fp32 ulp (fp64 log/sin/cos differ across libraries).
#pragma once

#include <cstdint>

#include "megatron/runtime/context.h"

namespace megatron::ops {

// out = in converted to out's dtype; same shape. Float <-> float for every float dtype; integer dtypes
// (I8, I16, I32, I64, U8, U16) <-> F32 only. int -> f32 rounds to nearest even; f32 -> int rounds toward
// zero and saturates to the integer range, NaN -> 0.
void cast(Context& ctx, const Tensor& out, const Tensor& in);

// fp8 (or any float) quantisation with a scale, one pass:  out = convert(in * scale)  with the product
// taken in fp32 (fp64 for F64 input), and  amax = max |in|  (F32 [1], the unscaled input; NaN if any input
// is NaN). in: F32/F16/BF16/F64; out: any float dtype; same shape.
void cast_scaled(Context& ctx, const Tensor& out, const Tensor& amax, const Tensor& in, float scale);

// out = in, same dtype and shape (any dtype). Each tensor is on ctx's device or on the host; a copy to a
// host tensor returns when the bytes are there, the others are queued on ctx's stream.
void copy(Context& ctx, const Tensor& out, const Tensor& in);

// out[i] = value converted to out's dtype (any dtype; integers: toward zero, saturated).
void fill(Context& ctx, const Tensor& out, double value);

// out[i] = lo + (hi - lo) * philox_uniform(seed, offset, index_base + i), in fp32 (fp64 for F64), then
// rounded to out's dtype. Values lie in [lo, hi] (hi only by rounding). Float dtypes. `index_base` is the
// element's offset in the global (unsharded) tensor, so shards filled separately equal the whole.
void fill_uniform(Context& ctx, const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi,
                  uint64_t index_base = 0);

// out[i] = mean + std * philox_normal(seed, offset, index_base + i), in fp32 (fp64 for F64). Float dtypes.
void fill_normal(Context& ctx, const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std,
                 uint64_t index_base = 0);

// Batched transpose of the last two dimensions: in [B, M, N] -> out [B, N, M] (or [M, N] -> [N, M]).
// Any dtype; out must not alias in.
void transpose(Context& ctx, const Tensor& out, const Tensor& in);

// out = a + b, out = a * b (same shape and dtype: F32, F16, BF16, F64).
void add(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b);
void mul(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b);
// out = alpha * in.
void scale(Context& ctx, const Tensor& out, const Tensor& in, double alpha);
// in, out [R, C] (any rank: the last dimension is C); s [R] F32 (F64 for F64 tensors): out[r, c] = in[r, c] * s[r]
// (a per-row gate, e.g. the shared experts' sigmoid gate). out may alias in.
void scale_rows(Context& ctx, const Tensor& out, const Tensor& in, const Tensor& s);
// out = alpha * x + beta * y; beta == 0 means y is not read (inf/NaN in y do not propagate).
void axpby(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& y, double alpha, double beta);

// Reductions; in: F32, F16, BF16, F64; out: F32 (fp32 accumulation on CUDA, fp64 on the CPU).
// in [R, C] -> out [R]: out[r] = sum_c in[r, c].
void sum_rows(Context& ctx, const Tensor& out, const Tensor& in);
// in [R, C] -> out [C]: out[c] = sum_r in[r, c]  (the bias gradient).
void sum_columns(Context& ctx, const Tensor& out, const Tensor& in);
// any shape -> out [1]: the sum of all elements.
void sum_all(Context& ctx, const Tensor& out, const Tensor& in);
// any shape, any float dtype (fp8 included) -> out [1]: max |in| (0 for an empty tensor; NaN if any
// element is NaN). Exact: the largest magnitude, widened to fp32.
void amax(Context& ctx, const Tensor& out, const Tensor& in);

}  // namespace megatron::ops
