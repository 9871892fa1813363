// The paired collectives of tensor/sequence parallelism (parallel/mappings.h) against a direct computation,
// under `mpiexec -np 3` (an odd TP size): every rank fills its inputs from Philox seeded by (case, rank), so
// each rank recomputes the other ranks' inputs and the expected result itself. Forward and backward of each
// pair, F32 (reductions, 1e-6) and BF16 (data movement, exact), odd row and column counts; a group of one
// leaves tensors untouched; shape errors name the group and the shapes; the pipelined collectives of
// --tp-comm-overlap against the same direct computation. Suite TensorParallelMappingsGpu runs the same checks on
// 2, 4 or 8 GPUs (TP over every rank) through NCCL with the overlapped (side-stream) forms, and through the copy
// engines.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "harness.h"
#include "megatron/comm/self_communicator.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/parallel/mappings.h"
#include "megatron/parallel/tensor_parallel.h"
#include "mpi_world.h"
#if MEGATRON_WITH_NCCL
#include "megatron/comm/nccl_communicator.h"
#endif

namespace megatron::parallel {
namespace {

struct Env {
  Context& ctx;
  TensorParallel tp;
  bool async = false;
};

// Rank r's input of case `what` (r = -1: an input shared by every rank), as doubles and as a device tensor.
std::vector<double> values(const Shape& shape, DType dt, const std::string& what, int r) {
  static CpuAllocator host;
  Tensor t = Tensor::empty(shape, dt, host);
  testing::fill_random(t, testing::seed_from(str_cat(what, "#", r)), -1.0, 1.0);
  return testing::to_doubles(testing::cpu_context(), t);
}
Tensor input(Env& e, const Shape& shape, DType dt, const std::string& what, int r) {
  static CpuAllocator host;
  Tensor t = Tensor::empty(shape, dt, host);
  testing::fill_random(t, testing::seed_from(str_cat(what, "#", r)), -1.0, 1.0);
  Tensor d = e.ctx.empty(shape, dt);
  copy_tensor(e.ctx, d, t);
  return d;
}
std::vector<double> read(Env& e, const Tensor& t) {
  e.ctx.synchronize();
  return testing::to_doubles(e.ctx, t);
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
      ++bad;
    }
}

double tol(DType dt) { return dt == DType::F32 ? 1e-6 : 0.0; }

// Sum over the ranks of each rank's values.
std::vector<double> sum_over_ranks(const Shape& shape, DType dt, const std::string& what, int ranks) {
  std::vector<double> s(size_t(shape.numel()), 0.0);
  for (int r = 0; r < ranks; ++r) {
    std::vector<double> v = values(shape, dt, what, r);
    for (size_t i = 0; i < s.size(); ++i) s[i] += v[i];
  }
  return s;
}

void check_all_reduce_pairs(Env& e) {
  const int P = e.tp.size(), me = e.tp.rank();
  const Shape shape{7, 5};
  {  // copy_to_tp backward: the input gradient summed over the ranks, in place
    Tensor dx = input(e, shape, DType::F32, "copy_bwd", me);
    PendingCollective pending = copy_to_tp_backward(e.ctx, e.tp, dx, e.async);
    pending.wait(e.ctx);
    expect_near(read(e, dx), sum_over_ranks(shape, DType::F32, "copy_bwd", P), 1e-6, "copy_to_tp_backward");
  }
  {  // reduce_from_tp forward
    Tensor y = input(e, shape, DType::F32, "reduce_fwd", me);
    reduce_from_tp_forward(e.ctx, e.tp, y);
    expect_near(read(e, y), sum_over_ranks(shape, DType::F32, "reduce_fwd", P), 1e-6, "reduce_from_tp_forward");
  }
}

void check_last_dim_pairs(Env& e, DType dt) {
  const int P = e.tp.size(), me = e.tp.rank();
  const int64_t rows = 5, n = 3;  // local columns; the whole has n * P
  const std::string tag = str_cat(" (", dtype_name(dt), ")");
  // scatter_to_tp forward: this rank's columns of a replicated x; gather_from_tp backward: the same rule.
  const std::vector<double> x = values({rows, n * P}, dt, "scatter_fwd", -1);
  std::vector<double> mine(size_t(rows * n));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < n; ++c) mine[size_t(i * n + c)] = x[size_t(i * n * P + me * n + c)];
  for (bool gather_backward : {false, true}) {
    Tensor full = input(e, {rows, n * P}, dt, "scatter_fwd", -1);
    Tensor out = e.ctx.empty({rows, n}, dt);
    if (gather_backward) gather_from_tp_backward(e.ctx, e.tp, out, full);
    else scatter_to_tp_forward(e.ctx, e.tp, out, full);
    expect_near(read(e, out), mine, 0.0, (gather_backward ? "gather_from_tp_backward" : "scatter_to_tp_forward") + tag);
  }
  // gather_from_tp forward / scatter_to_tp backward: every rank's [rows, n] side by side.
  std::vector<double> side_by_side(size_t(rows * n * P));
  for (int r = 0; r < P; ++r) {
    std::vector<double> v = values({rows, n}, dt, "gather_fwd", r);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < n; ++c) side_by_side[size_t(i * n * P + r * n + c)] = v[size_t(i * n + c)];
  }
  for (bool scatter_backward : {false, true}) {
    Tensor part = input(e, {rows, n}, dt, "gather_fwd", me);
    Tensor out = e.ctx.empty({rows, n * P}, dt);
    if (scatter_backward) scatter_to_tp_backward(e.ctx, e.tp, out, part);
    else gather_from_tp_forward(e.ctx, e.tp, out, part);
    expect_near(read(e, out), side_by_side, 0.0,
                (scatter_backward ? "scatter_to_tp_backward" : "gather_from_tp_forward") + tag);
  }
}

void check_sequence_pairs(Env& e, DType dt) {
  const int P = e.tp.size(), me = e.tp.rank();
  const int64_t local = 3, h = 5;  // rows per rank, row width
  const std::string tag = str_cat(" (", dtype_name(dt), ")");
  // All-gather of rows: gather_from_sp forward and reduce_scatter_to_sp backward.
  std::vector<double> stacked;
  for (int r = 0; r < P; ++r) {
    std::vector<double> v = values({local, h}, dt, "sp_gather", r);
    stacked.insert(stacked.end(), v.begin(), v.end());
  }
  for (bool rs_backward : {false, true}) {
    Tensor part = input(e, {local, h}, dt, "sp_gather", me);
    Tensor out = e.ctx.empty({local * P, h}, dt);
    PendingCollective pending = rs_backward ? reduce_scatter_to_sp_backward(e.ctx, e.tp, out, part, e.async)
                                            : gather_from_sp_forward(e.ctx, e.tp, out, part, e.async);
    pending.wait(e.ctx);
    expect_near(read(e, out), stacked, 0.0,
                (rs_backward ? "reduce_scatter_to_sp_backward" : "gather_from_sp_forward") + tag);
  }
  if (dt != DType::F32) return;  // reductions: fp32 only (bf16 sums round in an order of MPI's choosing)
  // Reduce-scatter of rows: reduce_scatter_to_sp forward and gather_from_sp backward.
  const std::vector<double> sum = sum_over_ranks({local * P, h}, dt, "sp_rs", P);
  const std::vector<double> my_rows(sum.begin() + me * local * h, sum.begin() + (me + 1) * local * h);
  for (bool gather_backward : {false, true}) {
    Tensor whole = input(e, {local * P, h}, dt, "sp_rs", me);
    Tensor out = e.ctx.empty({local, h}, dt);
    if (gather_backward) gather_from_sp_backward(e.ctx, e.tp, out, whole, e.async).wait(e.ctx);
    else reduce_scatter_to_sp_forward(e.ctx, e.tp, out, whole);
    expect_near(read(e, out), my_rows, tol(dt),
                (gather_backward ? "gather_from_sp_backward" : "reduce_scatter_to_sp_forward") + tag);
  }
}

void check_everything(Env& e) {
  check_all_reduce_pairs(e);
  for (DType dt : {DType::F32, DType::BF16}) {
    check_last_dim_pairs(e, dt);
    check_sequence_pairs(e, dt);
  }
}

// The pipelined collectives of --tp-comm-overlap (tp_comm_overlap.h) against the direct computation, three rounds
// of each size (the transfers' staging reused), sizes growing (the exchange remade larger): the all-gather hands
// every rank's shard to compute() once, chunk `rank` first and then rank - 1, rank - 2, ..., and fills
// `gathered`; the reduce-scatter sums every rank's partial for chunk `rank`.
void check_pipelined_collectives(Env& e, DType dt) {
  const int P = e.tp.size(), me = e.tp.rank();
  // BF16: each of the P - 1 additions rounds to BF16, at most half an ulp (2^-8 relative) of a sum up to P.
  const double sum_tol = dt == DType::F32 ? 1e-6 : P * std::ldexp(1.0, -7);
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{3, 5}, {3, 5}, {3, 5}, {67, 129}, {600, 513}, {600, 513},
                                                          {5, 7}};  // 600 x 513 x 4 bytes: over the first slots
  for (size_t round = 0; round < sizes.size(); ++round) {
    const auto [rows, cols] = sizes[round];
    SCOPED_TRACE(str_cat(dtype_name(dt), " round ", round, ": chunks [", rows, ", ", cols, "]"));
    const std::string tag = str_cat("ring ", round, " ", dtype_name(dt));
    const Tensor shard = input(e, {rows, cols}, dt, tag, me);
    const Tensor gathered = e.ctx.empty({P * rows, cols}, dt), seen = e.ctx.empty({P * rows, cols}, dt);
    std::vector<int> order;
    ring_all_gather(e.ctx, e.tp, shard, gathered, [&](int c, const Tensor& chunk) {
      order.push_back(c);
      ops::copy(e.ctx, row_block(seen, cols, c * rows, rows), chunk);
    });
    std::vector<double> want;
    for (int r = 0; r < P; ++r) {
      const std::vector<double> v = values({rows, cols}, dt, tag, r);
      want.insert(want.end(), v.begin(), v.end());
    }
    expect_near(read(e, gathered), want, 0.0, "all-gather: gathered");
    expect_near(read(e, seen), want, 0.0, "all-gather: the chunks compute() saw");
    std::vector<int> want_order;
    for (int k = 0; k < P; ++k) want_order.push_back((me + P - k) % P);
    EXPECT_EQ(order, want_order);

    const Tensor parts = input(e, {P * rows, cols}, dt, tag + " parts", me), out = e.ctx.empty({rows, cols}, dt);
    std::vector<int> computed;
    ring_reduce_scatter(e.ctx, e.tp, out, [&](int c, const Tensor& partial) {
      computed.push_back(c);
      ops::copy(e.ctx, partial, row_block(parts, cols, c * rows, rows));
    });
    std::vector<double> sum(size_t(rows * cols), 0.0);
    for (int r = 0; r < P; ++r) {
      const std::vector<double> v = values({P * rows, cols}, dt, tag + " parts", r);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[size_t(me * rows * cols) + i];
    }
    expect_near(read(e, out), sum, sum_tol, "reduce-scatter");
    std::sort(computed.begin(), computed.end());
    std::vector<int> every(static_cast<size_t>(P), 0);
    for (int r = 0; r < P; ++r) every[size_t(r)] = r;
    EXPECT_EQ(computed, every) << "compute() runs once for every chunk";
  }
}

TEST(TensorParallelMappings, MatchDirectComputation) {
  auto world = testing::mpi_world();
  ASSERT_GE(world->size(), 2);
  Env e{testing::cpu_context(), TensorParallel::create(testing::cpu_context(), world, true)};
  EXPECT_TRUE(e.tp.sp());
  EXPECT_EQ(e.tp.sp_rows(12 * world->size()), 12);
  EXPECT_EQ(e.tp.sp_row_offset(12 * world->size()), 12 * world->rank());
  check_everything(e);
  for (DType dt : {DType::F32, DType::BF16}) check_pipelined_collectives(e, dt);
  e.async = true;  // CPU ranks: the same, completed inside the call
  check_all_reduce_pairs(e);
}

TEST(TensorParallelMappings, GroupOfOneDoesNothing) {
  Context& ctx = testing::cpu_context();
  for (bool with_group : {false, true}) {
    TensorParallel tp = TensorParallel::create(
        ctx, with_group ? std::make_shared<comm::SelfCommunicator>() : nullptr, /*sequence_parallel=*/true);
    EXPECT_FALSE(tp.enabled());
    EXPECT_FALSE(tp.sp()) << "sequence parallelism is off at TP 1, as in Megatron";
    EXPECT_EQ(tp.sp_rows(10), 10);
    EXPECT_EQ(tp.sp_row_offset(10), 0);
    Tensor t = ctx.empty({4, 3}, DType::F32);
    testing::poison(ctx, t);  // NaN everywhere: an op that touched it would still leave NaN, so compare bytes
    std::vector<uint8_t> before(t.nbytes());
    std::memcpy(before.data(), t.data_ptr(), t.nbytes());
    copy_to_tp_backward(ctx, tp, t, true).wait(ctx);
    reduce_from_tp_forward(ctx, tp, t);
    EXPECT_EQ(std::memcmp(before.data(), t.data_ptr(), t.nbytes()), 0);
    Tensor x = ctx.empty({4, 3}, DType::F32), out = ctx.empty({4, 3}, DType::F32);
    testing::fill_random(x, 3);
    gather_from_sp_forward(ctx, tp, out, x);
    EXPECT_EQ(testing::to_doubles(ctx, out), testing::to_doubles(ctx, x));
  }
}

TEST(TensorParallelMappings, ShapeErrorsNameTheGroupAndShapes) {
  auto world = testing::mpi_world();
  Context& ctx = testing::cpu_context();
  TensorParallel tp = TensorParallel::create(ctx, world, true);
  const int P = world->size();
  Tensor local = ctx.empty({3, 4}, DType::F32), wrong = ctx.empty({3 * P + 1, 4}, DType::F32);
  testing::expect_error([&] { gather_from_sp_forward(ctx, tp, wrong, local); },
                        {"gather_from_sp_forward", "group 'world'", "f32[3, 4]", str_cat("f32[", 3 * P + 1, ", 4]")});
  Tensor cols = ctx.empty({3, 4 * P + 2}, DType::F32);
  testing::expect_error([&] { gather_from_tp_forward(ctx, tp, cols, local); },
                        {"gather_from_tp_forward", "group 'world'", "last dimension"});
  Tensor other = ctx.empty({3 * P, 4}, DType::BF16);
  testing::expect_error([&] { reduce_scatter_to_sp_forward(ctx, tp, local, other); }, {"reduce_scatter_to_sp_forward", "dtype"});
}

#if MEGATRON_WITH_NCCL
// Two or more ranks with a GPU each: each rank's context and the NCCL group over all (null context: skip the test).
struct RankGpus {
  std::unique_ptr<Context> ctx;
  std::shared_ptr<comm::Communicator> nccl;
};
RankGpus rank_gpus() {
  auto world = testing::mpi_world();
  const int count = cuda_device_count();
  if (count == 0 || world->size() < 2 || testing::mpi_runtime().local_size() > count) return {};
  const Device device = Device::cuda(testing::mpi_runtime().local_rank() % count);
  RankGpus g{Context::create(device), nullptr};
  g.nccl = comm::NcclCommunicator::create(*world, device.index, "tp", comm::timeout_from_minutes(2.0));
  return g;
}

TEST(TensorParallelMappingsGpu, MatchDirectComputationOnGpusWithOverlap) {
  const auto [ctx, nccl] = rank_gpus();
  if (!ctx) GTEST_SKIP() << "needs 2 or more ranks with a GPU each";
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "side stream" : "ctx stream");
    Env e{*ctx, TensorParallel::create(*ctx, nccl, true), async};
    ASSERT_TRUE(e.tp.overlap != nullptr);
    check_everything(e);
  }
}

TEST(TensorParallelMappingsGpu, PipelinedCollectivesByCopyEnginesAndByNcclMatchDirectComputation) {
  const auto [ctx, nccl] = rank_gpus();
  if (!ctx) GTEST_SKIP() << "needs 2 or more ranks with a GPU each";
  for (bool copy_engine : {true, false}) {
    SCOPED_TRACE(copy_engine ? "copy engines" : "NCCL point-to-point");
    Env e{*ctx, TensorParallel::create(*ctx, nccl, true)};
    e.tp.comm_overlap.copy_engine = copy_engine;
    e.async = true;  // the bulk (async) sequence-parallel gather and reduce-scatter: copy engines too
    for (DType dt : {DType::F32, DType::BF16}) {
      check_pipelined_collectives(e, dt);
      check_sequence_pairs(e, dt);
    }
    if (copy_engine) {  // the GPUs of one machine map each other's memory: the exchanges were used, not NCCL
      EXPECT_NE(e.tp.peers->get(*ctx, *nccl, 1), nullptr);
      EXPECT_NE(e.tp.bulk_peers->get(*ctx, *nccl, 1), nullptr);
    }
  }
}

// An async reduce-scatter whose input the caller drops right after issuing it (as a linear's backward drops its
// whole-sequence input gradient before the weight-gradient GEMM): the PendingCollective keeps the input until
// wait(), so the NaN that ctx's stream writes into fresh allocations of the same size meanwhile cannot reach the
// collective. The other ranks issue theirs 200 ms later, so the collective is still waiting for them while the
// fills run: without the hold, the caching allocator hands the dropped block to the first fill.
TEST(TensorParallelMappingsGpu, AsyncCollectiveHoldsItsTensorsUntilWait) {
  const auto [ctx, nccl] = rank_gpus();
  if (!ctx) GTEST_SKIP() << "needs 2 or more ranks with a GPU each";
  Env e{*ctx, TensorParallel::create(*ctx, nccl, true)};
  const int P = e.tp.size(), me = e.tp.rank();
  const int64_t rows = 1024, cols = 4096;  // 16 MiB a chunk: more than NCCL buffers before the peers arrive
  const DType dt = DType::F32;
  std::vector<double> want(size_t(rows * cols), 0.0);
  for (int r = 0; r < P; ++r) {
    const std::vector<double> v = values({rows * P, cols}, dt, "held reduce-scatter", r);
    for (size_t i = 0; i < want.size(); ++i) want[i] += v[size_t(me * rows * cols) + i];
  }
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(str_cat("round ", round));
    Tensor dx = ctx->empty({rows, cols}, dt);
    PendingCollective pending;
    {
      const Tensor dout = input(e, {rows * P, cols}, dt, "held reduce-scatter", me);
      ctx->synchronize();
      nccl->barrier();
      if (me != 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      pending = gather_from_sp_backward(*ctx, e.tp, dx, dout, /*async=*/true);
    }
    std::vector<Tensor> fills;
    for (int i = 0; i < 4; ++i) {
      fills.push_back(ctx->empty({rows * P, cols}, dt));
      ops::fill(*ctx, fills.back(), std::numeric_limits<double>::quiet_NaN());
    }
    pending.wait(*ctx);
    expect_near(read(e, dx), want, 1e-5, "reduce-scattered rows");
  }
}
#endif

}  // namespace
}  // namespace megatron::parallel
