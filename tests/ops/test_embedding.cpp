// embedding family: CUDA vs CPU (gather exact; scatter-add with many duplicate ids), finite differences,
// bitwise determinism of the CUDA backward, a direct formula check, bad inputs.
#include <cmath>
#include <cstring>

#include "harness.h"
#include "megatron/ops/embedding/embedding.h"

using ::megatron::testing::expect_error;

namespace megatron {
namespace {

using testing::GradCase;
using testing::OpCase;
using testing::TensorSpec;

struct Dims {
  std::vector<int64_t> ids_shape;
  int64_t vocab, hidden;
};

// Tokens outnumber rows in most shapes, so ids repeat.
const Dims kDims[] = {{{1}, 1, 1},        {{7}, 5, 7},        {{129}, 1000, 129}, {{1000}, 50, 1024},
                      {{33}, 7, 4097},    {{4, 33}, 300, 64}, {{257}, 3, 1000},   {{64}, 50257, 24}};

Shape rows_shape(const Dims& d) {
  std::vector<int64_t> s = d.ids_shape;
  s.push_back(d.hidden);
  return Shape(s);
}

std::string tag(const Dims& d, DType dt, DType ti) {
  std::string ids;
  for (int64_t e : d.ids_shape) ids += str_cat(ids.empty() ? "" : "x", e);
  return str_cat(ids, "_V", d.vocab, "_H", d.hidden, "_", dtype_name(dt), "_", dtype_name(ti));
}

std::vector<OpCase> cases() {
  std::vector<OpCase> out;
  for (const Dims& d : kDims)
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
      for (DType ti : {DType::I32, DType::I64}) {
        TensorSpec ids{Shape(d.ids_shape), ti, 0, double(d.vocab)};
        OpCase f;
        f.name = "forward_" + tag(d, dt, ti);
        f.inputs = {TensorSpec{{d.vocab, d.hidden}, dt}, ids};
        f.outputs = {TensorSpec{rows_shape(d), dt}};
        f.max_nmse = {1e-300};  // a copy: exact
        f.run = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& o) {
          ops::embedding_forward(ctx, o[0], in[0], in[1]);
        };
        out.push_back(f);
        if (ti == DType::I64 && dt != DType::BF16) continue;
        for (bool accumulate : {false, true}) {
          OpCase b;
          b.name = str_cat("backward_", tag(d, dt, ti), accumulate ? "_accumulate" : "");
          b.inputs = {TensorSpec{rows_shape(d), dt}, ids, TensorSpec{{d.vocab, d.hidden}, DType::F32}};
          b.outputs = {TensorSpec{{d.vocab, d.hidden}, DType::F32}};
          if (accumulate) b.output_starts_as_input = {{0, 2}};
          b.run = [accumulate](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& o) {
            ops::embedding_backward(ctx, o[0], in[0], in[1], accumulate);
          };
          out.push_back(b);
        }
      }
  return out;
}

// Vocabulary-parallel shards: rows [start, start + V) of a global table; ids cover the whole global range,
// so some rows are this shard's and some another's (zero rows / no gradient).
std::vector<OpCase> shard_cases() {
  std::vector<OpCase> out;
  struct Shard {
    int64_t tokens, global, start, rows, hidden;
  };
  for (Shard s : {Shard{37, 40, 0, 20, 9}, Shard{37, 40, 20, 20, 9}, Shard{129, 50304, 12576, 12576, 64},
                  Shard{300, 13, 5, 4, 1000}})
    for (DType dt : {DType::F32, DType::BF16}) {
      const std::string name = str_cat("shard_T", s.tokens, "_G", s.global, "_at", s.start, "_V", s.rows, "_H", s.hidden,
                                       "_", dtype_name(dt));
      TensorSpec ids{{s.tokens}, DType::I64, 0, double(s.global)};
      OpCase f;
      f.name = "forward_" + name;
      f.inputs = {TensorSpec{{s.rows, s.hidden}, dt}, ids};
      f.outputs = {TensorSpec{{s.tokens, s.hidden}, dt}};
      f.max_nmse = {1e-300};
      f.run = [s](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& o) {
        ops::vocab_parallel_embedding_forward(ctx, o[0], in[0], in[1], s.start, s.global);
      };
      out.push_back(f);
      OpCase b;
      b.name = "backward_accumulate_" + name;
      b.inputs = {TensorSpec{{s.tokens, s.hidden}, dt}, ids, TensorSpec{{s.rows, s.hidden}, DType::F32}};
      b.outputs = {TensorSpec{{s.rows, s.hidden}, DType::F32}};
      b.output_starts_as_input = {{0, 2}};
      b.run = [s](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& o) {
        ops::vocab_parallel_embedding_backward(ctx, o[0], in[0], in[1], true, s.start, s.global);
      };
      out.push_back(b);
    }
  return out;
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> out = cases();
  for (OpCase& c : shard_cases()) out.push_back(std::move(c));
  return out;
}

MEGATRON_OP_CASES(Embedding, all_cases);

// The shards of a table, each looked up with vocab_parallel_embedding_forward, sum to the whole lookup; their
// gradients are the rows of the whole gradient.
TEST(EmbeddingReference, VocabShardsComposeToTheWholeTable) {
  Context& ctx = testing::cpu_context();
  const int64_t global = 11, hidden = 5, tokens = 23;
  Tensor table = ctx.empty({global, hidden}, DType::F64), ids = ctx.empty({tokens}, DType::I32);
  Tensor dout = ctx.empty({tokens, hidden}, DType::F64);
  testing::fill_random(table, 1);
  testing::fill_random(dout, 2);
  for (int64_t i = 0; i < tokens; ++i) ids.data<int32_t>()[i] = int32_t((i * 7 + 3) % global);
  Tensor whole = ctx.empty({tokens, hidden}, DType::F64), dwhole = ctx.empty({global, hidden}, DType::F64);
  ops::embedding_forward(ctx, whole, table, ids);
  ops::embedding_backward(ctx, dwhole, dout, ids, false);
  const int64_t bounds[] = {0, 4, 4, 9, 11};  // an empty shard too
  std::vector<double> sum(size_t(tokens * hidden), 0.0);
  for (int k = 0; k + 1 < 5; ++k) {
    const int64_t start = bounds[k], rows = bounds[k + 1] - bounds[k];
    Tensor part = ctx.empty({tokens, hidden}, DType::F64), dpart = ctx.empty({rows, hidden}, DType::F64);
    ops::vocab_parallel_embedding_forward(ctx, part, table.slice(start, start + rows), ids, start, global);
    ops::vocab_parallel_embedding_backward(ctx, dpart, dout, ids, false, start, global);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part.data<double>()[i];
    for (int64_t i = 0; i < rows * hidden; ++i)
      EXPECT_EQ(dpart.data<double>()[i], dwhole.data<double>()[start * hidden + i]) << "shard " << k << " element " << i;
  }
  for (size_t i = 0; i < sum.size(); ++i) EXPECT_EQ(sum[i], whole.data<double>()[i]) << "element " << i;
  Tensor small = ctx.empty({4, hidden}, DType::F64);
  expect_error([&] { ops::vocab_parallel_embedding_forward(ctx, whole, small, ids, 8, global); },
               {"vocab_parallel_embedding_forward", "[8, 12)", "[0, 11)"});
  ids.data<int32_t>()[3] = int32_t(global);
  expect_error([&] { ops::vocab_parallel_embedding_forward(ctx, whole, small, ids, 4, global); },
               {"embedding_forward", "ids[3]", "[0, 11)"});
}

Tensor to_index(Context& ctx, const Tensor& f64) {
  Tensor ids = ctx.empty(f64.shape(), DType::I64);
  for (int64_t i = 0; i < f64.numel(); ++i) ids.data<int64_t>()[i] = int64_t(std::floor(f64.data<double>()[i]));
  return ids;
}

std::vector<GradCase> grad_cases() {
  std::vector<GradCase> out;
  for (Dims d : {Dims{{9}, 4, 5}, Dims{{3, 7}, 11, 3}, Dims{{1}, 1, 1}}) {
    GradCase c;
    c.name = tag(d, DType::F64, DType::I64);
    c.inputs = {TensorSpec{{d.vocab, d.hidden}, DType::F64}, TensorSpec{Shape(d.ids_shape), DType::F64, 0, double(d.vocab)}};
    c.differentiable = {0};
    c.forward = [d](Context& ctx, const std::vector<Tensor>& in) {
      Tensor y = ctx.empty(rows_shape(d), DType::F64);
      ops::embedding_forward(ctx, y, in[0], to_index(ctx, in[1]));
      return std::vector<Tensor>{y};
    };
    c.backward = [d](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& g) {
      Tensor dw = ctx.empty({d.vocab, d.hidden}, DType::F64);
      ops::embedding_backward(ctx, dw, g[0], to_index(ctx, in[1]), false);
      return std::vector<Tensor>{dw};
    };
    out.push_back(c);
  }
  return out;
}

MEGATRON_GRAD_CASES(Embedding, grad_cases);

// The backward written out: dweight[v] = start[v] + sum of dout rows whose id is v.
TEST(EmbeddingReference, BackwardMatchesDirectSum) {
  Context& ctx = testing::cpu_context();
  const int64_t tokens = 12, vocab = 4, hidden = 3;
  Tensor ids = ctx.empty({tokens}, DType::I32), dout = ctx.empty({tokens, hidden}, DType::F64);
  Tensor dw = ctx.empty({vocab, hidden}, DType::F64);
  for (int64_t t = 0; t < tokens; ++t) ids.data<int32_t>()[t] = int32_t((t * t) % 3);  // row 3 unused
  testing::fill_random(dout, 11);
  testing::fill_random(dw, 12);
  std::vector<double> start(dw.data<double>(), dw.data<double>() + vocab * hidden);
  ops::embedding_backward(ctx, dw, dout, ids, true);
  for (int64_t v = 0; v < vocab; ++v)
    for (int64_t h = 0; h < hidden; ++h) {
      double expect = start[size_t(v * hidden + h)];
      for (int64_t t = 0; t < tokens; ++t)
        if (ids.data<int32_t>()[t] == v) expect += dout.data<double>()[t * hidden + h];
      EXPECT_NEAR(dw.data<double>()[v * hidden + h], expect, 1e-14) << v << "," << h;
    }
  ops::embedding_backward(ctx, dw, dout, ids, false);
  for (int64_t h = 0; h < hidden; ++h) EXPECT_EQ(dw.data<double>()[3 * hidden + h], 0.0);
}

TEST(EmbeddingBadInput, IdOutOfRangeNamesPositionAndValue) {
  Context& ctx = testing::cpu_context();
  Tensor w = ctx.empty({10, 4}, DType::BF16), ids = ctx.empty({3}, DType::I64), out = ctx.empty({3, 4}, DType::BF16);
  testing::fill_random(w, 1);
  ids.data<int64_t>()[0] = 0;
  ids.data<int64_t>()[1] = 10;
  ids.data<int64_t>()[2] = 9;
  expect_error([&] { ops::embedding_forward(ctx, out, w, ids); }, {"embedding_forward", "ids[1]", "10", "[0, 10)"});
  ids.data<int64_t>()[1] = -1;
  Tensor dw = ctx.empty({10, 4}, DType::F32);
  expect_error([&] { ops::embedding_backward(ctx, dw, out, ids, false); }, {"embedding_backward", "ids[1]", "-1"});
}

TEST(EmbeddingBadInput, ShapesAndDtypes) {
  Context& ctx = testing::cpu_context();
  Tensor w = ctx.empty({10, 4}, DType::BF16), ids = ctx.empty({3}, DType::I32);
  expect_error([&] { ops::embedding_forward(ctx, ctx.empty({3, 5}, DType::BF16), w, ids); },
               {"embedding_forward", "out", "[3, 5]", "[3, 4]"});
  expect_error([&] { ops::embedding_forward(ctx, ctx.empty({3, 4}, DType::F32), w, ids); },
               {"embedding_forward", "out", "bf16"});
  expect_error([&] { ops::embedding_forward(ctx, ctx.empty({3, 4}, DType::BF16), w, ctx.empty({3}, DType::F32)); },
               {"embedding_forward", "ids"});
  expect_error([&] { ops::embedding_backward(ctx, ctx.empty({10, 4}, DType::BF16), ctx.empty({3, 4}, DType::BF16), ids, false); },
               {"embedding_backward", "dweight", "f32"});
  expect_error([&] { ops::embedding_backward(ctx, ctx.empty({10, 4}, DType::F32), ctx.empty({2, 4}, DType::BF16), ids, false); },
               {"embedding_backward", "dout", "[2, 4]", "[3, 4]"});
}

// ---- GPU-only ----

Tensor upload(const Tensor& cpu) {
  return to_device(testing::cuda_context(), cpu, testing::cuda_context().device(), testing::cpu_context().allocator());
}

// Two runs of the backward give identical bits, with heavy duplication (16384 tokens over 50 ids).
TEST(EmbeddingGpu, BackwardIsBitwiseDeterministic) {
  MEGATRON_REQUIRE_GPU();
  Context& cpu = testing::cpu_context();
  Context& gpu = testing::cuda_context();
  const int64_t tokens = 16384, vocab = 50, hidden = 1031;
  Tensor ids = cpu.empty({tokens}, DType::I32), dout = cpu.empty({tokens, hidden}, DType::BF16);
  testing::fill_random(ids, 21, 0, double(vocab));
  testing::fill_normal(dout, 22);
  Tensor gids = upload(ids), gdout = upload(dout);
  Tensor a = gpu.empty({vocab, hidden}, DType::F32), b = gpu.empty({vocab, hidden}, DType::F32);
  ops::embedding_backward(gpu, a, gdout, gids, false);
  ops::embedding_backward(gpu, b, gdout, gids, false);
  Tensor ha = to_device(gpu, a, Device::cpu(), cpu.allocator()), hb = to_device(gpu, b, Device::cpu(), cpu.allocator());
  EXPECT_EQ(std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()), 0) << "two backward runs differ";
  // And it agrees with the CPU reference.
  Tensor ref = cpu.empty({vocab, hidden}, DType::F32);
  ops::embedding_backward(cpu, ref, dout, ids, false);
  EXPECT_LE(testing::nmse(testing::to_doubles(cpu, ha), testing::to_doubles(cpu, ref)), 1e-10);
}

// Out-of-range ids on the GPU: NaN row forward, gradient dropped backward, other rows untouched.
TEST(EmbeddingGpu, OutOfRangeIdsAreContained) {
  MEGATRON_REQUIRE_GPU();
  Context& cpu = testing::cpu_context();
  Context& gpu = testing::cuda_context();
  Tensor w = cpu.empty({5, 8}, DType::BF16), ids = cpu.empty({3}, DType::I32), dout = cpu.empty({3, 8}, DType::F32);
  testing::fill_random(w, 1);
  testing::fill_random(dout, 2);
  ids.data<int32_t>()[0] = 2;
  ids.data<int32_t>()[1] = 5;
  ids.data<int32_t>()[2] = -7;
  Tensor out = gpu.empty({3, 8}, DType::BF16), dw = gpu.empty({5, 8}, DType::F32);
  Tensor gids = upload(ids);
  ops::embedding_forward(gpu, out, upload(w), gids);
  ops::embedding_backward(gpu, dw, upload(dout), gids, false);
  std::vector<double> o = testing::to_doubles(gpu, out), g = testing::to_doubles(gpu, dw);
  for (int h = 0; h < 8; ++h) {
    EXPECT_EQ(o[h], to_double(w.data<bf16_t>()[2 * 8 + h]));
    EXPECT_TRUE(std::isnan(o[8 + h]));
    EXPECT_TRUE(std::isnan(o[16 + h]));
    EXPECT_EQ(g[2 * 8 + h], double(dout.data<float>()[h]));
    for (int v : {0, 1, 3, 4}) EXPECT_EQ(g[v * 8 + h], 0.0);
  }
}

std::vector<OpCase> large_cases() {
  std::vector<OpCase> out;
  for (Dims d : {Dims{{16384}, 50304, 1024}, Dims{{8, 2048}, 128256, 257}, Dims{{16384}, 2, 64}}) {
    OpCase b;
    b.name = "backward_" + tag(d, DType::BF16, DType::I64);
    b.inputs = {TensorSpec{rows_shape(d), DType::BF16}, TensorSpec{Shape(d.ids_shape), DType::I64, 0, double(d.vocab)}};
    b.outputs = {TensorSpec{{d.vocab, d.hidden}, DType::F32}};
    b.run = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& o) {
      ops::embedding_backward(ctx, o[0], in[0], in[1], false);
    };
    out.push_back(b);
  }
  return out;
}

class EmbeddingGpuLarge : public ::testing::TestWithParam<OpCase> {};
TEST_P(EmbeddingGpuLarge, CudaMatchesCpu) {
  MEGATRON_REQUIRE_GPU();
  testing::expect_cuda_matches_cpu(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Ops, EmbeddingGpuLarge, ::testing::ValuesIn(large_cases()),
                         [](const auto& info) { return testing::gtest_name(info.param.name); });

}  // namespace
}  // namespace megatron
