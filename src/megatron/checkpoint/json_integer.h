// Integers read from checkpoint JSON (metadata.json and the training state it carries), which come from files
// and so are untrusted. nlohmann converts a JSON float to an integer type with a plain cast, undefined
// behaviour outside the type's range (1e300 as uint64_t), so only JSON integers within T's range are taken;
// anything else is an Error naming the field and the value.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"

namespace megatron::checkpoint {

template <class T>
T json_integer(const nlohmann::json& v, const std::string& field) {
  using Limits = std::numeric_limits<T>;
  bool ok = false;
  if (v.is_number_unsigned()) {
    ok = v.get<uint64_t>() <= uint64_t(Limits::max());
  } else if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    ok = x >= int64_t(Limits::min()) && (x < 0 || uint64_t(x) <= uint64_t(Limits::max()));
  }
  MEGATRON_CHECK(ok, field, " must be an integer in [", Limits::min(), ", ", Limits::max(), "], got ",
                 quoted_bytes(v.dump()));
  return v.is_number_unsigned() ? T(v.get<uint64_t>()) : T(v.get<int64_t>());
}

// Member `key` of object `j` as json_integer, or `fallback` when `j` has no such member.
template <class T>
T json_integer_or(const nlohmann::json& j, const std::string& key, T fallback, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) return fallback;
  return json_integer<T>(j.at(key), where + key);
}

inline std::vector<int64_t> json_integer_list(const nlohmann::json& v, const std::string& field) {
  MEGATRON_CHECK(v.is_array(), field, " must be a list of integers, got a ", v.type_name());
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(json_integer<int64_t>(v[i], str_cat(field, "[", i, "]")));
  return out;
}

}  // namespace megatron::checkpoint
