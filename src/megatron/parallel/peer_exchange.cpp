#include "megatron/parallel/peer_exchange.h"

#include <iostream>

#include "megatron/core/error.h"

#if MEGATRON_WITH_CUDA
#include <cuda_runtime.h>

#include "megatron/core/cuda_check.h"
#include "megatron/parallel/peer_flags.h"
#endif

namespace megatron::parallel {

#if MEGATRON_WITH_CUDA

namespace {
int64_t round_up(int64_t bytes, int64_t to) { return (bytes + to - 1) / to * to; }
}  // namespace

// This rank's allocation and every peer's, mapped: [arrival words x n | free words x n | pad] then `depth` slots
// for each source (every rank by number, or only the previous one). Rank r's arrival word s is raised by s when
// a push of s into r has landed; r's free word p is raised by p when p has released a slot it holds for r.
struct PeerExchange::Mapping {
  std::vector<std::byte*> base;  // per rank; base[rank] is our own cudaMalloc, the others IPC mappings
  int64_t flag_bytes = 0;
  int rank = 0, size = 0, depth = 1;
  bool from_previous_only = false;

  uint64_t* arrival_word(int on, int from) const { return reinterpret_cast<uint64_t*>(base[size_t(on)]) + from; }
  uint64_t* free_word(int on, int from) const {
    return reinterpret_cast<uint64_t*>(base[size_t(on)]) + size + from;
  }
  // Slot of push number `n` (from 1) of rank `from` on rank `on`.
  std::byte* slot(int on, int from, uint64_t n, int64_t slot_bytes) const {
    const int64_t source = from_previous_only ? 0 : from;
    return base[size_t(on)] + flag_bytes + (source * depth + int64_t((n - 1) % uint64_t(depth))) * slot_bytes;
  }

  ~Mapping() {
    cudaDeviceSynchronize();  // nothing of ours still copies into or out of these
    for (size_t r = 0; r < base.size(); ++r) {
      if (base[r] == nullptr) continue;
      if (int(r) == rank) cudaFree(base[r]);
      else cudaIpcCloseMemHandle(base[r]);
    }
    cudaGetLastError();  // a destructor reports nothing; leave no error behind for the next check
  }
};

std::unique_ptr<PeerExchange> PeerExchange::create(Context& ctx, comm::Communicator& group, int64_t slot_bytes,
                                                   PeerExchangeOptions options) {
  MEGATRON_CHECK(options.depth >= 1, "PeerExchange: depth ", options.depth, " (at least one slot per source)");
  if (!ctx.is_cuda() || group.size() < 2) return nullptr;
  const int n = group.size(), me = group.rank();
  std::unique_ptr<PeerExchange> px(new PeerExchange());
  px->group_ = &group;
  px->rank_ = me;
  px->size_ = n;
  px->device_ = ctx.device().index;
  px->slot_bytes_ = round_up(std::max<int64_t>(slot_bytes, 1), 1 << 20);
  px->options_ = options;
  px->pushed_.assign(size_t(n), 0);
  px->arrived_.assign(size_t(n), 0);
  px->released_.assign(size_t(n), 0);
  auto m = std::make_unique<Mapping>();
  m->rank = me;
  m->size = n;
  m->depth = options.depth;
  m->from_previous_only = options.from_previous_only;
  m->flag_bytes = round_up(2 * int64_t(n) * int64_t(sizeof(uint64_t)), 4096);
  m->base.assign(size_t(n), nullptr);
  const int64_t sources = options.from_previous_only ? 1 : n;

  // Our buffer and its handle; every rank takes part in both exchanges below whatever happened here.
  void* own = nullptr;
  cudaIpcMemHandle_t handle{};
  bool ok = cudaMalloc(&own, size_t(m->flag_bytes + sources * options.depth * px->slot_bytes_)) == cudaSuccess;
  if (ok) {
    m->base[size_t(me)] = static_cast<std::byte*>(own);
    ok = cudaMemset(own, 0, size_t(m->flag_bytes)) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess &&
         cudaIpcGetMemHandle(&handle, own) == cudaSuccess;
  }
  // Every rank's handle through the host all-reduce: a sum of zeros but for each rank's own bytes.
  constexpr size_t kBytes = sizeof(cudaIpcMemHandle_t);
  std::vector<double> table(size_t(n) * (kBytes + 1), 0.0);
  double* mine = table.data() + size_t(me) * (kBytes + 1);
  mine[0] = ok ? 1.0 : 0.0;
  const auto* bytes = reinterpret_cast<const unsigned char*>(&handle);
  for (size_t i = 0; i < kBytes; ++i) mine[1 + i] = double(bytes[i]);
  group.all_reduce_host(table, comm::ReduceOp::Sum);
  for (int r = 0; r < n; ++r) ok = ok && table[size_t(r) * (kBytes + 1)] == 1.0;
  for (int r = 0; r < n && ok; ++r) {
    if (r == me) continue;
    cudaIpcMemHandle_t theirs{};
    auto* out = reinterpret_cast<unsigned char*>(&theirs);
    for (size_t i = 0; i < kBytes; ++i) out[i] = static_cast<unsigned char>(table[size_t(r) * (kBytes + 1) + 1 + i]);
    void* mapped = nullptr;
    ok = cudaIpcOpenMemHandle(&mapped, theirs, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess;
    if (ok) m->base[size_t(r)] = static_cast<std::byte*>(mapped);
  }
  std::vector<double> failed(1, ok ? 0.0 : 1.0);
  group.all_reduce_host(failed, comm::ReduceOp::Max);
  cudaGetLastError();  // a refused mapping is an answer here, not an error for the next kernel launch
  if (failed[0] != 0.0) return nullptr;  // ~Mapping unmaps and frees what was made
  px->mapping_ = std::move(m);
  return px;
}

void PeerExchange::check_peer(const char* what, int peer) const {
  MEGATRON_CHECK(peer != rank_ && peer >= 0 && peer < size_, "PeerExchange::", what, ": rank ", peer, " of ", size_,
                 " (this rank is ", rank_, ")");
}

Tensor PeerExchange::slot(int src, const Shape& shape, DType dtype, int64_t byte_offset) const {
  check_peer("slot", src);
  const uint64_t n = arrived_[size_t(src)];
  MEGATRON_CHECK(n > 0, "PeerExchange::slot: nothing from rank ", src, " has been waited for yet");
  MEGATRON_CHECK(byte_offset >= 0 && byte_offset + int64_t(shape.numel()) * int64_t(dtype_size(dtype)) <= slot_bytes_,
                 "PeerExchange::slot: ", shape.numel(), " elements of ", dtype, " from byte ", byte_offset,
                 " exceed the ", slot_bytes_, "-byte slot");
  return Tensor::from_blob(mapping_->slot(rank_, src, n, slot_bytes_) + byte_offset, shape, dtype,
                           Device::cuda(device_));
}

void PeerExchange::push(StreamHandle stream, std::span<const Tensor> parts, int dst) {
  check_peer("push", dst);
  MEGATRON_CHECK(!options_.from_previous_only || dst == (rank_ + 1) % size_, "PeerExchange::push: a ring exchange ",
                 "pushes to rank ", (rank_ + 1) % size_, " only, not ", dst);
  int64_t bytes = 0;
  for (const Tensor& part : parts) bytes += int64_t(part.nbytes());
  MEGATRON_CHECK(bytes <= slot_bytes_, "PeerExchange::push: ", bytes, " bytes exceed the ", slot_bytes_,
                 "-byte slot");
  const uint64_t n = ++pushed_[size_t(dst)], depth = uint64_t(options_.depth);
  if (n > depth) {  // dst has read that slot
    enqueue_wait_at_least(stream, mapping_->free_word(rank_, dst), n - depth);
    group_->watch_stream(stream, "peer exchange push",
                         str_cat("rank ", dst, "'s release of push ", n - depth, " (copy engines)"));
  }
  std::byte* to = mapping_->slot(dst, rank_, n, slot_bytes_);
  for (const Tensor& part : parts) {
    CUDA_CHECK(cudaMemcpyAsync(to, part.data_ptr(), part.nbytes(), cudaMemcpyDeviceToDevice, stream));
    to += part.nbytes();
  }
  enqueue_raise(stream, mapping_->arrival_word(dst, rank_), n);
}

void PeerExchange::wait_arrival(StreamHandle stream, int src) {
  check_peer("wait_arrival", src);
  const uint64_t n = ++arrived_[size_t(src)];
  enqueue_wait_at_least(stream, mapping_->arrival_word(rank_, src), n);
  group_->watch_stream(stream, "peer exchange wait", str_cat("push ", n, " from rank ", src, " (copy engines)"));
}

void PeerExchange::release(StreamHandle stream, int src) {
  check_peer("release", src);
  enqueue_raise(stream, mapping_->free_word(src, rank_), ++released_[size_t(src)]);
}

#else

struct PeerExchange::Mapping {};

std::unique_ptr<PeerExchange> PeerExchange::create(Context&, comm::Communicator&, int64_t, PeerExchangeOptions) {
  return nullptr;
}
void PeerExchange::check_peer(const char*, int) const {}
Tensor PeerExchange::slot(int, const Shape&, DType, int64_t) const {
  MEGATRON_FAIL("PeerExchange: a build without CUDA");
}
void PeerExchange::push(StreamHandle, std::span<const Tensor>, int) {
  MEGATRON_FAIL("PeerExchange: a build without CUDA");
}
void PeerExchange::wait_arrival(StreamHandle, int) { MEGATRON_FAIL("PeerExchange: a build without CUDA"); }
void PeerExchange::release(StreamHandle, int) { MEGATRON_FAIL("PeerExchange: a build without CUDA"); }

#endif

PeerExchange::~PeerExchange() = default;

std::shared_ptr<PeerExchange> PeerExchangeCache::get(Context& ctx, comm::Communicator& group, int64_t bytes) {
  if (unavailable_) return nullptr;
  if (exchange_ && exchange_->slot_bytes() >= bytes) return exchange_;
  if (exchange_) {  // larger slots: every rank is here at the same call, after the same transfers
#if MEGATRON_WITH_CUDA
    CUDA_CHECK(cudaDeviceSynchronize());  // our last raises into the peers' words have landed
#endif
    group.barrier();  // and theirs into ours: nobody touches the old buffers any more
    exchange_.reset();
  }
  exchange_ = PeerExchange::create(ctx, group, bytes, options_);
  if (!exchange_) {
    unavailable_ = true;
    if (group.rank() == 0)
      std::cerr << "tp-comm-overlap: the ranks of " << group.describe()
                << " cannot map each other's GPU memory (CUDA IPC); the pipelined collectives use "
                << group.backend() << " instead of the copy engines\n";
  }
  return exchange_;
}

}  // namespace megatron::parallel
