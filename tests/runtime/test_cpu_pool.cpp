// The CPU worker pool (runtime/cpu_pool.h): every block runs exactly once for any block and thread count,
// nested and concurrent calls complete, and many back-to-back jobs (the hand-off between ops) neither lose
// work nor hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "megatron/runtime/cpu_pool.h"

namespace megatron {
namespace {

// Runs a job and returns how many times each block ran.
std::vector<int> run_counts(int64_t blocks, int threads) {
  std::vector<std::atomic<int>> counts(static_cast<size_t>(blocks));
  run_blocks(blocks, threads, [&](int64_t b) { counts[size_t(b)].fetch_add(1); });
  std::vector<int> out;
  for (auto& c : counts) out.push_back(c.load());
  return out;
}

TEST(CpuPool, EveryBlockRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 8})
    for (int64_t blocks : {0, 1, 2, 3, 7, 64, 1000}) {
      const std::vector<int> counts = run_counts(blocks, threads);
      for (int64_t b = 0; b < blocks; ++b)
        ASSERT_EQ(counts[size_t(b)], 1) << "block " << b << " of " << blocks << " with " << threads << " threads";
    }
}

// The threads that ran some block of a job of sleeping blocks.
std::set<std::thread::id> threads_used(int threads) {
  std::mutex m;
  std::set<std::thread::id> seen;
  run_blocks(64, threads, [&](int64_t) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // long enough for the workers to join in
    std::lock_guard lock(m);
    seen.insert(std::this_thread::get_id());
  });
  return seen;
}

TEST(CpuPool, UsesSeveralThreadsAndFewerAfterMore) {
  for (int threads : {4, 2, 4, 1}) {  // raising, lowering and raising the count again: workers are reused
    std::set<std::thread::id> seen = threads_used(threads);
    // On a loaded machine a worker may not be scheduled during one job: a few tries before concluding.
    for (int attempt = 0; attempt < 5 && threads > 1 && seen.size() < 2; ++attempt) seen = threads_used(threads);
    EXPECT_LE(int(seen.size()), threads);
    if (threads > 1) {
      EXPECT_GE(int(seen.size()), 2) << threads << " threads";
    }
  }
}

TEST(CpuPool, NestedCallsRunOnTheCallingThread) {
  std::atomic<int> inner{0};
  run_blocks(8, 4, [&](int64_t) {
    const auto outer_thread = std::this_thread::get_id();
    run_blocks(16, 4, [&](int64_t) {
      EXPECT_EQ(std::this_thread::get_id(), outer_thread);
      inner.fetch_add(1);
    });
  });
  EXPECT_EQ(inner.load(), 8 * 16);
}

TEST(CpuPool, ConcurrentCallersFromTwoHostThreadsBothComplete) {
  std::atomic<int64_t> total{0};
  auto caller = [&] {
    for (int job = 0; job < 200; ++job) run_blocks(32, 2, [&](int64_t b) { total.fetch_add(b); });
  };
  std::thread other(caller);
  caller();
  other.join();
  EXPECT_EQ(total.load(), 2 * 200 * (31 * 32 / 2));
}

TEST(CpuPool, ManyBackToBackJobsLoseNothing) {
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 2000; ++job) run_blocks(3, 2, [&](int64_t b) { total.fetch_add(b + 1); });
  EXPECT_EQ(total.load(), 2000 * 6);
}

}  // namespace
}  // namespace megatron
