// The shared harness of the trainer-level layout equivalence tests (pipeline, context and expert
// parallelism, under `mpiexec -np 8`, CPU ranks, fp32): every layout trains kIterations iterations on the
// first `ranks` ranks of the world and must give one rank's losses, gradient norms, logged MoE losses and
// validation loss within 1e-5 relative. Ranks outside a layout's world wait.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness.h"
#include "megatron/train/flags.h"
#include "megatron/train/model_config.h"
#include "megatron/trainer/model_chunks.h"
#include "megatron/trainer/trainer.h"

namespace megatron::trainer::testing_layouts {

inline constexpr int kIterations = 10;
inline constexpr double kTolerance = 1e-5;

// Parsed, sized for `world_size` ranks and validated.
inline train::Arguments layout_args(int world_size, const std::vector<std::string>& argv) {
  train::Arguments a = train::parse_arguments(argv);
  a.parallel.world_size = world_size;
  train::resolve_and_validate(a);
  return a;
}

struct TrainedRun {
  std::vector<double> losses, grad_norms;
  std::vector<std::vector<std::pair<std::string, double>>> moe_losses;  // per iteration, as logged
  double valid_loss = 0;
};

// params_dtype: the model's dtype when not the flags' (F64: FP8 training emulated at double precision).
inline TrainedRun train_layout(const train::Arguments& a, const parallel::ParallelContext& pc, const TrainingData& data,
                               std::optional<DType> params_dtype = std::nullopt) {
  Context& ctx = testing::cpu_context();
  nn::TransformerConfig config = train::transformer_config(a, uint64_t(a.training.seed));
  if (params_dtype) config.params_dtype = *params_dtype;
  const auto chunks = build_model_chunks(
      ctx, config, tensor_parallel(ctx, pc, a), context_parallel(pc, a), a,
      pc.pp().rank(), moe_parallel(pc));
  SampleStream train_stream = data.stream(data::Split::train), valid_stream = data.stream(data::Split::valid);
  Trainer trainer(ctx, a, chunk_pointers(chunks), pc);
  TrainedRun run;
  for (int64_t it = 1; it <= kIterations; ++it) {
    const StepResult r = trainer.train_step(train_stream, it);
    EXPECT_FALSE(r.skipped);
    run.losses.push_back(r.loss);
    run.grad_norms.push_back(r.grad_norm.value_or(NAN));
    run.moe_losses.push_back(trainer.moe_losses(1));
  }
  run.valid_loss = trainer.evaluate(valid_stream);
  EXPECT_EQ(train_stream.consumed(), kIterations * a.training.global_batch_size) << "the data position";
  return run;
}

inline void expect_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), tol * std::fabs(want)) << what << ": " << got << " vs one rank's " << want;
}

inline void expect_same_training(const TrainedRun& run, const TrainedRun& reference) {
  for (int it = 0; it < kIterations; ++it) {
    expect_rel(run.losses[size_t(it)], reference.losses[size_t(it)], kTolerance, str_cat("loss of iteration ", it + 1));
    expect_rel(run.grad_norms[size_t(it)], reference.grad_norms[size_t(it)], kTolerance,
               str_cat("grad norm of iteration ", it + 1));
    const auto& got = run.moe_losses[size_t(it)];
    const auto& want = reference.moe_losses[size_t(it)];
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      expect_rel(got[i].second, want[i].second, kTolerance, str_cat(want[i].first, " of iteration ", it + 1));
  }
  expect_rel(run.valid_loss, reference.valid_loss, kTolerance, "validation loss");
}

// Bit for bit: every loss and gradient norm, the router losses and the validation loss.
inline void expect_identical_training(const TrainedRun& got, const TrainedRun& want) {
  for (int it = 0; it < kIterations; ++it) {
    EXPECT_EQ(got.losses[size_t(it)], want.losses[size_t(it)]) << "loss of iteration " << it + 1;
    EXPECT_EQ(got.grad_norms[size_t(it)], want.grad_norms[size_t(it)]) << "grad norm of iteration " << it + 1;
  }
  EXPECT_EQ(got.moe_losses, want.moe_losses) << "router losses";
  EXPECT_EQ(got.valid_loss, want.valid_loss) << "validation loss";
}

struct Layout {
  std::string name;
  int ranks;
  parallel::ParallelSizes sizes;
  std::vector<std::string> flags;
  std::vector<std::string> function = {};  // flags that change the function: the one-rank reference takes them too
};

// make_args(world size, architecture flags, extra flags) -> the test's arguments.
using MakeArgs = std::function<train::Arguments(int, const std::vector<std::string>&, const std::vector<std::string>&)>;
using Architecture = std::pair<std::string, std::vector<std::string>>;

// Every layout of every architecture against one rank's run of the same function.
// min_moe_losses: how many router losses the log line must carry (MoE models); params_dtype: as train_layout's.
inline void expect_layouts_train_like_one_rank(comm::Communicator& world, const std::vector<Layout>& layouts,
                                               const std::vector<Architecture>& archs, const MakeArgs& make_args,
                                               size_t min_moe_losses = 0,
                                               std::optional<DType> params_dtype = std::nullopt) {
  for (const auto& [arch_name, arch] : archs) {
    const train::Arguments ref_args = make_args(1, arch, {});
    const TrainingData data(ref_args, ref_args.model.vocab_size - 1);
    std::map<std::vector<std::string>, TrainedRun> references;
    for (const Layout& l : layouts)
      if (!references.count(l.function))
        references[l.function] =
            train_layout(make_args(1, arch, l.function), parallel::ParallelContext::single(), data, params_dtype);
    EXPECT_GT(references[{}].grad_norms.front(), 0.5);  // clipping is active
    EXPECT_GE(references[{}].moe_losses.front().size(), min_moe_losses);
    for (const Layout& l : layouts) {
      SCOPED_TRACE(str_cat(arch_name, ": ", l.name));
      const std::shared_ptr<comm::Communicator> sub = world.split(world.rank() < l.ranks ? 0 : -1, world.rank(), "layout");
      if (sub) {
        // Megatron pads the vocabulary to make_vocab_size_divisible_by x TP: halve the multiple at TP = 2 so
        // every layout pads 4099 to the reference's 4112 (the logits cover the padding).
        std::vector<std::string> flags = l.flags;
        flags.insert(flags.end(), l.function.begin(), l.function.end());
        if (l.sizes.tensor_model_parallel == 2) flags.insert(flags.end(), {"--make-vocab-size-divisible-by", "8"});
        const train::Arguments a = make_args(l.ranks, arch, flags);
        ASSERT_EQ(a.padded_vocab_size(), ref_args.padded_vocab_size());
        expect_same_training(train_layout(a, parallel::ParallelContext::create(sub, l.sizes), data, params_dtype),
                             references[l.function]);
      }
      world.barrier();
    }
  }
}

// Flags that must not change the numbers (recomputation, offload, ...), by name.
using Variants = std::vector<std::pair<std::string, std::vector<std::string>>>;

// Every layout of every architecture on the first l.ranks ranks: each variant's flags added to the layout's train
// bit for bit like the layout alone.
inline void expect_variants_identical(comm::Communicator& world, const std::vector<Layout>& layouts,
                                      const std::vector<Architecture>& archs, const MakeArgs& make_args,
                                      const Variants& variants) {
  for (const auto& [arch_name, arch] : archs) {
    const train::Arguments ref_args = make_args(1, arch, {});
    const TrainingData data(ref_args, ref_args.model.vocab_size - 1);
    for (const Layout& l : layouts) {
      const std::shared_ptr<comm::Communicator> sub = world.split(world.rank() < l.ranks ? 0 : -1, world.rank(), "layout");
      if (sub) {
        const parallel::ParallelContext pc = parallel::ParallelContext::create(sub, l.sizes);
        const TrainedRun plain = train_layout(make_args(l.ranks, arch, l.flags), pc, data);
        for (const auto& [name, flags] : variants) {
          SCOPED_TRACE(str_cat(arch_name, ", ", l.name, ": ", name));
          std::vector<std::string> f = l.flags;
          f.insert(f.end(), flags.begin(), flags.end());
          expect_identical_training(train_layout(make_args(l.ranks, arch, f), pc, data), plain);
        }
      }
      world.barrier();
    }
  }
}

}  // namespace megatron::trainer::testing_layouts
