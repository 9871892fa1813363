#include "megatron/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <set>
#include <span>

#include <nlohmann/json.hpp>

#include "megatron/core/error.h"

namespace megatron::checkpoint {
namespace {

// The reference's dtype enum, in its order (the order canonical_order sorts by), with element sizes.
struct FileDType {
  const char* name;
  size_t size;
  std::optional<DType> dtype;
  bool is_bool;
};
const FileDType kFileDTypes[] = {
    {"BOOL", 1, DType::U8, true},          {"U8", 1, DType::U8, false},
    {"I8", 1, DType::I8, false},           {"F8_E5M2", 1, DType::F8E5M2, false},
    {"F8_E4M3", 1, DType::F8E4M3, false},  {"I16", 2, DType::I16, false},
    {"U16", 2, DType::U16, false},         {"F16", 2, DType::F16, false},
    {"BF16", 2, DType::BF16, false},       {"I32", 4, DType::I32, false},
    {"U32", 4, std::nullopt, false},       {"F32", 4, DType::F32, false},
    {"F64", 8, DType::F64, false},         {"I64", 8, DType::I64, false},
    {"U64", 8, std::nullopt, false},
};

const FileDType* find_file_dtype(const std::string& name) {
  for (const FileDType& d : kFileDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

int dtype_rank(const SafetensorsTensor& t) {
  const std::string name = t.is_bool ? "BOOL" : safetensors_dtype_name(t.dtype);
  for (size_t i = 0; i < std::size(kFileDTypes); ++i)
    if (name == kFileDTypes[i].name) return int(i);
  return -1;
}

size_t byte_size(const SafetensorsTensor& t) { return size_t(t.shape.numel()) * dtype_size(t.dtype); }

// The largest header the reference accepts (100 MB); larger lengths mean a corrupt file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const void* data, size_t n, const std::filesystem::path& path, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) MEGATRON_FAIL("safetensors: writing ", what, " to ", path.string(), " failed: ", errno_text());
    p += w;
    n -= size_t(w);
  }
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8E4M3: return "F8_E4M3";
    case DType::F8E5M2: return "F8_E5M2";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U16: return "U16";
    case DType::U8: return "U8";
  }
  MEGATRON_FAIL("safetensors: no safetensors dtype for dtype code ", int(dtype));
}

std::vector<size_t> canonical_order(std::span<const SafetensorsTensor> tensors) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int ra = dtype_rank(tensors[a]), rb = dtype_rank(tensors[b]);
    if (ra != rb) return ra > rb;
    return tensors[a].name < tensors[b].name;
  });
  return order;
}

std::string safetensors_header(std::span<const SafetensorsTensor> tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    MEGATRON_CHECK(t.name != "__metadata__", "safetensors: a tensor may not be named __metadata__");
    MEGATRON_CHECK(seen.insert(t.name).second, "safetensors: tensor '", t.name, "' is listed twice");
    MEGATRON_CHECK(!t.is_bool || t.dtype == DType::U8, "safetensors: tensor '", t.name, "' is BOOL but its dtype is ",
                   dtype_name(t.dtype), " (BOOL tensors are U8 bytes)");
    const uint64_t n = byte_size(t);
    MEGATRON_CHECK(n == 0 || t.data != nullptr, "safetensors: tensor '", t.name, "' (", n, " bytes) has no data");
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = t.is_bool ? "BOOL" : safetensors_dtype_name(t.dtype);
    e["shape"] = t.shape.dims();
    e["data_offsets"] = {offset, offset + n};
    header[t.name] = std::move(e);
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsTensor> tensors,
                       const std::map<std::string, std::string>& metadata, const SafetensorsWriteOptions& options) {
  const std::string header = safetensors_header(tensors, metadata);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) MEGATRON_FAIL("safetensors: cannot create ", path.string(), ": ", errno_text());
  try {
    uint8_t length[8];
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) length[i] = uint8_t(n >> (8 * i));
    write_all(fd, length, 8, path, "the header length");
    write_all(fd, header.data(), header.size(), path, "the header");
    for (const SafetensorsTensor& t : tensors) write_all(fd, t.data, byte_size(t), path, "tensor '" + t.name + "'");
    if (options.fsync && ::fsync(fd) != 0) MEGATRON_FAIL("safetensors: fsync of ", path.string(), " failed: ", errno_text());
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) MEGATRON_FAIL("safetensors: closing ", path.string(), " failed: ", errno_text());
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), map_size_);
}

namespace {

struct Mapping {
  const std::byte* data = nullptr;  // null for an empty file
  uint64_t size = 0;
};

// Maps the whole file read-only (the descriptor is closed again; the mapping stays).
Mapping map_file(const std::filesystem::path& path, const std::string& where) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) MEGATRON_FAIL("safetensors: cannot open ", where, ": ", errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    MEGATRON_FAIL("safetensors: cannot stat ", where, ": ", errno_text());
  }
  Mapping m;
  m.size = uint64_t(st.st_size);
  if (m.size > 0) {
    void* p = ::mmap(nullptr, size_t(m.size), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      MEGATRON_FAIL("safetensors: cannot map ", where, " (", m.size, " bytes): ", errno_text());
    }
    m.data = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  return m;
}

// The u64 little-endian header length, checked against the limit and the file size.
uint64_t read_header_length(const Mapping& file, const std::string& where) {
  const uint64_t file_size = file.size;
  MEGATRON_CHECK(file_size >= 8, "safetensors: ", where, " is ", file_size,
                 " bytes, shorter than the 8-byte header length (truncated or not a safetensors file)");
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(std::to_integer<uint8_t>(file.data[i])) << (8 * i);
  MEGATRON_CHECK(header_len <= kMaxHeaderBytes, "safetensors: ", where, ": header length ", header_len,
                 " exceeds the 100 MB limit (corrupt file?)");
  MEGATRON_CHECK(header_len <= file_size - 8, "safetensors: ", where, ": header length ", header_len,
                 " runs past the end of the file (", file_size, " bytes; truncated?)");
  return header_len;
}

// The header's JSON object (bytes 8 .. 8 + header_len).
nlohmann::ordered_json parse_header(const Mapping& file, uint64_t header_len, const std::string& where) {
  const char* text = reinterpret_cast<const char*>(file.data + 8);
  MEGATRON_CHECK(header_len > 0 && text[0] == '{', "safetensors: ", where, ": the header does not start with '{'");
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(text, text + header_len);
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL("safetensors: ", where, ": the header (bytes 8..", 8 + header_len, ") is not valid JSON: ", e.what());
  }
  MEGATRON_CHECK(header.is_object(), "safetensors: ", where, ": the header is not a JSON object");
  return header;
}

void read_metadata(const nlohmann::ordered_json& v, const std::string& where,
                   std::map<std::string, std::string>& metadata) {
  MEGATRON_CHECK(v.is_object(), "safetensors: ", where, ": __metadata__ is not an object");
  for (auto m = v.begin(); m != v.end(); ++m) {
    MEGATRON_CHECK(m.value().is_string(), "safetensors: ", where, ": __metadata__ value of '", m.key(),
                   "' is not a string");
    metadata[m.key()] = m.value().get<std::string>();
  }
}

// The header entry of tensor `name`: a known dtype, a shape of non-negative integers whose byte size does
// not overflow, and data_offsets within the buffer (buffer_size bytes after the header) that hold exactly
// that many bytes.
SafetensorsEntry parse_entry(const std::string& name, const nlohmann::ordered_json& v, const std::string& where,
                             uint64_t buffer_size, uint64_t file_size) {
  auto bad = [&](auto&&... parts) { MEGATRON_FAIL("safetensors: ", where, ": tensor '", name, "': ", parts...); };
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
    bad("expected an object with dtype, shape and data_offsets, got ", v.dump());
  if (!v["dtype"].is_string()) bad("dtype is not a string");
  SafetensorsEntry e;
  e.name = name;
  e.file_dtype = v["dtype"].get<std::string>();
  const FileDType* fd_type = find_file_dtype(e.file_dtype);
  if (fd_type == nullptr) bad("unknown dtype '", e.file_dtype, "'");
  e.dtype = fd_type->dtype;
  e.is_bool = fd_type->is_bool;
  if (!v["shape"].is_array()) bad("shape is not an array");
  std::vector<int64_t> dims;
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : v["shape"]) {
    if (!d.is_number_unsigned()) bad("shape ", v["shape"].dump(), " has an entry that is not a non-negative integer");
    uint64_t x = d.get<uint64_t>();
    if (x > uint64_t(std::numeric_limits<int64_t>::max())) overflow = true;
    else if (x != 0 && numel > std::numeric_limits<uint64_t>::max() / x) overflow = true;
    else numel *= x;
    dims.push_back(int64_t(x));
  }
  if (overflow) bad("shape ", v["shape"].dump(), " overflows");
  e.shape = Shape(std::move(dims));
  const auto& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    bad("data_offsets ", off.dump(), " is not a pair of non-negative integers");
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.begin > e.end) bad("data_offsets [", e.begin, ", ", e.end, "] end before they begin");
  if (e.end > buffer_size)
    bad("data_offsets [", e.begin, ", ", e.end, "] run past the end of the data (", buffer_size,
        " bytes after the header; the file is ", file_size, " bytes: truncated?)");
  if (numel > std::numeric_limits<uint64_t>::max() / fd_type->size) bad("shape overflows");
  if (e.end - e.begin != numel * fd_type->size)
    bad("dtype ", e.file_dtype, " x shape ", e.shape, " is ", numel * fd_type->size, " bytes but data_offsets [",
        e.begin, ", ", e.end, "] hold ", e.end - e.begin);
  return e;
}

// The buffer must be covered exactly, without holes or overlaps (the reference's rule).
void check_coverage(const std::vector<SafetensorsEntry>& entries, uint64_t buffer_size, const std::string& where) {
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& e : entries) by_offset.push_back(&e);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expected = 0;
  for (const SafetensorsEntry* e : by_offset) {
    MEGATRON_CHECK(e->begin == expected, "safetensors: ", where, ": tensor '", e->name, "' starts at data offset ",
                   e->begin, " but the previous tensor ends at ", expected, " (holes or overlaps in data_offsets)");
    expected = e->end;
  }
  MEGATRON_CHECK(expected == buffer_size, "safetensors: ", where, ": the tensors cover ", expected,
                 " bytes of data but the file holds ", buffer_size, " after the header (",
                 expected > buffer_size ? "truncated" : "trailing bytes", ")");
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->self_ = f;
  f->path_ = path;
  const std::string where = path.string();
  const Mapping file = map_file(path, where);
  // From here on f owns the mapping: a failed check below unmaps it with f.
  if (file.data != nullptr) {
    f->map_ = file.data;
    f->map_size_ = size_t(file.size);
  }

  const uint64_t header_len = read_header_length(file, where);
  f->data_start_ = 8 + header_len;
  const uint64_t buffer_size = file.size - f->data_start_;
  const nlohmann::ordered_json header = parse_header(file, header_len, where);
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      read_metadata(it.value(), where, f->metadata_);
      continue;
    }
    SafetensorsEntry e = parse_entry(it.key(), it.value(), where, buffer_size, file.size);
    f->index_[it.key()] = f->entries_.size();
    f->entries_.push_back(std::move(e));
  }
  check_coverage(f->entries_, buffer_size, where);
  return f;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  MEGATRON_CHECK(it != index_.end(), "safetensors: ", path_.string(), " has no tensor '", name, "' (it holds ",
                 entries_.size(), " tensors)");
  return entries_[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  if (e.end == e.begin) return {};
  return {map_ + data_start_ + e.begin, size_t(e.end - e.begin)};
}

namespace {
// Lets a Tensor keep a mapped file alive: Storage calls deallocate() when the last view dies, and this
// object (allocated per tensor) then releases its reference and deletes itself.
class MappingKeeper final : public Allocator {
 public:
  MappingKeeper(std::shared_ptr<const SafetensorsFile> file, const void* data) : file_(std::move(file)), data_(data) {}
  void* allocate(size_t, StreamHandle, std::source_location) override { return const_cast<void*>(data_); }
  void deallocate(void*) override { delete this; }
  Device device() const override { return Device::cpu(); }
  AllocatorStats stats() const override { return {}; }

 private:
  std::shared_ptr<const SafetensorsFile> file_;
  const void* data_;
};

// Owns a heap copy of a tensor's bytes (malloc aligns for every dtype) and frees it with the last view.
class CopyKeeper final : public Allocator {
 public:
  explicit CopyKeeper(std::span<const std::byte> bytes) : data_(std::malloc(bytes.size())) {
    if (data_ == nullptr) throw std::bad_alloc();
    std::memcpy(data_, bytes.data(), bytes.size());
  }
  void* allocate(size_t, StreamHandle, std::source_location) override { return data_; }
  void deallocate(void*) override {
    std::free(data_);
    delete this;
  }
  Device device() const override { return Device::cpu(); }
  AllocatorStats stats() const override { return {}; }

 private:
  void* data_;
};
}  // namespace

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  MEGATRON_CHECK(e.dtype.has_value(), "safetensors: ", path_.string(), ": tensor '", name, "' has dtype ",
                 e.file_dtype, ", which has no megatron dtype");
  static const std::byte empty{};
  const void* data = e.end > e.begin ? static_cast<const void*>(map_ + data_start_ + e.begin) : &empty;
  // The format aligns only the start of the byte buffer: a tensor after one of an odd size (an f32 after
  // two int8s) is misaligned for its dtype, and reading it through a typed pointer is undefined behaviour
  // (UBSan reports it). Such a tensor is copied out; aligned ones (the usual case: files of one dtype, or
  // with the wide dtypes first) stay views of the mapping.
  if (e.end > e.begin && reinterpret_cast<uintptr_t>(data) % dtype_size(*e.dtype) != 0) {
    auto* copy = new CopyKeeper({static_cast<const std::byte*>(data), size_t(e.end - e.begin)});
    return Tensor::empty(e.shape, *e.dtype, *copy);
  }
  auto* keeper = new MappingKeeper(self_.lock(), data);
  return Tensor::empty(e.shape, *e.dtype, *keeper);
}

}  // namespace megatron::checkpoint
