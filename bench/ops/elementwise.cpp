// Elementwise family benchmarks: all memory-bound, so each row reports the fewest bytes one call moves
// (inputs read once, outputs written once) and the driver turns that into GB/s against the copy ceiling.
#include <cuda_runtime.h>

#include "bench_util.h"
#include "megatron/core/cuda_check.h"
#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::bench {

std::vector<OpBenchRow> bench_elementwise(Context& ctx) {
  using enum DType;
  std::vector<OpBenchRow> rows;
  const int64_t R = 16384, C = 8192;
  const double n = double(R) * double(C);
  const std::string rc = std::to_string(R) + "x" + std::to_string(C);
  auto row = [&](const std::string& op, const std::string& config, double bytes, const std::function<void()>& fn) {
    rows.push_back(OpBenchRow{op, config, median_ms(ctx, fn), 0.0, bytes});
  };

  {  // The memory-bandwidth ceiling: a device-to-device copy of 2 GiB (bytes = read + write).
    const size_t bytes = size_t(2) << 30;
    Tensor src = random_device_tensor(ctx, Shape{int64_t(bytes / 4)}, F32, 1);
    Tensor dst = ctx.empty(Shape{int64_t(bytes / 4)}, F32);
    row("copy d2d (ceiling)", "2 GiB", 2.0 * double(bytes), [&] {
      CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDeviceToDevice, ctx.stream()));
    });
  }

  Tensor x_bf16 = random_device_tensor(ctx, Shape{R, C}, BF16, 2);
  Tensor y_bf16 = random_device_tensor(ctx, Shape{R, C}, BF16, 3);
  {
    Tensor out = ctx.empty(Shape{R, C}, F32);
    row("cast bf16->f32", rc, n * (2 + 4), [&] { ops::cast(ctx, out, x_bf16); });
  }
  {
    Tensor x = random_device_tensor(ctx, Shape{R, C}, F32, 4, -500, 500);
    Tensor out = ctx.empty(Shape{R, C}, F8E4M3);
    row("cast f32->e4m3", rc, n * (4 + 1), [&] { ops::cast(ctx, out, x); });
  }
  {
    Tensor out = ctx.empty(Shape{R, C}, F8E4M3);
    Tensor amax = ctx.empty(Shape{1}, F32);
    row("cast_scaled bf16->e4m3 +amax", rc, n * (2 + 1), [&] { ops::cast_scaled(ctx, out, amax, x_bf16, 64.0f); });
  }
  {
    Tensor out = ctx.empty(Shape{R, C}, BF16);
    row("add bf16", rc, n * 2 * 3, [&] { ops::add(ctx, out, x_bf16, y_bf16); });
    row("axpby bf16", rc, n * 2 * 3, [&] { ops::axpby(ctx, out, x_bf16, y_bf16, 0.5, -1.5); });
  }
  {
    Tensor out = ctx.empty(Shape{R, C}, F32);
    row("fill_normal f32", rc, n * 4, [&] { ops::fill_normal(ctx, out, 1, 2, 0.0, 0.02); });
    row("fill_uniform f32", rc, n * 4, [&] { ops::fill_uniform(ctx, out, 1, 2, -1.0, 1.0); });
    row("fill f32", rc, n * 4, [&] { ops::fill(ctx, out, 0.5); });
  }
  {
    Tensor out = ctx.empty(Shape{C, R}, BF16);
    row("transpose bf16", rc, n * 2 * 2, [&] { ops::transpose(ctx, out, x_bf16); });
  }
  {
    const int64_t r = 16384, c = 4096;
    Tensor x = random_device_tensor(ctx, Shape{r, c}, BF16, 5);
    Tensor out = ctx.empty(Shape{c}, F32);
    row("sum_columns bf16", std::to_string(r) + "x" + std::to_string(c), double(r) * double(c) * 2 + double(c) * 4,
        [&] { ops::sum_columns(ctx, out, x); });
  }
  {
    Tensor out = ctx.empty(Shape{R}, F32);
    row("sum_rows bf16", rc, n * 2 + double(R) * 4, [&] { ops::sum_rows(ctx, out, x_bf16); });
    Tensor one = ctx.empty(Shape{1}, F32);
    row("sum_all bf16", rc, n * 2, [&] { ops::sum_all(ctx, one, x_bf16); });
    row("amax bf16", rc, n * 2, [&] { ops::amax(ctx, one, x_bf16); });
  }
  return rows;
}

}  // namespace megatron::bench
