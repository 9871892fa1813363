#include "megatron/parallel/ring_attention.h"

#include <array>
#include <vector>

#include "megatron/ops/attention/attention_merge.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/parallel/sequence_rows.h"
#include "megatron/runtime/timeline.h"
#include "megatron/tensor/op_checks.h"

namespace megatron::parallel {
namespace {

// A block of keys and values (k, v [B, 2c, G, D]).
struct KvBlock {
  Tensor k, v;
};

// The ring over a communicator: rank r sends to r + 1 and receives from r - 1.
struct Ring {
  comm::Communicator* group = nullptr;
  int size = 1, rank = 0;

  explicit Ring(comm::Communicator* g) : group(g), size(g ? g->size() : 1), rank(g ? g->rank() : 0) {}
  int next() const { return (rank + 1) % size; }
  int prev() const { return (rank + size - 1) % size; }
  RingStep at(int step) const { return {rank, size, step}; }

  // Sends `send` to the next rank and receives the previous rank's into `recv`; the transfer runs while the
  // caller computes, the returned handle completes it.
  comm::PendingP2P exchange(Context& ctx, const KvBlock& send, const KvBlock& recv) const {
    const std::array<comm::P2POp, 4> ops = {comm::P2POp::send(send.k, next()), comm::P2POp::send(send.v, next()),
                                            comm::P2POp::recv(recv.k, prev()), comm::P2POp::recv(recv.v, prev())};
    return group->batch_send_recv(ops, ctx.stream());
  }
};

KvBlock empty_like(Context& ctx, const KvBlock& b) {
  return {ctx.empty(b.k.shape(), b.k.dtype()), ctx.empty(b.v.shape(), b.v.dtype())};
}

void check_shapes(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                  const ops::AttentionOptions& options) {
  OpCheck check(op);
  check.rank("q", q, 4).rank("k", k, 4).shape("v", v, k.shape());
  check.that(options.causal, "ring attention computes causal attention (options.causal must be true)");
  check.that(k.dim(1) == q.dim(1) && q.dim(1) % 2 == 0, "q ", q.describe(), " and k ", k.describe(),
             " must hold the same even number of tokens (two chunks of each sequence)");
}

ops::AttentionOptions full(const ops::AttentionOptions& options) {
  ops::AttentionOptions o = options;
  o.causal = false;
  return o;
}

// The options of one block's attention call: the dropout addressing of its queries (rows [q_first, +q_count) of
// this rank's [chunk r ; chunk 2P-1-r]) and keys (rows [0, k_count) of the owner's two chunks), c positions
// per chunk.
ops::AttentionOptions block_options(const ops::AttentionOptions& options, const RingStep& at, int64_t c,
                                    int64_t q_first, int64_t q_count, int64_t k_count) {
  if (!options.dropout.enabled()) return options;
  ops::AttentionOptions o = options;
  MEGATRON_CHECK(o.dropout.seq == 2 * int64_t(at.size) * c, "ring attention: the dropout addressing's sequence of ",
                 o.dropout.seq, " positions is not the ring's ", at.size, " ranks x 2 chunks of ", c);
  o.dropout.queries = ops::slice_runs(ops::two_chunk_runs(at.size, at.rank, c), q_first, q_count);
  o.dropout.keys = ops::slice_runs(ops::two_chunk_runs(at.size, at.owner(), c), 0, k_count);
  return o;
}

// The copy-engine channels for blocks of `bytes` on this ring, or none (CPU, no peers asked, unmappable).
struct Channels {
  std::shared_ptr<PeerExchange> kv, grads;
  StreamFork* side = nullptr;
  explicit operator bool() const { return kv != nullptr; }
};
Channels channels(Context& ctx, RingPeers* peers, const Ring& ring, int64_t bytes, bool with_grads) {
  if (peers == nullptr || !ctx.is_cuda() || ring.size < 2) return {};
  Channels c;
  c.kv = peers->kv.get(ctx, *ring.group, bytes);
  if (c.kv && with_grads) c.grads = peers->grads.get(ctx, *ring.group, bytes);
  if (!c.kv || (with_grads && !c.grads)) return {};
  if (!peers->side) peers->side = std::make_unique<StreamFork>(ctx);
  c.side = peers->side.get();
  return c;
}

// A block that landed in `px`'s slot from the previous rank, shaped like `like`.
KvBlock landed(const PeerExchange& px, int prev, const KvBlock& like) {
  return {px.slot(prev, like.k.shape(), like.k.dtype()),
          px.slot(prev, like.v.shape(), like.v.dtype(), int64_t(like.k.nbytes()))};
}

// Pushes `block` (k then v) to the next rank on the side stream, after ctx's work so far.
void push_block(Context& ctx, const Channels& c, PeerExchange& px, const KvBlock& block, int next, const char* what) {
  const StreamHandle side = c.side->fork(ctx);
  TimelineScope span(ctx.timeline(), what, "cp-comm", side);
  const std::array<Tensor, 2> parts = {block.k, block.v};
  px.push(side, parts, next);
}

// Frees the slot holding the previous rank's latest block once ctx's work so far (what read it) is done; queued
// on the side stream, behind the push that forwarded it.
void release_block(Context& ctx, const Channels& c, PeerExchange& px, int prev) {
  px.release(c.side->fork(ctx), prev);
}

// The key/value block of `step` (this rank's own at step 0, else the one that landed from the previous rank),
// pushed on to the next rank unless it is the last.
KvBlock take_block(Context& ctx, const Ring& ring, const Channels& c, const KvBlock& local, int step) {
  PeerExchange& px = *c.kv;
  KvBlock block = local;
  if (step > 0) {
    px.wait_arrival(ctx.stream(), ring.prev());
    block = landed(px, ring.prev(), local);
  }
  if (step + 1 < ring.size) push_block(ctx, c, px, block, ring.next(), "ring push (k, v)");
  return block;
}

void ring_forward_by_copy_engines(Context& ctx, const Ring& ring, const Channels& c, const Tensor& out,
                                  const Tensor& stats, const Tensor& q, const KvBlock& local,
                                  const ops::AttentionOptions& options) {
  for (int step = 0; step < ring.size; ++step) {
    const KvBlock current = take_block(ctx, ring, c, local, step);
    {
      TimelineScope span(ctx.timeline(), "ring attention step", "cp-attention");
      ring_attention_forward_step(ctx, ring.at(step), out, stats, q, current.k, current.v, options);
    }
    if (step > 0) release_block(ctx, c, *c.kv, ring.prev());
  }
  c.side->join(ctx);
}

// The backward's blocks travel as the forward's, and with each the gradient the ranks before accumulated for it:
// received into a slot, this rank's part added in place there, pushed on; the last one to arrive is this
// rank's own block's, copied out into dk, dv.
void ring_backward_by_copy_engines(Context& ctx, const Ring& ring, const Channels& c, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                                   const KvBlock& local, const Tensor& out, const Tensor& stats,
                                   const ops::AttentionOptions& options) {
  PeerExchange& gx = *c.grads;
  std::vector<Tensor> pushed;  // alive until the side stream is joined: step 0 pushes this rank's own dk, dv
  for (int step = 0; step < ring.size; ++step) {
    const KvBlock current = take_block(ctx, ring, c, local, step);
    RingBlockGrads g;
    {
      TimelineScope span(ctx.timeline(), "ring attention backward step", "cp-attention");
      g = ring_attention_backward_step(ctx, ring.at(step), dq, dout, q, current.k, current.v, out, stats, options);
    }
    if (step > 0) release_block(ctx, c, *c.kv, ring.prev());
    KvBlock grads{g.dk, g.dv};
    if (step > 0) {  // the gradient the ranks before this one accumulated for the block, plus this rank's part
      gx.wait_arrival(ctx.stream(), ring.prev());
      grads = landed(gx, ring.prev(), local);
      add_rows(ctx, grads.k, 0, g.dk);
      add_rows(ctx, grads.v, 0, g.dv);
    }
    push_block(ctx, c, gx, grads, ring.next(), "ring push (dk, dv)");
    pushed.insert(pushed.end(), {grads.k, grads.v});
    if (step > 0) release_block(ctx, c, gx, ring.prev());
  }
  gx.wait_arrival(ctx.stream(), ring.prev());  // this rank's own block's gradient, complete
  const KvBlock mine = landed(gx, ring.prev(), local);
  ops::copy(ctx, dk, mine.k);
  ops::copy(ctx, dv, mine.v);
  gx.release(ctx.stream(), ring.prev());
  c.side->join(ctx);
}

}  // namespace

void ring_attention_forward_step(Context& ctx, const RingStep& at, const Tensor& out, const Tensor& stats,
                                 const Tensor& q, const Tensor& k_block, const Tensor& v_block,
                                 const ops::AttentionOptions& options) {
  check_shapes("ring_attention_forward_step", q, k_block, v_block, options);
  const int64_t B = q.dim(0), c = q.dim(1) / 2, H = q.dim(2), D = q.dim(3);
  const int j = at.owner();
  if (at.step == 0) {
    ops::attention_forward(ctx, out, stats, q, k_block, v_block, block_options(options, at, c, 0, 2 * c, 2 * c));
  } else if (j < at.rank) {  // every local query over the block's first chunk
    Tensor part = ctx.empty(q.shape(), q.dtype()), part_stats = ctx.empty(stats.shape(), DType::F32);
    ops::attention_forward(ctx, part, part_stats, q, read_rows(ctx, k_block, 0, c), read_rows(ctx, v_block, 0, c),
                           full(block_options(options, at, c, 0, 2 * c, c)));
    ops::attention_merge(ctx, out, stats, part, part_stats, 0);
  } else {  // the second local chunk over the whole block
    Tensor part = ctx.empty({B, c, H, D}, q.dtype()), part_stats = ctx.empty({B, H, c, 1}, DType::F32);
    ops::attention_forward(ctx, part, part_stats, read_rows(ctx, q, c, c), k_block, v_block,
                           full(block_options(options, at, c, c, c, 2 * c)));
    ops::attention_merge(ctx, out, stats, part, part_stats, c);
  }
}

RingBlockGrads ring_attention_backward_step(Context& ctx, const RingStep& at, const Tensor& dq, const Tensor& dout,
                                            const Tensor& q, const Tensor& k_block, const Tensor& v_block,
                                            const Tensor& out, const Tensor& stats,
                                            const ops::AttentionOptions& options) {
  check_shapes("ring_attention_backward_step", q, k_block, v_block, options);
  const int64_t c = q.dim(1) / 2;
  auto like = [&](const Tensor& t, int64_t rows) { return ctx.empty(with_extent(t.shape(), kSeqDim, rows), t.dtype()); };
  if (at.step == 0) {
    RingBlockGrads g{like(k_block, 2 * c), like(v_block, 2 * c)};
    ops::attention_backward(ctx, dq, g.dk, g.dv, dout, q, k_block, v_block, out, stats,
                            block_options(options, at, c, 0, 2 * c, 2 * c));
    return g;
  }
  if (at.owner() < at.rank) {  // every local query over the block's first chunk
    const Tensor k = read_rows(ctx, k_block, 0, c), v = read_rows(ctx, v_block, 0, c);
    RingBlockGrads g{like(k, c), like(v, c)};
    Tensor dq_part = like(q, 2 * c);
    ops::attention_backward(ctx, dq_part, g.dk, g.dv, dout, q, k, v, out, stats,
                            full(block_options(options, at, c, 0, 2 * c, c)));
    add_rows(ctx, dq, 0, dq_part);
    return g;
  }
  // The second local chunk over the whole block.
  RingBlockGrads g{like(k_block, 2 * c), like(v_block, 2 * c)};
  Tensor dq_part = like(q, c);
  ops::attention_backward(ctx, dq_part, g.dk, g.dv, read_rows(ctx, dout, c, c), read_rows(ctx, q, c, c), k_block,
                          v_block, read_rows(ctx, out, c, c), read_rows(ctx, stats, c, c, kStatsSeqDim),
                          full(block_options(options, at, c, c, c, 2 * c)));
  add_rows(ctx, dq, c, dq_part);
  return g;
}

void ring_attention_forward(Context& ctx, comm::Communicator* group, const Tensor& out, const Tensor& stats,
                            const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionOptions& options,
                            RingPeers* peers) {
  const Ring ring(group);
  if (const Channels c = channels(ctx, peers, ring, int64_t(k.nbytes() + v.nbytes()), false)) {
    ring_forward_by_copy_engines(ctx, ring, c, out, stats, q, KvBlock{k, v}, options);
    return;
  }
  KvBlock current{k, v};
  for (int step = 0; step < ring.size; ++step) {
    // The next block travels while this one is computed.
    KvBlock incoming;
    comm::PendingP2P transfer;
    if (step + 1 < ring.size) {
      incoming = empty_like(ctx, current);
      transfer = ring.exchange(ctx, current, incoming);
    }
    ring_attention_forward_step(ctx, ring.at(step), out, stats, q, current.k, current.v, options);
    transfer.wait(ctx.stream());
    current = std::move(incoming);
  }
}

void ring_attention_backward(Context& ctx, comm::Communicator* group, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& stats, const ops::AttentionOptions& options,
                             RingPeers* peers) {
  const Ring ring(group);
  if (ring.size == 1) {
    ops::attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, stats,
                            block_options(options, ring.at(0), q.dim(1) / 2, 0, q.dim(1), q.dim(1)));
    return;
  }
  if (const Channels c = channels(ctx, peers, ring, int64_t(k.nbytes() + v.nbytes()), true)) {
    ring_backward_by_copy_engines(ctx, ring, c, dq, dk, dv, dout, q, KvBlock{k, v}, out, stats, options);
    return;
  }
  // `grads` accumulates the gradient of the block this rank holds and travels on with it; after the last
  // step the previous rank hands this rank its own block's finished gradient, received straight into dk, dv.
  KvBlock current{k, v}, grads, arriving;
  comm::PendingP2P grads_transfer;
  for (int step = 0; step < ring.size; ++step) {
    KvBlock incoming;
    comm::PendingP2P transfer;
    if (step + 1 < ring.size) {
      incoming = empty_like(ctx, current);
      transfer = ring.exchange(ctx, current, incoming);
    }
    const RingBlockGrads g =
        ring_attention_backward_step(ctx, ring.at(step), dq, dout, q, current.k, current.v, out, stats, options);
    if (step == 0) {
      grads = {g.dk, g.dv};
    } else {
      grads_transfer.wait(ctx.stream());  // the gradient the ranks before this one accumulated for the block
      grads = std::move(arriving);
      add_rows(ctx, grads.k, 0, g.dk);
      add_rows(ctx, grads.v, 0, g.dv);
    }
    arriving = step + 1 == ring.size ? KvBlock{dk, dv} : empty_like(ctx, current);
    grads_transfer = ring.exchange(ctx, grads, arriving);
    transfer.wait(ctx.stream());
    current = std::move(incoming);
  }
  grads_transfer.wait(ctx.stream());
}

}  // namespace megatron::parallel
