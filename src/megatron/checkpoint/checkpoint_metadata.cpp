#include "megatron/checkpoint/checkpoint_metadata.h"

#include <charconv>
#include <cstdio>
#include <fstream>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/checkpoint/json_integer.h"

namespace megatron::checkpoint {

namespace {

// One piece's fields (without the key, shape and dtype its tensor entry holds).
nlohmann::json piece_json(const SavedPiece& p) {
  nlohmann::json q;
  q["file"] = p.file;
  q["name"] = p.name;
  // A flat range names its box only when the box is a block (tensor parallelism), not the tensor.
  if (!p.spec.flat || !p.spec.box_is_whole()) {
    q["global_offset"] = p.spec.global_offset;
    q["local_shape"] = p.spec.local_shape;
  }
  if (p.spec.flat) q["flat_range"] = {p.spec.flat_begin, p.spec.flat_end};
  q["replica_id"] = p.spec.replica_id;
  q["bytes"] = p.bytes;
  char crc[16];
  std::snprintf(crc, sizeof crc, "0x%08x", p.crc32c);
  q["crc32c"] = crc;
  return q;
}

// "0x1a2b3c4d" (as piece_json writes it).
uint32_t parse_crc32c(const std::string& text, const std::string& key, const std::string& where) {
  uint32_t value = 0;
  const char* end = text.data() + text.size();
  const bool hex = text.size() > 2 && text.size() <= 10 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
  const auto [stop, error] = hex ? std::from_chars(text.data() + 2, end, value, 16) : std::from_chars(end, end, value);
  MEGATRON_CHECK(hex && error == std::errc() && stop == end, "checkpoint metadata ", where, ": a piece of '", key,
                 "' has crc32c ", quoted_bytes(text), "; expected 0x and up to 8 hex digits");
  return value;
}

SavedPiece parse_piece(const nlohmann::json& q, const std::string& key, const std::vector<int64_t>& global_shape,
                       DType dtype, const std::string& where) {
  SavedPiece p;
  p.spec.key = key;
  p.spec.global_shape = global_shape;
  p.spec.dtype = dtype;
  const std::string of = str_cat("'", key, "' piece's ");
  if (q.contains("flat_range")) {
    p.spec.flat = true;
    p.spec.flat_begin = json_integer<int64_t>(q.at("flat_range").at(0), of + "flat_range[0]");
    p.spec.flat_end = json_integer<int64_t>(q.at("flat_range").at(1), of + "flat_range[1]");
  }
  if (!p.spec.flat || q.contains("global_offset")) {
    p.spec.global_offset = json_integer_list(q.at("global_offset"), of + "global_offset");
    p.spec.local_shape = json_integer_list(q.at("local_shape"), of + "local_shape");
  } else {  // a flat range of the whole tensor
    p.spec.global_offset.assign(global_shape.size(), 0);
    p.spec.local_shape = global_shape;
  }
  if (q.contains("replica_id")) p.spec.replica_id = json_integer<int>(q.at("replica_id"), of + "replica_id");
  p.file = q.at("file").get<std::string>();
  p.name = q.at("name").get<std::string>();
  p.bytes = json_integer<uint64_t>(q.at("bytes"), of + "bytes");
  p.crc32c = parse_crc32c(q.at("crc32c").get<std::string>(), key, where);
  validate_shard(p.spec);
  MEGATRON_CHECK(p.file.find("..") == std::string::npos && !p.file.empty() && p.file[0] != '/',
                 "checkpoint metadata ", where, ": piece file '", p.file, "' of '", key, "' must be a plain file name");
  return p;
}

}  // namespace

CheckpointMetadata make_metadata(int64_t iteration, const std::vector<SavedPiece>& pieces, nlohmann::json state) {
  CheckpointMetadata m;
  m.iteration = iteration;
  m.state = std::move(state);
  for (const SavedPiece& p : pieces) {
    auto [it, fresh] = m.tensors.try_emplace(p.spec.key);
    TensorEntry& e = it->second;
    if (fresh) {
      e.global_shape = p.spec.global_shape;
      e.dtype = p.spec.dtype;
    }
    MEGATRON_CHECK(e.global_shape == p.spec.global_shape && e.dtype == p.spec.dtype, "checkpoint: pieces of '",
                   p.spec.key, "' disagree on the global shape or dtype: ", p.spec.describe(), " vs ",
                   e.pieces.front().spec.describe());
    MEGATRON_CHECK(p.spec.replica_id == 0, "checkpoint: piece ", p.spec.describe(),
                   " is a replica; only replica 0 is saved");
    e.pieces.push_back(p);
  }
  for (const auto& [key, e] : m.tensors) {
    std::vector<ShardSpec> specs;
    for (const SavedPiece& p : e.pieces) specs.push_back(p.spec);
    check_exact_cover(specs);
  }
  return m;
}

nlohmann::json metadata_to_json(const CheckpointMetadata& m) {
  nlohmann::json j;
  j["format"] = kFormatName;
  j["version"] = kFormatVersion;
  j["iteration"] = m.iteration;
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [key, e] : m.tensors) {
    nlohmann::json t;
    t["global_shape"] = e.global_shape;
    t["dtype"] = dtype_name(e.dtype);
    nlohmann::json pieces = nlohmann::json::array();
    for (const SavedPiece& p : e.pieces) pieces.push_back(piece_json(p));
    t["pieces"] = std::move(pieces);
    tensors[key] = std::move(t);
  }
  j["tensors"] = std::move(tensors);
  j["state"] = m.state;
  return j;
}

CheckpointMetadata metadata_from_json(const nlohmann::json& j, const std::string& where) {
  CheckpointMetadata m;
  try {
    MEGATRON_CHECK(j.value("format", std::string()) == kFormatName, "checkpoint metadata ", where,
                   ": not a megatron.cpp sharded checkpoint (format '", j.value("format", std::string()), "')");
    const int version = json_integer<int>(j.at("version"), "version");
    MEGATRON_CHECK(version == kFormatVersion, "checkpoint metadata ", where, ": format version ", version,
                   " is not supported (this build reads version ", kFormatVersion, ")");
    m.iteration = json_integer<int64_t>(j.at("iteration"), "iteration");
    m.state = j.value("state", nlohmann::json::object());
    for (const auto& [key, t] : j.at("tensors").items()) {
      TensorEntry e;
      e.global_shape = json_integer_list(t.at("global_shape"), str_cat("'", key, "' global_shape"));
      e.dtype = parse_dtype(t.at("dtype").get<std::string>());
      for (const auto& q : t.at("pieces")) e.pieces.push_back(parse_piece(q, key, e.global_shape, e.dtype, where));
      std::vector<ShardSpec> specs;
      for (const SavedPiece& p : e.pieces) specs.push_back(p.spec);
      check_exact_cover(specs);
      m.tensors.emplace(key, std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL("checkpoint metadata ", where, " is malformed: ", e.what());
  } catch (const Error& e) {
    MEGATRON_FAIL("checkpoint metadata ", where, ": ", e.what());
  }
  return m;
}

nlohmann::json saved_pieces_to_json(const std::vector<SavedPiece>& pieces) {
  nlohmann::json out = nlohmann::json::array();
  for (const SavedPiece& p : pieces) {
    nlohmann::json q = piece_json(p);
    q["key"] = p.spec.key;
    q["global_shape"] = p.spec.global_shape;
    q["dtype"] = dtype_name(p.spec.dtype);
    out.push_back(std::move(q));
  }
  return out;
}

std::vector<SavedPiece> saved_pieces_from_json(const nlohmann::json& j, const std::string& where) {
  std::vector<SavedPiece> out;
  try {
    for (const auto& q : j)
      out.push_back(parse_piece(q, q.at("key").get<std::string>(), json_integer_list(q.at("global_shape"), "global_shape"),
                                parse_dtype(q.at("dtype").get<std::string>()), where));
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL("checkpoint: the piece list from ", where, " is malformed: ", e.what());
  } catch (const Error& e) {
    MEGATRON_FAIL("checkpoint: the piece list from ", where, ": ", e.what());
  }
  return out;
}

CheckpointMetadata read_metadata(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / kMetadataFile;
  std::ifstream f(path);
  MEGATRON_CHECK(f.good(), "checkpoint: ", dir.string(), " has no ", kMetadataFile,
                 " (not a megatron.cpp checkpoint, or an incomplete save)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL("checkpoint metadata ", path.string(), " is not valid JSON (truncated or corrupt?): ", e.what());
  }
  return metadata_from_json(j, path.string());
}

}  // namespace megatron::checkpoint
