// Communicator: the collectives of one group of ranks, behind one interface with three engines:
// MpiCommunicator (CPU tensors, OpenMPI), NcclCommunicator (CUDA tensors, NCCL; CUDA builds) and
// SelfCommunicator (a group of one, no library). Groups are made by split(), as MPI_Comm_split and
// ncclCommSplit do.
//
// Contract of every operation:
// - Every rank of the group calls the same operations in the same order with matching sizes and dtypes
//   (the MPI/NCCL rule). Tensors are contiguous views (any offset into their storage); MPI takes CPU
//   tensors, NCCL CUDA tensors on its device.
// - Results are *assigned* into the destination (never accumulated). all_reduce works in place.
// - Streams (NCCL): `stream` is the caller's stream the operation is ordered with: the collective waits for
//   the work queued on `stream` so far, and work queued on `stream` afterwards sees its result. Nothing
//   waits on the host. Internally every operation of one communicator runs on that communicator's own
//   stream, so operations issued from different caller streams can never run in different orders on
//   different ranks. nullptr: ordered with nothing; call synchronize() before reading the result.
//   MPI and Self ignore `stream` and return when the operation is complete (except batch_send_recv, below).
// - Timeouts: a rank that waits longer than the communicator's timeout (--distributed-timeout-minutes)
//   reports its rank, the group, the collective, the sizes and the time waited on stderr, and the process
//   exits with kWatchdogExitCode (MPI: through MPI_Abort, which ends the whole job), instead of
//   hanging forever when another rank skipped the collective or died.
// - Errors (wrong sizes, dtypes, devices; a failed MPI/NCCL call) throw megatron::Error naming the call,
//   the group, this rank and the sizes.
//
// Point to point (batch_send_recv): a batch of sends and receives, to any peers and in both directions with
// the same peer, is started as one unit and completes as one unit, so no order of posting can deadlock
// (two ranks that both "send first" simply exchange). Contract:
// - Each op's peer posts the matching op with the same number of elements and dtype. Between two ranks the
//   sends of one are matched with the receives of the other in the order they were issued, within a batch
//   and across batches (NCCL's rule; on MPI every p2p message of a communicator carries one tag, and MPI's
//   non-overtaking rule — messages from one sender to one receiver with the same communicator and tag are
//   received in the order they were sent — gives the same order). Ranks outside the batch's peers need not
//   call anything; an empty batch is a no-op everywhere.
// - Validation happens before anything is posted, so a refused batch leaves the group as it was: every
//   tensor is defined and lives on device(); every peer is a rank of the group other than this one; a
//   receive buffer overlaps no other op's buffer. The error names the op (its index, kind, peer and sizes),
//   the group and this rank.
// - Ordering: the batch runs after the work queued on `stream` so far (NCCL: an event, then the
//   communicator's own stream, as every collective). It does not make `stream` wait for it: the returned
//   PendingP2P does, in wait().
// - Lifetime: the handle holds the tensors (the Tensor values, hence their storage) until wait(), so
//   neither the caller dropping a tensor nor the CUDA caching allocator handing its block to new work on
//   the caller's stream can race with the transfer. (NCCL, waited for on a stream other than the start
//   stream: kept until the GPU has finished the batch, since a block returns to the cache of the stream
//   it was allocated on.) A handle destroyed without wait() waits as wait(stream given at the start)
//   does (MPI: completes the requests), rather than leave a transfer writing into memory nobody owns.
// - Watchdog: a batch is watched like a collective: a receive whose send never comes (or the reverse)
//   becomes the timeout report naming every op of the batch, not a hang.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "megatron/tensor/tensor.h"

namespace megatron::comm {

enum class ReduceOp { Sum, Max, Avg };  // Avg = Sum / size(), in the tensor's dtype
const char* reduce_op_name(ReduceOp op);

// Exit status of a process whose collective timed out.
inline constexpr int kWatchdogExitCode = 86;

// Megatron's --distributed-timeout-minutes as a duration (fractional minutes allowed, for tests).
std::chrono::milliseconds timeout_from_minutes(double minutes);

// One operation of a point-to-point batch: send `tensor` to `peer`, or receive into it from `peer`
// (peer: a rank of the communicator's group).
struct P2POp {
  enum class Kind { Send, Recv };
  Kind kind = Kind::Send;
  Tensor tensor;
  int peer = -1;

  static P2POp send(Tensor t, int peer) { return P2POp{Kind::Send, std::move(t), peer}; }
  static P2POp recv(Tensor t, int peer) { return P2POp{Kind::Recv, std::move(t), peer}; }
};

// A point-to-point batch in flight, returned by Communicator::batch_send_recv. Move-only.
class PendingP2P {
 public:
  // What an engine keeps for one batch until it is complete (its requests or event, and the tensors).
  class Engine {
   public:
    virtual ~Engine() = default;
    virtual void wait(StreamHandle stream) = 0;
    virtual bool done() = 0;
  };

  PendingP2P() = default;  // nothing in flight (an empty batch)
  PendingP2P(std::unique_ptr<Engine> engine, StreamHandle started_on)
      : engine_(std::move(engine)), started_on_(started_on) {}
  PendingP2P(PendingP2P&& other) noexcept = default;
  // Completes the batch this handle held (as the destructor does), then takes `other`'s.
  PendingP2P& operator=(PendingP2P&& other);
  PendingP2P(const PendingP2P&) = delete;
  PendingP2P& operator=(const PendingP2P&) = delete;
  // An un-waited batch is completed here as by wait(the stream given at the start); a failure then (an MPI
  // error) cannot be thrown from a destructor: it is printed and the process aborts.
  ~PendingP2P();

  // Completes the batch for `stream`: afterwards the received tensors hold their data and the sent ones
  // may be overwritten, for work queued on `stream` (NCCL: `stream` waits for the batch by an event; the
  // host does not) or for the host (MPI, any `stream`; NCCL with stream == nullptr: the host blocks, the
  // watchdog ending the process on a timeout). MPI polls the requests under the watchdog: past the
  // timeout, the usual report and MPI_Abort. Then releases the handle: a second wait() does nothing.
  void wait(StreamHandle stream = nullptr);
  // True when wait() has nothing left to wait for: the batch has completed (MPI: every request; NCCL: the
  // GPU finished it), wait() was called already, or the handle is empty. Never blocks; on MPI it also
  // drives the transfers' progress, so polling done() completes a batch.
  bool done() const;

 private:
  std::unique_ptr<Engine> engine_;
  StreamHandle started_on_ = nullptr;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's name in messages: "world", "dp", "tp", ...
  virtual const std::string& name() const = 0;
  virtual const char* backend() const = 0;  // "mpi", "nccl", "self"
  // Where its tensors must live.
  virtual Device device() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // t = op over the ranks of t (in place).
  virtual void all_reduce(const Tensor& t, ReduceOp op, StreamHandle stream = nullptr) = 0;
  // in holds size() chunks of out.numel() elements; out = op over the ranks of their chunk number rank().
  // `out` may be exactly that chunk of `in` (in place).
  virtual void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, StreamHandle stream = nullptr) = 0;
  // out holds size() chunks of in.numel() elements; chunk r = rank r's `in`. `in` may be exactly this
  // rank's chunk of `out` (in place).
  virtual void all_gather(const Tensor& out, const Tensor& in, StreamHandle stream = nullptr) = 0;
  // t = root's t on every rank.
  virtual void broadcast(const Tensor& t, int root, StreamHandle stream = nullptr) = 0;
  // Starts a batch of sends and receives (see "Point to point" above); complete it with the handle's
  // wait(). `ops` is read during the call only (the handle keeps its own Tensor values).
  virtual PendingP2P batch_send_recv(std::span<const P2POp> ops, StreamHandle stream = nullptr) = 0;
  // One send or receive, complete for `stream` on return: a batch of one op, waited for on `stream`
  // (NCCL with stream == nullptr: the host waits). Two ranks that both send first deadlock once the
  // message is too large to be buffered: exchanges belong in one batch.
  void send(const Tensor& t, int peer, StreamHandle stream = nullptr);
  void recv(const Tensor& t, int peer, StreamHandle stream = nullptr);
  // `in` holds send_counts[r] elements for rank r, back to back in rank order; `out` receives
  // recv_counts[r] elements from rank r, back to back in rank order. Counts are in elements; every rank's
  // send_counts[p] equals rank p's recv_counts[rank()].
  virtual void all_to_all(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in,
                          std::span<const int64_t> send_counts, StreamHandle stream = nullptr) = 0;
  virtual void barrier() = 0;
  // Host values (a loss, a squared norm, an inf flag): reduced in double, returns when done.
  virtual void all_reduce_host(std::span<double> values, ReduceOp op) = 0;
  // Blocks the host until every operation issued so far has completed.
  virtual void synchronize() = 0;
  // Puts the work queued on `stream` so far under this group's watchdog, like its own operations: past
  // timeout() the job ends with the usual report naming `op` and `detail`. For waits on the GPU that are not
  // this communicator's operations but depend on its ranks, such as the copy-engine exchanges' flag waits
  // (parallel/peer_exchange.h). Backends without a device watchdog (MPI, self, sockets) do nothing.
  virtual void watch_stream(StreamHandle stream, const std::string& op, const std::string& detail) {}

  // Collective over this group: ranks passing the same color form a new group, ordered by key (ties by
  // rank). color < 0: this rank joins no group and gets nullptr. The new group keeps the timeout.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // "group 'dp' (rank 1 of 4, nccl)" for messages.
  std::string describe() const;
};

namespace detail {
// Throws unless `t` lives where `comm` needs it; `op` names the call in the message.
void check_tensor(const Communicator& comm, const char* op, const char* arg, const Tensor& t);
// "1000 f32 elements (4000 bytes)".
std::string sizes(const Tensor& t);
// The report a timed-out rank prints (one paragraph). `group` is Communicator::describe()'s text.
std::string timeout_report(const Communicator& comm, const std::string& op, const std::string& sizes,
                           std::chrono::duration<double> waited, int world_rank);
std::string timeout_report(const std::string& group, std::chrono::milliseconds timeout, const std::string& op,
                           const std::string& sizes, std::chrono::duration<double> waited, int world_rank);
// Validates a batch_send_recv batch against the contract in this file's comment (throws naming the op,
// group, rank, peer and sizes); returns the batch's description for messages and the watchdog, e.g.
// "send 777 f32 elements (3108 bytes) to rank 1, recv 5 bf16 elements (10 bytes) from rank 2".
std::string check_p2p(const Communicator& comm, std::span<const P2POp> ops);
// "send 777 f32 elements (3108 bytes) to rank 1" for op `op`.
std::string describe_p2p_op(const P2POp& op);
// Validates all_to_all's counts against the group size and the tensors; returns the element offsets of
// each rank's block as (send offsets, recv offsets), size() + 1 entries each.
std::pair<std::vector<int64_t>, std::vector<int64_t>> all_to_all_offsets(const Communicator& comm, const Tensor& out,
                                                                         std::span<const int64_t> recv_counts,
                                                                         const Tensor& in,
                                                                         std::span<const int64_t> send_counts);
}  // namespace detail

}  // namespace megatron::comm
