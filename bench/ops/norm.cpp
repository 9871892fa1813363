// LayerNorm / RMSNorm benchmarks: memory-bound, so each row reports the fewest bytes one call must move
// (activations read and written once, statistics, parameters and their gradients).
#include <string>
#include <vector>

#include "bench_util.h"
#include "megatron/ops/norm/norm.h"

namespace megatron::bench {

std::vector<OpBenchRow> bench_norm(Context& ctx) {
  std::vector<OpBenchRow> rows;
  const float eps = 1e-5f;
  struct Config {
    int64_t r, h;
    DType dt, wdt;
  };
  for (Config cfg : {Config{16384, 4096, DType::BF16, DType::BF16}, Config{16384, 8192, DType::BF16, DType::BF16},
                     Config{16384, 4096, DType::BF16, DType::F32}, Config{16384, 4096, DType::F32, DType::F32}}) {
    const int64_t r = cfg.r, h = cfg.h;
    const double act = double(r * h) * double(dtype_size(cfg.dt)), stat = double(r) * 4,
                 par = double(h) * double(dtype_size(cfg.wdt)), grad = double(h) * 4;
    const std::string config = std::to_string(r) + "x" + std::to_string(h) + " " + dtype_name(cfg.dt) + " w" +
                               dtype_name(cfg.wdt);
    Tensor x = random_device_tensor(ctx, Shape{r, h}, cfg.dt, 1, -1, 3);
    Tensor res = random_device_tensor(ctx, Shape{r, h}, cfg.dt, 2);
    Tensor dy = random_device_tensor(ctx, Shape{r, h}, cfg.dt, 3);
    Tensor w = random_device_tensor(ctx, Shape{h}, cfg.wdt, 4, 0.5, 1.5);
    Tensor b = random_device_tensor(ctx, Shape{h}, cfg.wdt, 5);
    Tensor y = ctx.empty(Shape{r, h}, cfg.dt), res_out = ctx.empty(Shape{r, h}, cfg.dt), dx = ctx.empty(Shape{r, h}, cfg.dt);
    Tensor mean = ctx.empty(Shape{r}, DType::F32), rstd = ctx.empty(Shape{r}, DType::F32);
    Tensor dw = ctx.empty(Shape{h}, DType::F32), db = ctx.empty(Shape{h}, DType::F32);

    double ms = median_ms(ctx, [&] { ops::layer_norm_forward(ctx, y, mean, rstd, x, w, b, eps); });
    rows.push_back({"layer_norm fwd", config, ms, 0, 2 * act + 2 * stat + 2 * par});
    ms = median_ms(ctx, [&] { ops::layer_norm_forward(ctx, y, res_out, mean, rstd, x, res, w, b, eps); });
    rows.push_back({"layer_norm fwd +residual", config, ms, 0, 4 * act + 2 * stat + 2 * par});
    ms = median_ms(ctx, [&] { ops::layer_norm_backward(ctx, dx, dw, db, dy, x, w, mean, rstd, true); });
    rows.push_back({"layer_norm bwd", config, ms, 0, 3 * act + 2 * stat + par + 4 * grad});
    ms = median_ms(ctx, [&] { ops::layer_norm_backward(ctx, dx, dw, db, dy, x, w, mean, rstd, true, res); });
    rows.push_back({"layer_norm bwd +dresidual", config, ms, 0, 4 * act + 2 * stat + par + 4 * grad});

    ms = median_ms(ctx, [&] { ops::rms_norm_forward(ctx, y, rstd, x, w, eps); });
    rows.push_back({"rms_norm fwd", config, ms, 0, 2 * act + stat + par});
    ms = median_ms(ctx, [&] { ops::rms_norm_forward(ctx, y, res_out, rstd, x, res, w, eps); });
    rows.push_back({"rms_norm fwd +residual", config, ms, 0, 4 * act + stat + par});
    ms = median_ms(ctx, [&] { ops::rms_norm_backward(ctx, dx, dw, dy, x, w, rstd, true); });
    rows.push_back({"rms_norm bwd", config, ms, 0, 3 * act + stat + par + 2 * grad});
    ms = median_ms(ctx, [&] { ops::rms_norm_backward(ctx, dx, dw, dy, x, w, rstd, true, res); });
    rows.push_back({"rms_norm bwd +dresidual", config, ms, 0, 4 * act + stat + par + 2 * grad});
  }
  return rows;
}

}  // namespace megatron::bench
