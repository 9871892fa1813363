#include "megatron/comm/communicator.h"

#include <cmath>
#include <cstdio>

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
  char seconds[64];
  std::snprintf(seconds, sizeof seconds, "%.1f s", waited.count());
  const double limit_minutes = double(comm.timeout().count()) / 60'000.0;
  return str_cat("[megatron watchdog] world rank ", world_rank, ": ", op, " on ", comm.describe(), " with ", sizes,
                 " has waited ", seconds, ", past --distributed-timeout-minutes ", limit_minutes,
                 ". Another rank of the group did not join this collective (it skipped it, is stuck elsewhere, "
                 "or died). Aborting the communicator and exiting with status ", kWatchdogExitCode, ".");
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
