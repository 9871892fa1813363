#include "megatron/comm/socket_communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "megatron/comm/host_reduction.h"

namespace megatron::comm {
namespace {

// Lanes of a group's channel: collectives and point-to-point batches never share one.
constexpr uint64_t kCollectiveLane = 1, kP2PLane = 0;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: every input bit moves every output bit
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// What a watched wait needs to report a timeout; a copy, so a pending batch outlives its communicator.
struct Watch {
  std::string group;
  std::chrono::milliseconds timeout;
  int world_rank;
};

// Finishes every transfer (done or failed) by driving the mesh, then throws the first failure, its text
// prefixed by `label(i)` (the operation, the group, the sizes): once it returns or throws, no transfer of `ts`
// touches its memory any more. Past the timeout: the report on stderr and the end of the process.
template <class Label>
void watched_wait(SocketMesh& mesh, const std::vector<std::shared_ptr<SocketMesh::Transfer>>& ts, const Watch& watch,
                  const char* op, const std::string& sizes, Label label) {
  const auto start = Clock::now();
  for (;;) {
    const auto unfinished = std::find_if(ts.begin(), ts.end(), [](const auto& t) { return !t->finished(); });
    if (unfinished == ts.end()) break;
    const std::chrono::duration<double> waited = Clock::now() - start;
    if (waited >= watch.timeout) {
      const std::string report =
          detail::timeout_report(watch.group, watch.timeout, op, sizes, waited, watch.world_rank);
      std::fprintf(stderr, "%s\n", report.c_str());
      std::fflush(stderr);
      std::fflush(stdout);
      std::_Exit(kWatchdogExitCode);  // closing the sockets tells the peers at once
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(watch.timeout - waited);
    mesh.progress(std::clamp(left + std::chrono::milliseconds(1), std::chrono::milliseconds(1),
                             std::chrono::milliseconds(200)));
  }
  for (size_t i = 0; i < ts.size(); ++i)
    if (!ts[i]->error.empty()) throw Error(str_cat(label(i), ": ", ts[i]->error));
}

// A batch_send_recv batch in flight: its transfers, the tensors they read and write, the ops' texts.
class SocketBatch final : public PendingP2P::Engine {
 public:
  SocketBatch(std::shared_ptr<SocketMesh> mesh, Watch watch, std::string what)
      : mesh_(std::move(mesh)), watch_(std::move(watch)), what_(std::move(what)) {}

  void add(std::shared_ptr<SocketMesh::Transfer> t, const P2POp& op) {
    transfers_.push_back(std::move(t));
    tensors_.push_back(op.tensor);
    ops_.push_back(detail::describe_p2p_op(op));
  }
  void wait(StreamHandle) override {
    if (tensors_.empty()) return;  // finished already (a failure was thrown by the first wait)
    const std::vector<Tensor> keep = std::move(tensors_);
    tensors_.clear();
    watched_wait(*mesh_, transfers_, watch_, "batch_send_recv", what_, [&](size_t i) { return label(i); });
  }
  bool done() override {
    if (tensors_.empty()) return true;
    mesh_->progress(std::chrono::milliseconds(0));
    for (const auto& t : transfers_)
      if (!t->finished()) return false;
    wait(nullptr);  // releases the tensors; throws a failure
    return true;
  }

 private:
  std::string label(size_t i) const {
    return str_cat("batch_send_recv on ", watch_.group, ": op ", i, " (", ops_[i], ")");
  }

  std::shared_ptr<SocketMesh> mesh_;
  Watch watch_;
  std::string what_;
  std::vector<std::shared_ptr<SocketMesh::Transfer>> transfers_;
  std::vector<Tensor> tensors_;
  std::vector<std::string> ops_;
};

std::vector<int64_t> even_offsets(int64_t count, int parts) {
  std::vector<int64_t> offsets(size_t(parts) + 1);
  for (int r = 0; r <= parts; ++r) offsets[size_t(r)] = count * r / parts;
  return offsets;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const char* a0 = static_cast<const char*>(a.data_ptr());
  const char* b0 = static_cast<const char*>(b.data_ptr());
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

std::byte* bytes_of(const Tensor& t) { return static_cast<std::byte*>(t.data_ptr()); }

}  // namespace

SocketCommunicator::SocketCommunicator(std::shared_ptr<SocketMesh> mesh, std::vector<int> members, uint64_t id,
                                       std::string name, std::chrono::milliseconds timeout)
    : mesh_(std::move(mesh)), members_(std::move(members)), id_(id >> 1), name_(std::move(name)), timeout_(timeout) {
  const auto me = std::find(members_.begin(), members_.end(), mesh_->rank());
  MEGATRON_CHECK(me != members_.end(), "SocketCommunicator '", name_, "': world rank ", mesh_->rank(),
                 " is not a member");
  rank_ = int(me - members_.begin());
}

std::unique_ptr<SocketCommunicator> SocketCommunicator::world(std::shared_ptr<SocketMesh> mesh, uint64_t id,
                                                             std::chrono::milliseconds timeout, std::string name) {
  std::vector<int> all(size_t(mesh->size()));
  std::iota(all.begin(), all.end(), 0);
  return std::make_unique<SocketCommunicator>(std::move(mesh), std::move(all), id, std::move(name), timeout);
}

void SocketCommunicator::send_to(Transfers& ts, int peer, const void* data, size_t bytes) {
  ts.push_back(mesh_->post_send(members_[size_t(peer)], id_ << 1 | kCollectiveLane, data, bytes));
}

void SocketCommunicator::recv_from(Transfers& ts, int peer, void* data, size_t bytes) {
  ts.push_back(mesh_->post_recv(members_[size_t(peer)], id_ << 1 | kCollectiveLane, data, bytes));
}

void SocketCommunicator::wait(const Transfers& ts, const char* op, const std::string& sizes) {
  watched_wait(*mesh_, ts, Watch{describe(), timeout_, mesh_->rank()}, op, sizes,
               [&](size_t) { return str_cat(op, " on ", describe(), " with ", sizes); });
}

void SocketCommunicator::reduce_chunks(const std::byte* data, const std::vector<int64_t>& offsets, DType dtype,
                                       ReduceOp op, std::byte* result, const char* op_name, const std::string& sizes) {
  const size_t elt = dtype_size(dtype);
  const int64_t mine = offsets[size_t(rank_) + 1] - offsets[size_t(rank_)];
  std::vector<std::vector<std::byte>> pieces(members_.size());
  Transfers ts;
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    pieces[size_t(p)].resize(size_t(mine) * elt);
    recv_from(ts, p, pieces[size_t(p)].data(), pieces[size_t(p)].size());
    send_to(ts, p, data + offsets[size_t(p)] * int64_t(elt), size_t(offsets[size_t(p) + 1] - offsets[size_t(p)]) * elt);
  }
  wait(ts, op_name, sizes);
  pieces[size_t(rank_)].assign(data + offsets[size_t(rank_)] * int64_t(elt),
                               data + offsets[size_t(rank_) + 1] * int64_t(elt));
  std::vector<std::byte> acc = std::move(pieces[0]);
  for (int p = 1; p < size(); ++p) reduce_into(dtype, op, acc.data(), pieces[size_t(p)].data(), mine);
  if (op == ReduceOp::Avg) divide_by_size(dtype, acc.data(), mine, size());
  if (!acc.empty()) std::memcpy(result, acc.data(), acc.size());
}

void SocketCommunicator::gather_chunks(std::byte* data, const std::vector<int64_t>& offsets, size_t elt,
                                       const char* op_name, const std::string& sizes) {
  const std::byte* mine = data + offsets[size_t(rank_)] * int64_t(elt);
  const size_t mine_bytes = size_t(offsets[size_t(rank_) + 1] - offsets[size_t(rank_)]) * elt;
  Transfers ts;
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    const size_t bytes = size_t(offsets[size_t(p) + 1] - offsets[size_t(p)]) * elt;
    recv_from(ts, p, data + offsets[size_t(p)] * int64_t(elt), bytes);
    send_to(ts, p, mine, mine_bytes);
  }
  wait(ts, op_name, sizes);
}

void SocketCommunicator::reduce_all(std::byte* data, int64_t count, DType dtype, ReduceOp op, const char* op_name,
                                    const std::string& sizes) {
  const std::vector<int64_t> offsets = even_offsets(count, size());
  const size_t elt = dtype_size(dtype);
  reduce_chunks(data, offsets, dtype, op, data + offsets[size_t(rank_)] * int64_t(elt), op_name, sizes);
  gather_chunks(data, offsets, elt, op_name, sizes);
}

void SocketCommunicator::all_reduce(const Tensor& t, ReduceOp op, StreamHandle) {
  detail::check_tensor(*this, "all_reduce", "t", t);
  MEGATRON_CHECK(host_reducible(t.dtype()), "all_reduce on ", describe(), ": cannot reduce ", t.describe());
  if (size() == 1) return;
  reduce_all(bytes_of(t), t.numel(), t.dtype(), op, "all_reduce",
             str_cat(reduce_op_name(op), " of ", detail::sizes(t)));
}

void SocketCommunicator::reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, StreamHandle) {
  detail::check_tensor(*this, "reduce_scatter", "out", out);
  detail::check_tensor(*this, "reduce_scatter", "in", in);
  MEGATRON_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() * size(), "reduce_scatter on ", describe(),
                 ": in ", in.describe(), " must hold ", size(), " chunks of out ", out.describe());
  MEGATRON_CHECK(host_reducible(in.dtype()), "reduce_scatter on ", describe(), ": cannot reduce ", in.describe());
  std::vector<int64_t> offsets(members_.size() + 1);
  for (size_t r = 0; r < offsets.size(); ++r) offsets[r] = int64_t(r) * out.numel();
  const std::string what = str_cat(reduce_op_name(op), " of ", detail::sizes(in), " into ", out.numel(), " per rank");
  reduce_chunks(bytes_of(in), offsets, in.dtype(), op, bytes_of(out), "reduce_scatter", what);
}

void SocketCommunicator::all_gather(const Tensor& out, const Tensor& in, StreamHandle) {
  detail::check_tensor(*this, "all_gather", "out", out);
  detail::check_tensor(*this, "all_gather", "in", in);
  MEGATRON_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * size(), "all_gather on ", describe(),
                 ": out ", out.describe(), " must hold ", size(), " chunks of in ", in.describe());
  std::byte* own = bytes_of(out) + int64_t(rank_) * int64_t(in.nbytes());
  const bool in_place = bytes_of(in) == own;
  MEGATRON_CHECK(in_place || !overlaps(out, in), "all_gather on ", describe(), ": in overlaps out but is not rank ",
                 rank_, "'s chunk of it");
  if (!in_place && in.nbytes() > 0) std::memcpy(own, in.data_ptr(), in.nbytes());
  std::vector<int64_t> offsets(members_.size() + 1);
  for (size_t r = 0; r < offsets.size(); ++r) offsets[r] = int64_t(r) * int64_t(in.nbytes());
  gather_chunks(bytes_of(out), offsets, 1, "all_gather", str_cat(detail::sizes(in), " per rank"));
}

void SocketCommunicator::broadcast(const Tensor& t, int root, StreamHandle) {
  detail::check_tensor(*this, "broadcast", "t", t);
  MEGATRON_CHECK(root >= 0 && root < size(), "broadcast on ", describe(), ": root ", root,
                 " is not a rank of the group");
  const std::string what = str_cat(detail::sizes(t), " from rank ", root);
  const int n = size(), relative = (rank_ - root + n) % n;
  const auto actual = [&](int r) { return (r + root) % n; };
  int mask = 1;
  for (; mask < n; mask <<= 1)  // the lowest set bit of `relative` names the parent
    if (relative & mask) {
      Transfers ts;
      recv_from(ts, actual(relative - mask), t.data_ptr(), t.nbytes());
      wait(ts, "broadcast", what);
      break;
    }
  Transfers ts;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (relative + mask < n) send_to(ts, actual(relative + mask), t.data_ptr(), t.nbytes());
  wait(ts, "broadcast", what);
}

PendingP2P SocketCommunicator::batch_send_recv(std::span<const P2POp> ops, StreamHandle stream) {
  if (ops.empty()) return {};
  std::string what = detail::check_p2p(*this, ops);
  auto batch = std::make_unique<SocketBatch>(mesh_, Watch{describe(), timeout_, mesh_->rank()}, std::move(what));
  for (const P2POp& op : ops) {
    const int peer = members_[size_t(op.peer)];
    const uint64_t channel = id_ << 1 | kP2PLane;
    batch->add(op.kind == P2POp::Kind::Send ? mesh_->post_send(peer, channel, op.tensor.data_ptr(), op.tensor.nbytes())
                                            : mesh_->post_recv(peer, channel, op.tensor.data_ptr(), op.tensor.nbytes()),
               op);
  }
  return PendingP2P(std::move(batch), stream);
}

void SocketCommunicator::all_to_all(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in,
                                    std::span<const int64_t> send_counts, StreamHandle) {
  auto [send_offsets, recv_offsets] = detail::all_to_all_offsets(*this, out, recv_counts, in, send_counts);
  MEGATRON_CHECK(!overlaps(out, in), "all_to_all on ", describe(), ": in and out overlap");
  const int64_t elt = int64_t(dtype_size(in.dtype()));
  const size_t me = size_t(rank_);
  if (send_counts[me] > 0)
    std::memcpy(bytes_of(out) + recv_offsets[me] * elt, bytes_of(in) + send_offsets[me] * elt,
                size_t(send_counts[me] * elt));
  Transfers ts;
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    recv_from(ts, p, bytes_of(out) + recv_offsets[size_t(p)] * elt, size_t(recv_counts[size_t(p)] * elt));
    send_to(ts, p, bytes_of(in) + send_offsets[size_t(p)] * elt, size_t(send_counts[size_t(p)] * elt));
  }
  wait(ts, "all_to_all", str_cat("send ", detail::sizes(in), ", receive ", detail::sizes(out)));
}

void SocketCommunicator::barrier() {
  for (int step = 1; step < size(); step <<= 1) {
    Transfers ts;
    send_to(ts, (rank_ + step) % size(), nullptr, 0);
    recv_from(ts, (rank_ - step + size()) % size(), nullptr, 0);
    wait(ts, "barrier", "no data");
  }
}

void SocketCommunicator::all_reduce_host(std::span<double> values, ReduceOp op) {
  if (size() == 1 || values.empty()) return;
  reduce_all(reinterpret_cast<std::byte*>(values.data()), int64_t(values.size()), DType::F64, op, "all_reduce_host",
             str_cat(reduce_op_name(op), " of ", values.size(), " host f64 values"));
}

std::unique_ptr<Communicator> SocketCommunicator::split(int color, int key, const std::string& name) {
  std::vector<int32_t> table(2 * members_.size());
  table[2 * size_t(rank_)] = color < 0 ? -1 : color;
  table[2 * size_t(rank_) + 1] = key;
  std::vector<int64_t> offsets(members_.size() + 1);
  for (size_t r = 0; r < offsets.size(); ++r) offsets[r] = int64_t(8 * r);
  gather_chunks(reinterpret_cast<std::byte*>(table.data()), offsets, 1, "split",
                str_cat("(color, key) of every rank, splitting into '", name, "'"));
  const uint64_t child = mix(mix(id_ ^ mix(++splits_)) ^ uint64_t(uint32_t(color)));
  if (color < 0) return nullptr;
  std::vector<int> ranks;  // group ranks of this group with my color, ordered by (key, rank)
  for (int r = 0; r < size(); ++r)
    if (table[2 * size_t(r)] == color) ranks.push_back(r);
  const auto key_of = [&](int r) { return table[2 * size_t(r) + 1]; };
  std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) { return key_of(a) < key_of(b); });
  std::vector<int> members;
  for (int r : ranks) members.push_back(members_[size_t(r)]);
  return std::make_unique<SocketCommunicator>(mesh_, std::move(members), child, name, timeout_);
}

}  // namespace megatron::comm
