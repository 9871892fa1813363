// Tensor views, shapes, dtypes and the op argument checks.
#include <gtest/gtest.h>

#include "harness.h"
#include "megatron/tensor/op_checks.h"

namespace megatron {
namespace {

using testing::cpu_context;

TEST(Tensor, ViewsShareStorageAndKeepContiguity) {
  Tensor t = cpu_context().empty(Shape{4, 3, 2}, DType::F32);
  float* p = t.data<float>();
  for (int i = 0; i < 24; ++i) p[i] = float(i);
  Tensor v = t.view({-1, 2});
  EXPECT_EQ(v.shape(), (Shape{12, 2}));
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.data<float>()[0], 6.0f);
  Tensor r = t.select(3);
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  EXPECT_EQ(r.data<float>()[5], 23.0f);
  EXPECT_EQ(r.slice(1, 2).data<float>()[0], 20.0f);
  EXPECT_THROW(t.view({5, 5}), Error);
  EXPECT_THROW(t.slice(2, 5), Error);
  EXPECT_THROW(t.data<bf16_t>(), Error);
}

TEST(Tensor, DescribeAndDtypeNames) {
  Tensor t = cpu_context().empty(Shape{4, 7}, DType::BF16);
  EXPECT_EQ(t.describe(), "bf16[4, 7] on cpu");
  for (DType d : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_THROW(parse_dtype("f31"), Error);
  EXPECT_EQ(dtype_size(DType::F8E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
}

TEST(OpCheck, MessagesNameOpArgumentAndShapes) {
  Tensor x = cpu_context().empty(Shape{4, 7}, DType::BF16);
  Tensor w = cpu_context().empty(Shape{8}, DType::BF16);
  try {
    OpCheck("rms_norm").shape("weight", w, Shape{x.dim(-1)});
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rms_norm: argument weight is bf16[8] on cpu but must have shape [7]");
  }
  try {
    OpCheck("gemm").device(Device::cuda(0), {{"a", x}});
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "gemm: argument a is bf16[4, 7] on cpu but the op runs on cuda:0");
  }
  EXPECT_THROW(OpCheck("add").dtype_in("x", x, {DType::F32, DType::F16}), Error);
  EXPECT_NO_THROW(OpCheck("add").dtype_in("x", x, {DType::F32, DType::BF16}));
}

TEST(Context, CpuContextAllocatesAndCudaFailsClearlyWithoutGpu) {
  Tensor t = cpu_context().empty(Shape{1000}, DType::F32);
  EXPECT_GE(cpu_context().allocator().stats().allocated_bytes, 4000u);
  if (!testing::have_gpu()) {
    try {
      Context::cuda(0);
      FAIL() << "no throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Context::cuda"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace megatron
