// UploadStaging (runtime/upload_staging.h): every uploaded tensor arrives with its host values, across dtypes and
// odd sizes, when the host tensors are overwritten as soon as upload() returns, when more uploads are queued than
// there are slots (a slot is reused only after its copies ran), and when an upload outgrows its slot's buffer; a
// transfer whose two sides differ is refused with both named. On a GPU (UploadStagingGpu), uploads queued behind
// a busy stream return without waiting for it, as many as there are slots; the next one waits for the oldest.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "harness.h"
#include "megatron/runtime/upload_staging.h"

namespace megatron {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// One upload's host tensors (random values of several dtypes and odd sizes, growing with `i`), their expected
// values and the device tensors they go to.
struct Batch {
  std::vector<Tensor> host, device;
  std::vector<std::vector<double>> expected;
};

Batch make_batch(Context& ctx, int i) {
  Batch b;
  const DType dtypes[] = {DType::I64, DType::F32, DType::BF16};
  for (int k = 0; k < 3; ++k) {
    const int64_t n = 1 + 997 * (i + 1) * (k + 1) + (i % 2 ? 4096 * i : 0);  // odd sizes; every other one larger
    Tensor host = Tensor::empty({n}, dtypes[k], testing::cpu_context().allocator());
    testing::fill_random(host, testing::seed_from("upload") + uint64_t(10 * i + k), -1000.0, 1000.0);
    b.expected.push_back(testing::to_doubles(testing::cpu_context(), host));
    b.device.push_back(ctx.empty({n}, dtypes[k]));
    b.host.push_back(host);
  }
  return b;
}

void upload(UploadStaging& staging, const Batch& b) {
  std::vector<UploadStaging::Transfer> transfers;
  for (size_t k = 0; k < b.host.size(); ++k) transfers.push_back({b.device[k], b.host[k]});
  staging.upload(transfers);
}

// Uploads `count` batches through `slots` slots, overwriting each host tensor right after its upload, then
// compares every device tensor with its batch's values.
void expect_uploads_arrive(Context& ctx, int slots, int count) {
  UploadStaging staging(ctx, slots);
  std::vector<Batch> batches;
  for (int i = 0; i < count; ++i) {
    batches.push_back(make_batch(ctx, i));
    upload(staging, batches.back());
    for (const Tensor& h : batches.back().host) testing::fill_random(h, 99, 5000.0, 6000.0);  // not what was sent
  }
  ctx.synchronize();
  for (int i = 0; i < count; ++i)
    for (size_t k = 0; k < batches[size_t(i)].device.size(); ++k)
      EXPECT_EQ(testing::to_doubles(ctx, batches[size_t(i)].device[k]), batches[size_t(i)].expected[k])
          << "upload " << i << ", tensor " << k;
}

TEST(UploadStaging, EveryUploadArrivesOnTheCpu) { expect_uploads_arrive(testing::cpu_context(), 2, 5); }

TEST(UploadStaging, RefusesTransfersWhoseSidesDiffer) {
  Context& ctx = testing::cpu_context();
  UploadStaging staging(ctx, 2);
  Tensor host = Tensor::empty({4}, DType::F32, ctx.allocator()), other = ctx.empty({5}, DType::F32);
  const std::vector<UploadStaging::Transfer> wrong{{other, host}};
  testing::expect_error([&] { staging.upload(wrong); }, {"cannot upload", "f32[4] on cpu into f32[5]", "number of elements"});
  testing::expect_error([&] { UploadStaging none(ctx, 0); }, {"at least one slot", "0"});
}

TEST(UploadStagingGpu, EveryUploadArrivesThroughReusedAndGrownSlots) {
  MEGATRON_REQUIRE_GPU();
  expect_uploads_arrive(testing::cuda_context(), 2, 7);
}

TEST(UploadStagingGpu, UploadsBehindABusyStreamDoNotWaitForIt) {
  MEGATRON_REQUIRE_GPU();
  Context& ctx = testing::cuda_context();
  const int64_t n = int64_t(64) << 20;  // floats: 256 MiB
  Tensor a = ctx.empty({n}, DType::F32), b = ctx.empty({n}, DType::F32);
  copy_tensor(ctx, a, b);
  const int slots = 3;
  std::vector<Batch> batches;
  for (int i = 0; i <= slots; ++i) batches.push_back(make_batch(ctx, 40 + i));  // ~1 MiB each
  UploadStaging staging(ctx, slots);
  ctx.synchronize();

  const Clock::time_point busy_start = Clock::now();
  for (int i = 0; i < 400; ++i) copy_tensor(ctx, a, b);  // 400 x 512 MiB of traffic: tens of milliseconds
  const Clock::time_point upload_start = Clock::now();
  for (int i = 0; i < slots; ++i) upload(staging, batches[size_t(i)]);
  const double queued = seconds_since(upload_start);
  upload(staging, batches[size_t(slots)]);  // the ring is full: waits for the first upload's copies
  const double waited = seconds_since(upload_start);
  ctx.synchronize();
  const double busy = seconds_since(busy_start);
  EXPECT_LT(queued, 0.1 * busy) << slots << " uploads queued in " << queued << " s behind " << busy << " s of work";
  EXPECT_GT(waited, 0.5 * busy) << "the fourth upload reused the first slot before its copies ran";
  for (int i = 0; i <= slots; ++i)
    for (size_t k = 0; k < batches[size_t(i)].device.size(); ++k)
      EXPECT_EQ(testing::to_doubles(ctx, batches[size_t(i)].device[k]), batches[size_t(i)].expected[k]);
}

}  // namespace
}  // namespace megatron
