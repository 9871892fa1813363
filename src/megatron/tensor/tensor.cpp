#include "megatron/tensor/tensor.h"

namespace megatron {

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator& allocator, StreamHandle stream,
                     std::source_location caller) {
  Tensor t;
  size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
  void* p = allocator.allocate(bytes, stream, caller);
  t.storage_ = std::make_shared<Storage>(p, bytes, allocator.device(), &allocator);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(data, size_t(shape.numel()) * dtype_size(dtype), device, nullptr);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::view(std::vector<int64_t> dims) const {
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      MEGATRON_CHECK(infer < 0, "Tensor::view: more than one -1 in the new shape for ", describe());
      infer = int(i);
    } else {
      known *= dims[i];
    }
  }
  if (infer >= 0) {
    MEGATRON_CHECK(known > 0 && numel() % known == 0, "Tensor::view: cannot infer -1 for ", describe());
    dims[infer] = numel() / known;
  }
  Shape s(std::move(dims));
  MEGATRON_CHECK(s.numel() == numel(), "Tensor::view: shape ", s, " has ", s.numel(), " elements but ", describe(),
                 " has ", numel());
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  MEGATRON_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "Tensor::slice(", begin, ", ", end,
                 ") out of range for ", describe());
  std::vector<int64_t> dims = shape_.dims();
  int64_t row = dims[0] == 0 ? 0 : numel() / dims[0];
  dims[0] = end - begin;
  Tensor t = *this;
  t.shape_ = Shape(std::move(dims));
  t.offset_ = offset_ + begin * row;
  return t;
}

Tensor Tensor::select(int64_t i) const {
  Tensor t = slice(i, i + 1);
  std::vector<int64_t> dims(shape_.dims().begin() + 1, shape_.dims().end());
  t.shape_ = Shape(std::move(dims));
  return t;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return str_cat(dtype_name(dtype_), shape_, " on ", device());
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.describe(); }

}  // namespace megatron
