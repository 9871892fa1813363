// SocketCommunicator: Communicator over TCP sockets (SocketMesh), for CPU tensors, where no MPI launched the
// job (torchrun). The same contracts as MpiCommunicator (communicator.h); collectives return when complete,
// `stream` is ignored, batch_send_recv returns a handle whose wait() completes the batch.
//
// Algorithms (direct exchanges; groups of CPU ranks are small, so each rank talks to every member):
// - all_reduce = reduce-scatter then all-gather over size() nearly equal chunks; reduce_scatter as the first
//   half. The owner of a chunk receives every rank's piece of it and reduces them in rank order:
//   op(...op(op(x0, x1), x2)..., x_{n-1}), each step with MpiCommunicator's arithmetic (host_reduction.h). So
//   the result is the same bits on every rank and in every run, independent of timing; with two ranks it is
//   the same bits as MPI's (a sum of two terms does not depend on the order). Avg divides the sum by size().
// - all_gather, all_to_all: every rank sends its blocks straight to their owners.
// - broadcast: a binomial tree from the root (log2(size) rounds), so NCCL's unique id reaches thousands of
//   ranks without a rank opening thousands of connections.
// - barrier: dissemination (log2(size) rounds of empty messages).
// - all_reduce_host: all_reduce of f64 values.
// - split(color, key): an all-gather of every rank's (color, key); the members of a color ordered by key,
//   ties by rank (MPI_Comm_split's rule). The new group's channels get an id mixed from this group's id,
//   the number of splits it has made and the color, the same on every member and distinct from every other
//   group's.
// Dtypes: reductions take F32, F64, I8..I64, U8, U16, BF16, F16 (as MPI); data movement any dtype.
// Collectives and point-to-point batches travel on separate channels, so a batch in flight never meets a
// collective of the same group.
//
// Watchdog: every wait polls the mesh with the clock running; past timeout() it prints
// detail::timeout_report (world rank, group, operation, sizes, time waited) and ends the process with
// kWatchdogExitCode (under torchrun the agent then stops the other ranks). A peer whose connection ended
// fails the operation at once with megatron::Error naming the peer, the operation and the group.
#pragma once

#include <memory>
#include <vector>

#include "megatron/comm/communicator.h"
#include "megatron/comm/socket_mesh.h"

namespace megatron::comm {

class SocketCommunicator final : public Communicator {
 public:
  // A group over `members` (world ranks of `mesh` in group rank order, this process's among them). `id` must
  // be the same on every member and differ from every other group's that shares a pair of ranks with it.
  SocketCommunicator(std::shared_ptr<SocketMesh> mesh, std::vector<int> members, uint64_t id, std::string name,
                     std::chrono::milliseconds timeout);
  // Every rank of the mesh, in world rank order.
  static std::unique_ptr<SocketCommunicator> world(std::shared_ptr<SocketMesh> mesh, uint64_t id,
                                                   std::chrono::milliseconds timeout, std::string name = "world");

  int rank() const override { return rank_; }
  int size() const override { return int(members_.size()); }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "socket"; }
  Device device() const override { return Device::cpu(); }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void all_reduce(const Tensor& t, ReduceOp op, StreamHandle stream = nullptr) override;
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, StreamHandle stream = nullptr) override;
  void all_gather(const Tensor& out, const Tensor& in, StreamHandle stream = nullptr) override;
  void broadcast(const Tensor& t, int root, StreamHandle stream = nullptr) override;
  PendingP2P batch_send_recv(std::span<const P2POp> ops, StreamHandle stream = nullptr) override;
  void all_to_all(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in,
                  std::span<const int64_t> send_counts, StreamHandle stream = nullptr) override;
  void barrier() override;
  void all_reduce_host(std::span<double> values, ReduceOp op) override;
  void synchronize() override {}
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 private:
  using Transfers = std::vector<std::shared_ptr<SocketMesh::Transfer>>;

  void send_to(Transfers& ts, int peer, const void* data, size_t bytes);
  void recv_from(Transfers& ts, int peer, void* data, size_t bytes);
  // Completes `ts` under the watchdog; throws naming `op` and `sizes` when a transfer failed.
  void wait(const Transfers& ts, const char* op, const std::string& sizes);
  // Chunk r of `data` (element offsets[r] .. offsets[r + 1]) reduced over the ranks in rank order into
  // `result` (this rank's chunk; may alias it).
  void reduce_chunks(const std::byte* data, const std::vector<int64_t>& offsets, DType dtype, ReduceOp op,
                     std::byte* result, const char* op_name, const std::string& sizes);
  // Every rank's chunk of `data` (this rank's in place already) to every rank.
  void gather_chunks(std::byte* data, const std::vector<int64_t>& offsets, size_t element_bytes, const char* op_name,
                     const std::string& sizes);
  void reduce_all(std::byte* data, int64_t count, DType dtype, ReduceOp op, const char* op_name,
                  const std::string& sizes);

  std::shared_ptr<SocketMesh> mesh_;
  std::vector<int> members_;
  uint64_t id_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  int rank_ = 0;
  uint64_t splits_ = 0;
};

}  // namespace megatron::comm
