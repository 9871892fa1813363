// The CUDA side of the runtime on a real GPU: caching allocator reuse, stats and the OOM message, pinned
// memory, streams/events, host<->device copies, and Philox giving the CPU's numbers on the device.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "harness.h"
#include "megatron/core/cuda_check.h"
#include "megatron/core/philox.h"
#include "megatron/runtime/cuda_libraries.h"
#include "megatron/runtime/cuda_stream.h"

namespace megatron {
namespace {

using testing::cpu_context;
using testing::cuda_context;

TEST(RuntimeGpu, CachingAllocatorReusesAndCounts) {
  MEGATRON_REQUIRE_GPU();
  Context& ctx = cuda_context();
  Allocator& a = ctx.allocator();
  a.reset_peak_stats();
  AllocatorStats before = a.stats();
  void* p = nullptr;
  {
    Tensor t = ctx.empty(Shape{3 << 20}, DType::F32);  // 12 MiB
    p = t.data_ptr();
    EXPECT_GE(a.stats().allocated_bytes, before.allocated_bytes + (size_t(12) << 20));
  }
  EXPECT_EQ(a.stats().allocated_bytes, before.allocated_bytes);
  Tensor again = ctx.empty(Shape{3 << 20}, DType::F32);
  EXPECT_EQ(again.data_ptr(), p) << "a freed block of the same size class and stream must be reused";
  EXPECT_GE(a.stats().peak_allocated_bytes, before.allocated_bytes + (size_t(12) << 20));
  EXPECT_GT(a.stats().num_cache_hits, before.num_cache_hits);
}

TEST(RuntimeGpu, OutOfMemoryErrorStatesRequestFreeReservedAndCaller) {
  MEGATRON_REQUIRE_GPU();
  Context& ctx = cuda_context();
  try {
    Tensor t = ctx.empty(Shape{int64_t(1) << 48}, DType::F32);  // 1 PiB
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("CUDA out of memory on cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("requested 1125899906842624 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("free on the device"), std::string::npos) << m;
    EXPECT_NE(m.find("reserved"), std::string::npos) << m;
    EXPECT_NE(m.find("test_cuda_runtime.cu"), std::string::npos) << "caller missing: " << m;
  }
  // The allocator still works afterwards.
  Tensor ok = ctx.empty(Shape{1024}, DType::F32);
  EXPECT_NE(ok.data_ptr(), nullptr);
}

TEST(RuntimeGpu, CopiesRoundTripThroughPinnedMemory) {
  MEGATRON_REQUIRE_GPU();
  Context& ctx = cuda_context();
  Tensor h = cpu_context().empty(Shape{1001}, DType::BF16);
  testing::fill_random(h, 5);
  Tensor pinned = Tensor::empty(h.shape(), h.dtype(), ctx.pinned_allocator());
  copy_tensor(ctx, pinned, h);
  Tensor d = ctx.empty(h.shape(), h.dtype());
  copy_tensor(ctx, d, pinned);
  Tensor back = cpu_context().empty(h.shape(), h.dtype());
  copy_tensor(ctx, back, d);
  EXPECT_EQ(std::memcmp(back.data_ptr(), h.data_ptr(), h.nbytes()), 0);
}

TEST(RuntimeGpu, EventsOrderStreams) {
  MEGATRON_REQUIRE_GPU();
  Context& ctx = cuda_context();
  CudaStream other;
  CudaEvent done(true), start(true);
  Tensor d = ctx.empty(Shape{1 << 24}, DType::U8);
  start.record(ctx.stream());
  CUDA_CHECK(cudaMemsetAsync(d.data_ptr(), 7, d.nbytes(), ctx.stream()));
  done.record(ctx.stream());
  other.wait(done.get());
  Tensor h = cpu_context().empty(d.shape(), DType::U8);
  CUDA_CHECK(cudaMemcpyAsync(h.data_ptr(), d.data_ptr(), d.nbytes(), cudaMemcpyDeviceToHost, other.get()));
  other.synchronize();
  EXPECT_EQ(h.data<uint8_t>()[d.numel() - 1], 7);
  EXPECT_TRUE(done.query());
  EXPECT_GE(done.elapsed_ms_since(start), 0.0f);
}

__global__ void philox_kernel(uint32_t* words, float* uniforms, float* normals, uint64_t seed, uint64_t offset, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    words[i] = philox_u32(seed, offset, uint64_t(i) + 12345);
    uniforms[i] = philox_uniform(seed, offset, uint64_t(i) + 12345);
    normals[i] = philox_normal(seed, offset, uint64_t(i) + 12345);
  }
}

TEST(RuntimeGpu, PhiloxMatchesCpu) {
  MEGATRON_REQUIRE_GPU();
  Context& ctx = cuda_context();
  const int n = 1 << 20;
  Tensor w = ctx.empty(Shape{n}, DType::I32), u = ctx.empty(Shape{n}, DType::F32), z = ctx.empty(Shape{n}, DType::F32);
  philox_kernel<<<(n + 255) / 256, 256, 0, ctx.stream()>>>(reinterpret_cast<uint32_t*>(w.data_ptr()), u.data<float>(),
                                                          z.data<float>(), 0xDEADBEEFCAFEull, 77, n);
  CUDA_CHECK_LAUNCH("philox_kernel");
  std::vector<double> gw = testing::to_doubles(ctx, w), gu = testing::to_doubles(ctx, u), gz = testing::to_doubles(ctx, z);
  int word_mismatch = 0, uniform_mismatch = 0, normal_ulp_off = 0;
  for (int i = 0; i < n; ++i) {
    uint64_t idx = uint64_t(i) + 12345;
    word_mismatch += uint32_t(int32_t(gw[i])) != philox_u32(0xDEADBEEFCAFEull, 77, idx);
    uniform_mismatch += float(gu[i]) != philox_uniform(0xDEADBEEFCAFEull, 77, idx);
    float cz = philox_normal(0xDEADBEEFCAFEull, 77, idx);
    normal_ulp_off += float(gz[i]) != cz;
  }
  EXPECT_EQ(word_mismatch, 0);
  EXPECT_EQ(uniform_mismatch, 0);
  // fp64 Box-Muller rounded to fp32: a difference needs the device and host libm to straddle a rounding
  // boundary (~2^-29 per element), so over 2^20 elements we allow a handful.
  EXPECT_LE(normal_ulp_off, 4);
}

}  // namespace
}  // namespace megatron
