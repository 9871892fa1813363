#include "megatron/pipeline/executor.h"

#include <map>
#include <optional>
#include <utility>

namespace megatron::pipeline {

PipelineComm PipelineComm::create(comm::Communicator& pipeline_group, bool overlap) {
  PipelineComm p;
  p.activations = pipeline_group.split(0, pipeline_group.rank(), "pp-activations");
  p.gradients = pipeline_group.split(0, pipeline_group.rank(), "pp-gradients");
  p.overlap = overlap;
  return p;
}

namespace {

using Key = std::pair<int, int>;  // (chunk, micro-batch)

// Where each chunk's hooks fire: the step index of its first forward and of its last backward.
struct HookPoints {
  std::vector<size_t> first_forward, last_backward;
};

HookPoints hook_points(const std::vector<Step>& steps, int num_chunks, int num_microbatches) {
  HookPoints h{std::vector<size_t>(size_t(num_chunks), steps.size()), std::vector<size_t>(size_t(num_chunks), steps.size())};
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    if (s.action == Action::Communicate) continue;
    MEGATRON_CHECK(s.chunk >= 0 && s.chunk < num_chunks, "run_schedule: step ", i, " (", describe({s}),
                   ") names chunk ", s.chunk, " of ", num_chunks);
    MEGATRON_CHECK(s.microbatch >= 0 && s.microbatch < num_microbatches, "run_schedule: step ", i, " (",
                   describe({s}), ") names micro-batch ", s.microbatch, " of ", num_microbatches);
    if (s.action == Action::Forward && h.first_forward[size_t(s.chunk)] == steps.size())
      h.first_forward[size_t(s.chunk)] = i;
    if (s.action == Action::Backward) h.last_backward[size_t(s.chunk)] = i;
  }
  return h;
}

// Megatron's timer of a point-to-point batch (p2p_communication.py): the directions it sends and receives in.
const char* p2p_timer_name(const std::vector<Message>& messages) {
  bool send_f = false, send_b = false, recv_f = false, recv_b = false;
  for (const Message& m : messages) {
    send_f |= m.kind == Message::Kind::SendForward;
    send_b |= m.kind == Message::Kind::SendBackward;
    recv_f |= m.kind == Message::Kind::RecvForward;
    recv_b |= m.kind == Message::Kind::RecvBackward;
  }
  const int kinds = int(send_f) + int(send_b) + int(recv_f) + int(recv_b);
  if (kinds > 2 || (send_f && send_b) || (recv_f && recv_b)) return "forward-backward-send-forward-backward-recv";
  if (send_f && recv_f) return "forward-send-forward-recv";
  if (send_f && recv_b) return "forward-send-backward-recv";
  if (send_b && recv_f) return "backward-send-forward-recv";
  if (send_b && recv_b) return "backward-send-backward-recv";
  if (send_f) return "forward-send";
  if (send_b) return "backward-send";
  return recv_f ? "forward-recv" : "backward-recv";
}

// A tensor arriving in a point-to-point batch; usable once the batch is waited for.
struct Received {
  Tensor tensor;
  std::shared_ptr<comm::PendingP2P> pending;
};

class Executor {
 public:
  Executor(Context& ctx, const std::vector<Step>& steps, ScheduleRun& run)
      : ctx_(ctx), steps_(steps), run_(run),
        points_(hook_points(steps, int(run.chunks.size()), run.num_microbatches)),
        data_(size_t(run.num_microbatches)), loaded_(size_t(run.num_microbatches), false),
        losses_(size_t(run.num_microbatches)) {
    for (const nn::GPTModel* chunk : run.chunks)
      if (chunk->layout().pre_process || chunk->layout().post_process) last_data_chunk_ = chunk_index(chunk);
  }

  std::vector<Tensor> run() {
    for (size_t i = 0; i < steps_.size(); ++i) {
      const Step& s = steps_[i];
      if (s.action == Action::Forward) forward(i, s);
      else if (s.action == Action::Backward) backward(i, s);
      else communicate(i, s);
    }
    finish();
    return std::move(losses_);
  }

 private:
  int chunk_index(const nn::GPTModel* chunk) const {
    for (size_t c = 0; c < run_.chunks.size(); ++c)
      if (run_.chunks[c] == chunk) return int(c);
    return -1;
  }
  std::string where(size_t i, const Step& s) const { return str_cat("run_schedule: step ", i, " (", describe({s}), ")"); }
  std::string label(Key key) const {
    return run_.chunks.size() > 1 ? str_cat(key.second, '.', key.first) : std::to_string(key.second);
  }

  // Micro-batch m's data, loaded the first time a chunk needs it.
  const nn::StageInput& data(int m, size_t i, const Step& s) {
    if (!loaded_[size_t(m)]) {
      data_[size_t(m)] = run_.input(m);
      loaded_[size_t(m)] = true;
      prepare_next_ = m + 1;
    }
    MEGATRON_CHECK(data_[size_t(m)].has_value(), where(i, s), " runs micro-batch ", m,
                   " again, after its last forward here released its data");
    return *data_[size_t(m)];
  }

  Tensor take_received(std::map<Key, Received>& from, Key key, size_t i, const Step& s, const char* what) {
    const bool from_forward = &from == &inputs_;
    auto it = from.find(key);
    MEGATRON_CHECK(it != from.end(), where(i, s), " needs its ", what, ", which no earlier batch received");
    if (it->second.pending) {
      TimelineScope span(run_.timeline, str_cat("wait for ", what, " ", label(key)), "p2p");
      TimerScope timer(run_.timers, from_forward ? "forward-recv" : "backward-recv", 2);
      it->second.pending->wait(ctx_.stream());
    }
    Tensor t = std::move(it->second.tensor);
    from.erase(it);
    return t;
  }

  void forward(size_t i, const Step& s);
  void backward(size_t i, const Step& s);
  void communicate(size_t i, const Step& s);
  void finish();

  Context& ctx_;
  const std::vector<Step>& steps_;
  ScheduleRun& run_;
  HookPoints points_;
  std::vector<std::optional<nn::StageInput>> data_;  // held until the last chunk needing it has run its forward
  std::vector<bool> loaded_;
  int last_data_chunk_ = -1, prepare_next_ = -1;
  std::vector<Tensor> losses_;
  std::map<Key, nn::StageSaved> in_flight_;           // forward done, backward not yet
  std::map<Key, Tensor> outputs_, input_grads_;        // produced here, waiting for their send
  std::map<Key, Received> inputs_, output_grads_;      // received, waiting for their step
  std::vector<std::shared_ptr<comm::PendingP2P>> batches_;  // posted, not known to be complete
  size_t first_forwards_seen_ = 0;
};

void Executor::forward(size_t i, const Step& s) {
  nn::GPTModel& chunk = *run_.chunks[size_t(s.chunk)];
  const nn::StageLayout& layout = chunk.layout();
  const Key key{s.chunk, s.microbatch};
  nn::StageInput in{.batch = run_.batch, .seq = run_.seq};
  if (layout.pre_process || layout.post_process) {
    const nn::StageInput& d = data(s.microbatch, i, s);
    if (layout.pre_process) in.tokens = d.tokens;
    if (layout.post_process) in.labels = d.labels, in.loss_mask = d.loss_mask;
    in.position_ids = d.position_ids;
    in.cu_seqlens = d.cu_seqlens;
  }
  if (!layout.pre_process) in.hidden = take_received(inputs_, key, i, s, "input hidden state");
  nn::ForwardOptions options = run_.options(s.microbatch);
  options.training = options.training && !run_.forward_only;
  options.hooks = run_.hooks.every_pass;
  options.hooks.grads_final = nullptr;
  options.timers = run_.timers;
  if (i == points_.first_forward[size_t(s.chunk)] && run_.hooks.before_first_forward)
    options.hooks.before_forward = [first = run_.hooks.before_first_forward,
                                    every = run_.hooks.every_pass.before_forward](const nn::ParameterList& params) {
      first(params);
      if (every) every(params);
    };
  nn::StageOutput out = [&] {
    TimelineScope span(run_.timeline, str_cat("forward ", label(key)), "compute");
    TimerScope timer(run_.timers, "forward-compute", 2);
    return chunk.forward(ctx_, in, options);
  }();
  if (layout.post_process) losses_[size_t(s.microbatch)] = out.loss;
  else outputs_[key] = std::move(out.hidden);
  if (!run_.forward_only) {
    MEGATRON_CHECK(!in_flight_.count(key), where(i, s), " runs a forward whose activations still wait for their backward");
    in_flight_.emplace(key, std::move(out.saved));
  }
  if (s.chunk == last_data_chunk_) data_[size_t(s.microbatch)].reset();  // the saved state keeps what backward needs
  if (prepare_next_ >= 0 && run_.prepare && prepare_next_ < run_.num_microbatches) run_.prepare(prepare_next_);
  prepare_next_ = -1;
  if (i == points_.first_forward[size_t(s.chunk)] && ++first_forwards_seen_ == run_.chunks.size() &&
      run_.hooks.after_first_forward)
    run_.hooks.after_first_forward();
}

void Executor::backward(size_t i, const Step& s) {
  MEGATRON_CHECK(!run_.forward_only, where(i, s), " in a forward-only run");
  nn::GPTModel& chunk = *run_.chunks[size_t(s.chunk)];
  const Key key{s.chunk, s.microbatch};
  auto it = in_flight_.find(key);
  MEGATRON_CHECK(it != in_flight_.end(), where(i, s), " runs a backward without its forward's activations");
  nn::StageSaved saved = std::move(it->second);
  in_flight_.erase(it);
  const Tensor doutput =
      chunk.layout().post_process ? Tensor() : take_received(output_grads_, key, i, s, "output gradient");
  nn::ParamHooks hooks = run_.hooks.every_pass;
  hooks.grads_final = i == points_.last_backward[size_t(s.chunk)] ? run_.hooks.grads_final : nullptr;
  Tensor dinput = [&] {
    TimelineScope span(run_.timeline, str_cat("backward ", label(key)), "compute");
    TimerScope timer(run_.timers, "backward-compute", 2);
    return chunk.backward(ctx_, std::move(saved), doutput, hooks);
  }();
  if (!chunk.layout().pre_process) input_grads_[key] = std::move(dinput);
}

void Executor::communicate(size_t i, const Step& s) {
  MEGATRON_CHECK(run_.p2p != nullptr, where(i, s), " needs the pipeline's point-to-point channels");
  const PipelineComm& p2p = *run_.p2p;
  const nn::GPTModel& any = *run_.chunks.front();
  const Shape hidden{any.tensor_parallel().sp_rows(run_.batch * run_.seq), any.config().hidden()};
  std::vector<comm::P2POp> forward_ops, backward_ops;
  std::vector<std::pair<Key, Tensor>> received_forward, received_backward;
  auto take = [&](std::map<Key, Tensor>& from, Key key, const char* what) {
    auto it = from.find(key);
    MEGATRON_CHECK(it != from.end(), where(i, s), " sends the ", what, " of micro-batch ", key.second, " chunk ",
                   key.first, ", which was not computed before it");
    Tensor t = std::move(it->second);
    from.erase(it);
    return t;
  };
  for (const Message& m : s.messages) {
    const Key key{m.chunk, m.microbatch};
    switch (m.kind) {
      case Message::Kind::SendForward: forward_ops.push_back(comm::P2POp::send(take(outputs_, key, "output"), p2p.next())); break;
      case Message::Kind::SendBackward: backward_ops.push_back(comm::P2POp::send(take(input_grads_, key, "input gradient"), p2p.prev())); break;
      case Message::Kind::RecvForward:
        received_forward.emplace_back(key, ctx_.empty(hidden, any.config().params_dtype));
        forward_ops.push_back(comm::P2POp::recv(received_forward.back().second, p2p.prev()));
        break;
      case Message::Kind::RecvBackward:
        received_backward.emplace_back(key, ctx_.empty(hidden, any.config().params_dtype));
        backward_ops.push_back(comm::P2POp::recv(received_backward.back().second, p2p.next()));
        break;
    }
  }
  auto post = [&](comm::Communicator& channel, const std::vector<comm::P2POp>& ops,
                  std::vector<std::pair<Key, Tensor>>& received, std::map<Key, Received>& into) {
    if (ops.empty()) return;
    auto pending = std::make_shared<comm::PendingP2P>(channel.batch_send_recv(ops, ctx_.stream()));
    for (auto& [key, t] : received) into[key] = Received{std::move(t), pending};
    if (!p2p.overlap) pending->wait(ctx_.stream());
    batches_.push_back(std::move(pending));
  };
  {
    TimelineScope span(run_.timeline, describe({s}), "p2p");
    TimerScope timer(run_.timers, p2p_timer_name(s.messages), 2);
    post(*p2p.activations, forward_ops, received_forward, inputs_);
    post(*p2p.gradients, backward_ops, received_backward, output_grads_);
  }
  // Batches known to be complete release their tensors (a send's output, once NCCL or MPI is done with it).
  std::erase_if(batches_, [](const std::shared_ptr<comm::PendingP2P>& b) { return b.use_count() == 1 && b->done(); });
}

void Executor::finish() {
  for (const std::shared_ptr<comm::PendingP2P>& b : batches_) b->wait(ctx_.stream());
  batches_.clear();
  auto left = [](const auto& map, const char* what) {
    MEGATRON_CHECK(map.empty(), "run_schedule: ", map.size(), " ", what, " (the first: micro-batch ",
                   map.begin()->first.second, " of chunk ", map.begin()->first.first, ")");
  };
  left(in_flight_, "micro-batch(es) ran their forward but not their backward");
  left(outputs_, "output(s) computed but never sent");
  left(input_grads_, "input gradient(s) computed but never sent");
  left(inputs_, "received input(s) that no forward read");
  left(output_grads_, "received gradient(s) that no backward read");
}

}  // namespace

std::vector<Tensor> run_schedule(Context& ctx, const std::vector<Step>& steps, ScheduleRun& run) {
  MEGATRON_CHECK(!run.chunks.empty() && run.options, "run_schedule: needs model chunks and an options callback");
  for (const nn::GPTModel* chunk : run.chunks)
    MEGATRON_CHECK(run.input || (!chunk->layout().pre_process && !chunk->layout().post_process),
                   "run_schedule: a chunk with the embedding or the loss needs an input callback");
  return Executor(ctx, steps, run).run();
}

}  // namespace megatron::pipeline
