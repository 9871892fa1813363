// The socket communicator (the CPU engine of torchrun launches) against the MPI communicator in one mpiexec
// job of 2 and of 3 ranks: the same random inputs through both engines, every dtype MPI reduces, odd sizes
// (empty included), every reduction, in place and not; all-to-all with random uneven counts; splits with
// random colors (some opting out) and tied keys, and a split of a split; point-to-point rings in both
// directions.
// With two ranks every result must be the same bits as MPI's (a reduction of two terms does not depend on
// the order). With three, data movement, integer and max reductions must be the same bits as MPI's; float
// sums must be the same bits as the fold of the inputs in rank order (the socket engine's documented order,
// computed here independently) and within rounding of MPI's (whose order is its algorithm's).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "harness.h"
#include "megatron/comm/mpi_communicator.h"
#include "megatron/core/philox.h"
#include "mpi_world.h"
#include "socket_world.h"

namespace megatron::comm {
namespace {

struct Engines {
  Communicator& mpi;
  Communicator& socket;
};

Engines engines() {
  static std::unique_ptr<Communicator> socket =
      testing::socket_world(*testing::mpi_world(), timeout_from_minutes(2.0));
  return {*testing::mpi_world(), *socket};
}

const DType kReducible[] = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I8,
                            DType::I16, DType::I32, DType::I64,  DType::U8,  DType::U16};

bool is_float(DType dt) { return dt == DType::F32 || dt == DType::F64 || dt == DType::BF16 || dt == DType::F16; }

// Rank r's input of case `what` (every rank can make every rank's).
Tensor input(DType dt, int64_t n, const std::string& what, int r) {
  static CpuAllocator host;
  Tensor t = Tensor::empty(Shape{n}, dt, host);
  // Integer sums stay in range: on overflow MPI's result is the implementation's (OpenMPI's vectorised 8-bit
  // sums saturate), the socket engine's wraps around.
  const double hi = is_float(dt) ? 1 : dt == DType::I8 ? 40 : dt == DType::U8 ? 80 : 100;
  const double lo = is_float(dt) ? -1 : (dt == DType::U8 || dt == DType::U16) ? 0 : -hi;
  testing::fill_random(t, testing::seed_from(str_cat(what, "#", r)), lo, hi);
  return t;
}

Tensor copy_of(const Tensor& t) {
  static CpuAllocator host;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), host);
  if (t.nbytes() > 0) std::memcpy(c.data_ptr(), t.data_ptr(), t.nbytes());
  return c;
}

// The first differing element, or "" when the bytes are equal.
std::string first_difference(const Tensor& got, const Tensor& expected) {
  const size_t elt = dtype_size(got.dtype());
  const char* g = static_cast<const char*>(got.data_ptr());
  const char* x = static_cast<const char*>(expected.data_ptr());
  if (got.nbytes() == expected.nbytes() && std::memcmp(g, x, got.nbytes()) == 0) return "";
  const std::vector<double> a = testing::to_doubles(testing::cpu_context(), got);
  const std::vector<double> b = testing::to_doubles(testing::cpu_context(), expected);
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (std::memcmp(g + i * elt, x + i * elt, elt) != 0)
      return str_cat("element ", i, ": ", a[i], " vs ", b[i]);
  return str_cat("sizes ", got.nbytes(), " vs ", expected.nbytes(), " bytes");
}

void expect_same_bits(const Tensor& got, const Tensor& expected, const std::string& what) {
  const std::string diff = first_difference(got, expected);
  EXPECT_TRUE(diff.empty()) << what << ": " << diff;
}

void expect_within_rounding(const Tensor& got, const Tensor& mpi, DType dt, const std::string& what) {
  const double tol = dt == DType::F64 ? 1e-13 : dt == DType::F32 ? 1e-6 : dt == DType::F16 ? 4e-3 : 3e-2;
  const std::vector<double> a = testing::to_doubles(testing::cpu_context(), got);
  const std::vector<double> b = testing::to_doubles(testing::cpu_context(), mpi);
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - b[i]) <= tol * 3.0)) {
      ADD_FAILURE() << what << ": element " << i << " is " << a[i] << " on sockets, " << b[i] << " on MPI";
      return;
    }
}

// acc = acc op x, element-wise, as the engines' contract states it (restated here, not borrowed).
template <class T>
T fold_step(T a, T b, ReduceOp op) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return op == ReduceOp::Max ? std::max(a, b) : T(U(U(a) + U(b)));
  } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return op == ReduceOp::Max ? std::max(a, b) : T(a + b);
  } else {
    const float x = to_float(a), y = to_float(b);
    return from_float<T>(op == ReduceOp::Max ? std::max(x, y) : x + y);
  }
}

// Elements [begin, end) of every rank's input folded in rank order (Avg: then divided by the size).
Tensor rank_order_fold(DType dt, int64_t n, int64_t begin, int64_t end, const std::string& what, int size,
                       ReduceOp op) {
  Tensor acc = copy_of(input(dt, n, what, 0).slice(begin, end));
  visit_dtype(dt, [&]<class T>() {
    if constexpr (!std::is_same_v<T, fp8e4m3_t> && !std::is_same_v<T, fp8e5m2_t>) {
      T* a = static_cast<T*>(acc.data_ptr());
      for (int r = 1; r < size; ++r) {
        const Tensor x = input(dt, n, what, r);
        const T* b = static_cast<const T*>(x.data_ptr());
        for (int64_t i = begin; i < end; ++i) a[i - begin] = fold_step(a[i - begin], b[i], op);
      }
      if (op == ReduceOp::Avg)
        for (int64_t i = 0; i < end - begin; ++i) {
          if constexpr (std::is_integral_v<T>) a[i] = T(a[i] / size);
          else a[i] = from_double<T>(to_double(a[i]) / double(size));
        }
    }
  });
  return acc;
}

// Compares a reduction's results: socket vs MPI, and vs the rank-order fold where the order matters.
void expect_reduction_matches(const Tensor& sock, const Tensor& mpi, DType dt, ReduceOp op, int size,
                              const std::function<Tensor()>& fold, const std::string& what) {
  if (size == 2 || !is_float(dt) || op == ReduceOp::Max) {
    expect_same_bits(sock, mpi, what + " (socket vs MPI)");
  } else {
    expect_same_bits(sock, fold(), what + " (socket vs rank-order fold)");
    expect_within_rounding(sock, mpi, dt, what);
  }
}

TEST(SocketVsMpi, AllReduceEveryDtypeAndOp) {
  Engines e = engines();
  const int me = e.mpi.rank(), size = e.mpi.size();
  for (DType dt : kReducible)
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1025), int64_t(100003)})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
        const std::string what = str_cat("all_reduce ", reduce_op_name(op), " ", dtype_name(dt), "[", n, "]");
        Tensor sock = input(dt, n, what, me), mpi = input(dt, n, what, me);
        e.socket.all_reduce(sock, op);
        e.mpi.all_reduce(mpi, op);
        const auto fold = [&] { return rank_order_fold(dt, n, 0, n, what, size, op); };
        expect_reduction_matches(sock, mpi, dt, op, size, fold, what);
      }
}

TEST(SocketVsMpi, ReduceScatterInPlaceAndNot) {
  Engines e = engines();
  const int me = e.mpi.rank(), size = e.mpi.size();
  for (DType dt : {DType::F32, DType::BF16, DType::F64, DType::I32, DType::U16})
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(333)})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max})
        for (bool in_place : {false, true}) {
          const std::string what = str_cat("reduce_scatter ", reduce_op_name(op), " ", dtype_name(dt), " ", n,
                                           " per rank", in_place ? " in place" : "");
          Tensor in_sock = input(dt, n * size, what, me), in_mpi = input(dt, n * size, what, me);
          Tensor out_sock = in_place ? in_sock.slice(me * n, (me + 1) * n) : copy_of(in_sock.slice(0, n));
          Tensor out_mpi = in_place ? in_mpi.slice(me * n, (me + 1) * n) : copy_of(in_mpi.slice(0, n));
          e.socket.reduce_scatter(out_sock, in_sock, op);
          e.mpi.reduce_scatter(out_mpi, in_mpi, op);
          const auto fold = [&] { return rank_order_fold(dt, n * size, me * n, (me + 1) * n, what, size, op); };
          expect_reduction_matches(out_sock, out_mpi, dt, op, size, fold, what);
        }
}

TEST(SocketVsMpi, AllReduceHost) {
  Engines e = engines();
  const int me = e.mpi.rank(), size = e.mpi.size();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
    const std::string what = str_cat("all_reduce_host ", reduce_op_name(op));
    Tensor values = input(DType::F64, 37, what, me);
    std::vector<double> sock(37), mpi(37);
    std::memcpy(sock.data(), values.data_ptr(), values.nbytes());
    mpi = sock;
    e.socket.all_reduce_host(sock, op);
    e.mpi.all_reduce_host(mpi, op);
    expect_reduction_matches(Tensor::from_blob(sock.data(), Shape{37}, DType::F64, Device::cpu()),
                             Tensor::from_blob(mpi.data(), Shape{37}, DType::F64, Device::cpu()), DType::F64, op, size,
                             [&] { return rank_order_fold(DType::F64, 37, 0, 37, what, size, op); }, what);
  }
}

TEST(SocketVsMpi, DataMovementIsTheSameBits) {
  Engines e = engines();
  const int me = e.mpi.rank(), size = e.mpi.size();
  for (DType dt : {DType::U8, DType::F16, DType::I64, DType::F8E4M3})
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(333)}) {
      const std::string what = str_cat("all_gather ", dtype_name(dt), "[", n, "]");
      Tensor mine = input(dt == DType::F8E4M3 ? DType::U8 : dt, n, what, me);  // fp8: any bytes
      Tensor in = Tensor::from_blob(mine.data_ptr(), Shape{n}, dt, Device::cpu());
      const int64_t out_bytes = n * size * int64_t(dtype_size(dt));
      Tensor sock_bytes = input(DType::U8, out_bytes, "poison", me), mpi_bytes = copy_of(sock_bytes);
      Tensor sock = Tensor::from_blob(sock_bytes.data_ptr(), Shape{n * size}, dt, Device::cpu());
      Tensor mpi_out = Tensor::from_blob(mpi_bytes.data_ptr(), Shape{n * size}, dt, Device::cpu());
      e.socket.all_gather(sock, in);
      e.mpi.all_gather(mpi_out, in);
      expect_same_bits(sock, mpi_out, what);
    }
  for (int root = 0; root < size; ++root)
    for (int64_t n : {int64_t(0), int64_t(5), int64_t(100003)}) {
      const std::string what = str_cat("broadcast f32[", n, "] from ", root);
      Tensor sock = input(DType::F32, n, what, me), mpi = input(DType::F32, n, what, me);
      e.socket.broadcast(sock, root);
      e.mpi.broadcast(mpi, root);
      expect_same_bits(sock, mpi, what);
      expect_same_bits(sock, input(DType::F32, n, what, root), what + " (root's values)");
    }
}

TEST(SocketVsMpi, AllToAllWithRandomUnevenCounts) {
  Engines e = engines();
  const int me = e.mpi.rank(), size = e.mpi.size();
  for (int round = 0; round < 4; ++round)
    for (DType dt : {DType::F32, DType::I16}) {
      const std::string what = str_cat("all_to_all round ", round, " ", dtype_name(dt));
      // count(from, to): the same table on every rank, zeros included.
      const auto count = [&](int from, int to) {
        return int64_t(philox_uniform(testing::seed_from(what), 7, uint64_t(from * size + to)) * 40.0) % 40;
      };
      std::vector<int64_t> send_counts, recv_counts;
      int64_t total_in = 0, total_out = 0;
      for (int p = 0; p < size; ++p) {
        send_counts.push_back(count(me, p));
        recv_counts.push_back(count(p, me));
        total_in += send_counts.back();
        total_out += recv_counts.back();
      }
      Tensor in = input(dt, total_in, what, me);
      Tensor sock = copy_of(input(dt, total_out, "out", me)), mpi = copy_of(sock);
      e.socket.all_to_all(sock, recv_counts, in, send_counts);
      e.mpi.all_to_all(mpi, recv_counts, in, send_counts);
      expect_same_bits(sock, mpi, what);
    }
}

// Random colors (-1: opting out) and keys with ties, the same table on every rank; then a split of the split.
TEST(SocketVsMpi, SplitsFollowMpiCommSplit) {
  Engines e = engines();
  const int me = e.mpi.rank();
  for (int round = 0; round < 6; ++round) {
    const uint64_t seed = testing::seed_from(str_cat("split ", round));
    const auto draw = [&](int r, int k, int range) {
      return int(philox_uniform(seed, uint64_t(k), uint64_t(r)) * range);
    };
    const int color = draw(me, 0, 4) - 1, key = draw(me, 1, 3) - 1;
    const std::string name = str_cat("split", round);
    std::unique_ptr<Communicator> sock = e.socket.split(color, key, name);
    std::unique_ptr<Communicator> mpi = e.mpi.split(color, key, name);
    ASSERT_EQ(sock == nullptr, mpi == nullptr) << name;
    ASSERT_EQ(sock == nullptr, color < 0) << name;
    if (!sock) continue;
    EXPECT_EQ(sock->size(), mpi->size()) << name;
    EXPECT_EQ(sock->rank(), mpi->rank()) << name;
    EXPECT_EQ(sock->name(), name);
    double sv[2] = {double(me) + 0.25, -double(me)}, mv[2] = {sv[0], sv[1]};
    sock->all_reduce_host(sv, ReduceOp::Sum);
    mpi->all_reduce_host(mv, ReduceOp::Sum);
    EXPECT_EQ(sv[0], mv[0]) << name;
    EXPECT_EQ(sv[1], mv[1]) << name;
    // A split of the split: ranks in reverse order.
    std::unique_ptr<Communicator> sock2 = sock->split(0, -sock->rank(), name + "/reversed");
    std::unique_ptr<Communicator> mpi2 = mpi->split(0, -mpi->rank(), name + "/reversed");
    EXPECT_EQ(sock2->rank(), mpi2->rank()) << name;
    EXPECT_EQ(sock2->rank(), sock->size() - 1 - sock->rank()) << name;
    Tensor t = input(DType::F32, 101, name, me), u = copy_of(t);
    sock2->broadcast(t, 0);
    mpi2->broadcast(u, 0);
    expect_same_bits(t, u, name + " broadcast in the split of the split");
  }
}

// A ring in both directions in one batch, different dtypes and sizes per direction; then two batches in
// flight at once over the ring the other way.
TEST(SocketVsMpi, PointToPointRingsBothDirections) {
  Engines e = engines();
  const int me = e.mpi.rank(), size = e.mpi.size();
  const int next = (me + 1) % size, prev = (me + size - 1) % size;
  for (Communicator* c : {&e.socket, &e.mpi}) {
    const std::string engine = c->backend();
    Tensor fwd = input(DType::BF16, 4099, "fwd", me), bwd = input(DType::I32, 31, "bwd", me);
    Tensor from_prev = copy_of(input(DType::BF16, 4099, "junk", me));
    Tensor from_next = copy_of(input(DType::I32, 31, "junk", me));
    // With two ranks next == prev: the sends (fwd, bwd) meet the receives (from_prev, from_next) in order.
    const std::vector<P2POp> ops = {P2POp::recv(from_prev, prev), P2POp::send(fwd, next), P2POp::send(bwd, prev),
                                    P2POp::recv(from_next, next)};
    c->batch_send_recv(ops).wait();
    expect_same_bits(from_prev, input(DType::BF16, 4099, "fwd", prev), engine + ": forward ring");
    expect_same_bits(from_next, input(DType::I32, 31, "bwd", next), engine + ": backward ring");
    Tensor a = input(DType::F64, 3, "a", me), b = input(DType::F64, 70001, "b", me);
    Tensor got_a = copy_of(a), got_b = copy_of(b);
    PendingP2P first = c->batch_send_recv(std::vector<P2POp>{P2POp::send(a, prev), P2POp::recv(got_a, next)});
    PendingP2P second = c->batch_send_recv(std::vector<P2POp>{P2POp::recv(got_b, next), P2POp::send(b, prev)});
    second.wait();
    first.wait();
    expect_same_bits(got_a, input(DType::F64, 3, "a", next), engine + ": first batch");
    expect_same_bits(got_b, input(DType::F64, 70001, "b", next), engine + ": second batch");
  }
}

// A receive whose size differs from the send is refused with both sizes; the group stays in step.
TEST(SocketVsMpi, MismatchedReceiveSizeIsReported) {
  Engines e = engines();
  const int me = e.socket.rank(), size = e.socket.size();
  const int next = (me + 1) % size, prev = (me + size - 1) % size;
  Tensor sent = input(DType::F32, 10, "mismatch", me), got = copy_of(input(DType::F32, 12, "junk", me));
  const std::vector<P2POp> ops = {P2POp::send(sent, next), P2POp::recv(got, prev)};
  testing::expect_error([&] { e.socket.batch_send_recv(ops).wait(); },
                        {"batch_send_recv on group 'world'", "op 1 (recv 12 f32 elements (48 bytes) from rank",
                         "received a message of 40 bytes where 48 were expected"});
  Tensor ok = copy_of(sent);
  e.socket.batch_send_recv(std::vector<P2POp>{P2POp::send(sent, next), P2POp::recv(ok, prev)}).wait();
  expect_same_bits(ok, input(DType::F32, 10, "mismatch", prev), "the exchange after the refused one");
}

}  // namespace
}  // namespace megatron::comm
