#include "megatron/data/tokenizers/json_util.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"

namespace megatron::data {

JsonWhere JsonWhere::child(std::string_view key) const {
  // Keys are outside text (a vocabulary's tokens): shown escaped when they hold anything but printable ASCII.
  const bool plain = std::all_of(key.begin(), key.end(), [](char c) { return c >= 0x20 && c < 0x7F && c != '"'; });
  const std::string shown = plain ? std::string(key) : quoted_bytes(key);
  return {file, path.empty() ? shown : str_cat(path, ".", shown)};
}
JsonWhere JsonWhere::index(size_t i) const { return {file, str_cat(path, "[", i, "]")}; }
std::string JsonWhere::str() const { return str_cat(file, ": ", path.empty() ? "<root>" : path); }

Json load_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MEGATRON_CHECK(in.good(), "cannot open ", path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return Json::parse(buffer.str());
  } catch (const Json::parse_error& e) {
    MEGATRON_FAIL(path, ": malformed JSON at byte ", e.byte, ": ", e.what());
  } catch (const Json::exception& e) {  // a number out of range while parsing (out_of_range 406), ...
    MEGATRON_FAIL(path, ": JSON not readable: ", e.what());
  }
}

const Json& json_member(const Json& j, std::string_view key, const JsonWhere& where) {
  MEGATRON_CHECK(j.is_object(), where.str(), " must be an object (it is ", j.type_name(), ")");
  const auto it = j.find(key);
  MEGATRON_CHECK(it != j.end(), where.str(), " has no member ", quoted_bytes(key));
  return *it;
}

const Json* json_optional(const Json& j, std::string_view key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::string json_string(const Json& j, const JsonWhere& where) {
  MEGATRON_CHECK(j.is_string(), where.str(), " must be a string (it is ", j.type_name(), ")");
  return j.get<std::string>();
}

bool json_bool(const Json& j, const JsonWhere& where) {
  MEGATRON_CHECK(j.is_boolean(), where.str(), " must be a boolean (it is ", j.type_name(), ")");
  return j.get<bool>();
}

int64_t json_int(const Json& j, const JsonWhere& where) {
  MEGATRON_CHECK(j.is_number_integer(), where.str(), " must be an integer (it is ", j.type_name(), ")");
  return j.get<int64_t>();
}

std::string json_string_or(const Json& j, std::string_view key, std::string fallback, const JsonWhere& where) {
  const Json* v = json_optional(j, key);
  return v ? json_string(*v, where.child(key)) : fallback;
}

bool json_bool_or(const Json& j, std::string_view key, bool fallback, const JsonWhere& where) {
  const Json* v = json_optional(j, key);
  return v ? json_bool(*v, where.child(key)) : fallback;
}

}  // namespace megatron::data
