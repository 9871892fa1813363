// Where a tensor's bytes live.
#pragma once

#include <ostream>

namespace megatron {

struct Device {
  enum class Kind : uint8_t { CPU, CUDA };
  Kind kind = Kind::CPU;
  int index = 0;  // CUDA ordinal; 0 for CPU

  static Device cpu() { return Device{Kind::CPU, 0}; }
  static Device cuda(int index = 0) { return Device{Kind::CUDA, index}; }
  bool is_cpu() const { return kind == Kind::CPU; }
  bool is_cuda() const { return kind == Kind::CUDA; }
  friend bool operator==(const Device&, const Device&) = default;
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) {
  return d.is_cpu() ? (os << "cpu") : (os << "cuda:" << d.index);
}

}  // namespace megatron
