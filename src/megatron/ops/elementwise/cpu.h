// CPU reference of the elementwise family (arguments already validated by elementwise.cpp).
#pragma once

#include "megatron/tensor/tensor.h"

namespace megatron::ops::cpu {

void cast(const Tensor& out, const Tensor& in);
void cast_scaled(const Tensor& out, const Tensor& amax, const Tensor& in, float scale);
void fill(const Tensor& out, double value);
void fill_uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi, uint64_t index_base);
void fill_normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std, uint64_t index_base);
void transpose(const Tensor& out, const Tensor& in, int64_t batch, int64_t m, int64_t n);
void add(const Tensor& out, const Tensor& a, const Tensor& b);
void mul(const Tensor& out, const Tensor& a, const Tensor& b);
void scale_rows(const Tensor& out, const Tensor& in, const Tensor& s);
void axpby(const Tensor& out, const Tensor& x, const Tensor& y, double alpha, double beta);  // scale: y = x, beta = 0
void sum_rows(const Tensor& out, const Tensor& in, int64_t rows, int64_t cols);
void sum_columns(const Tensor& out, const Tensor& in, int64_t rows, int64_t cols);
void sum_all(const Tensor& out, const Tensor& in);
void amax(const Tensor& out, const Tensor& in);

}  // namespace megatron::ops::cpu
