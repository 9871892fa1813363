// gemm: CUDA (cuBLASLt) vs the CPU reference (OpenBLAS) over dtypes, transposes, odd shapes, batches,
// accumulation, epilogues and fp8; the CPU reference vs plain loops; the linear-layer backward vs finite
// differences; bad input.
//
// Thresholds (normalised squared error) beyond the per-dtype defaults:
// - narrow (bf16/f16/fp8) inputs with an F32 D: both sides multiply the same rounded inputs exactly and
//   differ only in fp32 summation order, ~K * eps_f32^2 (< 1e-12 for K ~ 1000): kNarrowToF32 = 1e-9.
//   (Against an fp64 product of the *unrounded* values a bf16 gemm would sit at ~1e-5..1e-4 for any K, and
//   with bf16 *accumulation* it would grow with K to ~1e-3; neither happens here: both sides accumulate in
//   fp32 from the same bf16 values.)
// - fp8 inputs: Hopper's fp8 tensor cores accumulate with reduced precision (~14 mantissa bits) between the
//   promotions to fp32 that cuBLASLt does when fast accumulation is off, ~(2^-14)^2 ~ 4e-9 relative:
//   kFp8Accum = 1e-6 for F32 outputs and amax, 1e-5 for F16 outputs (bf16 / fp8 outputs: defaults, rounding
//   dominates).
// - GELU with an F32 D: cuBLASLt may evaluate tanh with the hardware approximation (relative error ~2^-11),
//   kGeluF32 = 1e-6. 16-bit outputs keep their defaults (output rounding dominates).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"
#include "megatron/ops/gemm/gemm.h"

namespace megatron::ops {
namespace {

using testing::GradCase;
using testing::OpCase;
using testing::TensorSpec;
using ::testing::HasSubstr;

constexpr double kNarrowToF32 = 1e-9;
constexpr double kGeluF32 = 1e-6;
constexpr double kFp8Accum = 1e-6;
constexpr double kFp8ToF16 = 1e-5;

struct Spec {
  std::string name;
  DType a = DType::F32, b = DType::F32, d = DType::F32;
  int64_t batch = 0;  // 0: 2-D call
  int64_t m = 1, n = 1, k = 1;
  bool ta = false, tb = false;
  float alpha = 1.0f, beta = 0.0f;
  GemmEpilogue epi = GemmEpilogue::None;
  bool aux = false, bgrad = false, b_shared = false, d_scale = false, amax = false, tf32 = false;
  Fp8ScaleLayout la = Fp8ScaleLayout::Tensor, lb = Fp8ScaleLayout::Tensor;  // fp8: the scales' layouts
  double nmse = 0;  // threshold for D (and the aux output); 0: the default of D's dtype
};

bool has_bias(GemmEpilogue e) { return e == GemmEpilogue::Bias || e == GemmEpilogue::BiasGelu; }

OpCase make_case(const Spec& s) {
  const bool fp8 = is_fp8(s.a);
  auto shape = [&](int64_t r, int64_t c, bool shared = false) {
    return (s.batch > 0 && !shared) ? Shape{s.batch, r, c} : Shape{r, c};
  };
  const Shape a_shape = s.ta ? shape(s.k, s.m) : shape(s.m, s.k);
  const Shape b_shape = s.tb ? shape(s.n, s.k, s.b_shared) : shape(s.k, s.n, s.b_shared);
  const Shape d_shape = shape(s.m, s.n);
  const double range = fp8 ? 2.0 : 1.0;

  OpCase c;
  c.name = s.name;
  c.inputs = {{a_shape, s.a, -range, range}, {b_shape, s.b, -range, range}};
  int c_in = -1, bias_in = -1, as_in = -1, bs_in = -1, ds_in = -1;
  auto add_input = [&](TensorSpec t) {
    c.inputs.push_back(t);
    return int(c.inputs.size()) - 1;
  };
  if (s.beta != 0.0f) c_in = add_input({d_shape, s.d});
  if (has_bias(s.epi)) {
    DType bias_dtype = !fp8 ? s.d : (s.d == DType::F16 ? DType::F16 : DType::BF16);
    bias_in = add_input({Shape{s.n}, bias_dtype});
  }
  if (fp8) {
    as_in = add_input({fp8_scale_shape(s.la, s.m, s.k), DType::F32, 0.5, 2.0});
    bs_in = add_input({fp8_scale_shape(s.lb, s.n, s.k), DType::F32, 0.5, 2.0});
  }
  if (s.d_scale) ds_in = add_input({Shape{1}, DType::F32, 0.25, 1.0});
  // DGelu reads the pre-GELU values; a wide range reaches both tails of gelu'.
  const int gelu_in = s.epi == GemmEpilogue::DGelu ? add_input({d_shape, s.d, -4.0, 4.0}) : -1;

  c.outputs = {{d_shape, s.d}};
  c.max_nmse = {s.nmse};
  int aux_out = -1, bgrad_out = -1, amax_out = -1;
  if (s.aux) {
    aux_out = int(c.outputs.size());
    c.outputs.push_back({d_shape, s.d});
    c.max_nmse.push_back(s.nmse);
  }
  if (s.bgrad) {
    bgrad_out = int(c.outputs.size());
    c.outputs.push_back({Shape{s.m}, s.d});
    c.max_nmse.push_back(0);
  }
  if (s.amax) {
    amax_out = int(c.outputs.size());
    c.outputs.push_back({Shape{1}, DType::F32});
    c.max_nmse.push_back(kFp8Accum);
  }
  if (c_in >= 0) c.output_starts_as_input = {{0, c_in}};

  c.run = [=](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    GemmOptions o;
    o.transpose_a = s.ta;
    o.transpose_b = s.tb;
    o.alpha = s.alpha;
    o.beta = s.beta;
    o.epilogue = s.epi;
    o.allow_tf32 = s.tf32;
    if (bias_in >= 0) o.bias = in[bias_in];
    o.a_scale_layout = s.la;
    o.b_scale_layout = s.lb;
    if (as_in >= 0) o.a_scale = in[as_in];
    if (bs_in >= 0) o.b_scale = in[bs_in];
    if (ds_in >= 0) o.d_scale = in[ds_in];
    if (aux_out >= 0) o.gelu_input_out = out[aux_out];
    if (gelu_in >= 0) o.gelu_input = in[gelu_in];
    if (bgrad_out >= 0) o.bias_grad_out = out[bgrad_out];
    if (amax_out >= 0) o.d_amax_out = out[amax_out];
    gemm(ctx, out[0], in[0], in[1], o);
  };
  return c;
}

std::string tname(bool ta, bool tb) { return std::string(ta ? "T" : "N") + (tb ? "T" : "N"); }

std::vector<OpCase> gemm_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const Spec& s) { cases.push_back(make_case(s)); };

  // Every input dtype x every transpose x odd shapes (M, N, K each take 1, 7, 129 and ~1000).
  const int64_t shapes[][3] = {{1, 1, 1}, {7, 129, 7}, {129, 7, 1000}, {1000, 129, 129}, {129, 1000, 1}};
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto& sh : shapes)
          add({.name = str_cat(dtype_name(t), "_", tname(ta, tb), "_", sh[0], "x", sh[1], "x", sh[2]), .a = t, .b = t,
               .d = t, .m = sh[0], .n = sh[1], .k = sh[2], .ta = ta, .tb = tb});
  // Large-ish K, aligned shapes (the tensor-core paths) in every input dtype.
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    add({.name = str_cat(dtype_name(t), "_NT_512x384x1024"), .a = t, .b = t, .d = t, .m = 512, .n = 384, .k = 1024,
         .tb = true});
  add({.name = "f32_tf32_NN_256x128x512", .m = 256, .n = 128, .k = 512, .tf32 = true, .nmse = 1e-5});

  // Mixed precision: 16-bit inputs, F32 output (main-grad accumulation).
  for (DType t : {DType::F16, DType::BF16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        add({.name = str_cat(dtype_name(t), "_to_f32_", tname(ta, tb), "_129x64x1000"), .a = t, .b = t,
             .d = DType::F32, .m = 129, .n = 64, .k = 1000, .ta = ta, .tb = tb, .nmse = kNarrowToF32});

  // Batched (strided) and batched with a shared 2-D B.
  for (DType t : {DType::F32, DType::BF16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        add({.name = str_cat(dtype_name(t), "_batched_", tname(ta, tb), "_3x129x7x65"), .a = t, .b = t, .d = t,
             .batch = 3, .m = 129, .n = 7, .k = 65, .ta = ta, .tb = tb});
        add({.name = str_cat(dtype_name(t), "_batched_sharedB_", tname(ta, tb), "_4x33x64x48"), .a = t, .b = t,
             .d = t, .batch = 4, .m = 33, .n = 64, .k = 48, .ta = ta, .tb = tb, .b_shared = true});
      }

  // alpha / beta: accumulation into D (beta != 0 reads D as C).
  add({.name = "bf16_to_f32_dW_accumulate", .a = DType::BF16, .b = DType::BF16, .d = DType::F32, .m = 129, .n = 64,
       .k = 1000, .ta = true, .beta = 1.0f, .nmse = kNarrowToF32});
  add({.name = "f32_alpha2_beta05_NT_65x33x129", .m = 65, .n = 33, .k = 129, .tb = true, .alpha = 2.0f, .beta = 0.5f});
  add({.name = "bf16_beta1_NN_7x129x129", .a = DType::BF16, .b = DType::BF16, .d = DType::BF16, .m = 7, .n = 129,
       .k = 129, .beta = 1.0f});
  add({.name = "f16_batched_beta1_TN_2x64x64x64", .a = DType::F16, .b = DType::F16, .d = DType::F16, .batch = 2,
       .m = 64, .n = 64, .k = 64, .ta = true, .beta = 1.0f});

  // Epilogues. N = 128: fused by cuBLASLt; N = 7 / 129: the GELU aux output cannot be fused (ld % 8).
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    double gelu_nmse = t == DType::F32 ? kGeluF32 : 0;
    for (int64_t n : {7, 128, 129}) {
      std::string base = str_cat(dtype_name(t), "_", n);
      add({.name = base + "_bias", .a = t, .b = t, .d = t, .m = 65, .n = n, .k = 96, .tb = true,
           .epi = GemmEpilogue::Bias});
      add({.name = base + "_gelu", .a = t, .b = t, .d = t, .m = 65, .n = n, .k = 96, .tb = true,
           .epi = GemmEpilogue::Gelu, .nmse = gelu_nmse});
      add({.name = base + "_gelu_aux", .a = t, .b = t, .d = t, .m = 65, .n = n, .k = 96, .tb = true,
           .epi = GemmEpilogue::Gelu, .aux = true, .nmse = gelu_nmse});
      add({.name = base + "_bias_gelu", .a = t, .b = t, .d = t, .m = 65, .n = n, .k = 96, .tb = true,
           .epi = GemmEpilogue::BiasGelu, .nmse = gelu_nmse});
      add({.name = base + "_bias_gelu_aux", .a = t, .b = t, .d = t, .m = 65, .n = n, .k = 96, .tb = true,
           .epi = GemmEpilogue::BiasGelu, .aux = true, .nmse = gelu_nmse});
    }
  }
  add({.name = "bf16_to_f32_bias_NN_33x64x129", .a = DType::BF16, .b = DType::BF16, .d = DType::F32, .m = 33,
       .n = 64, .k = 129, .epi = GemmEpilogue::Bias, .nmse = kNarrowToF32});
  add({.name = "bf16_batched_bias_gelu_aux_3x32x64x48", .a = DType::BF16, .b = DType::BF16, .d = DType::BF16,
       .batch = 3, .m = 32, .n = 64, .k = 48, .epi = GemmEpilogue::BiasGelu, .aux = true});
  add({.name = "bf16_batched_gelu_aux_odd_3x7x9x48", .a = DType::BF16, .b = DType::BF16, .d = DType::BF16,
       .batch = 3, .m = 7, .n = 9, .k = 48, .tb = true, .epi = GemmEpilogue::Gelu, .aux = true});
  add({.name = "f32_beta1_bias_gelu_aux_65x128x96", .m = 65, .n = 128, .k = 96, .tb = true, .beta = 1.0f,
       .epi = GemmEpilogue::BiasGelu, .aux = true, .nmse = kGeluF32});
  // DGELU: the MLP backward's dact = dY W2 with gelu' applied (NN layout); N % 8 != 0 takes the fallback.
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (int64_t n : {7, 128, 3072})
      add({.name = str_cat(dtype_name(t), "_dgelu_NN_65x", n, "x96"), .a = t, .b = t, .d = t, .m = 65, .n = n,
           .k = 96, .epi = GemmEpilogue::DGelu, .nmse = t == DType::F32 ? kGeluF32 : 0});
  add({.name = "bf16_batched_dgelu_NT_2x32x64x48", .a = DType::BF16, .b = DType::BF16, .d = DType::BF16, .batch = 2,
       .m = 32, .n = 64, .k = 48, .tb = true, .epi = GemmEpilogue::DGelu});

  // Bias gradient (row sums of op(A)); the dW layout (A = dY transposed) and the other one.
  for (DType t : {DType::F32, DType::BF16})
    for (bool ta : {false, true}) {
      DType d = t == DType::BF16 ? DType::F32 : t;
      add({.name = str_cat(dtype_name(t), "_bias_grad_", tname(ta, false), "_129x64x1000"), .a = t, .b = t, .d = d,
           .m = 129, .n = 64, .k = 1000, .ta = ta, .bgrad = true, .nmse = t == DType::BF16 ? kNarrowToF32 : 0});
    }
  add({.name = "bf16_bias_grad_accumulate_TN_128x96x256", .a = DType::BF16, .b = DType::BF16, .d = DType::F32,
       .m = 128, .n = 96, .k = 256, .ta = true, .beta = 1.0f, .bgrad = true, .nmse = kNarrowToF32});
  add({.name = "bf16_bias_grad_bf16_out_TN_128x96x256", .a = DType::BF16, .b = DType::BF16, .d = DType::BF16,
       .m = 128, .n = 96, .k = 256, .ta = true, .bgrad = true});

  // fp8 ("TN" only: A [M, K], B [N, K]; M, N, K multiples of 16).
  struct Fp8Pair {
    DType a, b;
  };
  for (Fp8Pair p : {Fp8Pair{DType::F8E4M3, DType::F8E4M3}, Fp8Pair{DType::F8E4M3, DType::F8E5M2},
                    Fp8Pair{DType::F8E5M2, DType::F8E4M3}})
    for (DType d : {DType::BF16, DType::F16, DType::F32}) {
      std::string base = str_cat(dtype_name(p.a), "x", dtype_name(p.b), "_to_", dtype_name(d));
      double nmse = d == DType::F32 ? kFp8Accum : (d == DType::F16 ? kFp8ToF16 : 0);
      add({.name = base + "_48x32x64", .a = p.a, .b = p.b, .d = d, .m = 48, .n = 32, .k = 64, .tb = true, .nmse = nmse});
      add({.name = base + "_256x128x1024", .a = p.a, .b = p.b, .d = d, .m = 256, .n = 128, .k = 1024, .tb = true,
           .nmse = nmse});
    }
  // Block scaling (1x128 activations / gradients, 128x128 weights): partial blocks in K, M and N.
  for (auto [la, lb] : {std::pair{Fp8ScaleLayout::Rows1x128, Fp8ScaleLayout::Blocks128x128},
                        std::pair{Fp8ScaleLayout::Blocks128x128, Fp8ScaleLayout::Rows1x128},
                        std::pair{Fp8ScaleLayout::Rows1x128, Fp8ScaleLayout::Rows1x128}})
    for (auto [a, b] : {std::pair{DType::F8E4M3, DType::F8E4M3}, std::pair{DType::F8E5M2, DType::F8E4M3}}) {
      const std::string base = str_cat(dtype_name(a), "x", dtype_name(b), "_", fp8_scale_layout_name(la), "_x_",
                                       fp8_scale_layout_name(lb));
      add({.name = base + "_to_bf16_176x272x400", .a = a, .b = b, .d = DType::BF16, .m = 176, .n = 272, .k = 400,
           .tb = true, .la = la, .lb = lb});
      add({.name = base + "_to_f32_beta1_256x144x272", .a = a, .b = b, .d = DType::F32, .m = 256, .n = 144, .k = 272,
           .tb = true, .beta = 1.0f, .la = la, .lb = lb, .nmse = kFp8Accum});
    }
  add({.name = "f8e4m3_1x128_x_128x128_to_bf16_bias_64x144x256", .a = DType::F8E4M3, .b = DType::F8E4M3,
       .d = DType::BF16, .m = 64, .n = 144, .k = 256, .tb = true, .epi = GemmEpilogue::Bias,
       .la = Fp8ScaleLayout::Rows1x128, .lb = Fp8ScaleLayout::Blocks128x128});
  add({.name = "f8e4m3_to_bf16_bias_64x48x128", .a = DType::F8E4M3, .b = DType::F8E4M3, .d = DType::BF16, .m = 64,
       .n = 48, .k = 128, .tb = true, .epi = GemmEpilogue::Bias});
  add({.name = "f8e4m3_to_bf16_bias_gelu_aux_64x48x128", .a = DType::F8E4M3, .b = DType::F8E4M3, .d = DType::BF16,
       .m = 64, .n = 48, .k = 128, .tb = true, .epi = GemmEpilogue::BiasGelu, .aux = true});
  add({.name = "f8e4m3_to_f32_beta1_64x48x128", .a = DType::F8E4M3, .b = DType::F8E4M3, .d = DType::F32, .m = 64,
       .n = 48, .k = 128, .tb = true, .beta = 1.0f, .nmse = kFp8Accum});
  add({.name = "f8e4m3_to_f8e4m3_dscale_amax_128x64x256", .a = DType::F8E4M3, .b = DType::F8E4M3,
       .d = DType::F8E4M3, .m = 128, .n = 64, .k = 256, .tb = true, .d_scale = true, .amax = true});
  add({.name = "f8e4m3_to_f8e4m3_bias_dscale_128x64x256", .a = DType::F8E4M3, .b = DType::F8E4M3,
       .d = DType::F8E4M3, .m = 128, .n = 64, .k = 256, .tb = true, .epi = GemmEpilogue::Bias, .d_scale = true});
  add({.name = "f8e4m3xf8e5m2_to_f8e5m2_dscale_amax_64x64x64", .a = DType::F8E4M3, .b = DType::F8E5M2,
       .d = DType::F8E5M2, .m = 64, .n = 64, .k = 64, .tb = true, .d_scale = true, .amax = true});
  add({.name = "f8e4m3_batched_to_bf16_2x32x16x64", .a = DType::F8E4M3, .b = DType::F8E4M3, .d = DType::BF16,
       .batch = 2, .m = 32, .n = 16, .k = 64, .tb = true});

  // Empty extents: nothing to compute (K = 0: D = beta * D).
  add({.name = "f32_empty_M", .m = 0, .n = 7, .k = 5});
  add({.name = "f32_empty_K_beta0", .m = 7, .n = 5, .k = 0});
  add({.name = "bf16_empty_K_beta1", .a = DType::BF16, .b = DType::BF16, .d = DType::BF16, .m = 7, .n = 5, .k = 0,
       .beta = 1.0f});
  return cases;
}

MEGATRON_OP_CASES(Gemm, gemm_cases);

// ---- the CPU reference against plain loops (transposes, batches, alpha/beta, epilogues) ----

Tensor random_cpu(const Shape& s, DType t, uint64_t seed) {
  Tensor x = testing::cpu_context().empty(s, t);
  testing::fill_random(x, seed);
  return x;
}

double at(const Tensor& t, int64_t i) {
  double v = 0;
  visit_float_dtype(t.dtype(), "test", [&]<class T>() { v = to_double(t.data<T>()[i]); });
  return v;
}

TEST(GemmCpu, MatchesPlainLoops) {
  Context& ctx = testing::cpu_context();
  for (DType dt : {DType::F64, DType::F32})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool shared : {false, true})
          for (GemmEpilogue epi : {GemmEpilogue::None, GemmEpilogue::BiasGelu}) {
            const int64_t batch = 2, m = 5, n = 7, k = 3;
            Tensor a = random_cpu(ta ? Shape{batch, k, m} : Shape{batch, m, k}, dt, 1);
            Tensor b = shared ? random_cpu(tb ? Shape{n, k} : Shape{k, n}, dt, 2)
                              : random_cpu(tb ? Shape{batch, n, k} : Shape{batch, k, n}, dt, 2);
            Tensor c = random_cpu(Shape{batch, m, n}, dt, 3);
            Tensor bias = random_cpu(Shape{n}, dt, 4);
            Tensor d = random_cpu(Shape{batch, m, n}, dt, 3);  // == c: beta != 0 accumulates into it
            Tensor aux = ctx.empty(Shape{batch, m, n}, dt);
            GemmOptions o{.transpose_a = ta, .transpose_b = tb, .alpha = 1.5f, .beta = 0.5f, .epilogue = epi};
            if (epi == GemmEpilogue::BiasGelu) {
              o.bias = bias;
              o.gelu_input_out = aux;
            }
            gemm(ctx, d, a, b, o);
            double worst = 0;
            for (int64_t p = 0; p < batch; ++p)
              for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                  double s = 0;
                  for (int64_t q = 0; q < k; ++q) {
                    double av = at(a, p * m * k + (ta ? q * m + i : i * k + q));
                    int64_t boff = shared ? 0 : p * k * n;
                    double bv = at(b, boff + (tb ? j * k + q : q * n + j));
                    s += av * bv;
                  }
                  int64_t idx = p * m * n + i * n + j;
                  double t = 1.5 * s + 0.5 * at(c, idx);
                  if (epi == GemmEpilogue::BiasGelu) {
                    t += at(bias, j);
                    worst = std::max(worst, std::abs(at(aux, idx) - t));
                    t = gelu_tanh(t);
                  }
                  worst = std::max(worst, std::abs(at(d, idx) - t));
                }
            EXPECT_LT(worst, dt == DType::F64 ? 1e-12 : 1e-5)
                << dtype_name(dt) << " " << tname(ta, tb) << (shared ? " shared B" : "") << " epilogue "
                << gemm_epilogue_name(epi);
          }
}

TEST(GemmCpu, BiasGradIsRowSumsOfOpA) {
  Context& ctx = testing::cpu_context();
  for (bool ta : {false, true}) {
    const int64_t m = 6, n = 4, k = 9;
    Tensor a = random_cpu(ta ? Shape{k, m} : Shape{m, k}, DType::F64, 5);
    Tensor b = random_cpu(Shape{k, n}, DType::F64, 6);
    Tensor d = ctx.empty(Shape{m, n}, DType::F64);
    Tensor db = ctx.empty(Shape{m}, DType::F64);
    gemm(ctx, d, a, b, {.transpose_a = ta, .bias_grad_out = db});
    for (int64_t i = 0; i < m; ++i) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q) s += at(a, ta ? q * m + i : i * k + q);
      EXPECT_NEAR(at(db, i), s, 1e-12) << "row " << i << (ta ? " (transpose_a)" : "");
    }
  }
}

TEST(GemmCpu, Fp8AppliesScalesAndAmax) {
  Context& ctx = testing::cpu_context();
  const int64_t m = 16, n = 16, k = 32;
  Tensor a = random_cpu(Shape{m, k}, DType::F8E4M3, 7);
  Tensor b = random_cpu(Shape{n, k}, DType::F8E5M2, 8);
  Tensor sa = ctx.empty(Shape{1}, DType::F32), sb = ctx.empty(Shape{1}, DType::F32), sd = ctx.empty(Shape{1}, DType::F32);
  sa.data<float>()[0] = 0.5f;
  sb.data<float>()[0] = 4.0f;
  sd.data<float>()[0] = 0.25f;
  Tensor d = ctx.empty(Shape{m, n}, DType::F32);
  Tensor amax = ctx.empty(Shape{1}, DType::F32);
  gemm(ctx, d, a, b, {.transpose_b = true, .a_scale = sa, .b_scale = sb});
  double want_amax = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q) s += at(a, i * k + q) * at(b, j * k + q);
      s *= 2.0;  // a_scale * b_scale
      want_amax = std::max(want_amax, std::abs(s));
      EXPECT_NEAR(at(d, i * n + j), s, 1e-5 * (1 + std::abs(s)));
    }
  EXPECT_GT(want_amax, 0.0);

  // fp8 output: D = round(d_scale * t), amax before d_scale.
  Tensor d8 = ctx.empty(Shape{m, n}, DType::F8E4M3);
  gemm(ctx, d8, a, b, {.transpose_b = true, .a_scale = sa, .b_scale = sb, .d_scale = sd, .d_amax_out = amax});
  EXPECT_NEAR(amax.data<float>()[0], want_amax, 1e-5 * want_amax);
  for (int64_t i = 0; i < m * n; ++i) {
    double want = to_double(fp8e4m3_from_float(float(0.25 * at(d, i))));
    EXPECT_EQ(at(d8, i), want) << "element " << i;
  }
}

// Block scales: every element of A and B dequantised by its own block's scale (gemm.h's layouts), against
// plain loops that look the scales up from the layouts' formulas; K, M and N end in partial blocks.
TEST(GemmCpu, Fp8BlockScalesApplyPerBlock) {
  Context& ctx = testing::cpu_context();
  const int64_t m = 48, n = 160, k = 272;
  Tensor a = random_cpu(Shape{m, k}, DType::F8E4M3, 21);
  Tensor b = random_cpu(Shape{n, k}, DType::F8E4M3, 22);
  for (auto [la, lb] : {std::pair{Fp8ScaleLayout::Rows1x128, Fp8ScaleLayout::Blocks128x128},
                        std::pair{Fp8ScaleLayout::Blocks128x128, Fp8ScaleLayout::Rows1x128},
                        std::pair{Fp8ScaleLayout::Rows1x128, Fp8ScaleLayout::Rows1x128}}) {
    Tensor sa = random_cpu(fp8_scale_shape(la, m, k), DType::F32, 23);
    Tensor sb = random_cpu(fp8_scale_shape(lb, n, k), DType::F32, 24);
    auto scale = [](const Tensor& s, Fp8ScaleLayout l, int64_t row, int64_t q) {
      const int64_t ld = s.dim(1);
      return double(l == Fp8ScaleLayout::Rows1x128 ? s.data<float>()[(q / 128) * ld + row]
                                                   : s.data<float>()[(row / 128) * ld + q / 128]);
    };
    Tensor d = ctx.empty(Shape{m, n}, DType::F32);
    gemm(ctx, d, a, b, {.transpose_b = true, .a_scale = sa, .b_scale = sb, .a_scale_layout = la, .b_scale_layout = lb});
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t q = 0; q < k; ++q) want += at(a, i * k + q) * scale(sa, la, i, q) * at(b, j * k + q) * scale(sb, lb, j, q);
        EXPECT_NEAR(at(d, i * n + j), want, 1e-4 * (1 + std::abs(want)))
            << fp8_scale_layout_name(la) << " x " << fp8_scale_layout_name(lb) << " at (" << i << ", " << j << ")";
      }
  }
}

// fp8 inputs into an F64 D (the CPU's double-precision emulation of FP8 training): the scaled products
// summed in double, accumulating onto D (beta 1) with a bf16 bias; scales that are not powers of two.
TEST(GemmCpu, Fp8IntoF64SumsInDouble) {
  Context& ctx = testing::cpu_context();
  const int64_t m = 32, n = 16, k = 48;
  Tensor a = random_cpu(Shape{m, k}, DType::F8E4M3, 11);
  Tensor b = random_cpu(Shape{n, k}, DType::F8E5M2, 12);
  Tensor bias = random_cpu(Shape{n}, DType::BF16, 13);
  Tensor sa = ctx.empty(Shape{1}, DType::F32), sb = ctx.empty(Shape{1}, DType::F32);
  sa.data<float>()[0] = 0.3f;
  sb.data<float>()[0] = 1.7f;
  Tensor d = random_cpu(Shape{m, n}, DType::F64, 14);
  Tensor d0 = random_cpu(Shape{m, n}, DType::F64, 14);
  gemm(ctx, d, a, b, {.transpose_b = true, .beta = 1.0f, .epilogue = GemmEpilogue::Bias, .bias = bias, .a_scale = sa,
                      .b_scale = sb});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q) s += (at(a, i * k + q) * double(0.3f)) * (at(b, j * k + q) * double(1.7f));
      const double want = s + at(d0, i * n + j) + at(bias, j);
      EXPECT_NEAR(at(d, i * n + j), want, 1e-13 * (1 + std::abs(want))) << "element " << i << ", " << j;
    }
}

// The epilogue equals separate ops: plain gemm, then + bias, then GELU (fp64, CPU).
TEST(GemmCpu, BiasGeluEpilogueEqualsSeparateOps) {
  Context& ctx = testing::cpu_context();
  const int64_t m = 9, n = 13, k = 17;
  Tensor x = random_cpu(Shape{m, k}, DType::F64, 9);
  Tensor w = random_cpu(Shape{n, k}, DType::F64, 10);
  Tensor bias = random_cpu(Shape{n}, DType::F64, 11);
  Tensor fused = ctx.empty(Shape{m, n}, DType::F64), aux = ctx.empty(Shape{m, n}, DType::F64);
  Tensor plain = ctx.empty(Shape{m, n}, DType::F64);
  gemm(ctx, fused, x, w, {.transpose_b = true, .epilogue = GemmEpilogue::BiasGelu, .bias = bias, .gelu_input_out = aux});
  gemm(ctx, plain, x, w, {.transpose_b = true});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double pre = plain.data<double>()[i * n + j] + bias.data<double>()[j];
      EXPECT_NEAR(aux.data<double>()[i * n + j], pre, 1e-13);
      // GELU, tanh form, written out independently of gelu_tanh().
      double want = 0.5 * pre * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (pre + 0.044715 * pre * pre * pre)));
      EXPECT_NEAR(fused.data<double>()[i * n + j], want, 1e-13);
    }
}

// ---- the linear layer's backward (two gemms) against finite differences ----

std::vector<GradCase> grad_cases() {
  std::vector<GradCase> cases;
  const int64_t t = 5, in = 7, out = 6;
  // Y = X W^T + b.  dX = dY W;  dW = dY^T X (with db = row sums of dY^T from the same call).
  cases.push_back(GradCase{
      .name = "linear_bias",
      .inputs = {{Shape{t, in}}, {Shape{out, in}}, {Shape{out}}},
      .differentiable = {0, 1, 2},
      .forward =
          [=](Context& ctx, const std::vector<Tensor>& x) {
            Tensor y = ctx.empty(Shape{t, out}, DType::F64);
            gemm(ctx, y, x[0], x[1], {.transpose_b = true, .epilogue = GemmEpilogue::Bias, .bias = x[2]});
            return std::vector<Tensor>{y};
          },
      .backward =
          [=](Context& ctx, const std::vector<Tensor>& x, const std::vector<Tensor>& dy) {
            Tensor dx = ctx.empty(Shape{t, in}, DType::F64), dw = ctx.empty(Shape{out, in}, DType::F64);
            Tensor db = ctx.empty(Shape{out}, DType::F64);
            gemm(ctx, dx, dy[0], x[1], {});
            gemm(ctx, dw, dy[0], x[0], {.transpose_a = true, .bias_grad_out = db});
            return std::vector<Tensor>{dx, dw, db};
          },
  });
  // Y = gelu(X W^T + b) with the pre-GELU values saved by the epilogue; the weight gradient is accumulated
  // in two halves (alpha 0.5, beta 0 then beta 1) to exercise the += path.
  cases.push_back(GradCase{
      .name = "linear_bias_gelu",
      .inputs = {{Shape{t, in}}, {Shape{out, in}}, {Shape{out}}},
      .differentiable = {0, 1, 2},
      .forward =
          [=](Context& ctx, const std::vector<Tensor>& x) {
            Tensor y = ctx.empty(Shape{t, out}, DType::F64);
            gemm(ctx, y, x[0], x[1], {.transpose_b = true, .epilogue = GemmEpilogue::BiasGelu, .bias = x[2]});
            return std::vector<Tensor>{y};
          },
      .backward =
          [=](Context& ctx, const std::vector<Tensor>& x, const std::vector<Tensor>& dy) {
            Tensor y = ctx.empty(Shape{t, out}, DType::F64), pre = ctx.empty(Shape{t, out}, DType::F64);
            gemm(ctx, y, x[0], x[1],
                 {.transpose_b = true, .epilogue = GemmEpilogue::BiasGelu, .bias = x[2], .gelu_input_out = pre});
            Tensor dz = ctx.empty(Shape{t, out}, DType::F64);
            for (int64_t i = 0; i < t * out; ++i)
              dz.data<double>()[i] = dy[0].data<double>()[i] * gelu_tanh_grad(pre.data<double>()[i]);
            Tensor dx = ctx.empty(Shape{t, in}, DType::F64), dw = ctx.empty(Shape{out, in}, DType::F64);
            Tensor db = ctx.empty(Shape{out}, DType::F64);
            gemm(ctx, dx, dz, x[1], {});
            gemm(ctx, dw, dz, x[0], {.transpose_a = true, .alpha = 0.5f});
            gemm(ctx, dw, dz, x[0], {.transpose_a = true, .alpha = 0.5f, .beta = 1.0f});
            for (int64_t j = 0; j < out; ++j) {
              double s = 0;
              for (int64_t i = 0; i < t; ++i) s += dz.data<double>()[i * out + j];
              db.data<double>()[j] = s;
            }
            return std::vector<Tensor>{dx, dw, db};
          },
  });
  // The GELU MLP, Y = gelu(X W1^T) W2^T, with its backward through the DGelu epilogue:
  // dpre = (dY W2) * gelu'(pre) in one gemm, then dX = dpre W1, dW1 = dpre^T X, dW2 = dY^T gelu(pre).
  const int64_t ffn = 6;
  cases.push_back(GradCase{
      .name = "mlp_gelu_dgelu",
      .inputs = {{Shape{t, in}}, {Shape{ffn, in}}, {Shape{out, ffn}}},
      .differentiable = {0, 1, 2},
      .forward =
          [=](Context& ctx, const std::vector<Tensor>& x) {
            Tensor h = ctx.empty(Shape{t, ffn}, DType::F64), y = ctx.empty(Shape{t, out}, DType::F64);
            gemm(ctx, h, x[0], x[1], {.transpose_b = true, .epilogue = GemmEpilogue::Gelu});
            gemm(ctx, y, h, x[2], {.transpose_b = true});
            return std::vector<Tensor>{y};
          },
      .backward =
          [=](Context& ctx, const std::vector<Tensor>& x, const std::vector<Tensor>& dy) {
            Tensor h = ctx.empty(Shape{t, ffn}, DType::F64), pre = ctx.empty(Shape{t, ffn}, DType::F64);
            gemm(ctx, h, x[0], x[1], {.transpose_b = true, .epilogue = GemmEpilogue::Gelu, .gelu_input_out = pre});
            Tensor dpre = ctx.empty(Shape{t, ffn}, DType::F64);
            gemm(ctx, dpre, dy[0], x[2], {.epilogue = GemmEpilogue::DGelu, .gelu_input = pre});
            Tensor dx = ctx.empty(Shape{t, in}, DType::F64), dw1 = ctx.empty(Shape{ffn, in}, DType::F64);
            Tensor dw2 = ctx.empty(Shape{out, ffn}, DType::F64);
            gemm(ctx, dx, dpre, x[1], {});
            gemm(ctx, dw1, dpre, x[0], {.transpose_a = true});
            gemm(ctx, dw2, dy[0], h, {.transpose_a = true});
            return std::vector<Tensor>{dx, dw1, dw2};
          },
  });
  return cases;
}

MEGATRON_GRAD_CASES(Gemm, grad_cases);

// ---- bad input ----

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(GemmBadInput, MismatchedK) {
  Context& ctx = testing::cpu_context();
  Tensor a = ctx.empty(Shape{4, 5}, DType::F32), b = ctx.empty(Shape{6, 3}, DType::F32);
  Tensor d = ctx.empty(Shape{4, 3}, DType::F32);
  std::string msg = error_of([&] { gemm(ctx, d, a, b); });
  EXPECT_THAT(msg, HasSubstr("gemm: inner dimensions differ"));
  EXPECT_THAT(msg, HasSubstr("[4, 5]"));
  EXPECT_THAT(msg, HasSubstr("[6, 3]"));
}

TEST(GemmBadInput, WrongOutputShape) {
  Context& ctx = testing::cpu_context();
  Tensor a = ctx.empty(Shape{4, 5}, DType::F32), b = ctx.empty(Shape{5, 3}, DType::F32);
  Tensor d = ctx.empty(Shape{3, 4}, DType::F32);
  std::string msg = error_of([&] { gemm(ctx, d, a, b); });
  EXPECT_THAT(msg, HasSubstr("gemm: D must have shape [4, 3]"));
  EXPECT_THAT(msg, HasSubstr("f32[3, 4]"));
}

TEST(GemmBadInput, WrongBiasShape) {
  Context& ctx = testing::cpu_context();
  Tensor a = ctx.empty(Shape{4, 5}, DType::F32), b = ctx.empty(Shape{3, 5}, DType::F32);
  Tensor d = ctx.empty(Shape{4, 3}, DType::F32), bias = ctx.empty(Shape{4}, DType::F32);
  std::string msg =
      error_of([&] { gemm(ctx, d, a, b, {.transpose_b = true, .epilogue = GemmEpilogue::Bias, .bias = bias}); });
  EXPECT_THAT(msg, HasSubstr("gemm: argument bias is f32[4]"));
  EXPECT_THAT(msg, HasSubstr("must have shape [3]"));
  msg = error_of([&] { gemm(ctx, d, a, b, {.transpose_b = true, .bias = bias}); });
  EXPECT_THAT(msg, HasSubstr("gemm: a bias tensor was given but the epilogue is none"));
}

TEST(GemmBadInput, WrongDevice) {
  Context& ctx = testing::cpu_context();
  std::vector<float> host(20);
  // A tensor that claims to live on cuda:0 (never dereferenced: validation rejects it first).
  Tensor a = Tensor::from_blob(host.data(), Shape{4, 5}, DType::F32, Device::cuda(0));
  Tensor b = ctx.empty(Shape{5, 3}, DType::F32), d = ctx.empty(Shape{4, 3}, DType::F32);
  std::string msg = error_of([&] { gemm(ctx, d, a, b); });
  EXPECT_THAT(msg, HasSubstr("gemm: argument a is f32[4, 5] on cuda:0 but the op runs on cpu"));
}

TEST(GemmBadInput, WrongDtypes) {
  Context& ctx = testing::cpu_context();
  Tensor a = ctx.empty(Shape{4, 5}, DType::BF16), b = ctx.empty(Shape{5, 3}, DType::F16);
  Tensor d = ctx.empty(Shape{4, 3}, DType::F32);
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a, b); }), HasSubstr("gemm: arguments a (bf16[4, 5] on cpu) and b"));
  Tensor b16 = ctx.empty(Shape{5, 3}, DType::BF16), d16 = ctx.empty(Shape{4, 3}, DType::F16);
  EXPECT_THAT(error_of([&] { gemm(ctx, d16, a, b16); }), HasSubstr("gemm: argument d is f16[4, 3]"));
}

TEST(GemmBadInput, Fp8NeedsTnLayoutScalesAndMultiplesOf16) {
  Context& ctx = testing::cpu_context();
  Tensor a = ctx.empty(Shape{16, 32}, DType::F8E4M3), b = ctx.empty(Shape{32, 16}, DType::F8E4M3);
  Tensor d = ctx.empty(Shape{16, 16}, DType::BF16);
  Tensor s = ctx.empty(Shape{1}, DType::F32);
  std::string msg = error_of([&] { gemm(ctx, d, a, b, {.a_scale = s, .b_scale = s}); });
  EXPECT_THAT(msg, HasSubstr("gemm: fp8 inputs need A as [M, K] and B as [N, K]"));
  EXPECT_THAT(msg, HasSubstr("'TN'"));
  EXPECT_THAT(msg, HasSubstr("f8e4m3[32, 16]"));

  Tensor bt = ctx.empty(Shape{16, 32}, DType::F8E4M3);
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a, bt, {.transpose_b = true}); }),
              HasSubstr("gemm: argument a_scale is an undefined tensor"));

  Tensor a2 = ctx.empty(Shape{16, 24}, DType::F8E4M3), b2 = ctx.empty(Shape{16, 24}, DType::F8E4M3);
  msg = error_of([&] { gemm(ctx, d, a2, b2, {.transpose_b = true, .a_scale = s, .b_scale = s}); });
  EXPECT_THAT(msg, HasSubstr("gemm: fp8 needs M, N and K to be multiples of 16; got M=16 N=16 K=24"));

  Tensor b5 = ctx.empty(Shape{16, 32}, DType::F8E5M2), a5 = ctx.empty(Shape{16, 32}, DType::F8E5M2);
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a5, b5, {.transpose_b = true, .a_scale = s, .b_scale = s}); }),
              HasSubstr("f8e5m2 x f8e5m2 is not supported"));

  // Block scaling: both operands block-scaled, not 128x128 on both, the scales' shapes, the supported options.
  Tensor a6 = ctx.empty(Shape{16, 32}, DType::F8E4M3), b6 = ctx.empty(Shape{16, 32}, DType::F8E4M3);
  const Tensor rows = ctx.empty(fp8_scale_shape(Fp8ScaleLayout::Rows1x128, 16, 32), DType::F32);
  const Tensor blocks = ctx.empty(fp8_scale_shape(Fp8ScaleLayout::Blocks128x128, 16, 32), DType::F32);
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a6, b6, {.transpose_b = true, .a_scale = rows, .b_scale = s,
                                                   .a_scale_layout = Fp8ScaleLayout::Rows1x128}); }),
              HasSubstr("fp8 block scaling needs both operands block-scaled"));
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a6, b6, {.transpose_b = true, .a_scale = blocks, .b_scale = blocks,
                                                   .a_scale_layout = Fp8ScaleLayout::Blocks128x128,
                                                   .b_scale_layout = Fp8ScaleLayout::Blocks128x128}); }),
              HasSubstr("not 128x128 on both"));
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a6, b6, {.transpose_b = true, .a_scale = blocks, .b_scale = rows,
                                                   .a_scale_layout = Fp8ScaleLayout::Rows1x128,
                                                   .b_scale_layout = Fp8ScaleLayout::Rows1x128}); }),
              HasSubstr("argument a_scale"));
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a6, b6, {.transpose_b = true, .a_scale = rows, .b_scale = rows,
                                                   .a_scale_layout = Fp8ScaleLayout::Rows1x128,
                                                   .b_scale_layout = Fp8ScaleLayout::Rows1x128,
                                                   .fp8_fast_accum = true}); }),
              HasSubstr("fp8_fast_accum off"));
}

TEST(GemmBadInput, OptionsOutsideTheirDomain) {
  Context& ctx = testing::cpu_context();
  Tensor a = ctx.empty(Shape{4, 5}, DType::F32), b = ctx.empty(Shape{5, 3}, DType::F32);
  Tensor d = ctx.empty(Shape{4, 3}, DType::F32), aux = ctx.empty(Shape{4, 3}, DType::F32);
  Tensor s = ctx.empty(Shape{1}, DType::F32), db = ctx.empty(Shape{4}, DType::F32);
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a, b, {.a_scale = s}); }),
              HasSubstr("gemm: a_scale / b_scale and their layouts are for fp8 inputs only"));
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a, b, {.d_amax_out = s}); }), HasSubstr("gemm: d_amax_out is for"));
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a, b, {.gelu_input_out = aux}); }),
              HasSubstr("gemm: gelu_input_out needs the gelu or bias+gelu epilogue"));
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a, b, {.epilogue = GemmEpilogue::DGelu}); }),
              HasSubstr("gelu_input"));
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a, b, {.beta = 1.0f, .epilogue = GemmEpilogue::DGelu, .gelu_input = aux}); }),
              HasSubstr("dgelu epilogue needs non-fp8 inputs and beta == 0"));
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a, b, {.gelu_input = aux}); }),
              HasSubstr("gelu_input is read by the dgelu epilogue only"));
  EXPECT_THAT(error_of([&] { gemm(ctx, d, a, b, {.alpha = 2.0f, .bias_grad_out = db}); }),
              HasSubstr("gemm: bias_grad_out needs a 2-D, non-fp8 call with alpha == 1"));
  Tensor a3 = ctx.empty(Shape{2, 4, 5}, DType::F32), b3 = ctx.empty(Shape{3, 5, 3}, DType::F32);
  Tensor d3 = ctx.empty(Shape{2, 4, 3}, DType::F32);
  EXPECT_THAT(error_of([&] { gemm(ctx, d3, a3, b3); }), HasSubstr("gemm: batch sizes differ between A and B"));
}

}  // namespace
}  // namespace megatron::ops
