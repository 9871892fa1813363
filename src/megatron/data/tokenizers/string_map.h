// Hash maps keyed by std::string that can be searched with a std::string_view (no temporary strings).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace megatron::data {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

template <class T>
using StringMap = std::unordered_map<std::string, T, StringHash, std::equal_to<>>;

}  // namespace megatron::data
