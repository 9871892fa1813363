// Schedules as data: a pure generator lists the steps of one iteration (forward or backward of micro-batch m
// of model chunk c), and one executor (run_schedule) carries them out. Megatron's forward_backward_func
// family (megatron/core/pipeline_parallel/schedules.py) becomes a list a test can print and compare.
//
// no_pipelining(m): Megatron's forward_backward_no_pipelining: F0 B0 F1 B1 ... on the one chunk (F0 F1 ...
// when forward_only, as for evaluation).
//
// run_schedule() owns the micro-batch loop of an iteration: it asks the caller for each micro-batch's input
// when the micro-batch's first forward comes (and lets it prepare the next one on the host while the device
// works), runs each forward, keeps the micro-batch's saved activations until its backward (any number in
// flight, in any order), and returns the loss of every micro-batch. It also decides when the data-parallel
// overlap hooks fire: ScheduleHooks::before_first_forward in the first forward of each chunk (the
// distributed optimizer's parameter all-gather must have landed), grads_final in the last backward of each
// chunk (every gradient bucket of the chunk is final then), after_first_forward once the first forward of
// every chunk has been queued.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "megatron/nn/gpt_model.h"

namespace megatron::pipeline {

enum class Action { Forward, Backward };

struct Step {
  Action action = Action::Forward;
  int microbatch = 0;
  int chunk = 0;
  bool operator==(const Step&) const = default;
};

// F0 B0 F1 B1 ... F(m-1) B(m-1), or F0 F1 ... F(m-1) when forward_only.
std::vector<Step> no_pipelining(int num_microbatches, bool forward_only = false);

// "F0 B0 F1 B1" (chunk shown as F0.1 when a schedule has several chunks).
std::string describe(const std::vector<Step>& steps);

struct ScheduleHooks {
  std::function<void(const nn::ParameterList&)> before_first_forward;
  std::function<void(const nn::ParameterList&)> grads_final;
  std::function<void()> after_first_forward;
};

// What one iteration runs the steps on.
struct ScheduleRun {
  std::vector<nn::GPTModel*> chunks;  // this rank's model chunks, in chunk order
  int num_microbatches = 1;
  bool forward_only = false;          // evaluation: forwards only, their saved state dropped at once
  // The input of micro-batch m (tokens on the first stage, labels and mask on the last), on the device;
  // called once per micro-batch, in micro-batch order, when its first forward comes.
  std::function<nn::StageInput(int microbatch)> input;
  // Optional: prepare micro-batch m's input on the host; called for m + 1 right after m's first forward has
  // been queued, so the host works while the device runs.
  std::function<void(int microbatch)> prepare;
  // The forward options of micro-batch m (training, dropout step, loss scaling); the hooks are set here.
  std::function<nn::ForwardOptions(int microbatch)> options;
  ScheduleHooks hooks;
};

// Runs `steps` and returns each micro-batch's loss (device scalars, in micro-batch order; undefined on
// ranks without the last stage). Throws naming the step when the steps are inconsistent (a backward before
// its forward, a micro-batch run twice, activations left over at the end).
std::vector<Tensor> run_schedule(Context& ctx, const std::vector<Step>& steps, ScheduleRun& run);

}  // namespace megatron::pipeline
