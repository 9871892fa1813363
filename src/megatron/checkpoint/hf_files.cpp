// Reading and writing Hugging Face model directories (config.json, model.safetensors or an index + shards).
#include <fstream>
#include <set>

#include "megatron/checkpoint/hf_convert.h"
#include "megatron/checkpoint/safetensors.h"
#include "megatron/core/error.h"
#include "megatron/core/progress.h"
#include "megatron/core/quoted_bytes.h"

namespace megatron::checkpoint {
namespace fs = std::filesystem;
using json = nlohmann::json;

json read_hf_config(const fs::path& dir) {
  std::ifstream f(dir / "config.json");
  MEGATRON_CHECK(f.good(), "convert: ", (dir / "config.json").string(), " not found");
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    MEGATRON_FAIL("convert: ", (dir / "config.json").string(), " is not valid JSON: ", e.what());
  }
}

TensorMap read_hf_weights(const fs::path& dir) {
  std::vector<fs::path> files;
  if (fs::exists(dir / "model.safetensors.index.json")) {
    const fs::path index_path = dir / "model.safetensors.index.json";
    std::ifstream f(index_path);
    MEGATRON_CHECK(f.good(), "convert: cannot open ", index_path.string());
    json index;
    try {
      index = json::parse(f);
    } catch (const json::exception& e) {
      MEGATRON_FAIL("convert: ", index_path.string(), " is not valid JSON: ", e.what());
    }
    const auto map = index.is_object() ? index.find("weight_map") : index.end();
    MEGATRON_CHECK(map != index.end() && map->is_object(), "convert: ", index_path.string(),
                   " needs a \"weight_map\" object (tensor name -> file)");
    std::set<std::string> names;
    for (const auto& [k, v] : map->items()) {
      MEGATRON_CHECK(v.is_string(), "convert: ", index_path.string(), ": weight_map.", quoted_bytes(k),
                     " must name a file (it is ", v.type_name(), ")");
      const std::string name = v.get<std::string>();
      MEGATRON_CHECK(!name.empty() && fs::path(name).filename() == fs::path(name), "convert: ", index_path.string(),
                     ": weight_map.", quoted_bytes(k), " must name a file in ", dir.string(), ", got ", quoted_bytes(name));
      names.insert(name);
    }
    for (const std::string& n : names) files.push_back(dir / n);
  } else {
    MEGATRON_CHECK(fs::exists(dir / "model.safetensors"), "convert: ", dir.string(),
                   " has neither model.safetensors nor model.safetensors.index.json");
    files.push_back(dir / "model.safetensors");
  }
  TensorMap out;
  int64_t total_bytes = 0;
  for (const fs::path& p : files) total_bytes += int64_t(fs::file_size(p));
  Progress progress("reading " + dir.string(), total_bytes >> 20, "MB");
  int64_t read = 0;
  for (const fs::path& p : files) {
    auto file = SafetensorsFile::open(p);
    for (const SafetensorsEntry& e : file->entries()) {
      MEGATRON_CHECK(e.dtype.has_value(), "convert: ", p.string(), ": tensor '", e.name, "' has dtype ", e.file_dtype);
      HostTensor t;
      t.dtype = *e.dtype;
      t.shape = e.shape.dims();
      auto bytes = file->bytes(e.name);
      t.bytes.assign(bytes.begin(), bytes.end());
      read += int64_t(bytes.size());
      progress.update(read >> 20);
      out[e.name] = std::move(t);
    }
  }
  return out;
}

void write_hf_checkpoint(const fs::path& dir, const json& config, const TensorMap& tensors) {
  fs::create_directories(dir);
  std::vector<SafetensorsTensor> list;
  for (const auto& [name, t] : tensors) list.push_back({name, t.dtype, Shape(t.shape), t.bytes.data(), false});
  std::vector<SafetensorsTensor> ordered;
  for (size_t i : canonical_order(list)) ordered.push_back(list[i]);
  write_safetensors(dir / "model.safetensors", ordered, {{"format", "pt"}});
  std::ofstream f(dir / "config.json");
  f << config.dump(2) << "\n";
  MEGATRON_CHECK(f.good(), "convert: cannot write ", (dir / "config.json").string());
}

}  // namespace megatron::checkpoint
