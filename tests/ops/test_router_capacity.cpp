// Tests of router_drop_over_capacity (expert capacity). The CPU op is checked against a reference written
// differently: each slot's rank among its expert's slots counted directly (a higher probability, or an equal
// one at a lower slot number, ranks first; by position only the slot number counts), kept when rank <
// capacity. Probabilities are drawn from a few values, so ties are common. The CUDA path must give the CPU's
// outputs exactly, for both policies and capacities from 0 to beyond every expert's load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "harness.h"
#include "megatron/ops/router/capacity.h"

using ::megatron::testing::expect_error;

namespace megatron {
namespace {

using enum DType;

Context& cpu() { return testing::cpu_context(); }

struct Routing {
  Tensor probs, indices;  // [T, k] on the CPU
};

// k distinct experts per token, skewed towards the low ids (some experts overflow, some stay empty);
// probabilities from 8 levels.
Routing random_routing(int64_t T, int64_t k, int E, DType dt, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Routing r{cpu().empty(Shape{T, k}, dt), cpu().empty(Shape{T, k}, I32)};
  std::uniform_int_distribution<int> level(1, 8);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> chosen;
    while (int64_t(chosen.size()) < k) {
      const int e = int(std::min<double>(E - 1, std::floor(E * std::pow(std::uniform_real_distribution<double>()(rng), 2))));
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int64_t s = 0; s < k; ++s) {
      r.indices.data<int32_t>()[t * k + s] = chosen[size_t(s)];
      const double p = level(rng) / 8.0;
      if (dt == F64) r.probs.data<double>()[t * k + s] = p;
      else r.probs.data<float>()[t * k + s] = float(p);
    }
  }
  return r;
}

double prob_at(const Tensor& t, int64_t i) { return t.dtype() == F64 ? t.data<double>()[i] : t.data<float>()[i]; }

Routing run(Context& ctx, const Routing& in, int E, int64_t capacity, bool by_probs) {
  auto on = [&](const Tensor& h) {
    Tensor d = ctx.empty(h.shape(), h.dtype());
    copy_tensor(ctx, d, h);
    return d;
  };
  const Tensor p = on(in.probs), idx = on(in.indices);
  Tensor kp = ctx.empty(p.shape(), p.dtype()), ki = ctx.empty(idx.shape(), I32);
  ops::router_drop_over_capacity(ctx, kp, ki, p, idx, E, capacity, by_probs);
  Routing out{cpu().empty(p.shape(), p.dtype()), cpu().empty(idx.shape(), I32)};
  copy_tensor(ctx, out.probs, kp);
  copy_tensor(ctx, out.indices, ki);
  return out;
}

void expect_reference(const Routing& in, const Routing& got, int64_t capacity, bool by_probs, const std::string& what) {
  const int64_t n = in.probs.numel();
  const int32_t* idx = in.indices.data<int32_t>();
  int failures = 0;
  for (int64_t i = 0; i < n && failures < 5; ++i) {
    int64_t rank = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (j == i || idx[j] != idx[i]) continue;
      const double pi = prob_at(in.probs, i), pj = prob_at(in.probs, j);
      rank += by_probs ? (pj > pi || (pj == pi && j < i)) : (j < i);
    }
    const bool kept = rank < capacity;
    const int32_t want_idx = kept ? idx[i] : -1;
    const double want_p = kept ? prob_at(in.probs, i) : 0.0;
    if (got.indices.data<int32_t>()[i] != want_idx || prob_at(got.probs, i) != want_p) {
      ++failures;
      ADD_FAILURE() << what << ": slot " << i << " (expert " << idx[i] << ", rank " << rank << ") got index "
                    << got.indices.data<int32_t>()[i] << " prob " << prob_at(got.probs, i) << ", want " << want_idx
                    << " / " << want_p;
    }
  }
}

TEST(RouterCapacity, MatchesTheDirectRanking) {
  uint64_t seed = 1;
  for (DType dt : {F32, F64})
    for (auto [T, k, E] : {std::tuple{1, 1, 1}, std::tuple{37, 2, 8}, std::tuple{200, 4, 16}, std::tuple{64, 1, 3}})
      for (int64_t capacity : {0, 1, 5, 13, 400})
        for (bool by_probs : {true, false}) {
          const Routing in = random_routing(T, k, E, dt, seed++);
          const std::string what = str_cat(dtype_name(dt), " T ", T, " k ", k, " E ", E, " capacity ", capacity,
                                           by_probs ? " probs" : " position");
          expect_reference(in, run(cpu(), in, E, capacity, by_probs), capacity, by_probs, what);
        }
}

TEST(RouterCapacity, RejectsBadArguments) {
  const Routing in = random_routing(4, 2, 4, F32, 3);
  Tensor kp = cpu().empty(Shape{4, 2}, F32), ki = cpu().empty(Shape{4, 2}, I32);
  expect_error([&] { ops::router_drop_over_capacity(cpu(), kp, ki, in.probs, in.indices, 4, -1, true); },
               {"router_drop_over_capacity", "capacity must be >= 0"});
  expect_error([&] { ops::router_drop_over_capacity(cpu(), in.probs, ki, in.probs, in.indices, 4, 1, true); },
               {"separate from the inputs"});
  expect_error([&] { ops::router_drop_over_capacity(cpu(), kp, ki, in.probs, in.indices, 2, 1, true); },
               {"outside [0, 2)"});
}

TEST(RouterCapacityGpu, SameAsCpu) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = testing::cuda_context();
  uint64_t seed = 100;
  for (auto [T, k, E] : {std::tuple{1, 1, 1}, std::tuple{37, 2, 8}, std::tuple{4096, 2, 8}, std::tuple{3000, 8, 64},
                         std::tuple{1500, 1, 4}})
    for (int64_t capacity : {int64_t(0), int64_t(7), int64_t(T) * k / E, int64_t(T) * k / E * 2, int64_t(T) * k})
      for (bool by_probs : {true, false}) {
        const Routing in = random_routing(T, k, E, F32, seed++);
        const Routing want = run(cpu(), in, E, capacity, by_probs), got = run(gpu, in, E, capacity, by_probs);
        const std::string what = str_cat("T ", T, " k ", k, " E ", E, " capacity ", capacity,
                                         by_probs ? " probs" : " position");
        for (int64_t i = 0; i < in.probs.numel(); ++i) {
          ASSERT_EQ(got.indices.data<int32_t>()[i], want.indices.data<int32_t>()[i]) << what << " slot " << i;
          ASSERT_EQ(got.probs.data<float>()[i], want.probs.data<float>()[i]) << what << " slot " << i;
        }
      }
}

}  // namespace
}  // namespace megatron
