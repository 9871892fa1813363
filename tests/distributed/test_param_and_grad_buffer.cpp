// The contiguous gradient buffer: Megatron's layout rules (reverse parameter order, bucket closing at
// bucket_size, distributed-optimizer padding to 64-element parameter starts and lcm(DP, 128)-element
// buckets, equal shards) and the rebinding of Parameters onto views that keep their values; FSDP's buckets per
// unit and sharded storage (only this rank's shard of each bucket persists; whole buckets bound while in use).
#include <gtest/gtest.h>

#include <numeric>

#include "harness.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/distributed/param_and_grad_buffer.h"

namespace megatron::distributed {
namespace {

TEST(BufferLayout, ReverseOrderAndBucketsWithoutPadding) {
  // Parameters 0..4 of 10, 20, 30, 40, 50 elements; buckets close at >= 60 elements.
  BufferLayout l = plan_buffer_layout({10, 20, 30, 40, 50}, 60, 1);
  ASSERT_EQ(l.entries.size(), 5u);
  std::vector<size_t> order;
  for (const auto& e : l.entries) order.push_back(e.param);
  EXPECT_EQ(order, (std::vector<size_t>{4, 3, 2, 1, 0}));  // backward order
  EXPECT_EQ(l.entries[0].offset, 0);
  EXPECT_EQ(l.entries[1].offset, 50);
  EXPECT_EQ(l.entries[4].offset, 140);
  // 50 + 40 = 90 >= 60 closes bucket 0; 30 + 20 + 10 = 60 closes bucket 1.
  ASSERT_EQ(l.buckets.size(), 2u);
  EXPECT_EQ(l.buckets[0].offset, 0);
  EXPECT_EQ(l.buckets[0].numel, 90);
  EXPECT_EQ(l.buckets[0].entries, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(l.buckets[1].offset, 90);
  EXPECT_EQ(l.buckets[1].numel, 60);
  EXPECT_EQ(l.numel, 150);
  // bucket_size 0: one bucket.
  BufferLayout one = plan_buffer_layout({10, 20, 30}, 0, 1);
  ASSERT_EQ(one.buckets.size(), 1u);
  EXPECT_EQ(one.buckets[0].numel, 60);
  EXPECT_EQ(one.numel, 60);
}

TEST(BufferLayout, DistributedOptimizerPadding) {
  for (int dp : {2, 3, 4, 8}) {
    const std::vector<int64_t> numels = {5, 1000, 7, 333, 64, 1};
    BufferLayout l = plan_buffer_layout(numels, 900, dp);
    const int64_t multiple = std::lcm(int64_t(dp), int64_t(128));
    int64_t covered = 0;
    for (const auto& b : l.buckets) {
      EXPECT_EQ(b.offset % multiple, 0) << "dp " << dp;
      EXPECT_EQ(b.numel % multiple, 0) << "dp " << dp;
      for (size_t e : b.entries) {
        const auto& entry = l.entries[e];
        EXPECT_EQ(entry.offset % 64, 0);
        EXPECT_EQ(entry.numel, numels[entry.param]);
        EXPECT_GE(entry.offset, b.offset);
        EXPECT_LE(entry.offset + entry.numel, b.offset + b.numel);
        covered += entry.numel;
      }
    }
    EXPECT_EQ(covered, std::accumulate(numels.begin(), numels.end(), int64_t(0)));
    EXPECT_EQ(l.numel, l.buckets.back().offset + l.buckets.back().numel);
    // Entries never overlap.
    for (size_t i = 1; i < l.entries.size(); ++i)
      EXPECT_GE(l.entries[i].offset, l.entries[i - 1].offset + l.entries[i - 1].numel);
  }
}

TEST(ParamAndGradBuffer, RebindsParametersOntoViews) {
  Context& ctx = testing::cpu_context();
  std::vector<nn::Parameter> storage;
  storage.push_back(nn::make_parameter(ctx, "a.weight", {3, 5}, DType::F32, false));
  storage.push_back(nn::make_parameter(ctx, "a.bias", {5}, DType::F32, true));
  storage.push_back(nn::make_parameter(ctx, "b.weight", {7, 2}, DType::F32, false));
  std::vector<nn::Parameter*> params;
  for (size_t i = 0; i < storage.size(); ++i) {
    testing::fill_random(storage[i].value, 100 + i);
    testing::fill_random(storage[i].main_grad, 200 + i);
    params.push_back(&storage[i]);
  }
  std::vector<std::vector<double>> values, grads;
  for (nn::Parameter* p : params) {
    values.push_back(testing::to_doubles(ctx, p->value));
    grads.push_back(testing::to_doubles(ctx, p->main_grad));
  }
  ParamAndGradBuffer buffer(ctx, params, 0, 2, /*distributed_optimizer=*/true);
  for (size_t i = 0; i < params.size(); ++i) {
    nn::Parameter& p = *params[i];
    EXPECT_EQ(p.main_grad.storage(), buffer.grads().storage()) << p.name;
    EXPECT_EQ(p.value.storage(), buffer.values().storage()) << p.name;
    EXPECT_EQ(testing::to_doubles(ctx, p.value), values[i]) << p.name;
    EXPECT_EQ(testing::to_doubles(ctx, p.main_grad), grads[i]) << p.name;
    EXPECT_EQ(p.value.shape(), p.main_grad.shape());
  }
  EXPECT_EQ(params[0]->value.dim(0), 3);
  // Shards split each bucket in two equal halves.
  auto [s0, s1] = buffer.shard(0, 0);
  auto [t0, t1] = buffer.shard(0, 1);
  EXPECT_EQ(s0, 0);
  EXPECT_EQ(s1, t0);
  EXPECT_EQ(t1, buffer.layout().buckets[0].numel);
  buffer.zero_grads(ctx);
  for (nn::Parameter* p : params)
    for (double g : testing::to_doubles(ctx, p->main_grad)) EXPECT_EQ(g, 0.0);
  testing::expect_error([&] { ParamAndGradBuffer(ctx, params, 0, 1, false).bucket_values(0); },
                        {"bucket_values", "distributed optimizer"});
}

// FP8 storage (--fp8-param-gather): the values become F8E4M3 views of a zeroed FP8 buffer, the values from before
// the move stay available for the optimizer's masters until released, and the gradients are moved as usual.
TEST(ParamAndGradBuffer, Fp8StorageKeepsTheValuesForTheMasters) {
  Context& ctx = testing::cpu_context();
  std::vector<nn::Parameter> storage;
  storage.push_back(nn::make_parameter(ctx, "a.weight", {16, 32}, DType::BF16, false));
  storage.push_back(nn::make_parameter(ctx, "b.weight", {48, 16}, DType::BF16, false));
  std::vector<nn::Parameter*> params;
  std::vector<std::vector<double>> values, grads;
  for (size_t i = 0; i < storage.size(); ++i) {
    testing::fill_random(storage[i].value, 300 + i);
    testing::fill_random(storage[i].main_grad, 400 + i);
    storage[i].keep_in_fp8 = true;
    params.push_back(&storage[i]);
    values.push_back(testing::to_doubles(ctx, storage[i].value));
    grads.push_back(testing::to_doubles(ctx, storage[i].main_grad));
  }
  ParamAndGradBuffer buffer(ctx, params, 0, 2, /*distributed_optimizer=*/true);
  ASSERT_TRUE(buffer.fp8_values());
  EXPECT_EQ(buffer.values().dtype(), DType::F8E4M3);
  EXPECT_EQ(buffer.param_dtype(), DType::BF16);
  for (size_t i = 0; i < params.size(); ++i) {
    const nn::Parameter& p = *params[i];
    EXPECT_TRUE(p.stored_in_fp8()) << p.name;
    EXPECT_EQ(p.dtype(), DType::BF16) << p.name;
    EXPECT_EQ(p.value.storage(), buffer.values().storage()) << p.name;
    EXPECT_EQ(p.value.shape(), p.main_grad.shape()) << p.name;
    for (double v : testing::to_doubles(ctx, p.value)) EXPECT_EQ(v, 0.0);  // until the optimizer quantises
    EXPECT_EQ(testing::to_doubles(ctx, p.fp8_scale_inv), std::vector<double>{1.0});
    EXPECT_EQ(testing::to_doubles(ctx, p.main_grad), grads[i]) << p.name;
    EXPECT_EQ(testing::to_doubles(ctx, buffer.initial_value(i)), values[i]) << p.name;
  }
  buffer.release_initial_values();
  testing::expect_error([&] { buffer.initial_value(0); }, {"initial_value", "release_initial_values"});
  // One buffer holds one kind; FP8 storage needs the distributed optimizer.
  std::vector<nn::Parameter> mixed;
  mixed.push_back(nn::make_parameter(ctx, "c.weight", {16, 16}, DType::BF16, false));
  mixed.push_back(nn::make_parameter(ctx, "d.weight", {16, 16}, DType::BF16, false));
  mixed[0].keep_in_fp8 = true;
  testing::expect_error([&] { ParamAndGradBuffer(ctx, {&mixed[0], &mixed[1]}, 0, 1, true); },
                        {"d.weight", "one buffer holds one kind"});
  testing::expect_error([&] { ParamAndGradBuffer(ctx, {&mixed[0]}, 0, 1, false); },
                        {"c.weight", "--fp8-param-gather", "distributed optimizer"});
}

TEST(BufferLayout, UnitsCloseBuckets) {
  // Units 0 0 1 1 2 of 10 .. 50 elements: a bucket per unit (in reverse order) whatever the size rule says,
  // and the size rule still closes buckets inside a unit.
  BufferLayout l = plan_buffer_layout({10, 20, 30, 40, 50}, 0, 1, {}, {0, 0, 1, 1, 2});
  ASSERT_EQ(l.buckets.size(), 3u);
  EXPECT_EQ(l.buckets[0].entries.size(), 1u);  // parameter 4
  EXPECT_EQ(l.buckets[1].numel, 70);            // parameters 3, 2
  EXPECT_EQ(l.buckets[2].numel, 30);            // parameters 1, 0
  BufferLayout sized = plan_buffer_layout({10, 20, 30, 40, 50}, 35, 1, {}, {0, 0, 0, 0, 0});
  EXPECT_EQ(sized.buckets.size(), 4u);  // 50 | 40 | 30 + 20 | 10 at >= 35 elements
  testing::expect_error([] { plan_buffer_layout({1, 2}, 0, 1, {}, {0}); }, {"1 unit numbers for 2 parameters"});
}

// Sharded storage at DP 2: each rank's shards hold exactly its elements of the whole buffer (the parameters'
// values and gradients at construction), the ranges map global elements to them, the Parameters are unbound,
// and binding a whole bucket makes them views of it again.
TEST(ParamAndGradBuffer, ShardedStorageKeepsOnlyThisRanksShards) {
  Context& ctx = testing::cpu_context();
  for (int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    std::vector<nn::Parameter> storage;
    storage.push_back(nn::make_parameter(ctx, "a.weight", {3, 50}, DType::F32, false));
    storage.push_back(nn::make_parameter(ctx, "a.bias", {70}, DType::F32, true));
    storage.push_back(nn::make_parameter(ctx, "b.weight", {9, 21}, DType::F32, false));
    std::vector<nn::Parameter*> params;
    std::vector<std::vector<double>> values, grads;
    for (size_t i = 0; i < storage.size(); ++i) {
      testing::fill_random(storage[i].value, 300 + i);
      testing::fill_random(storage[i].main_grad, 400 + i);
      params.push_back(&storage[i]);
      values.push_back(testing::to_doubles(ctx, storage[i].value));
      grads.push_back(testing::to_doubles(ctx, storage[i].main_grad));
    }
    // Units: {a.weight, a.bias} and {b.weight}: two buckets.
    ParamAndGradBuffer buffer(ctx, params, 0, 2, true, BufferSharding{.grads = true, .params = true}, rank, {0, 0, 1});
    const BufferLayout& l = buffer.layout();
    ASSERT_EQ(l.buckets.size(), 2u);
    for (const nn::Parameter* p : params) EXPECT_FALSE(p->value.defined() || p->main_grad.defined()) << p->name;
    // The whole buffer as the unsharded layout would hold it (padding zero), then each shard against it.
    std::vector<double> whole_values(size_t(l.numel), 0.0), whole_grads(size_t(l.numel), 0.0);
    for (const BufferLayout::Entry& e : l.entries)
      for (int64_t j = 0; j < e.numel; ++j) {
        whole_values[size_t(e.offset + j)] = values[e.param][size_t(j)];
        whole_grads[size_t(e.offset + j)] = grads[e.param][size_t(j)];
      }
    for (size_t k = 0; k < l.buckets.size(); ++k) {
      auto [s0, s1] = buffer.shard(k, rank);
      const std::vector<double> v = testing::to_doubles(ctx, buffer.value_shard(k));
      const std::vector<double> g = testing::to_doubles(ctx, buffer.grad_shard(k));
      EXPECT_EQ(v, std::vector<double>(whole_values.begin() + s0, whole_values.begin() + s1)) << "bucket " << k;
      EXPECT_EQ(g, std::vector<double>(whole_grads.begin() + s0, whole_grads.begin() + s1)) << "bucket " << k;
      // A sub-range inside the shard maps into it; one reaching outside is refused.
      EXPECT_EQ(testing::to_doubles(ctx, buffer.values_range(s0 + 1, s0 + 3)),
                std::vector<double>(whole_values.begin() + s0 + 1, whole_values.begin() + s0 + 3));
      const int64_t lo = s0 > 0 ? s0 - 1 : s0, hi = s0 > 0 ? s1 : s1 + 1;  // one element beyond the shard
      testing::expect_error([&] { buffer.values_range(lo, hi); }, {"not inside rank", "shard of one bucket"});
    }
    testing::expect_error([&] { buffer.grads(); }, {"only this rank's gradient shards persist"});
    // Binding a whole bucket: its Parameters become views of it (with their shapes), then unbound again.
    const size_t k = l.entries[0].bucket;
    Tensor whole = ctx.empty(Shape{l.buckets[k].numel}, DType::F32);
    testing::fill_random(whole, 7);
    buffer.bind_values(k, whole);
    for (size_t i : l.buckets[k].entries) {
      const BufferLayout::Entry& e = l.entries[i];
      const nn::Parameter& p = *params[e.param];
      ASSERT_TRUE(p.value.defined()) << p.name;
      EXPECT_EQ(p.value.shape(), storage[e.param].value.defined() ? storage[e.param].value.shape() : p.value.shape());
      EXPECT_EQ(p.value.numel(), e.numel);
      const int64_t at = e.offset - l.buckets[k].offset;
      EXPECT_EQ(testing::to_doubles(ctx, p.value), testing::to_doubles(ctx, whole.slice(at, at + e.numel))) << p.name;
    }
    buffer.unbind_values(k);
    for (size_t i : l.buckets[k].entries) EXPECT_FALSE(params[l.entries[i].param]->value.defined());
  }
}

}  // namespace
}  // namespace megatron::distributed
