// CUDA kernels of the elementwise family (arguments already validated by elementwise.cpp). No CUDA types here.
#pragma once

#include "megatron/runtime/context.h"

namespace megatron::ops::cuda {

void cast(Context& ctx, const Tensor& out, const Tensor& in);
void cast_scaled(Context& ctx, const Tensor& out, const Tensor& amax, const Tensor& in, float scale);
void fill(Context& ctx, const Tensor& out, double value);
void fill_uniform(Context& ctx, const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi,
                  uint64_t index_base);
void fill_normal(Context& ctx, const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std,
                 uint64_t index_base);
void transpose(Context& ctx, const Tensor& out, const Tensor& in, int64_t batch, int64_t m, int64_t n);
void add(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b);
void mul(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b);
void scale_rows(Context& ctx, const Tensor& out, const Tensor& in, const Tensor& s);
void axpby(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& y, double alpha, double beta);
void sum_rows(Context& ctx, const Tensor& out, const Tensor& in, int64_t rows, int64_t cols);
void sum_columns(Context& ctx, const Tensor& out, const Tensor& in, int64_t rows, int64_t cols);
void sum_all(Context& ctx, const Tensor& out, const Tensor& in);
void amax(Context& ctx, const Tensor& out, const Tensor& in);

}  // namespace megatron::ops::cuda
