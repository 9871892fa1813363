// AdamW over a model's parameters with Megatron-LM's mixed-precision layout
// (Float16OptimizerWithFloat16Params / FP32Optimizer): the optimizer owns fp32 master weights for
// bf16/fp16 parameters and the two moments; fp32 parameters (and F64 ones on the CPU) are their own
// masters. One step() is one ops::adamw_step call over every parameter (decoupled weight decay, bias
// correction with the 1-based step count, see ops/optimizer/optimizer.h), which also writes the rounded
// masters back into bf16/fp16 parameters.
//
// Ownership: the caller keeps the model's parameter and gradient tensors alive and in place (the
// optimizer holds views of them). Gradients are read only (the caller zeroes them for the next
// iteration). A parameter's weight decay is the scheduled value, or 0 with no_weight_decay
// (param_groups.h). A skipped fp16 iteration must not call step(): the step count, like Megatron's, counts
// updates taken.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "megatron/ops/optimizer/optimizer.h"
#include "megatron/runtime/context.h"

namespace megatron::optim {

struct AdamWParam {
  Tensor param;      // model weights: F32, BF16 or F16 (F64 on the CPU); updated by step()
  Tensor main_grad;  // same numel: F32 (BF16/F16 accepted; F64 on the CPU); read by step()
  bool no_weight_decay = false;
  // Something still changes this gradient after the data-parallel reduction of its bucket (finalize_model_grads
  // sums a norm's partial gradients over TP, a shared embedding's over the embedding group), so an offloaded
  // entry's gradient is not copied to the host early (prefetch_gradients) but at step().
  bool grad_changes_after_reduction = false;
  // The word embeddings or the output layer (param_groups.h): updated with step()'s decoupled_lr when it has one.
  bool embedding_or_output = false;
};

struct AdamWOptions {
  double beta1 = 0.9;    // --adam-beta1
  double beta2 = 0.999;  // --adam-beta2
  double eps = 1e-8;     // --adam-eps
  // --optimizer-cpu-offload with --optimizer-offload-fraction: the entries (whole, in order, while the offloaded
  // elements are fewer than this fraction of all, as Megatron's HybridDeviceOptimizer picks them) whose masters
  // and moments live in host memory (pinned on CUDA) and update on the CPU: each step copies their gradients
  // to the host, runs the CPU AdamW (double precision inside, as the CPU backend always does) and copies the
  // updated parameters back. 0: none.
  double offload_fraction = 0.0;
  // --overlap-cpu-optimizer-d2h-h2d (CUDA; accepted and the same arithmetic on the CPU): the offloaded entries'
  // transfers run on two copy streams of this object instead of ctx's, pipelined with the host update, as
  // Megatron's HybridDeviceOptimizer does -- each entry's gradient copy, its host update, its parameter's copy back
  // -- while the device entries update on ctx's stream; and gradients announced final during the backward
  // (prefetch_gradients) start their copy right then. See step().
  bool overlap_offload_transfers = false;
};

class AdamW {
 public:
  // Allocates on ctx's device: masters (copies of bf16/fp16 params, in fp32) and zeroed moments of the
  // masters' dtype. Every tensor must live on ctx's device.
  AdamW(Context& ctx, std::vector<AdamWParam> params, const AdamWOptions& options = {});
  ~AdamW();
  AdamW(AdamW&&) noexcept;
  AdamW& operator=(AdamW&&) noexcept;

  // One update with the scheduled lr and weight decay; gradients are multiplied by grad_scale first (a
  // clip coefficient or 1/loss scale not yet applied). decoupled_lr (--decoupled-lr's scheduled value) replaces
  // lr for the embedding_or_output entries, in their update and in their weight decay (lr * wd * p), as a torch
  // parameter group's own lr does. Increments step_count() first.
  void step(Context& ctx, double lr, double weight_decay, float grad_scale = 1.0f,
            std::optional<double> decoupled_lr = std::nullopt);

  // A reader of the tensors step() modifies (parameters, masters, moments) that still runs asynchronously
  // -- an --async-save snapshot's device-to-host copies on their own stream -- registers `fence` here; the
  // next step() calls it once, before it queues anything, with its ctx (the fence queues a stream wait on
  // an event; the host does not wait). A later registration replaces an unused one.
  void before_next_update(std::function<void(Context&)> fence) { fence_ = std::move(fence); }

  // Overlapped offload transfers (options().overlap_offload_transfers), one round per iteration:
  //   prefetch_gradients(ctx, region, stream)  the gradients inside `region` (a view of a gradient buffer) are
  //       final once the work queued on `stream` so far has run (a bucket's data-parallel reduction): the
  //       offloaded entries lying in it (except grad_changes_after_reduction ones) start their copy to the host,
  //       on the device-to-host stream after that work (on the CPU: copied now);
  //   join_gradient_prefetches(ctx)  ctx's stream waits for those copies (before anything writes the gradients
  //       again: the trainer calls it once the gradients are finalized);
  //   step()  updates from the copies and copies the rest itself; discard_gradient_prefetches() forgets a round
  //       that no step() consumed (a skipped update). Entries copied once are not copied again in the round.
  void prefetch_gradients(Context& ctx, const Tensor& region, StreamHandle stream);
  void join_gradient_prefetches(Context& ctx);
  void discard_gradient_prefetches();

  // Copies bf16/fp16 model params into their masters again (after loading model weights).
  void reload_model_params(Context& ctx);

  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t steps);  // checkpoint resume
  size_t size() const { return entries_.size(); }
  const Tensor& master(size_t i) const { return entries_.at(i).master; }
  const Tensor& exp_avg(size_t i) const { return entries_.at(i).exp_avg; }
  const Tensor& exp_avg_sq(size_t i) const { return entries_.at(i).exp_avg_sq; }
  const AdamWOptions& options() const { return options_; }
  // Bytes of optimizer state this object holds on ctx's device: both moments and the separate fp32 masters of
  // bf16/fp16 parameters (fp32 parameters are their own masters and count nothing); offloaded entries count
  // in host_state_bytes() instead (their masters, moments and the two staging copies).
  size_t state_bytes() const;
  size_t host_state_bytes() const;
  size_t offloaded_entries() const;

 private:
  struct Entry {
    AdamWParam source;
    Tensor master;      // == source.param when that is F32/F64
    Tensor exp_avg;
    Tensor exp_avg_sq;
    bool has_separate_master = false;
    bool on_host = false;          // offloaded: master and moments in host memory, updated there
    Tensor grad_host, param_host;  // offloaded: the gradient's and the updated parameter's host copies
    bool grad_copied = false;      // offloaded: grad_host holds this round's gradient (or its copy is queued)
  };
  // Overlapped transfers on CUDA (offload_transfer_streams.h): the two copy streams and the per-entry events.
  struct TransferStreams;
  bool overlapped(const Context& ctx) const { return options_.overlap_offload_transfers && ctx.is_cuda(); }
  // Queues entry i's gradient copy to the host on the device-to-host stream (or copies it, on the CPU).
  void copy_gradient_to_host(Context& ctx, size_t i);
  // The offloaded entries' host tensors (masters, moments, staging) as views of shared host buffers, the masters
  // from the parameters' values.
  void place_host_state(Context& ctx);
  // The other entries' masters (bf16/fp16 parameters) and moments on ctx's device, as views of shared buffers.
  void place_device_state(Context& ctx);
  // The CPU context the offloaded entries update on: ctx itself on a CPU context.
  Context& host(Context& ctx);
  void step_offloaded(Context& ctx, const std::vector<size_t>& entries, const ops::AdamWConfig& config,
                      double weight_decay, std::optional<double> decoupled_lr);

  std::vector<Entry> entries_;
  std::vector<size_t> copy_order_;  // offloaded entries whose gradient copy is queued, in queuing order
  std::unique_ptr<TransferStreams> streams_;
  std::unique_ptr<Context> host_ctx_;
  std::function<void(Context&)> fence_;  // before_next_update
  AdamWOptions options_;
  int64_t step_count_ = 0;
};

}  // namespace megatron::optim
