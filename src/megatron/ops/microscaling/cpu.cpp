// CPU MX quantisation: blocks in parallel (bounds fixed by the size, so the bits never depend on the thread
// count), each block widened to fp32, its amax and scale taken, then every element scaled and converted by
// the rules of formats.h.
#include "megatron/ops/microscaling/cpu.h"

#include <cmath>
#include <type_traits>

#include "megatron/ops/cpu_parallel.h"

namespace megatron::ops::cpu {

namespace {

template <class T>
float widen(T v) {
  if constexpr (std::is_same_v<T, double>) return float(v);  // round to nearest: the kernels work in fp32
  else return to_float(v);
}

template <class T>
void quantize_blocks(uint8_t* codes, uint8_t* scales, const T* in, int64_t blocks, MxElement element) {
  parallel_for(blocks, kStreamBlock / kMxBlock, [&](int64_t begin, int64_t end) {
    float x[kMxBlock];
    for (int64_t b = begin; b < end; ++b) {
      float amax = 0.0f;
      for (int64_t i = 0; i < kMxBlock; ++i) {
        x[i] = widen(in[b * kMxBlock + i]);
        amax = std::fmax(amax, std::fabs(x[i]));  // fmax returns the non-NaN operand: NaNs are skipped
      }
      const uint8_t scale = mx_scale_code(amax, element);
      scales[b] = scale;
      const float r = e8m0_reciprocal(scale);
      if (element == MxElement::E2M1) {
        uint8_t* dst = codes + b * (kMxBlock / 2);
        for (int64_t i = 0; i < kMxBlock; i += 2)
          dst[i / 2] = uint8_t(e2m1_from_float(x[i] * r) | (e2m1_from_float(x[i + 1] * r) << 4));
      } else {
        uint8_t* dst = codes + b * kMxBlock;
        for (int64_t i = 0; i < kMxBlock; ++i) dst[i] = mx_encode(x[i] * r, element);
      }
    }
  });
}

template <class T>
void dequantize_blocks(T* out, const uint8_t* codes, const uint8_t* scales, int64_t blocks, MxElement element) {
  parallel_for(blocks, kStreamBlock / kMxBlock, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float s = e8m0_to_float(scales[b]);
      T* dst = out + b * kMxBlock;
      for (int64_t i = 0; i < kMxBlock; ++i) {
        const uint8_t code = element == MxElement::E2M1 ? uint8_t(codes[(b * kMxBlock + i) / 2] >> (4 * (i & 1)))
                                                        : codes[b * kMxBlock + i];
        dst[i] = from_double<T>(double(s * mx_decode(code, element)));  // the fp32 product, rounded once
      }
    }
  });
}

}  // namespace

void mx_quantize(const Tensor& codes, const Tensor& scales, const Tensor& in, MxElement element) {
  const int64_t blocks = in.numel() / kMxBlock;
  auto* c = static_cast<uint8_t*>(codes.data_ptr());  // every codes dtype is one byte wide
  auto* s = scales.data<uint8_t>();
  visit_float_dtype(in.dtype(), "mx_quantize",
                    [&]<class T>() { quantize_blocks(c, s, in.data<T>(), blocks, element); });
}

void mx_dequantize(const Tensor& out, const Tensor& codes, const Tensor& scales, MxElement element) {
  const int64_t blocks = out.numel() / kMxBlock;
  const auto* c = static_cast<const uint8_t*>(codes.data_ptr());
  const auto* s = scales.data<uint8_t>();
  visit_float_dtype(out.dtype(), "mx_dequantize",
                    [&]<class T>() { dequantize_blocks(out.data<T>(), c, s, blocks, element); });
}

}  // namespace megatron::ops::cpu
