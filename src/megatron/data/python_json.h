// A JSON value rendered exactly as Python's json.dumps(value, indent=4) renders the equivalent Python
// value (ensure_ascii escaping, float repr, "[]"/"{}" when empty, key order kept). Megatron names its index
// caches by the md5 of such a text, so matching the text byte for byte reproduces Megatron's cache names.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace megatron::data {

class PyJson {
 public:
  using Array = std::vector<PyJson>;
  using Object = std::vector<std::pair<std::string, PyJson>>;  // ordered, like Python's dict / OrderedDict

  PyJson() : value_(nullptr) {}  // None -> null
  PyJson(std::nullptr_t) : value_(nullptr) {}
  PyJson(bool b) : value_(b) {}
  PyJson(int v) : value_(int64_t{v}) {}
  PyJson(int64_t v) : value_(v) {}
  PyJson(double v) : value_(v) {}
  PyJson(const char* s) : value_(std::string(s)) {}
  PyJson(std::string s) : value_(std::move(s)) {}
  PyJson(Array a) : value_(std::move(a)) {}
  PyJson(Object o) : value_(std::move(o)) {}

  std::string dumps(int indent = 4) const;

 private:
  void render(std::string& out, int indent, int depth) const;
  std::variant<std::nullptr_t, bool, int64_t, double, std::string, Array, Object> value_;
};

// Python's repr(float): the shortest digits that round-trip, exponent form when the decimal exponent is
// < -4 or >= 16 ("1e-05", "1e+16"), ".0" appended to integral values.
std::string python_float_repr(double value);

}  // namespace megatron::data
