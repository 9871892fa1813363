// The TCP rendezvous and the socket communicator inside one process, each rank a thread with its own listener
// and mesh (nothing is shared but the loopback interface): five ranks, so the broadcast tree and the
// dissemination barrier are not powers of two; the rendezvous' errors (nobody at the port within the timeout,
// ranks that never join, a port another process holds, another job or a duplicate rank knocking); and a peer
// that goes away in the middle of a collective. The comparison with MPI and the watchdog's report run in
// test_socket_communicator_mpi and test_watchdog.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <thread>

#include "harness.h"
#include "megatron/comm/socket_communicator.h"
#include "megatron/comm/tcp_rendezvous.h"
#include "megatron/core/philox.h"

namespace megatron::comm {
namespace {

using std::chrono::milliseconds;

int free_port() {
  Socket probe = listen_on(0, "free port probe");
  return bound_port(probe);
}

RendezvousRequest request(int rank, int world, int port, milliseconds timeout, std::string job = "job") {
  return RendezvousRequest{.rank = rank, .world_size = world, .master_addr = "127.0.0.1", .port = port,
                           .port_origin = "picked by the test", .job_id = std::move(job), .data_port = 0,
                           .timeout = timeout};
}

// A world communicator for `rank` made the torchrun way: listener, rendezvous, mesh.
std::unique_ptr<SocketCommunicator> join_world(RendezvousRequest r) {
  Socket listener = listen_on(0, "test listener");
  r.data_port = bound_port(listener);
  auto mesh = std::make_shared<SocketMesh>(r.rank, rendezvous(r), std::move(listener), 99, r.timeout);
  return SocketCommunicator::world(std::move(mesh), 5, r.timeout);
}

// Runs body(rank) on `world` threads; returns each rank's error text ("" when it succeeded).
std::vector<std::string> run_ranks(int world, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

std::vector<float> values(int rank, int n) {
  std::vector<float> v(static_cast<size_t>(n));
  const uint64_t seed = testing::seed_from(str_cat("v", rank));
  for (int i = 0; i < n; ++i) v[size_t(i)] = float(philox_uniform(seed, 0, uint64_t(i)) - 0.5);
  return v;
}

TEST(SocketCommunicator, FiveThreadRanksReduceInRankOrderBroadcastAndSplit) {
  const int world = 5, n = 1001, port = free_port();
  std::vector<float> fold = values(0, n);
  for (int r = 1; r < world; ++r) {
    const std::vector<float> x = values(r, n);
    for (int i = 0; i < n; ++i) fold[size_t(i)] = fold[size_t(i)] + x[size_t(i)];
  }
  const std::vector<std::string> errors = run_ranks(world, [&](int rank) {
    std::unique_ptr<SocketCommunicator> c = join_world(request(rank, world, port, milliseconds(60'000)));
    ASSERT_EQ(c->size(), world);
    ASSERT_EQ(c->rank(), rank);
    std::vector<float> v = values(rank, n);
    c->all_reduce(Tensor::from_blob(v.data(), Shape{n}, DType::F32, Device::cpu()), ReduceOp::Sum);
    EXPECT_EQ(std::memcmp(v.data(), fold.data(), sizeof(float) * n), 0) << "rank " << rank
                                                                         << ": not the rank-order sum";
    for (int root = 0; root < world; ++root) {
      std::vector<float> b = values(rank, 77);
      c->broadcast(Tensor::from_blob(b.data(), Shape{77}, DType::F32, Device::cpu()), root);
      EXPECT_EQ(b, values(root, 77)) << "broadcast from " << root << " at rank " << rank;
    }
    c->barrier();
    // Odd and even ranks, reversed: a group of 3 and a group of 2.
    std::unique_ptr<Communicator> half = c->split(rank % 2, -rank, "parity");
    EXPECT_EQ(half->size(), rank % 2 ? 2 : 3);
    double sum[1] = {double(rank)};
    half->all_reduce_host(sum, ReduceOp::Sum);
    EXPECT_EQ(sum[0], rank % 2 ? 1 + 3 : 0 + 2 + 4);
    half->barrier();
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

TEST(SocketCommunicator, UnreachableRendezvousIsReportedWithinTheTimeout) {
  const int port = free_port();  // nobody listens there
  const auto start = Clock::now();
  testing::expect_error([&] { rendezvous(request(1, 2, port, milliseconds(1200))); },
                        {"rank 1 could not reach the rendezvous of rank 0 at MASTER_ADDR=127.0.0.1 port",
                         str_cat(port), "picked by the test", "--distributed-timeout-minutes 0.02",
                         "Is rank 0 running on MASTER_ADDR's host"});
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(seconds, 1.1);
  EXPECT_LT(seconds, 5.0);
}

TEST(SocketCommunicator, RankZeroNamesTheRanksThatNeverJoined) {
  const int port = free_port();
  const std::vector<std::string> errors = run_ranks(2, [&](int rank) {  // ranks 0 and 1 of 4
    rendezvous(request(rank, 4, port, milliseconds(1500)));
  });
  EXPECT_NE(errors[0].find("2 of WORLD_SIZE=4 ranks have not joined: 2, 3"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("--distributed-timeout-minutes 0.025"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 0 waits for all WORLD_SIZE=4 ranks"), std::string::npos) << errors[1];
}

TEST(SocketCommunicator, PortHeldByAnotherProcessIsNamed) {
  Socket holder = listen_on(0, "holder");
  const int port = bound_port(holder);
  testing::expect_error([&] { rendezvous(request(0, 2, port, milliseconds(1000))); },
                        {"rank 0's rendezvous on port", str_cat(port), "cannot listen", "MEGATRON_RENDEZVOUS_PORT"});
}

TEST(SocketCommunicator, AnotherJobAndADuplicateRankAreRefused) {
  const int port = free_port();
  std::string rank0_error, duplicate_error, foreign_error;
  std::thread rank0([&] {
    try {
      rendezvous(request(0, 3, port, milliseconds(20'000)));
    } catch (const std::exception& e) {
      rank0_error = e.what();
    }
  });
  try {
    rendezvous(request(2, 3, port, milliseconds(5'000), "another job"));
  } catch (const std::exception& e) {
    foreign_error = e.what();
  }
  std::string rank1_error, rank2_error;
  std::thread rank1([&] {
    try {
      join_world(request(1, 3, port, milliseconds(20'000)));
    } catch (const std::exception& e) {
      rank1_error = e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(1000));  // rank 1 has said hello by now
  try {
    rendezvous(request(1, 3, port, milliseconds(5'000)));
  } catch (const std::exception& e) {
    duplicate_error = e.what();
  }
  std::thread rank2([&] {
    try {
      join_world(request(2, 3, port, milliseconds(20'000)));
    } catch (const std::exception& e) {
      rank2_error = e.what();
    }
  });
  rank0.join();
  rank1.join();
  rank2.join();
  EXPECT_EQ(rank0_error, "");
  EXPECT_EQ(rank1_error, "");
  EXPECT_EQ(rank2_error, "");
  EXPECT_NE(foreign_error.find("refused: this rendezvous belongs to job job"), std::string::npos) << foreign_error;
  EXPECT_NE(foreign_error.find("of job another job"), std::string::npos) << foreign_error;
  EXPECT_NE(duplicate_error.find("rank 1 has joined already"), std::string::npos) << duplicate_error;
}

TEST(SocketCommunicator, PeerThatGoesAwayFailsTheCollectiveNamingIt) {
  const int port = free_port();
  const std::vector<std::string> errors = run_ranks(2, [&](int rank) {
    std::unique_ptr<SocketCommunicator> c = join_world(request(rank, 2, port, milliseconds(60'000)));
    std::vector<float> v = values(rank, 10);
    c->all_reduce(Tensor::from_blob(v.data(), Shape{10}, DType::F32, Device::cpu()), ReduceOp::Sum);
    if (rank == 1) return;  // its mesh closes: the process "exited"
    std::vector<float> big(1 << 20, 1.0f);
    c->all_reduce(Tensor::from_blob(big.data(), Shape{1 << 20}, DType::F32, Device::cpu()), ReduceOp::Sum);
  });
  EXPECT_EQ(errors[1], "");
  for (const char* part : {"all_reduce on group 'world' (rank 0 of 2, socket) with sum of 1048576 f32 elements",
                           "the connection to world rank 1 ended"})
    EXPECT_NE(errors[0].find(part), std::string::npos) << part << " in: " << errors[0];
}

}  // namespace
}  // namespace megatron::comm
