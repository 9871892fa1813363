// attention_dropout_mask on CUDA (attention_dropout.h): the by-index masks written as 0/1 in the mask's dtype.
// One thread per four consecutive keys of a query row. The positions of the call's query and key rows in P come
// from one small device table (the runs expanded on the host: Sq + Skv int64), and consecutive key positions
// share a Philox block, so a thread evaluates Philox once or twice. Keys above the causal diagonal draw nothing.
// The keep test is philox_word_uniform's float expression, so the bits are the CPU's.
#include "megatron/ops/attention/cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "megatron/core/cuda_check.h"
#include "megatron/core/philox.h"
#include "megatron/ops/attention/attention_dropout.h"
#include "megatron/ops/cuda_common.cuh"

namespace megatron::ops::cuda {
namespace {

struct MaskParams {
  const int64_t* positions;  // [Sq] query positions, then [Skv] key positions, in P
  int64_t H, Sq, Skv, heads, batch_offset, head_offset, seq;
  uint64_t seed, offset;
  float p;
  bool causal;
};

template <class T>
__global__ void __launch_bounds__(256) dropout_mask_kernel(T* mask, MaskParams m, int64_t quads_per_row,
                                                           int64_t quads) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < quads; t += stride) {
    const int64_t row = t / quads_per_row;  // (b * H + h) * Sq + i
    const int64_t j0 = (t - row * quads_per_row) * 4;
    const int64_t i = row % m.Sq, bh = row / m.Sq, h = bh % m.H, b = m.batch_offset + bh / m.H;
    const uint64_t base = uint64_t(((b * m.heads + m.head_offset + h) * m.seq + m.positions[i]) * m.seq);
    const int64_t visible = m.causal ? min(m.Skv, i + (m.Skv - m.Sq) + 1) : m.Skv;
    const int64_t* key_positions = m.positions + m.Sq;
    uint64_t drawn = ~uint64_t(0);
    Philox4x32 r{};
    T* out = mask + row * m.Skv;
    for (int64_t j = j0; j < j0 + 4 && j < m.Skv; ++j) {
      float keep = 0.f;
      if (j < visible) {
        const uint64_t index = base + uint64_t(key_positions[j]), block = index >> 2;
        if (block != drawn) {
          r = philox4x32_10(uint32_t(block), uint32_t(block >> 32), uint32_t(m.offset), uint32_t(m.offset >> 32),
                            uint32_t(m.seed), uint32_t(m.seed >> 32));
          drawn = block;
        }
        keep = philox_word_uniform(r.v[index & 3u]) >= m.p ? 1.f : 0.f;
      }
      out[j] = from_f32<T>(keep);
    }
  }
}

}  // namespace

void attention_dropout_mask(Context& ctx, const Tensor& mask, const AttentionDropout& d, bool causal) {
  const int64_t B = mask.dim(0), H = mask.dim(1), Sq = mask.dim(2), Skv = mask.dim(3);
  std::vector<int64_t> host(size_t(Sq + Skv));
  for (int64_t i = 0; i < Sq; ++i) host[size_t(i)] = position_of(d.queries, i);
  for (int64_t j = 0; j < Skv; ++j) host[size_t(Sq + j)] = position_of(d.keys, j);
  Tensor positions = ctx.empty({Sq + Skv}, DType::I64);
  copy_tensor(ctx, positions, Tensor::from_blob(host.data(), {Sq + Skv}, DType::I64, Device::cpu()));
  const MaskParams m{positions.data<int64_t>(), H, Sq, Skv, d.heads > 0 ? d.heads : H, d.batch_offset, d.head_offset,
                     d.seq > 0 ? d.seq : Skv, d.seed, d.offset, d.p, causal};
  const int64_t quads_per_row = (Skv + 3) / 4, quads = B * H * Sq * quads_per_row;
  const unsigned grid = unsigned(std::min<int64_t>((quads + 255) / 256, int64_t(1) << 20));
  cudaStream_t stream = ctx.stream();
  switch (mask.dtype()) {
    case DType::F32: dropout_mask_kernel<float><<<grid, 256, 0, stream>>>(mask.data<float>(), m, quads_per_row, quads); break;
    case DType::BF16:
      dropout_mask_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(mask.data_ptr()), m,
                                                                   quads_per_row, quads);
      break;
    case DType::F16:
      dropout_mask_kernel<__half><<<grid, 256, 0, stream>>>(static_cast<__half*>(mask.data_ptr()), m, quads_per_row, quads);
      break;
    default: MEGATRON_FAIL("attention_dropout_mask (cuda): unsupported dtype ", dtype_name(mask.dtype()));
  }
  CUDA_CHECK_MSG(cudaGetLastError(), " after launching dropout_mask_kernel (", mask.describe(), ")");
}

}  // namespace megatron::ops::cuda
