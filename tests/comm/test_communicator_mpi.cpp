// Every collective of the Communicator against a direct computation, under `mpiexec -np N`: each rank
// fills its inputs from Philox seeded by (case, rank), so every rank can recompute every other rank's
// inputs and the expected result locally. Odd sizes, several dtypes, in-place and out-of-place forms,
// uneven all-to-all counts, splits, and point-to-point batches (ring exchanges in both directions, two ranks
// that both send first, several messages to one peer, asynchronous completion, refused batches). The same
// checks run on MPI (CPU tensors; suite Communicator), on the socket engine of torchrun launches (CPU tensors,
// its world made by the TCP rendezvous in the same job; the Socket tests) and on NCCL (CUDA tensors, one GPU
// per rank, bootstrapped over MPI and over the sockets; suite CommunicatorGpu, label gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "harness.h"
#include "megatron/comm/self_communicator.h"
#include "mpi_world.h"
#include "socket_world.h"
#if MEGATRON_WITH_NCCL
#include "megatron/comm/nccl_communicator.h"
#include "megatron/core/cuda_check.h"
#include "megatron/runtime/cuda_stream.h"
#endif

namespace megatron::comm {
namespace {

// Where the collectives run: a communicator and the context whose device holds its tensors.
struct Env {
  Communicator& comm;
  Context& ctx;
};

struct Range {
  double lo, hi;
};
Range range_of(DType dt) { return (dt == DType::F32 || dt == DType::F64 || dt == DType::BF16) ? Range{-1, 1} : Range{-100, 100}; }

uint64_t seed_for(const std::string& what, int rank) { return testing::seed_from(str_cat(what, "#rank", rank)); }

// Rank r's input of case `what`, on the host.
Tensor host_input(DType dt, int64_t n, const std::string& what, int r) {
  static CpuAllocator host;
  Tensor t = Tensor::empty(Shape{n}, dt, host);
  const Range range = range_of(dt);
  testing::fill_random(t, seed_for(what, r), range.lo, range.hi);
  return t;
}

std::vector<double> input_values(DType dt, int64_t n, const std::string& what, int r) {
  return testing::to_doubles(testing::cpu_context(), host_input(dt, n, what, r));
}

// A fresh tensor on the env's device holding `host`.
Tensor on_device(Env& e, const Tensor& host) {
  Tensor t = e.ctx.empty(host.shape(), host.dtype());
  copy_tensor(e.ctx, t, host);
  return t;
}

std::vector<double> read(Env& e, const Tensor& t) {
  e.ctx.synchronize();
  return testing::to_doubles(e.ctx, t);
}

// |got - expected| within tol * scale (scale: the sum of the magnitudes that went into it).
void expect_close(const std::vector<double>& got, const std::vector<double>& expected, const std::vector<double>& scale,
                  double tol, const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (!(std::fabs(got[i] - expected[i]) <= tol * scale[i] + 1e-300)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << expected[i];
      ++bad;
    }
}

double tolerance(DType dt) {
  switch (dt) {
    case DType::F64: return 1e-13;
    case DType::F32: return 1e-6;
    case DType::BF16: return 2e-2;
    default: return 0;  // integers: exact
  }
}

void check_all_reduce(Env& e) {
  const int size = e.comm.size(), me = e.comm.rank();
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::I32})
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(1025), int64_t(100003)})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
        if (dt == DType::I32 && op == ReduceOp::Avg) continue;
        const std::string what = str_cat("all_reduce ", reduce_op_name(op), " ", dtype_name(dt), "[", n, "]");
        Tensor t = on_device(e, host_input(dt, n, what, me));
        e.comm.all_reduce(t, op, e.ctx.stream());
        std::vector<double> expected(size_t(n), op == ReduceOp::Max ? -1e300 : 0.0), scale(size_t(n), 0.0);
        for (int r = 0; r < size; ++r) {
          std::vector<double> x = input_values(dt, n, what, r);
          for (int64_t i = 0; i < n; ++i) {
            expected[i] = op == ReduceOp::Max ? std::max(expected[i], x[i]) : expected[i] + x[i];
            scale[i] += std::fabs(x[i]);
          }
        }
        if (op == ReduceOp::Avg)
          for (int64_t i = 0; i < n; ++i) expected[i] /= size, scale[i] /= size;
        expect_close(read(e, t), expected, scale, op == ReduceOp::Max ? 0.0 : tolerance(dt), what);
      }
}

void check_reduce_scatter(Env& e) {
  const int size = e.comm.size(), me = e.comm.rank();
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(333)})
      for (bool in_place : {false, true}) {
        const std::string what = str_cat("reduce_scatter ", dtype_name(dt), " ", n, " per rank", in_place ? " in place" : "");
        Tensor in = on_device(e, host_input(dt, n * size, what, me));
        Tensor out = in_place ? in.slice(me * n, (me + 1) * n) : e.ctx.empty(Shape{n}, dt);
        e.comm.reduce_scatter(out, in, ReduceOp::Sum, e.ctx.stream());
        std::vector<double> expected(size_t(n), 0.0), scale(size_t(n), 0.0);
        for (int r = 0; r < size; ++r) {
          std::vector<double> x = input_values(dt, n * size, what, r);
          for (int64_t i = 0; i < n; ++i) expected[i] += x[me * n + i], scale[i] += std::fabs(x[me * n + i]);
        }
        expect_close(read(e, out), expected, scale, tolerance(dt), what);
      }
}

void check_all_gather(Env& e) {
  const int size = e.comm.size(), me = e.comm.rank();
  for (DType dt : {DType::F32, DType::BF16, DType::I64, DType::U8})
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(333)})
      for (bool in_place : {false, true}) {
        const std::string what = str_cat("all_gather ", dtype_name(dt), " ", n, " per rank", in_place ? " in place" : "");
        Tensor out = e.ctx.empty(Shape{n * size}, dt);
        Tensor in = in_place ? out.slice(me * n, (me + 1) * n) : e.ctx.empty(Shape{n}, dt);
        copy_tensor(e.ctx, in, host_input(dt, n, what, me));
        e.comm.all_gather(out, in, e.ctx.stream());
        std::vector<double> expected;
        for (int r = 0; r < size; ++r) {
          std::vector<double> x = input_values(dt, n, what, r);
          expected.insert(expected.end(), x.begin(), x.end());
        }
        EXPECT_EQ(read(e, out), expected) << what;
      }
}

void check_broadcast(Env& e) {
  for (int root = 0; root < e.comm.size(); ++root)
    for (DType dt : {DType::F32, DType::I64})
      for (int64_t n : {int64_t(5), int64_t(1001)}) {
        const std::string what = str_cat("broadcast ", dtype_name(dt), "[", n, "] from ", root);
        Tensor t = on_device(e, host_input(dt, n, what, e.comm.rank()));
        e.comm.broadcast(t, root, e.ctx.stream());
        EXPECT_EQ(read(e, t), input_values(dt, n, what, root)) << what;
      }
}

void check_send_recv(Env& e) {
  const int size = e.comm.size(), me = e.comm.rank();
  if (size == 1) return;
  const int next = (me + 1) % size, prev = (me + size - 1) % size;
  const int64_t n = 777;
  Tensor mine = on_device(e, host_input(DType::F32, n, "ring", me));
  Tensor got = e.ctx.empty(Shape{n}, DType::F32);
  // Even ranks send first, odd ranks receive first: no cycle of waiting senders.
  if (me % 2 == 0) {
    e.comm.send(mine, next, e.ctx.stream());
    e.comm.recv(got, prev, e.ctx.stream());
  } else {
    e.comm.recv(got, prev, e.ctx.stream());
    e.comm.send(mine, next, e.ctx.stream());
  }
  EXPECT_EQ(read(e, got), input_values(DType::F32, n, "ring", prev));
}

void check_all_to_all(Env& e) {
  const int size = e.comm.size(), me = e.comm.rank();
  // Rank r sends (r + 2p) % 4 elements to rank p (zeros included); element i of that block is
  // 1000 r + 10 p + i, exact in fp32.
  auto count = [](int from, int to) { return int64_t((from + 2 * to) % 4); };
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<float> send_values;
  for (int p = 0; p < size; ++p) {
    send_counts.push_back(count(me, p));
    recv_counts.push_back(count(p, me));
    for (int64_t i = 0; i < count(me, p); ++i) send_values.push_back(float(1000 * me + 10 * p + i));
  }
  int64_t total_in = int64_t(send_values.size()), total_out = 0;
  for (int64_t c : recv_counts) total_out += c;
  Tensor in = e.ctx.empty(Shape{std::max<int64_t>(total_in, 1)}, DType::F32).slice(0, total_in);
  if (total_in > 0)
    copy_tensor(e.ctx, in, Tensor::from_blob(send_values.data(), Shape{total_in}, DType::F32, Device::cpu()));
  Tensor out = e.ctx.empty(Shape{std::max<int64_t>(total_out, 1)}, DType::F32).slice(0, total_out);
  e.comm.all_to_all(out, recv_counts, in, send_counts, e.ctx.stream());
  std::vector<double> expected;
  for (int p = 0; p < size; ++p)
    for (int64_t i = 0; i < count(p, me); ++i) expected.push_back(1000.0 * p + 10.0 * me + double(i));
  EXPECT_EQ(read(e, out), expected);
}

void check_host_reductions(Env& e) {
  const int size = e.comm.size(), me = e.comm.rank();
  double v[3] = {double(me), -double(me), 1.5};
  e.comm.all_reduce_host(v, ReduceOp::Sum);
  EXPECT_EQ(v[0], size * (size - 1) / 2.0);
  EXPECT_EQ(v[1], -size * (size - 1) / 2.0);
  EXPECT_EQ(v[2], 1.5 * size);
  double m[2] = {double(me), -double(me)};
  e.comm.all_reduce_host(m, ReduceOp::Max);
  EXPECT_EQ(m[0], size - 1);
  EXPECT_EQ(m[1], 0);
  double a[1] = {double(me)};
  e.comm.all_reduce_host(a, ReduceOp::Avg);
  EXPECT_DOUBLE_EQ(a[0], (size - 1) / 2.0);
  e.comm.barrier();
}

void check_split(Env& e) {
  const int size = e.comm.size(), me = e.comm.rank();
  // Parity groups, keys reversed: the new rank order is descending world rank.
  std::unique_ptr<Communicator> half = e.comm.split(me % 2, -me, "parity");
  ASSERT_NE(half, nullptr);
  int members = 0, before_me = 0;
  for (int r = 0; r < size; ++r)
    if (r % 2 == me % 2) ++members, before_me += r > me;
  EXPECT_EQ(half->size(), members);
  EXPECT_EQ(half->rank(), before_me);
  EXPECT_EQ(half->name(), "parity");
  double v[1] = {double(me)};
  half->all_reduce_host(v, ReduceOp::Sum);
  double expected = 0;
  for (int r = 0; r < size; ++r)
    if (r % 2 == me % 2) expected += r;
  EXPECT_EQ(v[0], expected);
  Tensor t = on_device(e, host_input(DType::F32, 9, "split", me));
  half->all_reduce(t, ReduceOp::Max, e.ctx.stream());
  std::vector<double> m(9, -1e300);
  for (int r = 0; r < size; ++r)
    if (r % 2 == me % 2) {
      std::vector<double> x = input_values(DType::F32, 9, "split", r);
      for (int i = 0; i < 9; ++i) m[i] = std::max(m[i], x[i]);
    }
  EXPECT_EQ(read(e, t), m);
  half.reset();

  // Rank 0 opts out.
  std::unique_ptr<Communicator> rest = e.comm.split(me == 0 ? -1 : 0, me, "rest");
  if (me == 0) {
    EXPECT_EQ(rest, nullptr);
  } else {
    ASSERT_NE(rest, nullptr);
    EXPECT_EQ(rest->size(), size - 1);
    EXPECT_EQ(rest->rank(), me - 1);
  }
}

void check_errors(Env& e) {
  const int size = e.comm.size();
  Tensor in = e.ctx.empty(Shape{int64_t(3 * size + 1)}, DType::F32);
  Tensor out = e.ctx.empty(Shape{3}, DType::F32);
  testing::expect_error([&] { e.comm.reduce_scatter(out, in, ReduceOp::Sum, e.ctx.stream()); },
                        {"reduce_scatter", "group 'world'", str_cat("rank ", e.comm.rank(), " of ", size), "must hold"});
  Tensor wrong = e.ctx.empty(Shape{3}, DType::F64);
  testing::expect_error([&] { e.comm.all_gather(in.slice(0, 3 * size), wrong, e.ctx.stream()); },
                        {"all_gather", "group 'world'", "f64[3]"});
  testing::expect_error([&] { e.comm.broadcast(out, size, e.ctx.stream()); }, {"broadcast", "root"});
  std::vector<int64_t> counts(size_t(size + 1), 0);
  testing::expect_error([&] { e.comm.all_to_all(out, counts, in, counts, e.ctx.stream()); },
                        {"all_to_all", "one count per rank"});
}

// Point-to-point batches. Every rank builds its batch from its own rank, so the peers' batches match.

// A ring in both directions in one batch: rank r sends an f32 tensor to r+1 and an i64 tensor of another
// size to r-1, and receives both kinds, with sends and receives interleaved in the op list. With two ranks
// next == prev, so the order of the two messages to the same peer is exercised too.
void check_batch_ring(Env& e) {
  const int size = e.comm.size(), me = e.comm.rank();
  if (size == 1) return;
  const int next = (me + 1) % size, prev = (me + size - 1) % size;
  const int64_t n_fwd = 1031, n_bwd = 65;
  Tensor fwd = on_device(e, host_input(DType::F32, n_fwd, "ring forward", me));
  Tensor bwd = on_device(e, host_input(DType::I64, n_bwd, "ring backward", me));
  Tensor from_prev = e.ctx.empty(Shape{n_fwd}, DType::F32), from_next = e.ctx.empty(Shape{n_bwd}, DType::I64);
  const std::vector<P2POp> ops = {P2POp::recv(from_prev, prev), P2POp::send(fwd, next), P2POp::send(bwd, prev),
                                  P2POp::recv(from_next, next)};
  PendingP2P pending = e.comm.batch_send_recv(ops, e.ctx.stream());
  pending.wait(e.ctx.stream());
  EXPECT_TRUE(pending.done());
  EXPECT_EQ(read(e, from_prev), input_values(DType::F32, n_fwd, "ring forward", prev));
  EXPECT_EQ(read(e, from_next), input_values(DType::I64, n_bwd, "ring backward", next));
}

// Ranks 0 and 1 both put their send first: with blocking calls and a message too large to be buffered
// (4 MiB) each would wait for the other's receive forever. The other ranks pass an empty batch.
void check_batch_both_send_first(Env& e) {
  const int me = e.comm.rank();
  if (e.comm.size() == 1) return;
  const int64_t n = int64_t(1) << 20;
  std::vector<P2POp> ops;
  Tensor got;
  if (me < 2) {
    got = e.ctx.empty(Shape{n}, DType::F32);
    ops = {P2POp::send(on_device(e, host_input(DType::F32, n, "send first", me)), 1 - me), P2POp::recv(got, 1 - me)};
  }
  PendingP2P pending = e.comm.batch_send_recv(ops, e.ctx.stream());
  if (me >= 2) {
    EXPECT_TRUE(pending.done()) << "an empty batch has nothing in flight";
  }
  pending.wait(e.ctx.stream());
  if (me < 2) {
    EXPECT_EQ(read(e, got), input_values(DType::F32, n, "send first", 1 - me));
  }
}

// Four messages to the same peer (three of one size, so only the order tells them apart), split over two
// batches that are both in flight before either is waited for, the second waited for first.
void check_batch_same_peer_order(Env& e) {
  const int size = e.comm.size(), me = e.comm.rank();
  if (size == 1) return;
  const int next = (me + 1) % size, prev = (me + size - 1) % size;
  const int64_t sizes[4] = {300, 300, 300, 17};
  std::vector<Tensor> sent, got;
  for (int k = 0; k < 4; ++k) {
    sent.push_back(on_device(e, host_input(DType::F32, sizes[k], str_cat("order ", k), me)));
    got.push_back(e.ctx.empty(Shape{sizes[k]}, DType::F32));
  }
  const std::vector<P2POp> first = {P2POp::send(sent[0], next), P2POp::send(sent[1], next), P2POp::recv(got[0], prev),
                                    P2POp::recv(got[1], prev)};
  const std::vector<P2POp> second = {P2POp::recv(got[2], prev), P2POp::send(sent[2], next), P2POp::send(sent[3], next),
                                     P2POp::recv(got[3], prev)};
  PendingP2P a = e.comm.batch_send_recv(first, e.ctx.stream());
  PendingP2P b = e.comm.batch_send_recv(second, e.ctx.stream());
  b.wait(e.ctx.stream());
  a.wait(e.ctx.stream());
  for (int k = 0; k < 4; ++k)
    EXPECT_EQ(read(e, got[k]), input_values(DType::F32, sizes[k], str_cat("order ", k), prev)) << "message " << k;
}

// Asynchronous use: the batch is started, the caller drops its only reference to the sent tensor and goes
// on with other work on the stream, then waits. The handle must keep the sent tensor's memory: a new
// tensor of the same size, allocated meanwhile, must get other memory (the allocator would hand the
// same block back, and the copy into it would race with the send, were it released).
void check_batch_async(Env& e) {
  const int size = e.comm.size(), me = e.comm.rank();
  if (size == 1) return;
  const int next = (me + 1) % size, prev = (me + size - 1) % size;
  const int64_t n = 4099;
  Tensor got = e.ctx.empty(Shape{n}, DType::F32);
  const void* sent_at = nullptr;
  PendingP2P pending;
  {
    Tensor temp = on_device(e, host_input(DType::F32, n, "async", me));
    sent_at = temp.data_ptr();
    const std::vector<P2POp> ops = {P2POp::send(std::move(temp), next), P2POp::recv(got, prev)};
    pending = e.comm.batch_send_recv(ops, e.ctx.stream());
  }
  Tensor other = on_device(e, host_input(DType::F32, n, "async other", me));
  EXPECT_NE(other.data_ptr(), sent_at) << "the pending batch's sent tensor was released before wait()";
  Tensor twice = e.ctx.empty(Shape{n}, DType::F32);
  copy_tensor(e.ctx, twice, other);
  pending.wait(e.ctx.stream());
  Tensor copied = e.ctx.empty(Shape{n}, DType::F32);
  copy_tensor(e.ctx, copied, got);  // queued after the wait: sees the received values
  EXPECT_EQ(read(e, copied), input_values(DType::F32, n, "async", prev));
  EXPECT_EQ(read(e, twice), input_values(DType::F32, n, "async other", me));
}

// done() alone completes a batch (MPI: it drives the transfers), and a handle destroyed without wait()
// completes its batch before the tensors are read.
void check_batch_done_and_destroy(Env& e) {
  const int size = e.comm.size(), me = e.comm.rank();
  if (size == 1) return;
  const int next = (me + 1) % size, prev = (me + size - 1) % size;
  const int64_t n = 70001;
  Tensor got = e.ctx.empty(Shape{n}, DType::BF16);
  {
    const std::vector<P2POp> ops = {P2POp::send(on_device(e, host_input(DType::BF16, n, "poll", me)), next),
                                    P2POp::recv(got, prev)};
    PendingP2P pending = e.comm.batch_send_recv(ops, e.ctx.stream());
    const auto start = std::chrono::steady_clock::now();
    while (!pending.done() && std::chrono::steady_clock::now() - start < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    EXPECT_TRUE(pending.done()) << "polling done() did not complete the batch within 60 s";
  }
  EXPECT_EQ(read(e, got), input_values(DType::BF16, n, "poll", prev));

  Tensor got2 = e.ctx.empty(Shape{n}, DType::BF16);
  {
    const std::vector<P2POp> ops = {P2POp::recv(got2, prev),
                                    P2POp::send(on_device(e, host_input(DType::BF16, n, "destroyed", me)), next)};
    PendingP2P pending = e.comm.batch_send_recv(ops, e.ctx.stream());
  }  // destroyed un-waited: completes on the start stream
  EXPECT_EQ(read(e, got2), input_values(DType::BF16, n, "destroyed", prev));
}

// Refused batches: the error names the call, the group, this rank, the op, its peer and sizes. Nothing
// is posted, so a valid exchange afterwards still matches.
void check_batch_errors(Env& e) {
  const int size = e.comm.size(), me = e.comm.rank();
  const std::string rank_text = str_cat("rank ", me, " of ", size);
  const std::string group_text = str_cat("group '", e.comm.name(), "'");
  Tensor t = e.ctx.empty(Shape{777}, DType::F32);
  const auto refused = [&](std::vector<P2POp> ops, std::vector<std::string> parts) {
    parts.insert(parts.begin(), {"batch_send_recv", group_text, rank_text});
    testing::expect_error([&] { e.comm.batch_send_recv(ops, e.ctx.stream()).wait(e.ctx.stream()); }, parts);
  };
  PendingP2P empty = e.comm.batch_send_recv({}, e.ctx.stream());
  EXPECT_TRUE(empty.done());
  empty.wait(e.ctx.stream());
  if (size == 1) {
    refused({P2POp::send(t, 1)}, {"op 0", "send 777 f32 elements (3108 bytes) to rank 1", "group of one has no peers"});
    return;
  }
  const int other = (me + 1) % size;
  refused({P2POp::send(t, other), P2POp::send(t, size)},
          {"op 1", "send 777 f32 elements (3108 bytes) to rank ", str_cat("peer ", size), "not a rank of the group"});
  refused({P2POp::recv(t, -1)}, {"op 0", "recv 777 f32 elements (3108 bytes) from rank -1", "peer -1"});
  refused({P2POp::recv(t, me)}, {"op 0", str_cat("peer ", me), "is this rank"});
  refused({P2POp::send(Tensor(), other)}, {"op 0", "no tensor"});
  refused({P2POp::recv(t.slice(0, 10), other), P2POp::recv(t.slice(5, 15), other)},
          {"op 0", "recv 10 f32 elements (40 bytes)", "receives into bytes of op 1"});
  refused({P2POp::send(t, other), P2POp::recv(t.slice(100, 200), other)}, {"op 1", "receives into bytes of op 0"});
  if (e.comm.device().is_cuda()) {
    static CpuAllocator host;
    refused({P2POp::send(Tensor::empty(Shape{3}, DType::F32, host), other)}, {"op 0", "on cpu", "live on cuda"});
  }
  check_batch_ring(e);  // the group is still in step
}

void run_all_checks(Env& e) {
  check_all_reduce(e);
  check_reduce_scatter(e);
  check_all_gather(e);
  check_broadcast(e);
  check_send_recv(e);
  check_all_to_all(e);
  check_host_reductions(e);
  check_split(e);
  check_errors(e);
}

TEST(Communicator, MpiCollectivesMatchDirectComputation) {
  Env e{*testing::mpi_world(), testing::cpu_context()};
  ASSERT_EQ(std::string(e.comm.backend()), "mpi");
  run_all_checks(e);
}

// The socket world of this job, made once (collective: every rank runs the tests in the same order).
Communicator& sockets() {
  static std::unique_ptr<Communicator> world = testing::socket_world(*testing::mpi_world(), timeout_from_minutes(2.0));
  return *world;
}

TEST(Communicator, SocketCollectivesMatchDirectComputation) {
  Env e{sockets(), testing::cpu_context()};
  ASSERT_EQ(std::string(e.comm.backend()), "socket");
  run_all_checks(e);
}

TEST(Communicator, SelfCommunicatorIsAGroupOfOne) {
  SelfCommunicator self(Device::cpu(), "world");
  Env e{self, testing::cpu_context()};
  run_all_checks(e);
  testing::expect_error([&] { self.send(e.ctx.empty(Shape{2}, DType::F32), 1, nullptr); }, {"send", "no peers"});
  check_batch_errors(e);  // an empty batch is a no-op, any op is refused
}

// The point-to-point checks, each a test of its own on MPI (suite CommunicatorP2P) and on NCCL
// (CommunicatorGpuP2P).
struct P2PCase {
  const char* name;
  void (*check)(Env&);
};
const P2PCase kP2PCases[] = {
    {"RingExchangeBothDirections", check_batch_ring},
    {"BothRanksSendFirst", check_batch_both_send_first},
    {"SamePeerMessagesArriveInOrder", check_batch_same_peer_order},
    {"AsynchronousUseKeepsTensorsAlive", check_batch_async},
    {"DoneAndDestructionComplete", check_batch_done_and_destroy},
    {"RefusesBadOps", check_batch_errors},
};
std::string p2p_case_name(const ::testing::TestParamInfo<P2PCase>& info) { return info.param.name; }
void PrintTo(const P2PCase& c, std::ostream* os) { *os << c.name; }

class CommunicatorP2P : public ::testing::TestWithParam<P2PCase> {};

TEST_P(CommunicatorP2P, Mpi) {
  Env e{*testing::mpi_world(), testing::cpu_context()};
  GetParam().check(e);
}
TEST_P(CommunicatorP2P, Socket) {
  Env e{sockets(), testing::cpu_context()};
  GetParam().check(e);
}
INSTANTIATE_TEST_SUITE_P(Batch, CommunicatorP2P, ::testing::ValuesIn(kP2PCases), p2p_case_name);

TEST(Communicator, TimeoutFromMinutes) {
  EXPECT_EQ(timeout_from_minutes(0.05).count(), 3000);
  EXPECT_EQ(timeout_from_minutes(10).count(), 600000);
  testing::expect_error([] { timeout_from_minutes(0); }, {"--distributed-timeout-minutes", "positive"});
}

#if MEGATRON_WITH_NCCL
// One GPU per rank (local rank), NCCL bootstrapped over the MPI world.
class CommunicatorGpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const int count = cuda_device_count();
    const auto& mpi = testing::mpi_runtime();
    if (count == 0 || mpi.local_size() > count) return;  // same answer on every rank of a node
    ctx_ = Context::cuda(mpi.local_rank() % count);
    nccl_ = NcclCommunicator::create(*testing::mpi_world(), ctx_->device().index, "world",
                                     timeout_from_minutes(2.0));
  }
  static void TearDownTestSuite() {
    nccl_.reset();
    ctx_.reset();
  }
  void SetUp() override {
    if (!nccl_) GTEST_SKIP() << "needs one CUDA device per rank on each node";
  }
  static std::unique_ptr<Context> ctx_;
  static std::unique_ptr<NcclCommunicator> nccl_;
};
std::unique_ptr<Context> CommunicatorGpu::ctx_;
std::unique_ptr<NcclCommunicator> CommunicatorGpu::nccl_;

TEST_F(CommunicatorGpu, NcclCollectivesMatchDirectComputation) {
  Env e{*nccl_, *ctx_};
  run_all_checks(e);
}

// As under torchrun: NCCL's unique id broadcast over the socket world instead of MPI.
TEST_F(CommunicatorGpu, NcclBootstrappedOverSocketsMatchesDirectComputation) {
  std::unique_ptr<NcclCommunicator> nccl =
      NcclCommunicator::create(sockets(), ctx_->device().index, "world", timeout_from_minutes(2.0));
  Env e{*nccl, *ctx_};
  run_all_checks(e);
  check_batch_ring(e);
}

class CommunicatorGpuP2P : public CommunicatorGpu, public ::testing::WithParamInterface<P2PCase> {};

TEST_P(CommunicatorGpuP2P, Nccl) {
  Env e{*nccl_, *ctx_};
  GetParam().check(e);
}
INSTANTIATE_TEST_SUITE_P(Batch, CommunicatorGpuP2P, ::testing::ValuesIn(kP2PCases), p2p_case_name);

// Waited for on a stream other than the start stream: work queued on that stream afterwards sees the
// data (the sent tensor, dropped by the caller, is kept until the GPU has finished); the host form
// (nullptr) returns once the data is there.
TEST_F(CommunicatorGpu, NcclBatchWaitOnAnotherStreamAndOnTheHost) {
  const int size = nccl_->size(), me = nccl_->rank();
  const int next = (me + 1) % size, prev = (me + size - 1) % size;
  const int64_t n = 1 << 18;
  Env e{*nccl_, *ctx_};
  CudaStream other;
  Tensor got = ctx_->empty(Shape{n}, DType::F32);
  {
    const std::vector<P2POp> ops = {P2POp::send(on_device(e, host_input(DType::F32, n, "other stream", me)), next),
                                    P2POp::recv(got, prev)};
    nccl_->batch_send_recv(ops, ctx_->stream()).wait(other.get());
  }
  Tensor copied = ctx_->empty(Shape{n}, DType::F32);
  ctx_->synchronize();  // `copied` is allocated; the copy below is ordered by `other` alone
  CUDA_CHECK(cudaMemcpyAsync(copied.data_ptr(), got.data_ptr(), got.nbytes(), cudaMemcpyDeviceToDevice, other.get()));
  other.synchronize();
  EXPECT_EQ(read(e, copied), input_values(DType::F32, n, "other stream", prev));

  Tensor host_got = ctx_->empty(Shape{n}, DType::F32);
  const std::vector<P2POp> ops = {P2POp::recv(host_got, prev),
                                  P2POp::send(on_device(e, host_input(DType::F32, n, "host wait", me)), next)};
  ctx_->synchronize();
  nccl_->batch_send_recv(ops, ctx_->stream()).wait(nullptr);
  EXPECT_EQ(read(e, host_got), input_values(DType::F32, n, "host wait", prev));
}

// Collectives issued from two caller streams still complete and agree (the communicator serialises them
// on its own stream).
TEST_F(CommunicatorGpu, TwoCallerStreams) {
  CudaStream other;
  const int me = nccl_->rank();
  Tensor a = ctx_->empty(Shape{4097}, DType::F32), b = ctx_->empty(Shape{4097}, DType::F32);
  copy_tensor(*ctx_, a, host_input(DType::F32, 4097, "stream a", me));
  copy_tensor(*ctx_, b, host_input(DType::F32, 4097, "stream b", me));
  ctx_->synchronize();
  for (int i = 0; i < 10; ++i) {
    nccl_->all_reduce(a, ReduceOp::Max, ctx_->stream());
    nccl_->all_reduce(b, ReduceOp::Max, other.get());
  }
  other.synchronize();
  Env e{*nccl_, *ctx_};
  for (auto [t, what] : {std::pair{a, "stream a"}, std::pair{b, "stream b"}}) {
    std::vector<double> expected(4097, -1e300);
    for (int r = 0; r < nccl_->size(); ++r) {
      std::vector<double> x = input_values(DType::F32, 4097, what, r);
      for (int i = 0; i < 4097; ++i) expected[i] = std::max(expected[i], x[i]);
    }
    EXPECT_EQ(read(e, t), expected) << what;
  }
}
#endif

}  // namespace
}  // namespace megatron::comm
