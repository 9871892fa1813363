// Activation benchmarks (memory-bound): bytes = each input read once + each output written once.
#include <string>
#include <vector>

#include "bench_util.h"
#include "megatron/ops/activation/activation.h"

namespace megatron::bench {

std::vector<OpBenchRow> bench_activation(Context& ctx) {
  std::vector<OpBenchRow> rows;
  for (DType dt : {DType::BF16, DType::F32}) {
    const int64_t r = 16384, f = 5632;
    const double e = double(dtype_size(dt)), rf = double(r * f);
    const std::string config = std::to_string(r) + "x" + std::to_string(f) + " " + dtype_name(dt);
    Tensor x2 = random_device_tensor(ctx, Shape{r, 2 * f}, dt, 1, -4, 4);
    Tensor dx2 = ctx.empty(Shape{r, 2 * f}, dt);
    Tensor y = ctx.empty(Shape{r, f}, dt);
    Tensor dy = random_device_tensor(ctx, Shape{r, f}, dt, 2);
    Tensor x = x2.view({r, 2 * f}).slice(0, r / 2).view({r, f});  // [r, f] over the first half of x2's storage
    Tensor dx = dx2.view({r, 2 * f}).slice(0, r / 2).view({r, f});

    double ms = median_ms(ctx, [&] { ops::swiglu_forward(ctx, y, x2); });
    rows.push_back({"swiglu fwd", config + " (x [R,2F])", ms, 0, 3 * rf * e});
    ms = median_ms(ctx, [&] { ops::swiglu_backward(ctx, dx2, dy, x2); });
    rows.push_back({"swiglu bwd", config + " (x [R,2F])", ms, 0, 5 * rf * e});
    ms = median_ms(ctx, [&] { ops::gelu_forward(ctx, y, x); });
    rows.push_back({"gelu fwd", config, ms, 0, 2 * rf * e});
    ms = median_ms(ctx, [&] { ops::gelu_backward(ctx, dx, dy, x); });
    rows.push_back({"gelu bwd", config, ms, 0, 3 * rf * e});
    ms = median_ms(ctx, [&] { ops::silu_forward(ctx, y, x); });
    rows.push_back({"silu fwd", config, ms, 0, 2 * rf * e});
    ms = median_ms(ctx, [&] { ops::silu_backward(ctx, dx, dy, x); });
    rows.push_back({"silu bwd", config, ms, 0, 3 * rf * e});
  }
  return rows;
}

}  // namespace megatron::bench
