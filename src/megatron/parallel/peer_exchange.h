// PeerExchange: transfers between the GPUs of one node by the copy engines, for the collectives that overlap
// GEMMs (tp_comm_overlap.h) and the context-parallel ring (ring_attention.h). Measured on two H200s
// (bench/RESULTS.md 2026-11-29, scripts/gpu/tp_comm_probe.py): an NCCL transfer on a side stream and a cuBLAS GEMM
// on the compute stream run almost one after the other (a median of 12% of the shorter one hidden, -12% to 61%),
// while a peer memcpy, which the copy engines do without a kernel, hides a median of 57% (26-74%). Transformer Engine's userbuffers take
// the same route.
//
// Every rank of the group allocates one staging buffer with `depth` slots for each rank that pushes to it (every
// other rank, or only rank - 1 for a ring) and a block of flag words, and maps every other rank's (CUDA IPC; the
// handles travel through the group's host all-reduce). Push n from rank s to rank d lands in s's slot
// (n - 1) % depth on d. A push and its consumption are ordered by two counters per pair:
//
//   push(stream, parts, d)     on `stream`: wait until d has released our push depth pushes back (its slot is
//                              free), copy the parts back to back into the slot, then raise d's arrival word for us
//                              to the number of pushes so far;
//   wait_arrival(stream, s)    on `stream`: wait until s's arrival word reaches the number of waits so far; slot(s)
//                              is then where that push landed;
//   release(stream, s)         on `stream`, after the work that reads slot(s): raise s's free word for us.
//
// The waits are one-thread kernels spinning on a word of this GPU's memory, the raises one-thread kernels
// storing to the peer's (with system-scope fences around both), so nothing waits on the host. Every rank must
// make the same calls in the same order for its peers (the layers of a TP group do), exactly like the
// collectives they replace. Each wait joins the group's watchdog (Communicator::watch_stream): a peer that
// never pushes or releases ends the job after --distributed-timeout-minutes with a report naming it and the
// push, instead of a silent hang. CUDA only; create() answers null where it cannot work (a CPU context, ranks
// that cannot map each other's memory), and the caller keeps NCCL. The group must outlive the exchange.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "megatron/comm/communicator.h"
#include "megatron/runtime/context.h"

namespace megatron::parallel {

struct PeerExchangeOptions {
  int depth = 1;                    // slots per source: a push waits for the release of the one `depth` back
  bool from_previous_only = false;  // a ring: only rank - 1 pushes to a rank (and a rank only to rank + 1)
};

class PeerExchange {
 public:
  // Collective over `group` (every rank calls it): slots of `slot_bytes` each. Null on every rank when any
  // rank cannot map the others' memory.
  static std::unique_ptr<PeerExchange> create(Context& ctx, comm::Communicator& group, int64_t slot_bytes,
                                              PeerExchangeOptions options = {});
  ~PeerExchange();
  PeerExchange(const PeerExchange&) = delete;
  PeerExchange& operator=(const PeerExchange&) = delete;

  int64_t slot_bytes() const { return slot_bytes_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Where `src`'s latest awaited push landed on this rank, from `byte_offset` on, viewed as `shape` of `dtype`.
  Tensor slot(int src, const Shape& shape, DType dtype, int64_t byte_offset = 0) const;

  void push(StreamHandle stream, std::span<const Tensor> parts, int dst);
  void push(StreamHandle stream, const Tensor& data, int dst) { push(stream, std::span<const Tensor>(&data, 1), dst); }
  void wait_arrival(StreamHandle stream, int src);
  void release(StreamHandle stream, int src);

 private:
  PeerExchange() = default;
  struct Mapping;  // the IPC mappings of the peers' buffers (CUDA builds)
  std::unique_ptr<Mapping> mapping_;
  comm::Communicator* group_ = nullptr;    // whose watchdog follows the waits
  int rank_ = 0, size_ = 1, device_ = 0;  // device_: the CUDA device the slots live on
  int64_t slot_bytes_ = 0;
  PeerExchangeOptions options_;
  void check_peer(const char* what, int peer) const;
  std::vector<uint64_t> pushed_, arrived_, released_;  // per peer: pushes to it, waits for it, releases of it
};

// A group's PeerExchange, made on first use and made again with larger slots when a transfer needs them (both
// collective: the ranks of a group ask at the same points, as for its collectives). get() answers null, from
// then on, where the ranks cannot map each other's memory (rank 0 says so once). A transfer still pending holds
// its exchange (shared), so remaking one never pulls buffers from under it.
class PeerExchangeCache {
 public:
  explicit PeerExchangeCache(PeerExchangeOptions options = {}) : options_(options) {}
  std::shared_ptr<PeerExchange> get(Context& ctx, comm::Communicator& group, int64_t bytes);

 private:
  PeerExchangeOptions options_;
  std::shared_ptr<PeerExchange> exchange_;
  bool unavailable_ = false;
};

}  // namespace megatron::parallel
