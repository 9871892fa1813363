#include "megatron/checkpoint/shard_reader.h"

#include <cstring>
#include <vector>

#include "megatron/checkpoint/checkpoint_dir.h"
#include "megatron/core/crc32c.h"
#include "megatron/checkpoint/safetensors.h"
#include "megatron/checkpoint/sharded_tensor.h"
#include "megatron/core/error.h"

namespace megatron::checkpoint {
namespace fs = std::filesystem;
namespace {

// dst[i] = src[i] converted (float types through double, CUDA's rounding on narrowing).
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) {
  visit_dtype(dst_dtype, [&]<class D>() {
    visit_dtype(src_dtype, [&]<class S>() {
      D* d = static_cast<D*>(dst);
      const S* s = static_cast<const S*>(src);
      for (int64_t i = 0; i < n; ++i) d[i] = from_double<D>(to_double(s[i]));
    });
  });
}

}  // namespace

CheckpointReader CheckpointReader::open(const fs::path& path) {
  CheckpointReader r;
  if (fs::exists(path / kMetadataFile)) {
    r.dir_ = path;
    r.release_ = path.filename() == "release";
  } else {
    std::optional<LatestCheckpoint> latest = read_latest_checkpoint(path);
    MEGATRON_CHECK(latest.has_value(), "checkpoint: ", path.string(), " holds neither ", kTrackerFile, " nor ",
                   kMetadataFile, " (no checkpoint there)");
    r.dir_ = latest->dir;
    r.release_ = latest->release;
  }
  r.metadata_ = read_metadata(r.dir_);
  return r;
}

const TensorEntry& CheckpointReader::tensor(const std::string& key) const {
  auto it = metadata_.tensors.find(key);
  MEGATRON_CHECK(it != metadata_.tensors.end(), "checkpoint ", dir_.string(), " has no tensor '", key, "' (it holds ",
                 metadata_.tensors.size(), " tensors)");
  return it->second;
}

const SafetensorsFile& CheckpointReader::file(const SavedPiece& piece) {
  auto it = files_.find(piece.file);
  if (it == files_.end()) {
    std::shared_ptr<SafetensorsFile> f;
    try {
      f = SafetensorsFile::open(dir_ / piece.file);
    } catch (const Error& e) {
      MEGATRON_FAIL("checkpoint: cannot read tensor '", piece.spec.key, "' from shard file ", (dir_ / piece.file).string(),
                    ": ", e.what());
    }
    it = files_.emplace(piece.file, std::move(f)).first;
  }
  return *it->second;
}

void CheckpointReader::load(Context& ctx, const ShardSpec& want, const Tensor& dst) {
  const TensorEntry& entry = tensor(want.key);
  validate_shard(want);
  MEGATRON_CHECK(want.global_shape == entry.global_shape, "checkpoint ", dir_.string(), ": tensor '", want.key,
                 "' is ", dims_text(entry.global_shape), " in the checkpoint but ", dims_text(want.global_shape),
                 " in this model");
  MEGATRON_CHECK(dst.defined() && dst.numel() == want.numel(), "checkpoint: loading ", want.describe(), " into ",
                 dst.defined() ? dst.describe() : std::string("an undefined tensor"), " (", want.numel(), " elements expected)");
  const bool same_dtype = dst.dtype() == entry.dtype;
  MEGATRON_CHECK(same_dtype || (is_floating(dst.dtype()) && is_floating(entry.dtype)), "checkpoint: tensor '", want.key,
                 "' is ", dtype_name(entry.dtype), " in the checkpoint and cannot be loaded as ", dtype_name(dst.dtype()));
  const size_t es = dtype_size(entry.dtype);
  std::vector<std::byte> staging;
  void* buffer = nullptr;
  if (same_dtype && dst.device().is_cpu()) {
    buffer = dst.data_ptr();
  } else {
    staging.resize(size_t(want.numel()) * es);
    buffer = staging.data();
  }
  ShardSpec target = want;
  target.dtype = entry.dtype;
  int64_t copied = 0;
  for (const SavedPiece& piece : entry.pieces) {
    if (overlap_elements(target, piece.spec) == 0) continue;
    const SafetensorsFile& f = file(piece);
    const fs::path where = dir_ / piece.file;
    MEGATRON_CHECK(f.contains(piece.name), "checkpoint: shard file ", where.string(), " lacks tensor '", piece.name,
                   "' (piece ", piece.spec.describe(), ")");
    std::span<const std::byte> bytes = f.bytes(piece.name);
    MEGATRON_CHECK(bytes.size() == piece.bytes, "checkpoint: shard file ", where.string(), ": tensor '", piece.name,
                   "' holds ", bytes.size(), " bytes, metadata says ", piece.bytes);
    const std::string id = piece.file + "/" + piece.name;
    if (!verified_.count(id)) {
      const uint32_t crc = crc32c(bytes.data(), bytes.size());
      if (crc != piece.crc32c) {
        char got[16], want_crc[16];
        std::snprintf(got, sizeof got, "0x%08x", crc);
        std::snprintf(want_crc, sizeof want_crc, "0x%08x", piece.crc32c);
        MEGATRON_FAIL("checkpoint: shard file ", where.string(), " is corrupt: tensor '", piece.name, "' (",
                      piece.spec.describe(), ", data bytes ", f.data_start() + f.entry(piece.name).begin, "..",
                      f.data_start() + f.entry(piece.name).end, " of the file) has CRC-32C ", got, ", metadata says ",
                      want_crc);
      }
      verified_.insert(id);
    }
    copied += copy_overlap(target, buffer, piece.spec, bytes.data(), es);
    bytes_read_ += bytes.size();
  }
  MEGATRON_CHECK(copied == want.numel(), "checkpoint ", dir_.string(), ": found ", copied, " of the ", want.numel(),
                 " elements of ", want.describe());
  if (buffer == dst.data_ptr()) return;
  if (!same_dtype) {
    std::vector<std::byte> converted(size_t(want.numel()) * dtype_size(dst.dtype()));
    convert(converted.data(), dst.dtype(), buffer, entry.dtype, want.numel());
    staging.swap(converted);
  }
  copy_tensor(ctx, dst, Tensor::from_blob(staging.data(), dst.shape(), dst.dtype(), Device::cpu()));
  ctx.synchronize();  // `staging` dies here
}

void CheckpointReader::load_whole(Context& ctx, const std::string& key, const Tensor& dst) {
  const TensorEntry& entry = tensor(key);
  load(ctx, whole_tensor(key, entry.global_shape, entry.dtype), dst);
}

}  // namespace megatron::checkpoint
