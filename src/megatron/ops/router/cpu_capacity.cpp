// CPU reference of router_drop_over_capacity (see capacity.h): per expert, its slots in slot order, stably
// sorted by probability (descending) for by_probs; those past the capacity are dropped.
#include <algorithm>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/ops/router/cpu.h"

namespace megatron::ops::cpu {

void router_drop_over_capacity(const Tensor& kept_probs, const Tensor& kept_indices, const Tensor& probs,
                               const Tensor& indices, int num_experts, int64_t capacity, bool by_probs) {
  const int64_t n = probs.numel();
  const int32_t* idx = indices.data<int32_t>();
  int32_t* kept_idx = kept_indices.data<int32_t>();
  std::copy(idx, idx + n, kept_idx);
  visit_float_dtype(probs.dtype(), "router_drop_over_capacity", [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T* p = probs.data<T>();
      T* kept_p = kept_probs.data<T>();
      std::copy(p, p + n, kept_p);
      std::vector<std::vector<int64_t>> slots(static_cast<size_t>(num_experts));
      for (int64_t i = 0; i < n; ++i) {
        const int32_t e = idx[i];
        MEGATRON_CHECK(e >= 0 && e < num_experts, "router_drop_over_capacity: expert id ", e, " at slot ", i,
                       " outside [0, ", num_experts, ")");
        slots[size_t(e)].push_back(i);
      }
      for (std::vector<int64_t>& s : slots) {
        if (int64_t(s.size()) <= capacity) continue;
        if (by_probs) std::stable_sort(s.begin(), s.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
        for (size_t j = size_t(capacity); j < s.size(); ++j) {
          kept_idx[s[j]] = -1;
          kept_p[s[j]] = T(0);
        }
      }
    } else {
      MEGATRON_FAIL("router_drop_over_capacity: probs must be F32 or F64, got ", probs.describe());
    }
  });
}

}  // namespace megatron::ops::cpu
