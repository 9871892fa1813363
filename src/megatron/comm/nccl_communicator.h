// NcclCommunicator: Communicator over NCCL, for CUDA tensors on one device (CUDA builds with NCCL only).
//
// create() bootstraps from a CPU communicator (MPI's world): its rank 0 makes the NCCL unique id, which is
// broadcast over that communicator, then every rank joins (ncclCommInitRankConfig) on its device.
// split() is ncclCommSplit (a collective over this communicator).
//
// Streams: the communicator owns one CUDA stream; every operation waits for the work queued so far on the
// caller's `stream` (an event), runs on the owned stream, and makes the caller's stream wait for its
// completion (another event), so results are stream-ordered for the caller and nothing blocks the host.
// all_reduce_host, barrier and synchronize block the host.
// batch_send_recv: ncclGroupStart, one ncclSend/ncclRecv per op (bytes; empty tensors skipped, their peer's
// op being empty too), ncclGroupEnd, all on the owned stream after the caller's `stream`; an event recorded
// after the group is what the handle's wait() makes a stream wait for (or the host, with nullptr). Tensors
// waited for on their start stream are released at once; waited for on another stream, they are kept until
// the event has completed (released at a later batch_send_recv, synchronize() or destruction).
// Dtypes: reductions F32, F64, F16, BF16, I8, I32, I64, U8 (Avg is ncclAvg); data movement any dtype.
//
// Watchdog: a thread per communicator records an event after every operation and polls it; when the
// oldest unfinished operation is older than timeout() (or NCCL reports an asynchronous error) it prints
// detail::timeout_report and ends the process with kWatchdogExitCode (mpirun then ends the other ranks), without
// ncclCommAbort: the abort would let the blocked thread run on with unfinished results before the exit. The host can therefore block on a stream safely: a hang becomes an exit.
#pragma once

#include <memory>

#include "megatron/comm/communicator.h"

namespace megatron::comm {

class NcclCommunicator final : public Communicator {
 public:
  struct State;  // NCCL and CUDA handles, the watchdog (nccl_communicator.cpp)

  // Collective over `bootstrap` (CPU tensors); the new communicator has its ranks and rank order, on
  // CUDA device `device`. `world_rank` is reported in timeout messages (default: bootstrap's rank).
  static std::unique_ptr<NcclCommunicator> create(Communicator& bootstrap, int device, std::string name,
                                                  std::chrono::milliseconds timeout, int world_rank = -1);
  NcclCommunicator(std::unique_ptr<State> state, std::string name, std::chrono::milliseconds timeout, int world_rank);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "nccl"; }
  Device device() const override;
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
  void synchronize() override;
  void watch_stream(StreamHandle stream, const std::string& op, const std::string& detail) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 private:
  // Stream ordering around one operation (see the file comment) and its watchdog record.
  void begin(StreamHandle caller);
  void end(StreamHandle caller, const char* op, const std::string& sizes);

  std::unique_ptr<State> state_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  int rank_ = 0, size_ = 1, world_rank_ = 0;
};

}  // namespace megatron::comm
