// Reading tokenizer JSON files with errors that name the file and the JSON path ("f.json: model.merges[3]").
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace megatron::data {

using Json = nlohmann::json;

// Where a JSON value sits: file path plus JSON path; child() extends it.
struct JsonWhere {
  std::string file;
  std::string path;  // "" for the root
  JsonWhere child(std::string_view key) const;
  JsonWhere index(size_t i) const;
  std::string str() const;  // "file: path" (or "file: <root>")
};

// Parses a whole file; errors name the path and the parser's byte offset.
Json load_json_file(const std::string& path);
// The member `key` of object `j`; errors when `j` is not an object or lacks `key`.
const Json& json_member(const Json& j, std::string_view key, const JsonWhere& where);
// The member or nullptr when absent or null.
const Json* json_optional(const Json& j, std::string_view key);
std::string json_string(const Json& j, const JsonWhere& where);
bool json_bool(const Json& j, const JsonWhere& where);
int64_t json_int(const Json& j, const JsonWhere& where);
// Optional members with defaults (null counts as absent).
std::string json_string_or(const Json& j, std::string_view key, std::string fallback, const JsonWhere& where);
bool json_bool_or(const Json& j, std::string_view key, bool fallback, const JsonWhere& where);

}  // namespace megatron::data
