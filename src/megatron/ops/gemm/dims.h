// The problem sizes of one validated gemm call, shared by the CPU and CUDA implementations (internal).
#pragma once

#include <cstdint>

namespace megatron::ops {

struct GemmDims {
  int64_t batch = 1;      // 1 for 2-D calls
  int64_t m = 0, n = 0, k = 0;
  bool batched = false;   // A and D are 3-D
  bool b_shared = false;  // batched with a 2-D B used by every batch entry
  // Row-major leading dimensions: the extent of the last dimension of A and B (D's is n).
  int64_t lda = 0, ldb = 0;
  // Elements between consecutive batch entries.
  int64_t stride_a() const { return m * k; }
  int64_t stride_b() const { return b_shared ? 0 : k * n; }
  int64_t stride_d() const { return m * n; }
};

}  // namespace megatron::ops
