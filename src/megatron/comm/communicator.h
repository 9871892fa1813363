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
//   MPI and Self ignore `stream` and return when the operation is complete.
// - Timeouts: a rank that waits longer than the communicator's timeout (--distributed-timeout-minutes)
//   reports its rank, the group, the collective, the sizes and the time waited on stderr, aborts the
//   communicator (MPI_Abort / ncclCommAbort) and the process exits with kWatchdogExitCode, instead of
//   hanging forever when another rank skipped the collective or died.
// - Errors (wrong sizes, dtypes, devices; a failed MPI/NCCL call) throw megatron::Error naming the call,
//   the group, this rank and the sizes.
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
  // Point to point within the group; the peer posts the matching recv/send with the same size.
  virtual void send(const Tensor& t, int peer, StreamHandle stream = nullptr) = 0;
  virtual void recv(const Tensor& t, int peer, StreamHandle stream = nullptr) = 0;
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
// The report a timed-out rank prints (one paragraph).
std::string timeout_report(const Communicator& comm, const std::string& op, const std::string& sizes,
                           std::chrono::duration<double> waited, int world_rank);
// Validates all_to_all's counts against the group size and the tensors; returns the element offsets of
// each rank's block as (send offsets, recv offsets), size() + 1 entries each.
std::pair<std::vector<int64_t>, std::vector<int64_t>> all_to_all_offsets(const Communicator& comm, const Tensor& out,
                                                                         std::span<const int64_t> recv_counts,
                                                                         const Tensor& in,
                                                                         std::span<const int64_t> send_counts);
}  // namespace detail

}  // namespace megatron::comm
