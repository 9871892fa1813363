// Tensor: a typed, shaped view of shared storage.
//
// Invariants: a tensor is always row-major contiguous over [offset, offset + numel) elements of its
// storage. Views (view, slice along dim 0, select) share the storage and keep that invariant; anything
// else (transpose, non-leading slices) is an op that writes a new tensor. This keeps every kernel's
// indexing trivial; strided views can come later if a layout needs them.
#pragma once

#include <memory>
#include <string>

#include "megatron/core/dtype.h"
#include "megatron/tensor/allocator.h"
#include "megatron/tensor/device.h"
#include "megatron/tensor/shape.h"

namespace megatron {

// Owns (or borrows) one allocation.
class Storage {
 public:
  // `owner` == nullptr: borrowed memory, not freed here.
  Storage(void* ptr, size_t bytes, Device device, Allocator* owner) : ptr_(ptr), bytes_(bytes), device_(device), owner_(owner) {}
  ~Storage() {
    if (owner_ != nullptr) owner_->deallocate(ptr_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* ptr_;
  size_t bytes_;
  Device device_;
  Allocator* owner_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: no storage

  // New uninitialised tensor from `allocator` (for CUDA: usable on `stream`).
  static Tensor empty(const Shape& shape, DType dtype, Allocator& allocator, StreamHandle stream = nullptr,
                      std::source_location caller = std::source_location::current());
  // Borrows memory the caller keeps alive.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  int64_t offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* data_ptr() const {
    return storage_ ? static_cast<char*>(storage_->data()) + offset_ * int64_t(dtype_size(dtype_)) : nullptr;
  }
  // Typed pointer; throws if T is not this tensor's element type.
  template <class T>
  T* data() const {
    MEGATRON_CHECK(dtype_v<T> == dtype_, "Tensor::data<", dtype_name(dtype_v<T>), ">() on a ", describe());
    return static_cast<T*>(data_ptr());
  }

  // Same elements, another shape (numel must match; -1 infers one extent).
  Tensor view(std::vector<int64_t> dims) const;
  // Rows [begin, end) of dimension 0.
  Tensor slice(int64_t begin, int64_t end) const;
  // Row i of dimension 0, with that dimension dropped.
  Tensor select(int64_t i) const;

  // "bf16[4, 7] on cuda:0" (for error messages).
  std::string describe() const;

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::F32;
  int64_t offset_ = 0;  // in elements
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace megatron
