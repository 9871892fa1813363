// CPU reference of the Sinkhorn routing ops (sinkhorn.h): the balancing in the summation order of the CUDA
// kernel (rows over e in order; columns as sums of row chunks, added in chunk order), with router_math.h's
// operations, so that both devices give the same bits. One thread: the cost matrix is small (tokens x experts).
#include <algorithm>
#include <vector>

#include "megatron/ops/router/cpu.h"
#include "megatron/ops/router/cpu_rows.h"

namespace megatron::ops::cpu {

namespace {

using namespace router_rows;
using enum DType;

// cost [T, E] <- Megatron's sinkhorn(exp(logits)), in place.
template <class TL, class C>
void balance(C* cost, const TL* logits, int64_t T, int64_t E) {
  for (int64_t i = 0; i < T * E; ++i) cost[i] = rm::exp_of(widen<C>(logits[i]));
  const int64_t R = sinkhorn_chunk_rows(T);
  const C inv_t = C(1.0 / double(T)), inv_e = C(1.0 / double(E)), eps = C(1e-8), tol = C(1e-4);
  std::vector<C> d0 = buffer<C>(T), d1(static_cast<size_t>(E), C(1));
  for (int iteration = 0; iteration < kSinkhornMaxIterations; ++iteration) {
    for (int64_t t = 0; t < T; ++t) {
      C s = C(0);
      for (int64_t e = 0; e < E; ++e) s = rm::add(s, rm::mul(d1[size_t(e)], cost[t * E + e]));
      d0[size_t(t)] = rm::mul(inv_t, rm::div(C(1), rm::add(s, eps)));
    }
    C error = C(0);
    for (int64_t e = 0; e < E; ++e) {
      C s = C(0);
      for (int64_t first = 0; first < T; first += R) {
        C chunk = C(0);
        for (int64_t t = first; t < std::min(T, first + R); ++t)
          chunk = rm::add(chunk, rm::mul(d0[size_t(t)], cost[t * E + e]));
        s = rm::add(s, chunk);
      }
      const C next = rm::mul(inv_e, rm::div(C(1), rm::add(s, eps)));
      error = rm::add(error, rm::magnitude(rm::sub(d1[size_t(e)], next)));
      d1[size_t(e)] = next;
    }
    if (!(rm::div(error, C(E)) > tol)) break;
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) cost[t * E + e] = rm::mul(rm::mul(d1[size_t(e)], cost[t * E + e]), d0[size_t(t)]);
}

}  // namespace

void router_sinkhorn(const Tensor& balanced, const Tensor& logits) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  auto run = [&]<class TL>() {
    using C = compute_t<TL>;
    balance<TL, C>(balanced.data<C>(), static_cast<const TL*>(logits.data_ptr()), T, E);
  };
  switch (logits.dtype()) {
    case F32: return run.template operator()<float>();
    case BF16: return run.template operator()<bf16_t>();
    case F16: return run.template operator()<fp16_t>();
    case F64: return run.template operator()<double>();
    default: MEGATRON_FAIL("router_sinkhorn (CPU): logits dtype ", dtype_name(logits.dtype()), " is not supported");
  }
}

void router_scores_at(const Tensor& probs, const Tensor& scores, const Tensor& indices) {
  const int64_t T = scores.dim(0), E = scores.dim(1), k = indices.dim(1);
  const int32_t* id = indices.data<int32_t>();
  for (int64_t i = 0; i < T * k; ++i)
    MEGATRON_CHECK(id[i] >= 0 && id[i] < E, "router_scores_at: indices[", i / k, ", ", i % k, "] = ", id[i],
                   " is not an expert of scores ", scores.describe());
  auto run = [&]<class C>() {
    const C* sc = scores.data<C>();
    C* out = probs.data<C>();
    for (int64_t i = 0; i < T * k; ++i) out[i] = sc[(i / k) * E + id[i]];
  };
  if (scores.dtype() == F64) run.template operator()<double>();
  else run.template operator()<float>();
}

}  // namespace megatron::ops::cpu
