// run_schedule: carries out one rank's schedule (schedule.h) over its model chunks for one iteration.
//
// It owns the micro-batch loop: it asks the caller for a micro-batch's data (tokens on the first stage, labels
// and loss mask on the last) when the micro-batch first needs it (and lets it prepare the next one on the host
// while the device works), runs each forward, keeps the micro-batch's saved activations until its backward
// (any number in flight, in any order: the schedule decides), moves activations and gradients between
// pipeline ranks in the schedule's point-to-point batches, and returns the loss of every micro-batch (on the
// rank holding the last stage). It also decides when the data-parallel overlap hooks fire:
// ScheduleHooks::before_first_forward in the first forward of each chunk (the distributed optimizer's
// parameter all-gather must have landed), grads_final in the last backward of each chunk (every gradient
// bucket of the chunk is final then), after_first_forward once every chunk has had its first forward, and
// every_pass's hooks in every forward and backward (FSDP's gathers and reductions around each module group).
//
// Point to point (PipelineComm): activations travel on one communicator, gradients on another, both over the
// pipeline group, so each kind keeps its own order between two ranks whatever the batches hold (at P = 2 the
// previous and the next rank are the same one, and a batch then holds both kinds to and from it). A batch's
// tensors are held until it completes; with overlap the executor waits for a received tensor only just
// before the step that reads it (on the compute stream: no host wait on GPUs), so transfers run under the
// computation; without, it waits where the batch is posted. A send's output is freed once the batch is done.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "megatron/comm/communicator.h"
#include "megatron/nn/gpt_model.h"
#include "megatron/pipeline/schedule.h"
#include "megatron/runtime/timeline.h"

namespace megatron::pipeline {

struct ScheduleHooks {
  std::function<void(const nn::ParameterList&)> before_first_forward;
  std::function<void(const nn::ParameterList&)> grads_final;
  std::function<void()> after_first_forward;
  nn::ParamHooks every_pass;  // its grads_final is not used (the one above is)
};

// The pipeline group's point-to-point channels (absent without pipelining).
struct PipelineComm {
  std::shared_ptr<comm::Communicator> activations;  // forward direction (SendForward / RecvForward)
  std::shared_ptr<comm::Communicator> gradients;    // backward direction (SendBackward / RecvBackward)
  bool overlap = true;                              // wait for a receive where its data is used
  int prev() const { return (activations->rank() + activations->size() - 1) % activations->size(); }
  int next() const { return (activations->rank() + 1) % activations->size(); }
  // Two communicators over `pipeline_group` (collective over it).
  static PipelineComm create(comm::Communicator& pipeline_group, bool overlap);
};

// What one iteration runs the steps on.
struct ScheduleRun {
  std::vector<nn::GPTModel*> chunks;  // this rank's model chunks, in chunk order
  int num_microbatches = 1;
  bool forward_only = false;          // evaluation: forwards only, their saved state dropped at once
  int64_t batch = 0, seq = 0;         // the micro-batch shape: b samples of s tokens (hidden-state buffers)
  // The data of micro-batch m (tokens for the first stage, labels and loss mask for the last), on the
  // device; called once per micro-batch, in micro-batch order, only on ranks with the first or last stage.
  std::function<nn::StageInput(int microbatch)> input;
  // Optional: prepare micro-batch m's data on the host; called for m + 1 right after m's first forward.
  std::function<void(int microbatch)> prepare;
  // The forward options of micro-batch m (training, dropout step, loss scaling); the hooks are set here.
  std::function<nn::ForwardOptions(int microbatch)> options;
  ScheduleHooks hooks;
  const PipelineComm* p2p = nullptr;  // null: one pipeline stage
  Timeline* timeline = nullptr;       // records forward, backward and point-to-point spans (null: none)
};

// Runs `steps` and returns each micro-batch's loss (device scalars, in micro-batch order; undefined on ranks
// without the last stage). Throws naming the step when the steps are inconsistent (a backward before its
// forward, a micro-batch run twice, a step whose input never arrived, activations left over at the end).
std::vector<Tensor> run_schedule(Context& ctx, const std::vector<Step>& steps, ScheduleRun& run);

}  // namespace megatron::pipeline
