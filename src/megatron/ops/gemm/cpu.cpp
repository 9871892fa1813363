// CPU gemm: OpenBLAS sgemm/dgemm on tiles of D run in parallel (ops/cpu_parallel.h), the epilogue applied
// to each tile while it is in cache.
//
// Tiles. D [M, N] (per batch entry) is cut along its longer side into pieces fixed by (M, N, K) alone, so
// every element is computed by the same single-threaded BLAS call whatever the thread count (OpenBLAS is
// kept at one thread: runtime/cpu_threads.h). A tile re-reads the whole operand it does not cut (BLAS packs
// it again), so pieces are kept large enough that this packing stays a small fraction of the tile's
// arithmetic; K is never cut, so no partial sums need combining.
//
// Precision. F32 inputs and D: sgemm straight into D (alpha and beta applied by BLAS in fp32), epilogue in
// fp32 (GELU with cpu_math.h's tanh, ~1e-7 relative; the test limit for fp32 GELU is NMSE 1e-6). Narrow
// inputs (bf16, f16, fp8 with their scales) are widened to fp32 first; a narrow D is computed in an fp32
// tile and rounded once. F64 (inputs, or fp8 inputs into an F64 D): dgemm and a double epilogue (std::tanh): the
// finite-difference reference, and FP8 training emulated at double precision.
#include "megatron/ops/gemm/cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "megatron/ops/cpu_math.h"
#include "megatron/ops/cpu_parallel.h"

namespace megatron::ops::cpu {
namespace {

float scalar_or_one(const Tensor& t) { return t.defined() ? t.data<float>()[0] : 1.0f; }

void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
               const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// An operand as Acc values: the tensor itself when it already holds Acc, else a widened (and, for fp8,
// scaled) copy.
template <class Acc>
struct Operand {
  std::vector<Acc> copy;
  const Acc* data = nullptr;
};

// The dequantisation scale of element (r, k) of an fp8 operand [R, K] (gemm.h's scale layouts).
struct ScaleLookup {
  Fp8ScaleLayout layout = Fp8ScaleLayout::Tensor;
  const float* s = nullptr;  // null: 1
  int64_t ld = 0;            // the scale tensor's row length
  bool per_block() const { return s != nullptr && layout != Fp8ScaleLayout::Tensor; }
  float whole() const { return s == nullptr ? 1.0f : s[0]; }  // Tensor layout (or none)
  float at(int64_t r, int64_t k) const {                      // block layouts
    return layout == Fp8ScaleLayout::Rows1x128 ? s[(k / 128) * ld + r] : s[(r / 128) * ld + k / 128];
  }
};

ScaleLookup scale_lookup(const Tensor& scale, Fp8ScaleLayout layout) {
  if (!scale.defined()) return {};
  return {.layout = layout, .s = scale.data<float>(), .ld = scale.shape().cols()};
}

// `t` is [.., cols] (an fp8 operand is [R, K]: cols = K).
template <class Acc>
Operand<Acc> operand(const Tensor& t, const ScaleLookup& scale) {
  Operand<Acc> op;
  if (t.dtype() == dtype_v<Acc>) {
    op.data = t.data<Acc>();
    return op;
  }
  op.copy.resize(size_t(t.numel()));
  const int64_t cols = t.numel() == 0 ? 1 : t.shape().cols();
  visit_float_dtype(t.dtype(), "gemm", [&]<class T>() {
    const T* p = t.data<T>();
    Acc* out = op.copy.data();
    // Every bf16 / f16 operand of the CPU backend is widened here: the index arithmetic of block scales stays
    // out of that loop.
    if (!scale.per_block()) {
      const Acc s = Acc(scale.whole());
      parallel_for(t.numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = Acc(to_double(p[i])) * s;
      });
      return;
    }
    parallel_for(t.numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = Acc(to_double(p[i])) * Acc(scale.at(i / cols, i % cols));
    });
  });
  op.data = op.copy.data();
  return op;
}

// The tiles of one batch entry: `count` pieces of `step` rows (split_rows) or columns.
struct TilePlan {
  bool split_rows = true;
  int64_t step = 1, count = 1;
};

TilePlan plan_tiles(const GemmDims& g) {
  constexpr double kMinTileFlops = double(1 << 22);  // below this a product is not worth a thread
  constexpr double kFlopsPerPackedElement = 512;     // packing one element costs about as much as this
  constexpr int64_t kMaxTiles = 64, kAlign = 32;
  TilePlan plan;
  plan.split_rows = g.m >= g.n;  // cut the longer side: the operand packed again per tile is the smaller one
  const int64_t extent = plan.split_rows ? g.m : g.n;
  const double flops = 2.0 * double(g.m) * double(g.n) * double(std::max<int64_t>(g.k, 1));
  const double repacked = double(g.k) * double(plan.split_rows ? g.n : g.m);
  const double tile_flops = std::max(kMinTileFlops, kFlopsPerPackedElement * repacked);
  const int64_t wanted = std::clamp<int64_t>(int64_t(flops / tile_flops), 1, kMaxTiles);
  plan.step = std::max<int64_t>(1, (extent + wanted - 1) / wanted);
  if (plan.step < extent) plan.step = std::min(extent, (plan.step + kAlign - 1) / kAlign * kAlign);
  plan.count = std::max<int64_t>(1, (extent + plan.step - 1) / plan.step);
  return plan;
}

// What the epilogue needs, with the bias widened once.
template <class Acc, class TD>
struct Epilogue {
  Acc alpha = 1, beta = 0, d_scale = 1;
  bool gelu = false;
  std::vector<Acc> bias;            // empty: no bias
  TD* aux = nullptr;                // pre-GELU values out
  const TD* gelu_input = nullptr;   // DGelu
  bool wants_amax = false;
};

template <class TD, class Acc>
TD narrow_to(Acc v) {
  if constexpr (std::is_same_v<TD, Acc>) return v;
  else if constexpr (std::is_same_v<TD, double>) return double(v);
  else return from_float<TD>(float(v));
}

template <class Acc>
MEGATRON_CPU_INLINE Acc gelu_of(Acc x) {
  if constexpr (std::is_same_v<Acc, double>) return gelu_tanh(x);
  else return gelu_tanh_f32(x);
}
template <class Acc>
MEGATRON_CPU_INLINE Acc gelu_grad_of(Acc x) {
  if constexpr (std::is_same_v<Acc, double>) return gelu_tanh_grad(x);
  else return gelu_tanh_grad_f32(x);
}

// The epilogue of one row piece, in passes the compiler vectorises: t = alpha * acc + beta * D (skipped
// when BLAS wrote t into D already: t_is_d), + bias, the pre-GELU copy, GELU or DGELU's factor, then
// D = round(d_scale * t). `t` holds the row's products on entry (a row of the scratch tile, or of D).
// Returns max |t| when fp8 amax is wanted.
template <class Acc, class TD>
MEGATRON_CPU_CLONES double finish_row(const Epilogue<Acc, TD>& e, TD* d, Acc* t, int64_t cols, int64_t col0,
                                      int64_t offset, bool t_is_d) {
  if (!t_is_d) {
    for (int64_t j = 0; j < cols; ++j) t[j] *= e.alpha;
    if (e.beta != Acc(0))
      for (int64_t j = 0; j < cols; ++j) t[j] += e.beta * Acc(to_double(d[j]));  // D is read only when beta != 0
  }
  if (!e.bias.empty()) {
    const Acc* bias = e.bias.data() + col0;
    for (int64_t j = 0; j < cols; ++j) t[j] += bias[j];
  }
  if (e.gelu) {
    if (e.aux != nullptr)
      for (int64_t j = 0; j < cols; ++j) e.aux[offset + j] = narrow_to<TD>(t[j]);
    for (int64_t j = 0; j < cols; ++j) t[j] = gelu_of(t[j]);
  }
  if (e.gelu_input != nullptr)
    for (int64_t j = 0; j < cols; ++j) t[j] *= gelu_grad_of(Acc(to_double(e.gelu_input[offset + j])));
  double amax = 0;
  if (e.wants_amax)
    for (int64_t j = 0; j < cols; ++j) amax = std::max(amax, std::abs(double(t[j])));
  if (!t_is_d)
    for (int64_t j = 0; j < cols; ++j) d[j] = narrow_to<TD>(e.d_scale * t[j]);
  return amax;
}

struct Tile {
  int64_t batch, row0, rows, col0, cols;
};

Tile tile_at(const GemmDims& g, const TilePlan& plan, int64_t item) {
  const int64_t batch = item / plan.count, piece = item % plan.count;
  const int64_t extent = plan.split_rows ? g.m : g.n;
  const int64_t begin = piece * plan.step, len = std::min(plan.step, extent - begin);
  if (plan.split_rows) return {batch, begin, len, 0, g.n};
  return {batch, 0, g.m, begin, len};
}

// Computes one tile of D; returns its max |t| (0 unless amax is wanted).
template <class Acc, class TD>
double run_tile(const Epilogue<Acc, TD>& e, TD* d, const Acc* a, const Acc* b, const GemmOptions& opt,
                const GemmDims& g, const Tile& t) {
  const Acc* a_tile = a + t.batch * g.stride_a() + (opt.transpose_a ? t.row0 : t.row0 * g.lda);
  const Acc* b_tile = b + t.batch * g.stride_b() + (opt.transpose_b ? t.col0 * g.ldb : t.col0);
  TD* d_tile = d + t.batch * g.stride_d() + t.row0 * g.n + t.col0;
  // Straight into D when it holds Acc values (BLAS applies alpha and beta); otherwise via an Acc tile.
  const bool direct = std::is_same_v<TD, Acc> && g.k > 0;
  const bool epilogue = !e.bias.empty() || e.gelu || e.gelu_input != nullptr || e.wants_amax;
  std::vector<Acc> scratch;
  Acc* acc = nullptr;
  int64_t ld_acc = g.n;
  if constexpr (std::is_same_v<TD, Acc>) {
    if (direct) {
      blas_gemm(opt.transpose_a, opt.transpose_b, t.rows, t.cols, g.k, e.alpha, a_tile, g.lda, b_tile, g.ldb,
                e.beta, d_tile, g.n);
      if (!epilogue) return 0;
      acc = d_tile;
    }
  }
  if (!direct) {
    scratch.assign(size_t(t.rows * t.cols), Acc(0));
    if (g.k > 0)
      blas_gemm(opt.transpose_a, opt.transpose_b, t.rows, t.cols, g.k, Acc(1), a_tile, g.lda, b_tile, g.ldb, Acc(0),
                scratch.data(), t.cols);
    acc = scratch.data();
    ld_acc = t.cols;
  }
  double amax = 0;
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t offset = t.batch * g.stride_d() + (t.row0 + r) * g.n + t.col0;
    amax = std::max(amax, finish_row(e, d_tile + r * g.n, acc + r * ld_acc, t.cols, t.col0, offset, direct));
  }
  return amax;
}

template <class Acc, class TD>
Epilogue<Acc, TD> make_epilogue(const Tensor& d, const GemmOptions& opt) {
  Epilogue<Acc, TD> e;
  e.alpha = Acc(opt.alpha);
  e.beta = Acc(opt.beta);
  e.d_scale = Acc(scalar_or_one(opt.d_scale));
  e.gelu = opt.epilogue == GemmEpilogue::Gelu || opt.epilogue == GemmEpilogue::BiasGelu;
  if (opt.epilogue == GemmEpilogue::Bias || opt.epilogue == GemmEpilogue::BiasGelu) {
    visit_float_dtype(opt.bias.dtype(), "gemm", [&]<class TB>() {
      const TB* p = opt.bias.data<TB>();
      for (int64_t j = 0; j < opt.bias.numel(); ++j) e.bias.push_back(Acc(to_double(p[j])));
    });
  }
  if (opt.gelu_input_out.defined()) e.aux = opt.gelu_input_out.data<TD>();
  if (opt.epilogue == GemmEpilogue::DGelu) e.gelu_input = opt.gelu_input.data<TD>();
  e.wants_amax = opt.d_amax_out.defined();
  return e;
}

template <class Acc>
void run(const Tensor& d, const Tensor& a, const Tensor& b, const GemmOptions& opt, const GemmDims& g) {
  MEGATRON_CHECK(g.m <= INT32_MAX && g.n <= INT32_MAX && g.k <= INT32_MAX && g.lda <= INT32_MAX &&
                     g.ldb <= INT32_MAX,
                 "gemm: the CPU backend (BLAS) needs every dimension below 2^31; got M=", g.m, " N=", g.n, " K=", g.k);
  if (g.batch * g.m * g.n == 0) {
    if (opt.d_amax_out.defined()) opt.d_amax_out.data<float>()[0] = 0.0f;
    return;
  }
  const Operand<Acc> wa = operand<Acc>(a, scale_lookup(opt.a_scale, opt.a_scale_layout));
  const Operand<Acc> wb = operand<Acc>(b, scale_lookup(opt.b_scale, opt.b_scale_layout));
  visit_float_dtype(d.dtype(), "gemm", [&]<class TD>() {
    const Epilogue<Acc, TD> e = make_epilogue<Acc, TD>(d, opt);
    const TilePlan plan = plan_tiles(g);
    TD* out = d.data<TD>();
    const std::vector<double> amax = parallel_partials<double>(g.batch * plan.count, 1, [&](int64_t item, int64_t) {
      return run_tile(e, out, wa.data, wb.data, opt, g, tile_at(g, plan, item));
    });
    if (opt.d_amax_out.defined())
      opt.d_amax_out.data<float>()[0] = float(amax.empty() ? 0.0 : *std::max_element(amax.begin(), amax.end()));
  });
}

// bias_grad_out[m] = sum_k op(A)[m, k], in double, k ascending. With transpose_a these are column sums of
// A [K, M], taken over blocks of columns so that every row of A is read contiguously.
void row_sums_of_op_a(const Tensor& out, const Tensor& a, const GemmOptions& opt, const GemmDims& g) {
  constexpr int64_t kColumns = 64;
  visit_float_dtype(a.dtype(), "gemm", [&]<class TA>() {
    visit_float_dtype(out.dtype(), "gemm", [&]<class TO>() {
      const TA* pa = a.data<TA>();
      TO* o = out.data<TO>();
      if (!opt.transpose_a) {
        parallel_for(g.m, rows_per_block(g.k), [&](int64_t begin, int64_t end) {
          for (int64_t m = begin; m < end; ++m) {
            double s = 0;
            for (int64_t k = 0; k < g.k; ++k) s += to_double(pa[m * g.lda + k]);
            o[m] = from_double<TO>(s);
          }
        });
        return;
      }
      parallel_for(g.m, kColumns, [&](int64_t begin, int64_t end) {
        double s[kColumns] = {};
        for (int64_t k = 0; k < g.k; ++k)
          for (int64_t m = begin; m < end; ++m) s[m - begin] += to_double(pa[k * g.lda + m]);
        for (int64_t m = begin; m < end; ++m) o[m] = from_double<TO>(s[m - begin]);
      });
    });
  });
}

}  // namespace

void gemm(Context& ctx, const Tensor& d, const Tensor& a, const Tensor& b, const GemmOptions& opt, const GemmDims& g) {
  if (a.dtype() == DType::F64 || d.dtype() == DType::F64) run<double>(d, a, b, opt, g);  // F64 D: fp8 inputs too
  else run<float>(d, a, b, opt, g);
  if (opt.bias_grad_out.defined()) row_sums_of_op_a(opt.bias_grad_out, a, opt, g);
}

}  // namespace megatron::ops::cpu
