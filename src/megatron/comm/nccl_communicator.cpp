#include "megatron/comm/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "megatron/core/cuda_check.h"

namespace megatron::comm {
namespace {

[[noreturn]] void fail_nccl(const char* call, ncclResult_t status, ncclComm_t comm, const std::string& extra,
                            std::source_location where) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  ::megatron::detail::fail_check(nullptr,
                                 str_cat("NCCL call failed with ", ncclGetErrorString(status), ": ", call, extra,
                                         (last != nullptr && *last != '\0') ? str_cat(" (NCCL: ", last, ")") : ""),
                                 where);
}

#define NCCL_CHECK_MSG(comm, call, ...)                                                                   \
  do {                                                                                                    \
    ncclResult_t nccl_status_ = (call);                                                                   \
    if (nccl_status_ != ncclSuccess && nccl_status_ != ncclInProgress) [[unlikely]]                       \
      fail_nccl(#call, nccl_status_, comm, ::megatron::str_cat(__VA_ARGS__), std::source_location::current()); \
  } while (0)

ncclDataType_t reduce_type(DType t, const Communicator& comm, const char* op) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::I8: return ncclInt8;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    default: break;
  }
  MEGATRON_FAIL(op, " on ", comm.describe(), ": NCCL cannot reduce ", dtype_name(t), " tensors");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Avg: return ncclAvg;
  }
  return ncclSum;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const char* a0 = static_cast<const char*>(a.data_ptr());
  const char* b0 = static_cast<const char*>(b.data_ptr());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// Polls one event per operation on the communicator's stream; past the timeout, reports and ends the
// process (see nccl_communicator.h).
class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  ~Watchdog() { stop(); }

  void start(const Communicator& owner, ncclComm_t comm, int device, int world_rank) {
    owner_ = &owner;
    comm_ = comm;
    device_ = device;
    world_rank_ = world_rank;
    thread_ = std::thread([this] { run(); });
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (const Pending& p : pending_) cudaEventDestroy(p.event);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
    pending_.clear();
    free_.clear();
  }

  // Records an event on `stream` now; the watchdog follows it until it completes.
  void watch(cudaStream_t stream, const char* op, const std::string& sizes) {
    std::lock_guard lock(mutex_);
    cudaEvent_t event = nullptr;
    if (!free_.empty()) {
      event = free_.back();
      free_.pop_back();
    } else {
      CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    }
    CUDA_CHECK_MSG(cudaEventRecord(event, stream), " (watchdog event after ", op, " on ", owner_->describe(), ")");
    pending_.push_back(Pending{event, Clock::now(), op, sizes});
  }

  // The host is in a call that can block until the peers take part (ncclGroupEnd connects point-to-point
  // peers the first time they meet): watched like an operation on the stream until host_exit().
  void host_enter(const char* op, const std::string& sizes) {
    std::lock_guard lock(mutex_);
    host_ = Pending{nullptr, Clock::now(), op, sizes};
  }
  void host_exit() {
    std::lock_guard lock(mutex_);
    host_.reset();
  }

 private:
  struct Pending {
    cudaEvent_t event;
    Clock::time_point issued;
    std::string op, sizes;
  };

  void run() {
    cudaSetDevice(device_);
    const auto tick = std::clamp(owner_->timeout() / 20, std::chrono::milliseconds(10), std::chrono::milliseconds(500));
    std::unique_lock lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, tick);
      if (stop_) break;
      while (!pending_.empty() && cudaEventQuery(pending_.front().event) == cudaSuccess) {
        free_.push_back(pending_.front().event);
        pending_.pop_front();
      }
      (void)cudaGetLastError();  // cudaErrorNotReady is sticky-free but keep the error state clean
      for (const Pending* p : {pending_.empty() ? nullptr : &pending_.front(), host_ ? &*host_ : nullptr}) {
        if (p == nullptr) continue;
        const std::chrono::duration<double> waited = Clock::now() - p->issued;
        if (waited >= owner_->timeout()) fail(detail::timeout_report(*owner_, p->op, p->sizes, waited, world_rank_));
      }
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
        fail(str_cat("[megatron watchdog] world rank ", world_rank_, ": NCCL reports an asynchronous error on ",
                     owner_->describe(), ": ", ncclGetErrorString(async), " (", ncclGetLastError(comm_),
                     "). Ending the job: this rank exits with status ", kWatchdogExitCode, "."));
    }
  }

  // Ends the process without aborting the communicator first: ncclCommAbort would release the thread blocked
  // on the hung operation, which would then carry on with whatever the collective left in its buffers before
  // this thread gets to exit. Process exit tears down the CUDA context, hung kernels included.
  [[noreturn]] void fail(const std::string& report) {
    std::fprintf(stderr, "%s\n", report.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(kWatchdogExitCode);
  }

  const Communicator* owner_ = nullptr;
  ncclComm_t comm_ = nullptr;
  int device_ = 0, world_rank_ = 0;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::deque<Pending> pending_;
  std::optional<Pending> host_;
  std::vector<cudaEvent_t> free_;
  std::thread thread_;
};

constexpr size_t kHostScratch = 512;  // doubles per all_reduce_host piece

// One batch_send_recv batch: the event recorded after it on the communicator's stream and the tensors it
// reads and writes, which must live until the GPU has finished it.
struct InFlight {
  cudaEvent_t done = nullptr;
  std::vector<Tensor> tensors;
  ~InFlight() {
    if (done != nullptr) cudaEventDestroy(done);  // legal while pending: CUDA frees it once it completes
  }
  // True once the GPU has passed the event; throws on a CUDA error.
  bool complete() const {
    const cudaError_t status = cudaEventQuery(done);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    CUDA_CHECK_MSG(status, " (querying a batch_send_recv completion event)");
    return true;
  }
};

// Batches waited for on a stream other than the one they started on: their tensors stay here until the
// GPU has finished them (a block returned to the caching allocator is reused in its own stream's order, so
// only the start stream's wait makes an early release safe). Shared with the handles, which may outlive
// the communicator.
class RetiredBatches {
 public:
  void add(std::shared_ptr<InFlight> batch) {
    std::lock_guard lock(mutex_);
    batches_.push_back(std::move(batch));
  }
  // Drops the finished ones (all of them with `all`, after the stream was synchronised).
  void release(bool all) {
    std::lock_guard lock(mutex_);
    std::erase_if(batches_, [&](const std::shared_ptr<InFlight>& b) { return all || b->complete(); });
  }

 private:
  std::mutex mutex_;
  std::vector<std::shared_ptr<InFlight>> batches_;
};

class NcclBatch final : public PendingP2P::Engine {
 public:
  NcclBatch(std::shared_ptr<InFlight> batch, StreamHandle started_on, std::shared_ptr<RetiredBatches> retired)
      : batch_(std::move(batch)), started_on_(started_on), retired_(std::move(retired)) {}

  void wait(StreamHandle stream) override {
    if (stream == nullptr) {
      CUDA_CHECK_MSG(cudaEventSynchronize(batch_->done), " (waiting for a batch_send_recv on the host)");
      return;
    }
    CUDA_CHECK_MSG(cudaStreamWaitEvent(stream, batch_->done, 0), " (a stream waiting for a batch_send_recv)");
    if (stream != started_on_ && !batch_->complete()) retired_->add(std::move(batch_));
  }
  bool done() override { return batch_->complete(); }

 private:
  std::shared_ptr<InFlight> batch_;
  StreamHandle started_on_;
  std::shared_ptr<RetiredBatches> retired_;
};

}  // namespace

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t order_in = nullptr, order_out = nullptr;
  double* scratch = nullptr;  // device, kHostScratch doubles
  Watchdog watchdog;
  std::shared_ptr<RetiredBatches> retired = std::make_shared<RetiredBatches>();

  State(ncclComm_t c, int d) : comm(c), device(d) {
    CUDA_CHECK(cudaSetDevice(device));
    int lowest = 0, highest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, highest));
    CUDA_CHECK(cudaEventCreateWithFlags(&order_in, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&order_out, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&scratch, kHostScratch * sizeof(double)));
  }
  ~State() {
    watchdog.stop();
    if (stream != nullptr) cudaStreamSynchronize(stream);
    retired->release(/*all=*/true);
    if (comm != nullptr) ncclCommDestroy(comm);
    if (scratch != nullptr) cudaFree(scratch);
    if (order_in != nullptr) cudaEventDestroy(order_in);
    if (order_out != nullptr) cudaEventDestroy(order_out);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(Communicator& bootstrap, int device, std::string name,
                                                           std::chrono::milliseconds timeout, int world_rank) {
  MEGATRON_CHECK(bootstrap.device().is_cpu(), "NcclCommunicator::create: the bootstrap communicator ",
                 bootstrap.describe(), " must carry CPU tensors (MPI)");
  CUDA_CHECK_MSG(cudaSetDevice(device), " (NCCL communicator '", name, "', rank ", bootstrap.rank(), ")");
  ncclUniqueId id{};
  if (bootstrap.rank() == 0)
    NCCL_CHECK_MSG(nullptr, ncclGetUniqueId(&id), " (communicator '", name, "', rank 0 of ", bootstrap.size(), ")");
  bootstrap.broadcast(Tensor::from_blob(&id, Shape{int64_t(sizeof id)}, DType::U8, Device::cpu()), 0);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ncclComm_t comm = nullptr;
  NCCL_CHECK_MSG(nullptr, ncclCommInitRankConfig(&comm, bootstrap.size(), id, bootstrap.rank(), &config),
                 " (communicator '", name, "', rank ", bootstrap.rank(), " of ", bootstrap.size(), ", device ", device, ")");
  return std::make_unique<NcclCommunicator>(std::make_unique<State>(comm, device), std::move(name), timeout,
                                            world_rank >= 0 ? world_rank : bootstrap.rank());
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<State> state, std::string name, std::chrono::milliseconds timeout,
                                   int world_rank)
    : state_(std::move(state)), name_(std::move(name)), timeout_(timeout), world_rank_(world_rank) {
  NCCL_CHECK_MSG(state_->comm, ncclCommUserRank(state_->comm, &rank_), " (communicator '", name_, "')");
  NCCL_CHECK_MSG(state_->comm, ncclCommCount(state_->comm, &size_), " (communicator '", name_, "')");
  state_->watchdog.start(*this, state_->comm, state_->device, world_rank_);
}

NcclCommunicator::~NcclCommunicator() = default;

Device NcclCommunicator::device() const { return Device::cuda(state_->device); }

void NcclCommunicator::begin(StreamHandle caller) {
  CUDA_CHECK(cudaSetDevice(state_->device));
  if (caller == nullptr) return;
  CUDA_CHECK(cudaEventRecord(state_->order_in, caller));
  CUDA_CHECK(cudaStreamWaitEvent(state_->stream, state_->order_in, 0));
}

void NcclCommunicator::watch_stream(StreamHandle stream, const std::string& op, const std::string& detail) {
  CUDA_CHECK(cudaSetDevice(state_->device));
  state_->watchdog.watch(stream, op.c_str(), detail);
}

void NcclCommunicator::end(StreamHandle caller, const char* op, const std::string& sizes) {
  state_->watchdog.watch(state_->stream, op, sizes);
  if (caller == nullptr) return;
  CUDA_CHECK(cudaEventRecord(state_->order_out, state_->stream));
  CUDA_CHECK(cudaStreamWaitEvent(caller, state_->order_out, 0));
}

void NcclCommunicator::all_reduce(const Tensor& t, ReduceOp op, StreamHandle stream) {
  detail::check_tensor(*this, "all_reduce", "t", t);
  const ncclDataType_t type = reduce_type(t.dtype(), *this, "all_reduce");
  const std::string what = str_cat(reduce_op_name(op), " of ", detail::sizes(t));
  begin(stream);
  NCCL_CHECK_MSG(state_->comm,
                 ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), type, nccl_op(op), state_->comm,
                               state_->stream),
                 " on ", describe(), ", ", what);
  end(stream, "all_reduce", what);
}

void NcclCommunicator::reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, StreamHandle stream) {
  detail::check_tensor(*this, "reduce_scatter", "out", out);
  detail::check_tensor(*this, "reduce_scatter", "in", in);
  MEGATRON_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() * size_, "reduce_scatter on ", describe(),
                 ": in ", in.describe(), " must hold ", size_, " chunks of out ", out.describe());
  const char* own = static_cast<const char*>(in.data_ptr()) + int64_t(rank_) * int64_t(out.nbytes());
  MEGATRON_CHECK(out.data_ptr() == own || !overlaps(out, in), "reduce_scatter on ", describe(),
                 ": out overlaps in but is not rank ", rank_, "'s chunk of it");
  const ncclDataType_t type = reduce_type(in.dtype(), *this, "reduce_scatter");
  const std::string what = str_cat(reduce_op_name(op), " of ", detail::sizes(in), " into ", out.numel(), " per rank");
  begin(stream);
  NCCL_CHECK_MSG(state_->comm,
                 ncclReduceScatter(in.data_ptr(), out.data_ptr(), size_t(out.numel()), type, nccl_op(op), state_->comm,
                                   state_->stream),
                 " on ", describe(), ", ", what);
  end(stream, "reduce_scatter", what);
}

void NcclCommunicator::all_gather(const Tensor& out, const Tensor& in, StreamHandle stream) {
  detail::check_tensor(*this, "all_gather", "out", out);
  detail::check_tensor(*this, "all_gather", "in", in);
  MEGATRON_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * size_, "all_gather on ", describe(),
                 ": out ", out.describe(), " must hold ", size_, " chunks of in ", in.describe());
  const char* own = static_cast<const char*>(out.data_ptr()) + int64_t(rank_) * int64_t(in.nbytes());
  MEGATRON_CHECK(in.data_ptr() == own || !overlaps(out, in), "all_gather on ", describe(),
                 ": in overlaps out but is not rank ", rank_, "'s chunk of it");
  const std::string what = str_cat(detail::sizes(in), " per rank");
  begin(stream);
  NCCL_CHECK_MSG(state_->comm,
                 ncclAllGather(in.data_ptr(), out.data_ptr(), in.nbytes(), ncclUint8, state_->comm, state_->stream),
                 " on ", describe(), ", ", what);
  end(stream, "all_gather", what);
}

void NcclCommunicator::broadcast(const Tensor& t, int root, StreamHandle stream) {
  detail::check_tensor(*this, "broadcast", "t", t);
  MEGATRON_CHECK(root >= 0 && root < size_, "broadcast on ", describe(), ": root ", root, " is not a rank of the group");
  const std::string what = str_cat(detail::sizes(t), " from rank ", root);
  begin(stream);
  NCCL_CHECK_MSG(state_->comm,
                 ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, state_->comm, state_->stream),
                 " on ", describe(), ", ", what);
  end(stream, "broadcast", what);
}

PendingP2P NcclCommunicator::batch_send_recv(std::span<const P2POp> ops, StreamHandle stream) {
  if (ops.empty()) return {};
  const std::string what = detail::check_p2p(*this, ops);
  state_->retired->release(/*all=*/false);
  auto batch = std::make_shared<InFlight>();
  CUDA_CHECK(cudaSetDevice(state_->device));
  CUDA_CHECK(cudaEventCreateWithFlags(&batch->done, cudaEventDisableTiming));
  begin(stream);
  // Watched on the host until the group is queued: the first batch with a peer connects to it inside
  // ncclGroupEnd, which waits there for a peer that never comes.
  struct HostWatch {
    Watchdog& watchdog;
    ~HostWatch() { watchdog.host_exit(); }
  } host_watch{state_->watchdog};
  state_->watchdog.host_enter("batch_send_recv", what);
  NCCL_CHECK_MSG(state_->comm, ncclGroupStart(), " (batch_send_recv on ", describe(), ")");
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    batch->tensors.push_back(op.tensor);
    if (op.tensor.nbytes() == 0) continue;  // the peer's matching op has no bytes either
    if (op.kind == P2POp::Kind::Send)
      NCCL_CHECK_MSG(state_->comm,
                     ncclSend(op.tensor.data_ptr(), op.tensor.nbytes(), ncclUint8, op.peer, state_->comm, state_->stream),
                     " (batch_send_recv on ", describe(), ", op ", i, ": ", detail::describe_p2p_op(op), ")");
    else
      NCCL_CHECK_MSG(state_->comm,
                     ncclRecv(op.tensor.data_ptr(), op.tensor.nbytes(), ncclUint8, op.peer, state_->comm, state_->stream),
                     " (batch_send_recv on ", describe(), ", op ", i, ": ", detail::describe_p2p_op(op), ")");
  }
  NCCL_CHECK_MSG(state_->comm, ncclGroupEnd(), " (batch_send_recv on ", describe(), ": ", what, ")");
  state_->watchdog.watch(state_->stream, "batch_send_recv", what);
  CUDA_CHECK_MSG(cudaEventRecord(batch->done, state_->stream), " (batch_send_recv on ", describe(), ")");
  return PendingP2P(std::make_unique<NcclBatch>(std::move(batch), stream, state_->retired), stream);
}

void NcclCommunicator::all_to_all(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in,
                                  std::span<const int64_t> send_counts, StreamHandle stream) {
  auto [send_offsets, recv_offsets] = detail::all_to_all_offsets(*this, out, recv_counts, in, send_counts);
  MEGATRON_CHECK(!overlaps(out, in) || out.nbytes() == 0 || in.nbytes() == 0, "all_to_all on ", describe(),
                 ": in and out overlap");
  const size_t elt = dtype_size(in.dtype());
  const std::string what = str_cat("send ", detail::sizes(in), ", receive ", detail::sizes(out));
  char* send_base = static_cast<char*>(in.data_ptr());
  char* recv_base = static_cast<char*>(out.data_ptr());
  begin(stream);
  NCCL_CHECK_MSG(state_->comm, ncclGroupStart(), " (all_to_all on ", describe(), ")");
  for (int r = 0; r < size_; ++r) {
    if (send_counts[r] > 0)
      NCCL_CHECK_MSG(state_->comm,
                     ncclSend(send_base + send_offsets[r] * int64_t(elt), size_t(send_counts[r]) * elt, ncclUint8, r,
                              state_->comm, state_->stream),
                     " (all_to_all on ", describe(), ", to rank ", r, ")");
    if (recv_counts[r] > 0)
      NCCL_CHECK_MSG(state_->comm,
                     ncclRecv(recv_base + recv_offsets[r] * int64_t(elt), size_t(recv_counts[r]) * elt, ncclUint8, r,
                              state_->comm, state_->stream),
                     " (all_to_all on ", describe(), ", from rank ", r, ")");
  }
  NCCL_CHECK_MSG(state_->comm, ncclGroupEnd(), " (all_to_all on ", describe(), ", ", what, ")");
  end(stream, "all_to_all", what);
}

void NcclCommunicator::barrier() {
  std::vector<double> one(1, 0.0);
  all_reduce_host(one, ReduceOp::Sum);
}

void NcclCommunicator::all_reduce_host(std::span<double> values, ReduceOp op) {
  const std::string what = str_cat(reduce_op_name(op), " of ", values.size(), " host f64 values");
  for (size_t begin_at = 0; begin_at < values.size(); begin_at += kHostScratch) {
    const size_t n = std::min(kHostScratch, values.size() - begin_at);
    begin(nullptr);
    CUDA_CHECK_MSG(cudaMemcpyAsync(state_->scratch, values.data() + begin_at, n * sizeof(double),
                                   cudaMemcpyHostToDevice, state_->stream),
                   " (all_reduce_host on ", describe(), ")");
    NCCL_CHECK_MSG(state_->comm,
                   ncclAllReduce(state_->scratch, state_->scratch, n, ncclFloat64, nccl_op(op), state_->comm,
                                 state_->stream),
                   " on ", describe(), ", ", what);
    CUDA_CHECK_MSG(cudaMemcpyAsync(values.data() + begin_at, state_->scratch, n * sizeof(double),
                                   cudaMemcpyDeviceToHost, state_->stream),
                   " (all_reduce_host on ", describe(), ")");
    end(nullptr, "all_reduce_host", what);
    synchronize();
  }
}

void NcclCommunicator::synchronize() {
  CUDA_CHECK_MSG(cudaStreamSynchronize(state_->stream), " (communicator ", describe(), ")");
  state_->retired->release(/*all=*/false);
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, const std::string& name) {
  CUDA_CHECK(cudaSetDevice(state_->device));
  ncclComm_t child = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  NCCL_CHECK_MSG(state_->comm,
                 ncclCommSplit(state_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config),
                 " splitting ", describe(), " into '", name, "' (color ", color, ", key ", key, ")");
  if (color < 0 || child == nullptr) return nullptr;
  return std::make_unique<NcclCommunicator>(std::make_unique<State>(child, state_->device), name, timeout_,
                                            world_rank_);
}

}  // namespace megatron::comm
