// The acceptance test of data parallelism, under `mpiexec -np 4`: a tiny GPT on mock data (fp32, dropout
// 0, clipping active) trained for a few iterations at DP=2 and DP=4, with the replicated and the
// distributed optimizer, with and without overlapped bucketed reduction (several buckets) and with
// gradient accumulation (global batch 8 of micro-batches of 1: 4 and 2 micro-batches per rank), gives the
// losses, gradient norms, validation loss and parameters of DP=1 at the same global batch within 1e-5
// relative, and every rank of a DP group ends with bit-identical parameters. DP=2 runs as two independent
// groups of two inside the world of four; every rank computes the DP=1 reference itself.
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"
#include "megatron/train/flags.h"
#include "megatron/train/model_config.h"
#include "megatron/trainer/trainer.h"
#include "mpi_world.h"
#if MEGATRON_WITH_NCCL
#include "megatron/comm/nccl_communicator.h"
#endif

namespace megatron::trainer {
namespace {

constexpr int kIterations = 3;

train::Arguments tiny_args(int world_size, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {
      "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
      "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", std::to_string(kIterations), "--lr",
      "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0.1",
      "--clip-grad", "0.5", "--mock-data", "--vocab-size", "4096", "--hidden-dropout", "0", "--attention-dropout",
      "0", "--seed", "5", "--eval-interval", "1000", "--eval-iters", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  train::Arguments a = train::parse_arguments(argv);
  a.parallel.world_size = world_size;
  train::resolve_and_validate(a);
  return a;
}

struct TrainedRun {
  std::vector<double> losses, grad_norms;
  double valid_loss = 0;
  std::vector<std::string> names;
  std::vector<std::vector<double>> params;
  size_t optimizer_state_bytes = 0;
};

TrainedRun train(const train::Arguments& a, const parallel::ParallelContext& pc, const TrainingData& data,
                 Device device = Device::cpu()) {
  auto ctx = Context::create(device);
  const DType dtype = a.training.bf16 ? DType::BF16 : DType::F32;
  nn::GPTModel model(*ctx, train::transformer_config(a.model, dtype, uint64_t(a.training.seed)));
  SampleStream train_stream = data.stream(data::Split::train), valid_stream = data.stream(data::Split::valid);
  Trainer trainer(*ctx, a, model, pc);
  TrainedRun run;
  for (int64_t it = 1; it <= kIterations; ++it) {
    StepResult r = trainer.train_step(train_stream, it);
    EXPECT_FALSE(r.skipped);
    run.losses.push_back(r.loss);
    run.grad_norms.push_back(r.grad_norm.value_or(NAN));
  }
  run.valid_loss = trainer.evaluate(valid_stream);
  for (nn::Parameter* p : model.parameters()) {
    run.names.push_back(p->name);
    run.params.push_back(testing::to_doubles(*ctx, p->value));
  }
  run.optimizer_state_bytes = trainer.optimizer_state_bytes();
  return run;
}

void expect_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), tol * std::fabs(want)) << what << ": " << got << " vs DP=1 " << want;
}

// Every rank of `group` holds exactly the same values.
void expect_replicas_identical(const TrainedRun& run, comm::Communicator& group, const std::string& what) {
  for (size_t i = 0; i < run.params.size(); ++i) {
    std::vector<double> hi = run.params[i], lo = run.params[i];
    for (double& v : lo) v = -v;
    group.all_reduce_host(hi, comm::ReduceOp::Max);
    group.all_reduce_host(lo, comm::ReduceOp::Max);
    size_t differ = 0;
    for (size_t k = 0; k < hi.size(); ++k) differ += hi[k] != -lo[k];
    EXPECT_EQ(differ, 0u) << what << ": " << run.names[i] << " differs across the DP ranks in " << differ << " elements";
  }
}

// The samples depend on the global batch, iterations, sequence length and seed only, so every run shares
// one dataset (building the mock dataset's indices is the slow part of this test).
const TrainingData& shared_data() {
  static const train::Arguments args = tiny_args(1);
  static const TrainingData data(args, args.model.vocab_size - 1);
  return data;
}

TEST(DataParallel, SameLossesAndParametersAsOneRank) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  const train::Arguments reference_args = tiny_args(1);
  const TrainingData& data = shared_data();
  const TrainedRun reference = train(reference_args, parallel::ParallelContext::single(), data);
  ASSERT_EQ(reference.losses.size(), size_t(kIterations));
  EXPECT_LT(reference.losses.back(), reference.losses.front()) << "the reference should be learning";

  struct Variant {
    std::string name;
    std::vector<std::string> flags;
  };
  const std::vector<Variant> variants = {
      {"replicated", {}},
      {"replicated, overlapped buckets", {"--overlap-grad-reduce", "--ddp-bucket-size", "5000"}},
      {"distributed optimizer", {"--use-distributed-optimizer"}},
      {"distributed optimizer, overlapped buckets and gathers",
       {"--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "5000", "--overlap-param-gather"}},
  };
  size_t replicated_state = 0;
  for (int dp : {2, 4}) {
    // DP=2: ranks {0, 1} and {2, 3} train as two independent groups.
    std::shared_ptr<comm::Communicator> group = world->split(world->rank() / dp, world->rank() % dp, "dp-test");
    const parallel::ParallelContext pc = parallel::ParallelContext::create(group);
    ASSERT_EQ(pc.dp_size(), dp);
    for (const Variant& v : variants) {
      const std::string what = str_cat("DP=", dp, " ", v.name);
      SCOPED_TRACE(what);
      const train::Arguments a = tiny_args(dp, v.flags);
      TrainedRun run = train(a, pc, data);
      for (int it = 0; it < kIterations; ++it) {
        expect_rel(run.losses[it], reference.losses[it], 1e-5, str_cat("loss of iteration ", it + 1));
        expect_rel(run.grad_norms[it], reference.grad_norms[it], 1e-5, str_cat("grad norm of iteration ", it + 1));
      }
      expect_rel(run.valid_loss, reference.valid_loss, 1e-5, "validation loss");
      ASSERT_EQ(run.params.size(), reference.params.size());
      for (size_t i = 0; i < run.params.size(); ++i) {
        double diff = 0, norm = 0, max_abs = 0, max_ref = 0;
        for (size_t k = 0; k < run.params[i].size(); ++k) {
          const double d = run.params[i][k] - reference.params[i][k];
          diff += d * d;
          norm += reference.params[i][k] * reference.params[i][k];
          max_abs = std::max(max_abs, std::fabs(d));
          max_ref = std::max(max_ref, std::fabs(reference.params[i][k]));
        }
        // 1e-5 relative, as the norm of the difference over the norm of the tensor. Element by element the
        // bound is looser: the key bias has an exactly zero gradient in exact arithmetic (softmax ignores a
        // shift shared by all keys), so Adam turns rounding noise (~1e-12, summed in another order at DP=N)
        // into updates of ~1e-7 there; every other element agrees to ~1e-7 relative.
        EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm)) << reference.names[i] << " (largest difference " << max_abs << ")";
        EXPECT_LE(max_abs, 1e-4 * max_ref) << reference.names[i];
      }
      expect_replicas_identical(run, *group, what);
      // The distributed optimizer keeps 1/DP of the state (plus alignment padding).
      if (v.flags.empty()) replicated_state = run.optimizer_state_bytes;
      if (!v.flags.empty() && v.flags[0] == "--use-distributed-optimizer") {
        double total[1] = {double(run.optimizer_state_bytes)};
        group->all_reduce_host(total, comm::ReduceOp::Sum);
        EXPECT_GE(total[0], double(replicated_state));
        EXPECT_LE(total[0], 1.05 * double(replicated_state));
        EXPECT_LE(double(run.optimizer_state_bytes), 1.05 * double(replicated_state) / dp);
      }
    }
  }
}

TEST(DataParallel, EachRankReadsItsMicroBatchesOfTheGlobalBatch) {
  // Megatron's sampler: step m takes mbs * DP consecutive samples, DP rank r rows [r * mbs, (r + 1) * mbs).
  const TrainingData& data = shared_data();
  CpuAllocator host;
  SampleStream one = data.stream(data::Split::train);
  Tensor global = one.next(8, host);  // one iteration at DP=1
  const int dp = 2, mbs = 2;
  for (int r = 0; r < dp; ++r) {
    SampleStream s = data.stream(data::Split::train);
    for (int m = 0; m < 8 / (mbs * dp); ++m) {
      Tensor mine = s.next(mbs * dp, host, r * mbs, mbs);
      ASSERT_EQ(mine.dim(0), mbs);
      const int64_t first = (m * dp + r) * mbs, width = mine.dim(1);
      for (int64_t k = 0; k < mbs * width; ++k)
        ASSERT_EQ(mine.data<int64_t>()[k], global.data<int64_t>()[first * width + k]) << "rank " << r << " step " << m;
    }
    EXPECT_EQ(s.consumed(), 8) << "consumed samples count the whole global batch";
  }
}

#if MEGATRON_WITH_NCCL
// The same on 2, 4 or 8 GPUs through NCCL, in bf16 (the GPU model's dtype): DP over every rank, with the
// distributed optimizer and every overlap on, against DP=1 computed by each rank on its own GPU. bf16
// activations make the comparison approximate; the replicas must still be bit-identical.
TEST(DataParallelGpu, GpusMatchOneInBf16) {
  auto world = testing::mpi_world();
  const int count = cuda_device_count();
  if (count == 0 || world->size() < 2 || testing::mpi_runtime().local_size() > count)
    GTEST_SKIP() << "needs 2 or more ranks with a GPU each";
  const int dp = world->size();  // DP over every rank (2, 4 or 8 GPUs)
  const Device device = Device::cuda(testing::mpi_runtime().local_rank() % count);
  std::shared_ptr<comm::Communicator> nccl =
      comm::NcclCommunicator::create(*world, device.index, "world", comm::timeout_from_minutes(2.0));
  const std::vector<std::string> shape = {"--bf16", "--hidden-size", "64", "--seq-length", "32",
                                          "--micro-batch-size", "2", "--ddp-bucket-size", "20000"};
  train::Arguments reference_args = tiny_args(1, shape);
  const TrainingData data(reference_args, reference_args.model.vocab_size - 1);
  const TrainedRun reference = train(reference_args, parallel::ParallelContext::single(device), data, device);
  for (bool distributed : {false, true}) {
    SCOPED_TRACE(distributed ? "distributed optimizer" : "replicated");
    std::vector<std::string> flags = shape;
    flags.insert(flags.end(), {"--overlap-grad-reduce"});
    if (distributed) flags.insert(flags.end(), {"--use-distributed-optimizer", "--overlap-param-gather"});
    const parallel::ParallelContext pc = parallel::ParallelContext::create(nccl);
    TrainedRun run = train(tiny_args(dp, flags), pc, data, device);
    for (int it = 0; it < kIterations; ++it) {
      expect_rel(run.losses[it], reference.losses[it], 5e-3, str_cat("loss of iteration ", it + 1));
      expect_rel(run.grad_norms[it], reference.grad_norms[it], 2e-2, str_cat("grad norm of iteration ", it + 1));
    }
    for (size_t i = 0; i < run.params.size(); ++i) {
      double diff = 0, norm = 0;
      for (size_t k = 0; k < run.params[i].size(); ++k) {
        const double d = run.params[i][k] - reference.params[i][k];
        diff += d * d;
        norm += reference.params[i][k] * reference.params[i][k];
      }
      EXPECT_LE(std::sqrt(diff), 2e-2 * std::sqrt(norm) + 1e-6) << reference.names[i];
    }
    expect_replicas_identical(run, *world, str_cat("DP=", dp, distributed ? " GPU distributed" : " GPU replicated"));
  }
}
#endif

}  // namespace
}  // namespace megatron::trainer
