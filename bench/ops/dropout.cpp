// Dropout benchmarks (memory-bound; the mask is regenerated, never stored): bytes = inputs read once +
// output written once.
#include <string>
#include <vector>

#include "bench_util.h"
#include "megatron/ops/dropout/dropout.h"

namespace megatron::bench {

std::vector<OpBenchRow> bench_dropout(Context& ctx) {
  std::vector<OpBenchRow> rows;
  const int64_t r = 16384, h = 8192;
  for (DType dt : {DType::BF16, DType::F32}) {
    const double act = double(r * h) * double(dtype_size(dt));
    const std::string config = std::to_string(r) + "x" + std::to_string(h) + " " + dtype_name(dt) + " p=0.1";
    Tensor x = random_device_tensor(ctx, Shape{r, h}, dt, 1);
    Tensor res = random_device_tensor(ctx, Shape{r, h}, dt, 2);
    Tensor bias = random_device_tensor(ctx, Shape{h}, dt, 3);
    Tensor y = ctx.empty(Shape{r, h}, dt);
    double ms = median_ms(ctx, [&] { ops::dropout_forward(ctx, y, x, 0.1f, 1234, 7); });
    rows.push_back({"dropout fwd", config, ms, 0, 2 * act});
    ms = median_ms(ctx, [&] { ops::dropout_backward(ctx, y, x, 0.1f, 1234, 7); });
    rows.push_back({"dropout bwd", config, ms, 0, 2 * act});
    ms = median_ms(ctx, [&] { ops::bias_dropout_add_forward(ctx, y, x, bias, res, 0.1f, 1234, 7); });
    rows.push_back({"bias_dropout_add fwd", config, ms, 0, 3 * act});
    ms = median_ms(ctx, [&] { ops::dropout_forward(ctx, y, x, 0.1f, 1234, 7, 1); });
    rows.push_back({"dropout fwd (index_base % 4 != 0)", config, ms, 0, 2 * act});
  }
  return rows;
}

}  // namespace megatron::bench
