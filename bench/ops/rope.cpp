// RoPE benchmark: bf16 [4, 4096, 32, 128], half layout, forward and backward. Memory-bound: one read and
// one write of every element.
#include <string>
#include <vector>

#include "../bench_util.h"
#include "megatron/ops/rope/rope.h"

namespace megatron::bench {

std::vector<OpBenchRow> bench_rope(Context& ctx) {
  std::vector<OpBenchRow> rows;
  const Shape shape{4, 4096, 32, 128};
  Tensor x = random_device_tensor(ctx, shape, DType::BF16, 1);
  Tensor out = ctx.empty(shape, DType::BF16);
  const double bytes = 2.0 * double(x.nbytes());
  ops::RopeOptions options;
  rows.push_back({"rope fwd bf16", "[4, 4096, 32, 128]", median_ms(ctx, [&] { ops::rope_forward(ctx, out, x, options); }), 0, bytes});
  rows.push_back({"rope bwd bf16", "[4, 4096, 32, 128]", median_ms(ctx, [&] { ops::rope_backward(ctx, out, x, options); }), 0, bytes});
  options.interleaved = true;
  rows.push_back({"rope fwd bf16 interleaved", "[4, 4096, 32, 128]", median_ms(ctx, [&] { ops::rope_forward(ctx, out, x, options); }), 0, bytes});
  return rows;
}

}  // namespace megatron::bench
