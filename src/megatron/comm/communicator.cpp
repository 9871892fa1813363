#include "megatron/comm/communicator.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>

namespace megatron::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Avg: return "avg";
  }
  return "?";
}

std::chrono::milliseconds timeout_from_minutes(double minutes) {
  MEGATRON_CHECK(std::isfinite(minutes) && minutes > 0, "--distributed-timeout-minutes must be positive, got ", minutes);
  return std::chrono::milliseconds(int64_t(std::llround(minutes * 60'000.0)));
}

std::string Communicator::describe() const {
  return str_cat("group '", name(), "' (rank ", rank(), " of ", size(), ", ", backend(), ")");
}

void Communicator::send(const Tensor& t, int peer, StreamHandle stream) {
  const P2POp op = P2POp::send(t, peer);
  batch_send_recv(std::span<const P2POp>(&op, 1), stream).wait(stream);
}

void Communicator::recv(const Tensor& t, int peer, StreamHandle stream) {
  const P2POp op = P2POp::recv(t, peer);
  batch_send_recv(std::span<const P2POp>(&op, 1), stream).wait(stream);
}

PendingP2P& PendingP2P::operator=(PendingP2P&& other) {
  if (this != &other) {
    if (engine_) wait(started_on_);
    engine_ = std::move(other.engine_);
    started_on_ = other.started_on_;
  }
  return *this;
}

PendingP2P::~PendingP2P() {
  if (!engine_) return;
  try {
    wait(started_on_);
  } catch (const std::exception& e) {
    // The transfer may still be writing into the tensors this handle is about to release.
    std::fprintf(stderr, "PendingP2P destroyed while its batch could not be completed: %s\n", e.what());
    std::fflush(stderr);
    std::abort();
  }
}

void PendingP2P::wait(StreamHandle stream) {
  if (!engine_) return;
  engine_->wait(stream);
  engine_.reset();
}

bool PendingP2P::done() const { return !engine_ || engine_->done(); }

namespace detail {

void check_tensor(const Communicator& comm, const char* op, const char* arg, const Tensor& t) {
  MEGATRON_CHECK(t.defined(), op, " on ", comm.describe(), ": ", arg, " is an undefined tensor");
  MEGATRON_CHECK(t.device() == comm.device(), op, " on ", comm.describe(), ": ", arg, " is ", t.describe(),
                 " but this communicator's tensors live on ", comm.device());
}

std::string sizes(const Tensor& t) {
  return str_cat(t.numel(), " ", dtype_name(t.dtype()), " elements (", t.nbytes(), " bytes)");
}

std::string timeout_report(const Communicator& comm, const std::string& op, const std::string& sizes,
                           std::chrono::duration<double> waited, int world_rank) {
  return timeout_report(comm.describe(), comm.timeout(), op, sizes, waited, world_rank);
}

std::string timeout_report(const std::string& group, std::chrono::milliseconds timeout, const std::string& op,
                           const std::string& sizes, std::chrono::duration<double> waited, int world_rank) {
  char seconds[64];
  std::snprintf(seconds, sizeof seconds, "%.1f s", waited.count());
  const double limit_minutes = double(timeout.count()) / 60'000.0;
  const char* cause = op == "batch_send_recv"
                          ? ". A peer named here did not post the matching send or receive (it skipped it, is stuck "
                            "elsewhere, or died)"
                      : op.starts_with("peer exchange")
                          ? ". The rank named here did not make the matching push or release of the copy-engine "
                            "exchange (it skipped it, is stuck elsewhere, or died)"
                          : ". Another rank of the group did not join this collective (it skipped it, is stuck "
                            "elsewhere, or died)";
  return str_cat("[megatron watchdog] world rank ", world_rank, ": ", op, " on ", group, " with ", sizes,
                 " has waited ", seconds, ", past --distributed-timeout-minutes ", limit_minutes, cause,
                 ". Ending the job: this rank exits with status ", kWatchdogExitCode, ".");
}

std::string describe_p2p_op(const P2POp& op) {
  const bool send = op.kind == P2POp::Kind::Send;
  const std::string what = op.tensor.defined() ? sizes(op.tensor) : std::string("an undefined tensor");
  return str_cat(send ? "send " : "recv ", what, send ? " to rank " : " from rank ", op.peer);
}

namespace {

bool bytes_overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const char* a0 = static_cast<const char*>(a.data_ptr());
  const char* b0 = static_cast<const char*>(b.data_ptr());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

std::string check_p2p(const Communicator& comm, std::span<const P2POp> ops) {
  const auto where = [&](size_t i) {
    return str_cat("batch_send_recv on ", comm.describe(), ": op ", i, " (", describe_p2p_op(ops[i]), ")");
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    MEGATRON_CHECK(op.tensor.defined(), where(i), " has no tensor");
    MEGATRON_CHECK(op.tensor.device() == comm.device(), where(i), ": the tensor is ", op.tensor.describe(),
                   " but this communicator's tensors live on ", comm.device());
    MEGATRON_CHECK(comm.size() > 1, where(i), ": a group of one has no peers");
    MEGATRON_CHECK(op.peer >= 0 && op.peer < comm.size(), where(i), ": peer ", op.peer,
                   " is not a rank of the group (0..", comm.size() - 1, ")");
    MEGATRON_CHECK(op.peer != comm.rank(), where(i), ": peer ", op.peer,
                   " is this rank; a rank does not send to or receive from itself");
  }
  // A receive racing with another op on the same bytes has no defined result.
  for (size_t i = 0; i < ops.size(); ++i)
    for (size_t j = i + 1; j < ops.size(); ++j) {
      if (ops[i].kind == P2POp::Kind::Send && ops[j].kind == P2POp::Kind::Send) continue;  // reading twice is fine
      const size_t recv = ops[i].kind == P2POp::Kind::Recv ? i : j, other = recv == i ? j : i;
      MEGATRON_CHECK(!bytes_overlap(ops[i].tensor, ops[j].tensor), where(recv), ": it receives into bytes of op ",
                     other, " (", describe_p2p_op(ops[other]), ")");
    }
  std::string text;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i == 6) return str_cat(text, ", and ", ops.size() - i, " more ops");
    text += str_cat(i == 0 ? "" : ", ", describe_p2p_op(ops[i]));
  }
  return text;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> all_to_all_offsets(const Communicator& comm, const Tensor& out,
                                                                         std::span<const int64_t> recv_counts,
                                                                         const Tensor& in,
                                                                         std::span<const int64_t> send_counts) {
  check_tensor(comm, "all_to_all", "out", out);
  check_tensor(comm, "all_to_all", "in", in);
  const size_t n = size_t(comm.size());
  MEGATRON_CHECK(recv_counts.size() == n && send_counts.size() == n, "all_to_all on ", comm.describe(),
                 ": need one count per rank (", n, "), got ", send_counts.size(), " send and ", recv_counts.size(),
                 " recv counts");
  MEGATRON_CHECK(in.dtype() == out.dtype(), "all_to_all on ", comm.describe(), ": in is ", in.describe(), ", out is ",
                 out.describe(), " (dtypes differ)");
  std::vector<int64_t> send(n + 1, 0), recv(n + 1, 0);
  for (size_t r = 0; r < n; ++r) {
    MEGATRON_CHECK(send_counts[r] >= 0 && recv_counts[r] >= 0, "all_to_all on ", comm.describe(),
                   ": negative count for rank ", r);
    send[r + 1] = send[r] + send_counts[r];
    recv[r + 1] = recv[r] + recv_counts[r];
  }
  MEGATRON_CHECK(send[n] == in.numel() && recv[n] == out.numel(), "all_to_all on ", comm.describe(),
                 ": send counts sum to ", send[n], " but in has ", in.numel(), " elements; recv counts sum to ",
                 recv[n], " but out has ", out.numel());
  return {send, recv};
}

}  // namespace detail
}  // namespace megatron::comm
