#include "megatron/pipeline/schedule.h"

#include <map>
#include <optional>
#include <utility>

namespace megatron::pipeline {

std::vector<Step> no_pipelining(int num_microbatches, bool forward_only) {
  MEGATRON_CHECK(num_microbatches > 0, "no_pipelining: the number of micro-batches must be positive, got ",
                 num_microbatches);
  std::vector<Step> steps;
  for (int m = 0; m < num_microbatches; ++m) {
    steps.push_back({Action::Forward, m, 0});
    if (!forward_only) steps.push_back({Action::Backward, m, 0});
  }
  return steps;
}

std::string describe(const std::vector<Step>& steps) {
  bool chunks = false;
  for (const Step& s : steps) chunks = chunks || s.chunk != 0;
  std::string out;
  for (const Step& s : steps) {
    if (!out.empty()) out += ' ';
    out += str_cat(s.action == Action::Forward ? "F" : "B", s.microbatch);
    if (chunks) out += str_cat('.', s.chunk);
  }
  return out;
}

namespace {

// Where each chunk's hooks fire: the step index of its first forward and of its last backward.
struct HookPoints {
  std::vector<size_t> first_forward, last_backward;
};

HookPoints hook_points(const std::vector<Step>& steps, int num_chunks) {
  HookPoints h{std::vector<size_t>(size_t(num_chunks), steps.size()), std::vector<size_t>(size_t(num_chunks), steps.size())};
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    MEGATRON_CHECK(s.chunk >= 0 && s.chunk < num_chunks, "run_schedule: step ", i, " (", describe({s}),
                   ") names chunk ", s.chunk, " of ", num_chunks);
    if (s.action == Action::Forward && h.first_forward[size_t(s.chunk)] == steps.size())
      h.first_forward[size_t(s.chunk)] = i;
    if (s.action == Action::Backward) h.last_backward[size_t(s.chunk)] = i;
  }
  return h;
}

class Executor {
 public:
  Executor(Context& ctx, const std::vector<Step>& steps, ScheduleRun& run)
      : ctx_(ctx), steps_(steps), run_(run), points_(hook_points(steps, int(run.chunks.size()))),
        inputs_(size_t(run.num_microbatches)), loaded_(size_t(run.num_microbatches), false),
        losses_(size_t(run.num_microbatches)) {}

  std::vector<Tensor> run() {
    for (size_t i = 0; i < steps_.size(); ++i) {
      const Step& s = steps_[i];
      MEGATRON_CHECK(s.microbatch >= 0 && s.microbatch < run_.num_microbatches, "run_schedule: step ", i, " (",
                     describe({s}), ") names micro-batch ", s.microbatch, " of ", run_.num_microbatches);
      if (s.action == Action::Forward) forward(i, s);
      else backward(i, s);
    }
    MEGATRON_CHECK(in_flight_.empty(), "run_schedule: ", in_flight_.size(),
                   " micro-batch(es) ran their forward but not their backward");
    return std::move(losses_);
  }

 private:
  void forward(size_t i, const Step& s) {
    nn::GPTModel& chunk = *run_.chunks[size_t(s.chunk)];
    MEGATRON_CHECK(chunk.layout().pre_process, "run_schedule: chunk ", s.chunk,
                   " has no embedding; its input would come from another pipeline stage");
    const bool first_use = !loaded_[size_t(s.microbatch)];
    if (first_use) {
      inputs_[size_t(s.microbatch)] = run_.input(s.microbatch);
      loaded_[size_t(s.microbatch)] = true;
    }
    MEGATRON_CHECK(inputs_[size_t(s.microbatch)].has_value(), "run_schedule: step ", i, " (", describe({s}),
                   ") runs a micro-batch whose forward has already run on every chunk");
    nn::ForwardOptions options = run_.options(s.microbatch);
    options.training = options.training && !run_.forward_only;
    if (i == points_.first_forward[size_t(s.chunk)]) options.hooks.before_forward = run_.hooks.before_first_forward;
    nn::StageOutput out = chunk.forward(ctx_, *inputs_[size_t(s.microbatch)], options);
    if (chunk.layout().post_process) losses_[size_t(s.microbatch)] = out.loss;
    if (!run_.forward_only) {
      const auto key = std::make_pair(s.chunk, s.microbatch);
      MEGATRON_CHECK(!in_flight_.count(key), "run_schedule: step ", i, " (", describe({s}),
                     ") runs a forward whose activations are still waiting for their backward");
      in_flight_.emplace(key, std::move(out.saved));
    }
    // The last chunk of this rank has read the input: the saved state keeps what the backward needs.
    if (size_t(s.chunk) + 1 == run_.chunks.size()) inputs_[size_t(s.microbatch)].reset();
    if (first_use && run_.prepare && s.microbatch + 1 < run_.num_microbatches) run_.prepare(s.microbatch + 1);
    if (i == points_.first_forward[size_t(s.chunk)] && ++first_forwards_seen_ == run_.chunks.size() &&
        run_.hooks.after_first_forward)
      run_.hooks.after_first_forward();
  }

  void backward(size_t i, const Step& s) {
    MEGATRON_CHECK(!run_.forward_only, "run_schedule: step ", i, " (", describe({s}), ") in a forward-only run");
    auto it = in_flight_.find(std::make_pair(s.chunk, s.microbatch));
    MEGATRON_CHECK(it != in_flight_.end(), "run_schedule: step ", i, " (", describe({s}),
                   ") runs a backward without its forward's activations");
    nn::StageSaved saved = std::move(it->second);
    in_flight_.erase(it);
    nn::ParamHooks hooks;
    if (i == points_.last_backward[size_t(s.chunk)]) hooks.grads_final = run_.hooks.grads_final;
    run_.chunks[size_t(s.chunk)]->backward(ctx_, std::move(saved), Tensor(), hooks);
  }

  Context& ctx_;
  const std::vector<Step>& steps_;
  ScheduleRun& run_;
  HookPoints points_;
  std::vector<std::optional<nn::StageInput>> inputs_;  // held until the micro-batch's last forward here
  std::vector<bool> loaded_;
  std::vector<Tensor> losses_;
  std::map<std::pair<int, int>, nn::StageSaved> in_flight_;  // (chunk, micro-batch) -> activations
  size_t first_forwards_seen_ = 0;
};

}  // namespace

std::vector<Tensor> run_schedule(Context& ctx, const std::vector<Step>& steps, ScheduleRun& run) {
  MEGATRON_CHECK(!run.chunks.empty() && run.input && run.options, "run_schedule: needs model chunks, an input and an "
                 "options callback");
  return Executor(ctx, steps, run).run();
}

}  // namespace megatron::pipeline
