#include "megatron/pipeline/schedule.h"

#include <algorithm>

#include "megatron/core/error.h"

namespace megatron::pipeline {
namespace {

using Kind = Message::Kind;

// Appends steps while dropping empty point-to-point batches (a first stage receives no forward input, ...).
class StepList {
 public:
  void forward(int m, int c) { steps_.push_back({Action::Forward, m, c, {}}); }
  void backward(int m, int c) { steps_.push_back({Action::Backward, m, c, {}}); }
  void communicate(std::vector<Message> messages) {
    if (!messages.empty()) steps_.push_back({Action::Communicate, 0, 0, std::move(messages)});
  }
  std::vector<Step> take() { return std::move(steps_); }

 private:
  std::vector<Step> steps_;
};

void check_position(const PipelinePosition& p, int num_microbatches, const char* schedule) {
  MEGATRON_CHECK(p.size >= 1 && p.rank >= 0 && p.rank < p.size && p.virtual_size >= 1 && num_microbatches > 0,
                 schedule, ": invalid pipeline position (rank ", p.rank, " of ", p.size, ", ", p.virtual_size,
                 " chunks) or micro-batch count ", num_microbatches);
}

// The messages of one batch, each present only when the rank has a peer in that direction for that chunk.
struct Batch {
  const PipelinePosition& p;
  std::vector<Message> messages;
  Batch& send_forward(int m, int c) {
    if (!p.last_stage(c)) messages.push_back({Kind::SendForward, m, c});
    return *this;
  }
  Batch& recv_forward(int m, int c) {
    if (!p.first_stage(c)) messages.push_back({Kind::RecvForward, m, c});
    return *this;
  }
  Batch& send_backward(int m, int c) {
    if (!p.first_stage(c)) messages.push_back({Kind::SendBackward, m, c});
    return *this;
  }
  Batch& recv_backward(int m, int c) {
    if (!p.last_stage(c)) messages.push_back({Kind::RecvBackward, m, c});
    return *this;
  }
};

}  // namespace

std::vector<Step> no_pipelining(int num_microbatches, bool forward_only) {
  MEGATRON_CHECK(num_microbatches > 0, "no_pipelining: the number of micro-batches must be positive, got ",
                 num_microbatches);
  std::vector<Step> steps;
  for (int m = 0; m < num_microbatches; ++m) {
    steps.push_back({Action::Forward, m, 0, {}});
    if (!forward_only) steps.push_back({Action::Backward, m, 0, {}});
  }
  return steps;
}

std::vector<Step> one_f_one_b(const PipelinePosition& p, int M, bool forward_only) {
  check_position(p, M, "one_f_one_b");
  MEGATRON_CHECK(p.virtual_size == 1, "one_f_one_b: ", p.virtual_size, " model chunks need the interleaved schedule");
  StepList s;
  auto batch = [&] { return Batch{p, {}}; };
  if (forward_only) {
    for (int m = 0; m < M; ++m) {
      s.communicate(batch().recv_forward(m, 0).messages);
      s.forward(m, 0);
      s.communicate(batch().send_forward(m, 0).messages);
    }
    return s.take();
  }
  const int warmup = std::min(p.size - p.rank - 1, M), steady = M - warmup;
  for (int m = 0; m < warmup; ++m) {
    s.communicate(batch().recv_forward(m, 0).messages);
    s.forward(m, 0);
    s.communicate(batch().send_forward(m, 0).messages);
  }
  if (steady > 0) s.communicate(batch().recv_forward(warmup, 0).messages);
  for (int i = 0; i < steady; ++i) {
    s.forward(warmup + i, 0);
    s.communicate(batch().send_forward(warmup + i, 0).recv_backward(i, 0).messages);
    s.backward(i, 0);
    if (i == steady - 1)
      s.communicate(batch().send_backward(i, 0).messages);
    else
      s.communicate(batch().send_backward(i, 0).recv_forward(warmup + i + 1, 0).messages);
  }
  for (int i = 0; i < warmup; ++i) {
    s.communicate(batch().recv_backward(steady + i, 0).messages);
    s.backward(steady + i, 0);
    s.communicate(batch().send_backward(steady + i, 0).messages);
  }
  return s.take();
}

namespace {

// Megatron's interleaved schedule, step by step: the table of (micro-batch, chunk) per virtual micro-batch,
// the warm-up count, and which chunk a received tensor belongs to.
class Interleaved {
 public:
  Interleaved(const PipelinePosition& p, int M, int G, bool forward_only, bool overlap_p2p)
      : p_(p), M_(M), C_(p.virtual_size), total_(M * p.virtual_size), forward_only_(forward_only),
        overlap_p2p_(overlap_p2p),
        received_forward_(size_t(C_), 0), received_backward_(size_t(C_), 0) {
    // Micro-batches in groups of G, each group over every chunk in turn (get_schedule_table).
    for (int first = 0; first < M; first += G) {
      const int end = first + G >= M ? M : first + G;
      for (int c = 0; c < C_; ++c)
        for (int m = first; m < end; ++m) table_.push_back({m, c});
    }
    warmup_ = forward_only ? total_ : std::min((p.size - p.rank - 1) * 2 + (C_ - 1) * G, total_);
  }

  std::vector<Step> generate();

 private:
  struct Entry {
    int microbatch, chunk;
  };
  Entry forward_of(int k) const { return table_[size_t(k)]; }
  Entry backward_of(int k) const { return {table_[size_t(k)].microbatch, C_ - 1 - table_[size_t(k)].chunk}; }
  int chunk_of(int k, bool forward) const {
    const int c = table_[size_t(k % total_)].chunk;
    return forward ? c : C_ - 1 - c;
  }
  // Megatron's recv_tensor_from_previous_stage: after virtual micro-batch k, does a tensor arrive from the
  // neighbour, and for which chunk? The leading stage (rank 0 forward, the last rank backward) lags the
  // other end of the ring by P - 1 virtual micro-batches; the last chunk at the far end produces nothing.
  std::pair<bool, int> receives_after(int k, bool forward) const {
    const bool leading = forward ? p_.rank == 0 : p_.rank == p_.size - 1;
    if (!leading) return {true, chunk_of(k + 1, forward)};
    const int far_last_chunk = forward ? C_ - 1 : 0;
    bool recv = true;
    int chunk = 0;
    if (k < p_.size - 1) {
      recv = false;
      chunk = chunk_of(k + 1, forward);
    } else {
      chunk = chunk_of(k - (p_.size - 1), forward);
    }
    if (chunk == far_last_chunk) recv = false;
    return {recv, forward ? chunk + 1 : chunk - 1};
  }
  // Receives are labelled with the next micro-batch of their chunk (each chunk's inputs arrive in order).
  void recv_forward(Batch& b, int chunk) { b.recv_forward(received_forward_[size_t(chunk)]++, chunk); }
  void recv_backward(Batch& b, int chunk) { b.recv_backward(received_backward_[size_t(chunk)]++, chunk); }
  void warmup_step(int k);
  void steady_step(int k);
  void cooldown_step(int k);

  const PipelinePosition& p_;
  const int M_, C_, total_;
  const bool forward_only_, overlap_p2p_;
  int warmup_ = 0;
  std::vector<Entry> table_;
  std::vector<int> received_forward_, received_backward_;
  StepList steps_;
};

void Interleaved::warmup_step(int k) {
  const Entry f = forward_of(k);
  auto [recv_prev, next_chunk] = receives_after(k, true);
  if (k == total_ - 1) recv_prev = false;
  steps_.forward(f.microbatch, f.chunk);
  Batch b{p_, {}};
  b.send_forward(f.microbatch, f.chunk);
  if (recv_prev) recv_forward(b, next_chunk);
  // The last warm-up forward also receives the first output gradient (send_forward_backward_recv_forward_backward;
  // with overlap a batch of its own, send_backward_recv_backward).
  const bool first_gradient = k == warmup_ - 1 && !forward_only_ && warmup_ < total_ && p_.rank != p_.size - 1;
  if (overlap_p2p_ && first_gradient) {
    steps_.communicate(std::move(b.messages));
    b.messages.clear();
  }
  if (first_gradient) recv_backward(b, C_ - 1);
  steps_.communicate(std::move(b.messages));
}

void Interleaved::steady_step(int k) {
  const int forward_k = k + warmup_;
  const Entry f = forward_of(forward_k), g = backward_of(k);
  auto [recv_prev, next_forward] = receives_after(forward_k, true);
  const auto [recv_next, next_backward] = receives_after(k, false);
  if (k == total_ - warmup_ - 1) recv_prev = false;
  steps_.forward(f.microbatch, f.chunk);
  if (overlap_p2p_) {  // send_forward_recv_forward, then send_backward_recv_backward
    Batch forward_batch{p_, {}}, backward_batch{p_, {}};
    forward_batch.send_forward(f.microbatch, f.chunk);
    if (recv_prev) recv_forward(forward_batch, next_forward);
    steps_.communicate(std::move(forward_batch.messages));
    steps_.backward(g.microbatch, g.chunk);
    backward_batch.send_backward(g.microbatch, g.chunk);
    if (recv_next) recv_backward(backward_batch, next_backward);
    steps_.communicate(std::move(backward_batch.messages));
    return;
  }
  steps_.backward(g.microbatch, g.chunk);  // send_forward_backward_recv_forward_backward
  Batch b{p_, {}};
  b.send_forward(f.microbatch, f.chunk).send_backward(g.microbatch, g.chunk);
  if (recv_prev) recv_forward(b, next_forward);
  if (recv_next) recv_backward(b, next_backward);
  steps_.communicate(std::move(b.messages));
}

void Interleaved::cooldown_step(int k) {
  const Entry g = backward_of(k);
  auto [recv_next, next_chunk] = receives_after(k, false);
  if (k == total_ - 1) recv_next = false;
  steps_.backward(g.microbatch, g.chunk);
  Batch b{p_, {}};
  b.send_backward(g.microbatch, g.chunk);
  if (recv_next) recv_backward(b, next_chunk);
  steps_.communicate(std::move(b.messages));
}

std::vector<Step> Interleaved::generate() {
  Batch first{p_, {}};
  recv_forward(first, 0);
  steps_.communicate(std::move(first.messages));
  for (int k = 0; k < warmup_; ++k) warmup_step(k);
  for (int k = 0; k < total_ - warmup_; ++k) steady_step(k);
  if (forward_only_) return steps_.take();
  if (warmup_ == total_ && p_.rank != p_.size - 1) {  // every micro-batch was a warm-up forward
    Batch b{p_, {}};
    recv_backward(b, C_ - 1);
    steps_.communicate(std::move(b.messages));
  }
  for (int k = total_ - warmup_; k < total_; ++k) cooldown_step(k);
  return steps_.take();
}

}  // namespace

std::vector<Step> interleaved(const PipelinePosition& p, int M, int G, bool forward_only, bool overlap_p2p) {
  check_position(p, M, "interleaved");
  MEGATRON_CHECK(p.size > 1 && p.virtual_size > 1, "interleaved: needs a pipeline (", p.size,
                 " ranks) with several model chunks per rank (", p.virtual_size, ")");
  MEGATRON_CHECK(G >= p.size && G <= M && (M % G == 0 || M % G >= p.size), "interleaved: micro-batch group ", G,
                 " must be in [", p.size, ", ", M, "] and leave a last group of 0 or at least ", p.size);
  return Interleaved(p, M, G, forward_only, overlap_p2p).generate();
}

std::vector<Step> schedule_for(const PipelinePosition& p, int M, int G, bool forward_only, bool overlap_p2p) {
  if (p.size == 1) return no_pipelining(M, forward_only);
  if (p.virtual_size == 1) return one_f_one_b(p, M, forward_only);
  return interleaved(p, M, G, forward_only, overlap_p2p);
}

namespace {

std::string label(const std::string& what, int m, int c, bool chunks) {
  return chunks ? str_cat(what, m, '.', c) : str_cat(what, m);
}

std::string describe_steps(const std::vector<Step>& steps, bool with_messages) {
  bool chunks = false;
  for (const Step& s : steps) {
    chunks = chunks || s.chunk != 0;
    for (const Message& m : s.messages) chunks = chunks || m.chunk != 0;
  }
  static const char* kNames[] = {"sF", "rF", "sB", "rB"};
  std::string out;
  for (const Step& s : steps) {
    if (s.action == Action::Communicate && !with_messages) continue;
    if (!out.empty()) out += ' ';
    if (s.action != Action::Communicate) {
      out += label(s.action == Action::Forward ? "F" : "B", s.microbatch, s.chunk, chunks);
      continue;
    }
    out += '[';
    for (size_t i = 0; i < s.messages.size(); ++i)
      out += (i ? " " : "") + label(kNames[int(s.messages[i].kind)], s.messages[i].microbatch, s.messages[i].chunk, chunks);
    out += ']';
  }
  return out;
}

}  // namespace

std::string describe(const std::vector<Step>& steps) { return describe_steps(steps, true); }
std::string describe_compute(const std::vector<Step>& steps) { return describe_steps(steps, false); }

}  // namespace megatron::pipeline
