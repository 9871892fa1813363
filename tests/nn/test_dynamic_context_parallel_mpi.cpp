// Dynamic context parallelism at the model level (mpiexec -np 2 and -np 4, CPU, fp32): six packed micro-batches
// whose longest documents ask for CP sizes 1, 2 and the whole group are run as plan_dynamic_cp places them
// (each rank on its aligned sub-group of the micro-batch's size, or alone, idle in some waves), and at fixed CP
// over every rank. With Megatron's per-token loss (each micro-batch's summed loss over the global token count,
// which hybrid CP requires) the gradients summed over the ranks and the summed losses agree to 1e-5: the plan
// changes who computes what, not the function. A Llama-style model (RoPE per document, GQA).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "harness.h"
#include "megatron/nn/gpt_model.h"
#include "megatron/parallel/dynamic_cp_schedule.h"
#include "megatron/train/model_config.h"
#include "microbatch_checks.h"
#include "model_batches.h"
#include "mpi_world.h"

namespace megatron::nn {
namespace {

constexpr int64_t kSeq = 16, kMaxSeqlenPerRank = 4;
// The documents of each micro-batch's one row; longest 8, 16, 4, 9, 8, 4 -> CP sizes 2, 4, 1, 4, 2, 1 (capped at
// the group's size).
const std::vector<std::vector<int64_t>> kDocuments = {{3, 5, 8}, {16}, {2, 2, 4, 4, 4}, {7, 9}, {1, 3, 4, 8}, {4, 4, 4, 4}};

struct PackedMicroBatch {
  testing::ModelBatch batch;
  Tensor positions, cu_seqlens;  // [1, S] I64 whole row; [N + 1] I64
  int64_t longest = 0;
};

Tensor i64(Context& ctx, const std::vector<int64_t>& v, const Shape& shape) {
  Tensor t = ctx.empty(shape, DType::I64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

std::vector<PackedMicroBatch> micro_batches(Context& ctx, int64_t vocab) {
  std::vector<PackedMicroBatch> out;
  for (size_t m = 0; m < kDocuments.size(); ++m) {
    std::vector<int64_t> positions, cu = {0};
    int64_t longest = 0;
    for (int64_t len : kDocuments[m]) {
      for (int64_t j = 0; j < len; ++j) positions.push_back(j);
      cu.push_back(cu.back() + len);
      longest = std::max(longest, len);
    }
    out.push_back({testing::make_model_batch(ctx, 1, kSeq, vocab, 100 + m), i64(ctx, positions, {1, kSeq}),
                   i64(ctx, cu, {int64_t(cu.size())}), longest});
  }
  return out;
}

// The local chunks of a [1, S] tensor for CP rank `rank` of `size`.
Tensor cut(Context& ctx, const Tensor& whole, int size, int rank) {
  const parallel::SequenceSplit split{size, rank, kSeq};
  Tensor local = ctx.empty({1, split.local_seq()}, whole.dtype());
  const size_t bytes = dtype_size(whole.dtype());
  for (int64_t j = 0; j < split.local_seq(); ++j)
    std::memcpy(static_cast<char*>(local.data_ptr()) + size_t(j) * bytes,
                static_cast<const char*>(whole.data_ptr()) + size_t(split.global_position(j)) * bytes, bytes);
  return local;
}

// Forward and backward of `mb` on `model` as CP rank `rank` of `size`, the gradients those of this rank's summed
// loss over `tokens`; returns this rank's summed loss (the model reports its tokens' mean).
double run(Context& ctx, GPTModel& model, const PackedMicroBatch& mb, int size, int rank, double tokens) {
  const StageInput in{.tokens = cut(ctx, mb.batch.tokens, size, rank), .labels = cut(ctx, mb.batch.labels, size, rank),
                      .loss_mask = cut(ctx, mb.batch.mask, size, rank), .position_ids = cut(ctx, mb.positions, size, rank),
                      .cu_seqlens = mb.cu_seqlens};
  StageOutput out = model.forward(ctx, in, {.training = true, .loss_denominator = tokens});
  double counted = 0;
  for (int64_t i = 0; i < in.loss_mask.numel(); ++i) counted += in.loss_mask.data<float>()[i];
  const double loss = read_scalar(ctx, out.loss) * counted;
  model.backward(ctx, std::move(out.saved));
  return loss;
}

std::vector<double> summed_grads(const std::vector<GPTModel*>& models, comm::Communicator& world) {
  std::vector<double> all;
  const size_t n = models[0]->parameters().size();
  for (size_t i = 0; i < n; ++i) {
    const Tensor& g0 = models[0]->parameters()[i]->main_grad;
    std::vector<double> g(size_t(g0.numel()), 0.0);
    for (GPTModel* m : models) {
      const float* p = m->parameters()[i]->main_grad.data<float>();
      for (size_t k = 0; k < g.size(); ++k) g[k] += double(p[k]);
    }
    world.all_reduce_host(g, comm::ReduceOp::Sum);
    all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

TEST(DynamicContextParallel, EqualsFixedCpOnTheSamePackedMicroBatches) {
  auto world = testing::mpi_world();
  const int C = world->size(), rank = world->rank();
  Context& ctx = testing::cpu_context();
  train::ModelArguments args = microbatch::llama_args();
  args.seq_length = kSeq;
  args.hidden_dropout = 0.0;
  const TransformerConfig config = train::transformer_config(args, DType::F32, 4321, 1);
  const std::vector<PackedMicroBatch> mbs = micro_batches(ctx, args.vocab_size);
  double tokens = 0;
  for (const PackedMicroBatch& mb : mbs)
    for (int64_t i = 0; i < kSeq; ++i) tokens += mb.batch.mask.data<float>()[i];

  // Fixed CP over every rank.
  GPTModel fixed(ctx, config, {}, {}, parallel::ContextParallel{.group = world});
  zero_grads(ctx, fixed.parameters());
  double fixed_loss = 0;
  for (const PackedMicroBatch& mb : mbs) fixed_loss += run(ctx, fixed, mb, C, rank, tokens);

  // Dynamic: one model per CP size on this rank's aligned sub-group of that size (same weights).
  std::vector<int64_t> longest;
  for (const PackedMicroBatch& mb : mbs) longest.push_back(mb.longest);
  const std::vector<parallel::CpWave> plan = parallel::plan_dynamic_cp(longest, kMaxSeqlenPerRank, C);
  std::map<int, std::unique_ptr<GPTModel>> by_size;
  for (int c = 1; c <= C; c *= 2) {
    std::shared_ptr<comm::Communicator> group(world->split(rank / c, rank, "cp" + std::to_string(c)));
    by_size[c] = std::make_unique<GPTModel>(ctx, config, parallel::TensorParallel{}, StageLayout{},
                                            c > 1 ? parallel::ContextParallel{.group = group} : parallel::ContextParallel{});
    zero_grads(ctx, by_size[c]->parameters());
  }
  double dynamic_loss = 0;
  for (const parallel::CpRun& r : parallel::runs_of_rank(plan, rank)) {
    if (r.micro_batch < 0) continue;  // idle in this wave
    dynamic_loss += run(ctx, *by_size[r.size], mbs[size_t(r.micro_batch)], r.size, rank - r.first_rank, tokens);
  }

  double losses[2] = {fixed_loss, dynamic_loss};
  world->all_reduce_host(losses, comm::ReduceOp::Sum);
  EXPECT_NEAR(losses[1], losses[0], 1e-5 * losses[0]);
  std::vector<GPTModel*> dynamic_models;
  for (auto& [c, m] : by_size) dynamic_models.push_back(m.get());
  const std::vector<double> want = summed_grads({&fixed}, *world), got = summed_grads(dynamic_models, *world);
  ASSERT_EQ(got.size(), want.size());
  double scale = 0, diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    diff = std::max(diff, std::abs(got[i] - want[i]));
  }
  EXPECT_LE(diff, 1e-5 * scale) << "max |dynamic - fixed| over every gradient, relative to the largest";
  if (rank == 0)
    std::cout << "CP " << C << ": " << plan.size() << " waves for " << mbs.size() << " micro-batches; summed loss "
              << losses[0] << " fixed, " << losses[1] << " dynamic; max gradient difference " << diff / scale
              << " of the largest\n";
  EXPECT_LT(int64_t(plan.size()), int64_t(mbs.size())) << "the plan must run micro-batches side by side";
}

}  // namespace
}  // namespace megatron::nn
