// The host conversions of core/float_types.h and core/fp8_convert.h against the CUDA intrinsics, bit for bit:
// widening on every 16-bit / 8-bit pattern, narrowing on edge cases, every value of each narrow format with
// the midpoints to its neighbours, and 16 million random fp32 bit patterns (NaN, inf and subnormal inputs
// included) plus 4 million random values inside the narrow formats' ranges.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "harness.h"
#include "megatron/core/cuda_check.h"
#include "megatron/core/dtype.h"

namespace megatron {
namespace {

__global__ void widen16_kernel(uint32_t* bf16_out, uint32_t* fp16_out) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < 65536u; i += gridDim.x * blockDim.x) {
    __nv_bfloat16_raw b;
    b.x = uint16_t(i);
    __half_raw h;
    h.x = uint16_t(i);
    bf16_out[i] = __float_as_uint(__bfloat162float(__nv_bfloat16(b)));
    fp16_out[i] = __float_as_uint(__half2float(__half(h)));
  }
}

__global__ void widen8_kernel(uint32_t* e4m3_out, uint32_t* e5m2_out) {
  uint32_t i = threadIdx.x;
  if (i < 256u) {
    e4m3_out[i] = __float_as_uint(__half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(i), __NV_E4M3))));
    e5m2_out[i] = __float_as_uint(__half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(i), __NV_E5M2))));
  }
}

__global__ void narrow_kernel(const uint32_t* in, size_t n, uint16_t* bf16_out, uint16_t* fp16_out, uint8_t* e4m3_out,
                              uint8_t* e5m2_out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float x = __uint_as_float(in[i]);
    bf16_out[i] = __nv_bfloat16_raw(__float2bfloat16_rn(x)).x;
    fp16_out[i] = __half_raw(__float2half_rn(x)).x;
    e4m3_out[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    e5m2_out[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
  }
}

template <class T>
std::vector<T> download(const T* device_ptr, size_t n) {
  std::vector<T> host(n);
  CUDA_CHECK(cudaMemcpy(host.data(), device_ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// Counts mismatches between `got` (ours) and `want` (the intrinsic) and prints the first ones.
template <class Bits>
void expect_same_bits(const char* what, const std::vector<uint32_t>& inputs, const std::vector<Bits>& ours,
                      const std::vector<Bits>& intrinsic) {
  size_t bad = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (ours[i] == intrinsic[i]) continue;
    if (bad++ < 12)
      ADD_FAILURE() << what << ": input 0x" << std::hex << inputs[i] << " -> ours 0x" << uint64_t(ours[i])
                    << ", intrinsic 0x" << uint64_t(intrinsic[i]) << std::dec;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << inputs.size() << " inputs differ";
}

TEST(FloatTypesGpu, WideningMatchesIntrinsicsOnEveryPattern) {
  MEGATRON_REQUIRE_GPU();
  uint32_t *d_bf16 = nullptr, *d_fp16 = nullptr, *d_e4m3 = nullptr, *d_e5m2 = nullptr;
  CUDA_CHECK(cudaMalloc(&d_bf16, 65536 * 4));
  CUDA_CHECK(cudaMalloc(&d_fp16, 65536 * 4));
  CUDA_CHECK(cudaMalloc(&d_e4m3, 256 * 4));
  CUDA_CHECK(cudaMalloc(&d_e5m2, 256 * 4));
  widen16_kernel<<<256, 256>>>(d_bf16, d_fp16);
  CUDA_CHECK_LAUNCH("widen16_kernel");
  widen8_kernel<<<1, 256>>>(d_e4m3, d_e5m2);
  CUDA_CHECK_LAUNCH("widen8_kernel");
  auto g_bf16 = download(d_bf16, 65536), g_fp16 = download(d_fp16, 65536);
  auto g_e4m3 = download(d_e4m3, 256), g_e5m2 = download(d_e5m2, 256);
  for (uint32_t* p : {d_bf16, d_fp16, d_e4m3, d_e5m2}) CUDA_CHECK(cudaFree(p));

  std::vector<uint32_t> in16(65536), in8(256);
  std::vector<uint32_t> o_bf16(65536), o_fp16(65536), o_e4m3(256), o_e5m2(256);
  for (uint32_t i = 0; i < 65536; ++i) {
    in16[i] = i;
    o_bf16[i] = std::bit_cast<uint32_t>(to_float(bf16_t{uint16_t(i)}));
    o_fp16[i] = std::bit_cast<uint32_t>(to_float(fp16_t{uint16_t(i)}));
  }
  for (uint32_t i = 0; i < 256; ++i) {
    in8[i] = i;
    o_e4m3[i] = std::bit_cast<uint32_t>(to_float(fp8e4m3_t{uint8_t(i)}));
    o_e5m2[i] = std::bit_cast<uint32_t>(to_float(fp8e5m2_t{uint8_t(i)}));
  }
  expect_same_bits("bf16 -> f32", in16, o_bf16, g_bf16);
  expect_same_bits("f16 -> f32", in16, o_fp16, g_fp16);
  expect_same_bits("e4m3 -> f32", in8, o_e4m3, g_e4m3);
  expect_same_bits("e5m2 -> f32", in8, o_e5m2, g_e5m2);
}

// Narrowing inputs: specials, every value of the four formats with the midpoints between neighbours and
// one fp32 ulp either side, random bit patterns, random values in the narrow ranges.
std::vector<uint32_t> narrowing_inputs() {
  std::vector<float> xs = {0.0f, -0.0f, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN, FLT_TRUE_MIN,
                           -FLT_TRUE_MIN, 448.0f, 464.0f, 465.0f, 480.0f, 57344.0f, 61440.0f, 65504.0f, 65520.0f};
  auto add_grid = [&](auto to_f, uint32_t count) {
    for (uint32_t c = 0; c + 1 < count; ++c) {
      float lo = to_f(c), hi = to_f(c + 1);
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      float mid = float((double(lo) + double(hi)) / 2);
      for (float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        xs.push_back(v);
        xs.push_back(-v);
      }
    }
  };
  add_grid([](uint32_t c) { return to_float(bf16_t{uint16_t(c)}); }, 0x7f80u);
  add_grid([](uint32_t c) { return to_float(fp16_t{uint16_t(c)}); }, 0x7c00u);
  add_grid([](uint32_t c) { return to_float(fp8e4m3_t{uint8_t(c)}); }, 0x7fu);
  add_grid([](uint32_t c) { return to_float(fp8e5m2_t{uint8_t(c)}); }, 0x7cu);
  std::vector<uint32_t> in;
  for (float x : xs) in.push_back(std::bit_cast<uint32_t>(x));
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu, 0x7fbfffffu})
    in.push_back(nan);
  std::mt19937_64 rng(20240917);
  for (size_t i = 0; i < (size_t(1) << 24); ++i) in.push_back(uint32_t(rng()));
  for (size_t i = 0; i < (size_t(1) << 22); ++i) {
    uint64_t r = rng();
    uint32_t exp = uint32_t(127 - 26 + int((r >> 32) % 44));  // 2^-26 .. 2^17
    in.push_back((uint32_t(r >> 63) << 31) | (exp << 23) | (uint32_t(r) & 0x7fffffu));
  }
  return in;
}

TEST(FloatTypesGpu, NarrowingMatchesIntrinsics) {
  MEGATRON_REQUIRE_GPU();
  std::vector<uint32_t> in = narrowing_inputs();
  size_t n = in.size();
  uint32_t* d_in = nullptr;
  uint16_t *d_bf16 = nullptr, *d_fp16 = nullptr;
  uint8_t *d_e4m3 = nullptr, *d_e5m2 = nullptr;
  CUDA_CHECK(cudaMalloc(&d_in, n * 4));
  CUDA_CHECK(cudaMalloc(&d_bf16, n * 2));
  CUDA_CHECK(cudaMalloc(&d_fp16, n * 2));
  CUDA_CHECK(cudaMalloc(&d_e4m3, n));
  CUDA_CHECK(cudaMalloc(&d_e5m2, n));
  CUDA_CHECK(cudaMemcpy(d_in, in.data(), n * 4, cudaMemcpyHostToDevice));
  narrow_kernel<<<1024, 256>>>(d_in, n, d_bf16, d_fp16, d_e4m3, d_e5m2);
  CUDA_CHECK_LAUNCH("narrow_kernel");
  auto g_bf16 = download(d_bf16, n), g_fp16 = download(d_fp16, n);
  auto g_e4m3 = download(d_e4m3, n), g_e5m2 = download(d_e5m2, n);
  CUDA_CHECK(cudaFree(d_in));
  CUDA_CHECK(cudaFree(d_bf16));
  CUDA_CHECK(cudaFree(d_fp16));
  CUDA_CHECK(cudaFree(d_e4m3));
  CUDA_CHECK(cudaFree(d_e5m2));

  std::vector<uint16_t> o_bf16(n), o_fp16(n);
  std::vector<uint8_t> o_e4m3(n), o_e5m2(n);
  for (size_t i = 0; i < n; ++i) {
    float x = std::bit_cast<float>(in[i]);
    o_bf16[i] = bf16_from_float(x).bits;
    o_fp16[i] = fp16_from_float(x).bits;
    o_e4m3[i] = fp8e4m3_from_float(x).bits;
    o_e5m2[i] = fp8e5m2_from_float(x).bits;
  }
  expect_same_bits("f32 -> bf16 (__float2bfloat16_rn)", in, o_bf16, g_bf16);
  expect_same_bits("f32 -> f16 (__float2half_rn)", in, o_fp16, g_fp16);
  expect_same_bits("f32 -> e4m3 (__nv_cvt_float_to_fp8 SATFINITE)", in, o_e4m3, g_e4m3);
  expect_same_bits("f32 -> e5m2 (__nv_cvt_float_to_fp8 SATFINITE)", in, o_e5m2, g_e5m2);
}

// Our conversions are also __device__ functions; on the GPU they must agree with themselves on the host
// (guards against host/device differences such as flushed subnormals in the software path).
__global__ void our_device_narrow_kernel(const uint32_t* in, size_t n, uint8_t* e4m3_out, uint8_t* e5m2_out,
                                         uint32_t* e4m3_wide, uint32_t* e5m2_wide) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float x = __uint_as_float(in[i]);
    e4m3_out[i] = fp8e4m3_from_float(x).bits;
    e5m2_out[i] = fp8e5m2_from_float(x).bits;
    e4m3_wide[i] = __float_as_uint(to_float(fp8e4m3_t{uint8_t(in[i])}));
    e5m2_wide[i] = __float_as_uint(to_float(fp8e5m2_t{uint8_t(in[i])}));
  }
}

TEST(FloatTypesGpu, OurFunctionsGiveTheSameBitsOnDevice) {
  MEGATRON_REQUIRE_GPU();
  std::vector<uint32_t> in = narrowing_inputs();
  size_t n = in.size();
  uint32_t *d_in = nullptr, *d_w4 = nullptr, *d_w5 = nullptr;
  uint8_t *d_4 = nullptr, *d_5 = nullptr;
  CUDA_CHECK(cudaMalloc(&d_in, n * 4));
  CUDA_CHECK(cudaMalloc(&d_w4, n * 4));
  CUDA_CHECK(cudaMalloc(&d_w5, n * 4));
  CUDA_CHECK(cudaMalloc(&d_4, n));
  CUDA_CHECK(cudaMalloc(&d_5, n));
  CUDA_CHECK(cudaMemcpy(d_in, in.data(), n * 4, cudaMemcpyHostToDevice));
  our_device_narrow_kernel<<<1024, 256>>>(d_in, n, d_4, d_5, d_w4, d_w5);
  CUDA_CHECK_LAUNCH("our_device_narrow_kernel");
  auto g4 = download(d_4, n), g5 = download(d_5, n);
  auto gw4 = download(d_w4, n), gw5 = download(d_w5, n);
  for (void* p : {(void*)d_in, (void*)d_w4, (void*)d_w5, (void*)d_4, (void*)d_5}) CUDA_CHECK(cudaFree(p));
  std::vector<uint8_t> h4(n), h5(n);
  std::vector<uint32_t> hw4(n), hw5(n);
  for (size_t i = 0; i < n; ++i) {
    float x = std::bit_cast<float>(in[i]);
    h4[i] = fp8e4m3_from_float(x).bits;
    h5[i] = fp8e5m2_from_float(x).bits;
    hw4[i] = std::bit_cast<uint32_t>(to_float(fp8e4m3_t{uint8_t(in[i])}));
    hw5[i] = std::bit_cast<uint32_t>(to_float(fp8e5m2_t{uint8_t(in[i])}));
  }
  expect_same_bits("fp8e4m3_from_float device vs host", in, g4, h4);
  expect_same_bits("fp8e5m2_from_float device vs host", in, g5, h5);
  expect_same_bits("to_float(e4m3) device vs host", in, gw4, hw4);
  expect_same_bits("to_float(e5m2) device vs host", in, gw5, hw5);
}

}  // namespace
}  // namespace megatron
