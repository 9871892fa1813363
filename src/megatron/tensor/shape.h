// A tensor shape: up to a handful of int64 extents, row-major (last dimension contiguous).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <vector>

#include "megatron/core/error.h"

namespace megatron {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) { validate(); }
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) { validate(); }

  int rank() const { return int(dims_.size()); }
  // Negative indices count from the end, as in Python.
  int64_t operator[](int i) const { return dims_.at(normalize(i)); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims_) n *= d;
    return n;
  }
  // Product of the extents of all dimensions but the last ("rows" of a row-major matrix view).
  int64_t rows() const { return rank() == 0 ? 1 : numel() / dims_.back(); }
  int64_t cols() const { return rank() == 0 ? 1 : dims_.back(); }
  const std::vector<int64_t>& dims() const { return dims_; }
  int normalize(int i) const {
    int r = rank();
    MEGATRON_CHECK(i >= -r && i < r, "dimension ", i, " out of range for a rank-", r, " shape");
    return i < 0 ? i + r : i;
  }
  friend bool operator==(const Shape&, const Shape&) = default;

 private:
  void validate() const {
    for (int64_t d : dims_) MEGATRON_CHECK(d >= 0, "negative extent ", d, " in a shape");
  }
  std::vector<int64_t> dims_;
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) {
  os << '[';
  for (int i = 0; i < s.rank(); ++i) os << (i ? ", " : "") << s[i];
  return os << ']';
}

}  // namespace megatron
