// Schedules as data: a pure generator lists what one pipeline rank does in one iteration, in order --
// forwards and backwards of (micro-batch m, model chunk c) and the point-to-point batches between them -- and
// one executor (executor.h) carries the list out. Megatron's forward_backward_func family
// (megatron/core/pipeline_parallel/schedules.py) becomes a list a test can print, simulate and compare.
//
//   no_pipelining(M):         F0 B0 F1 B1 ... (forward_backward_no_pipelining; F0 F1 ... forward-only).
//   one_f_one_b(P, r, M):     the non-interleaved 1F1B schedule of pipeline rank r of P: min(P - r - 1, M)
//                             warm-up forwards, then one forward and one backward in turn, then the cool-down
//                             backwards; at most P - r micro-batches are ever between forward and backward.
//   interleaved(P, r, V, M, G): the interleaved 1F1B schedule with V model chunks per rank: micro-batches walk
//                             over the chunks in groups of G (Megatron's get_schedule_table; G defaults to P),
//                             (P - r - 1) * 2 + (V - 1) * G warm-up forwards, backwards take chunk V - 1 - c.
// The point-to-point batches sit where Megatron's schedules post them (recv_forward, send_forward,
// send_forward_recv_backward, send_backward_recv_forward, send_forward_backward_recv_forward_backward, ...):
// the ops of one batch start together (deadlock-free, comm/communicator.h) and the executor waits for a
// receive only where its data is used (overlap), or at once with --no-overlap-p2p-communication. With overlap
// the interleaved schedule posts as Megatron's overlap_p2p_comm does: a forward's send and the next forward's
// receive right after that forward, a backward's send and the next backward's receive right after that
// backward -- not both after the backward that follows -- so an activation leaves one backward earlier.
// Each message names the (micro-batch, chunk) whose data it carries on this rank:
//   SendForward m.c   the output of F(m, c) to the next rank;   RecvForward m.c   the input of F(m, c) from the previous;
//   SendBackward m.c  the input gradient of B(m, c) to the previous; RecvBackward m.c the output gradient of B(m, c) from the next.
// Chunk c's output on the last rank feeds chunk c + 1 on rank 0 (the ring of virtual stages).
#pragma once

#include <string>
#include <vector>

namespace megatron::pipeline {

enum class Action { Forward, Backward, Communicate };

struct Message {
  enum class Kind { SendForward, RecvForward, SendBackward, RecvBackward };
  Kind kind = Kind::SendForward;
  int microbatch = 0;
  int chunk = 0;
  bool operator==(const Message&) const = default;
};

struct Step {
  Action action = Action::Forward;
  int microbatch = 0;             // Forward / Backward
  int chunk = 0;
  std::vector<Message> messages;  // Communicate: one batch
  bool operator==(const Step&) const = default;
};

// Where a rank sits in the pipeline.
struct PipelinePosition {
  int size = 1;           // P
  int rank = 0;           // r
  int virtual_size = 1;   // V model chunks per rank
  bool first_stage(int chunk) const { return rank == 0 && chunk == 0; }
  bool last_stage(int chunk) const { return rank == size - 1 && chunk == virtual_size - 1; }
};

std::vector<Step> no_pipelining(int num_microbatches, bool forward_only = false);
std::vector<Step> one_f_one_b(const PipelinePosition& position, int num_microbatches, bool forward_only = false);
// overlap_p2p: Megatron's overlap_p2p_comm batches (above); false: its non-overlapped ones.
std::vector<Step> interleaved(const PipelinePosition& position, int num_microbatches, int group_size,
                              bool forward_only = false, bool overlap_p2p = false);
// The schedule Megatron would pick: no pipelining at P = 1, 1F1B, or interleaved with V > 1 (overlap_p2p: as
// interleaved's; 1F1B has one batch layout).
std::vector<Step> schedule_for(const PipelinePosition& position, int num_microbatches, int group_size,
                               bool forward_only = false, bool overlap_p2p = false);

// "F0 [sF0 rB1] B1 ..." (chunks shown as F0.1 when V > 1).
std::string describe(const std::vector<Step>& steps);
// Just the computation: "F0 F1 B0 ..." (the order Megatron's tests and papers draw).
std::string describe_compute(const std::vector<Step>& steps);

}  // namespace megatron::pipeline
