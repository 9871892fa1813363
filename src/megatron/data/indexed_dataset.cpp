#include "megatron/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <system_error>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"

namespace megatron::data {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderSize = 9 + 8 + 1 + 8 + 8;  // 34
constexpr uint64_t kVersion = 1;
constexpr size_t kBinBufferSize = size_t{1} << 20;

template <class T>
T load_unaligned(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

std::string errno_text() { return std::system_category().message(errno); }

void write_all(int fd, const void* data, size_t bytes, const std::filesystem::path& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    MEGATRON_CHECK(n > 0, path.string(), ": write of ", bytes, " bytes failed: ", errno_text());
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void fsync_directory_of(const std::filesystem::path& path) {
  auto dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

template <class T>
bool fits(int64_t v) {
  return v >= static_cast<int64_t>(std::numeric_limits<T>::lowest()) &&
         v <= static_cast<int64_t>(std::numeric_limits<T>::max());
}

}  // namespace

size_t token_dtype_size(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::U8: case TokenDType::I8: return 1;
    case TokenDType::I16: case TokenDType::U16: return 2;
    case TokenDType::I32: case TokenDType::F32: return 4;
    case TokenDType::I64: case TokenDType::F64: return 8;
  }
  MEGATRON_FAIL("invalid token dtype code ", int(dtype));
}

const char* token_dtype_name(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::U8: return "uint8";
    case TokenDType::I8: return "int8";
    case TokenDType::I16: return "int16";
    case TokenDType::I32: return "int32";
    case TokenDType::I64: return "int64";
    case TokenDType::F64: return "float64";
    case TokenDType::F32: return "float32";
    case TokenDType::U16: return "uint16";
  }
  return "invalid";
}

bool is_valid_token_dtype_code(uint8_t code) { return code >= 1 && code <= 8; }

TokenDType token_dtype_for_vocab_size(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::U16 : TokenDType::I32;
}

std::filesystem::path idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::filesystem::path bin_path(const std::string& prefix) { return prefix + ".bin"; }
std::filesystem::path temporary_idx_path(const std::string& prefix) { return prefix + ".idx.tmp"; }
std::filesystem::path temporary_bin_path(const std::string& prefix) { return prefix + ".bin.tmp"; }

// ---------------------------------------------------------------------------------------------- reader

struct IndexedDatasetReader::Mapping {
  std::filesystem::path path;
  const std::byte* data = nullptr;
  size_t size = 0;

  explicit Mapping(std::filesystem::path p) : path(std::move(p)) {
    int fd = ::open(path.c_str(), O_RDONLY);
    MEGATRON_CHECK(fd >= 0, path.string(), ": cannot open: ", errno_text());
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      MEGATRON_FAIL(path.string(), ": cannot stat: ", errno_text());
    }
    size = static_cast<size_t>(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        MEGATRON_FAIL(path.string(), ": mmap of ", size, " bytes failed: ", errno_text());
      }
      data = static_cast<const std::byte*>(p);
    }
    ::close(fd);
  }
  ~Mapping() {
    if (data != nullptr) ::munmap(const_cast<std::byte*>(data), size);
  }
};

IndexedDatasetReader::IndexedDatasetReader(std::string prefix) : prefix_(std::move(prefix)) {
  idx_map_ = std::make_unique<Mapping>(idx_path(prefix_));
  const std::string idx = idx_map_->path.string();
  const std::byte* p = idx_map_->data;
  const size_t idx_size = idx_map_->size;

  MEGATRON_CHECK(idx_size >= kHeaderSize, idx, ": truncated: expected at least ", kHeaderSize,
                 " bytes of header, found ", idx_size);
  MEGATRON_CHECK(std::memcmp(p, kMagic, sizeof(kMagic)) == 0, idx,
                 ": bad magic at byte 0: expected ", quoted_bytes(std::string_view(kMagic, sizeof(kMagic))),
                 " (a Megatron indexed dataset), found ", quoted_bytes(std::string_view(reinterpret_cast<const char*>(p), 9)));
  uint64_t version = load_unaligned<uint64_t>(p + 9);
  MEGATRON_CHECK(version == kVersion, idx, ": unsupported version: expected ", kVersion, ", found ", version);
  uint8_t code = load_unaligned<uint8_t>(p + 17);
  MEGATRON_CHECK(is_valid_token_dtype_code(code), idx, ": bad dtype code: expected 1..8 (1 uint8, 2 int8, 3 int16, ",
                 "4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), found ", int(code));
  dtype_ = static_cast<TokenDType>(code);
  const uint64_t n = load_unaligned<uint64_t>(p + 18);
  const uint64_t d = load_unaligned<uint64_t>(p + 26);
  MEGATRON_CHECK(n < (uint64_t{1} << 56) && d < (uint64_t{1} << 56), idx, ": implausible counts: ", n,
                 " sequences and ", d, " document indices");
  const uint64_t expected = kHeaderSize + n * 4 + n * 8 + d * 8;
  MEGATRON_CHECK(idx_size == expected || idx_size == expected + n, idx, ": ",
                 idx_size < expected ? "truncated" : "unexpected size", ": expected ", expected, " bytes for ", n,
                 " sequences and ", d, " document indices (", expected + n,
                 " with sequence modes), found ", idx_size);

  const std::byte* lengths = p + kHeaderSize;
  pointers_ = lengths + n * 4;
  const std::byte* documents = pointers_ + n * 8;
  sequence_lengths_.resize(n);
  if (n > 0) std::memcpy(sequence_lengths_.data(), lengths, n * 4);
  document_indices_.resize(d);
  if (d > 0) std::memcpy(document_indices_.data(), documents, d * 8);

  const int64_t item = static_cast<int64_t>(token_dtype_size(dtype_));
  for (uint64_t i = 1; i < n; ++i) {
    const int64_t previous = load_unaligned<int64_t>(pointers_ + 8 * (i - 1));
    const int64_t pointer = load_unaligned<int64_t>(pointers_ + 8 * i);
    MEGATRON_CHECK(pointer >= previous, idx, ": non-monotone sequence pointers: pointer[", i, "] = ", pointer,
                   " < pointer[", i - 1, "] = ", previous);
  }
  int64_t expected_pointer = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const int32_t length = sequence_lengths_[i];
    MEGATRON_CHECK(length >= 0, idx, ": sequence ", i, " has negative length ", length);
    const int64_t pointer = load_unaligned<int64_t>(pointers_ + 8 * i);
    MEGATRON_CHECK(pointer == expected_pointer, idx, ": sequence pointer[", i, "] = ", pointer,
                   " inconsistent with the lengths: expected ", expected_pointer,
                   " (the previous pointer + length * ", item, " bytes)");
    expected_pointer += length * item;
  }

  MEGATRON_CHECK(d >= 1 && document_indices_[0] == 0, idx, ": document indices must start with 0, found ",
                 d == 0 ? std::string("none") : std::to_string(document_indices_[0]));
  for (uint64_t i = 1; i < d; ++i)
    MEGATRON_CHECK(document_indices_[i] >= document_indices_[i - 1], idx, ": document indices decrease: [", i,
                   "] = ", document_indices_[i], " < [", i - 1, "] = ", document_indices_[i - 1]);
  MEGATRON_CHECK(document_indices_.back() == static_cast<int64_t>(n), idx, ": the last document index must be the ",
                 "sequence count ", n, ", found ", document_indices_.back());

  bin_map_ = std::make_unique<Mapping>(bin_path(prefix_));
  MEGATRON_CHECK(static_cast<int64_t>(bin_map_->size) == expected_pointer, bin_map_->path.string(), ": ",
                 static_cast<int64_t>(bin_map_->size) < expected_pointer ? "shorter" : "longer",
                 " than the index says: expected ", expected_pointer, " bytes (", n, " sequences of ",
                 token_dtype_name(dtype_), " per ", idx, "), found ", bin_map_->size);
}

IndexedDatasetReader::~IndexedDatasetReader() = default;

int64_t IndexedDatasetReader::sequence_pointer(int64_t sequence) const {
  MEGATRON_CHECK(sequence >= 0 && sequence < num_sequences(), prefix_, ": sequence ", sequence,
                 " out of range [0, ", num_sequences(), ")");
  return load_unaligned<int64_t>(pointers_ + 8 * sequence);
}

std::pair<int64_t, int64_t> IndexedDatasetReader::checked_window(int64_t sequence, int64_t offset,
                                                                 int64_t length) const {
  MEGATRON_CHECK(sequence >= 0 && sequence < num_sequences(), prefix_, ": sequence ", sequence,
                 " out of range [0, ", num_sequences(), ")");
  const int64_t size = sequence_lengths_[sequence];
  if (length < 0) length = size - offset;
  MEGATRON_CHECK(offset >= 0 && length >= 0 && offset + length <= size, prefix_, ": tokens [", offset, ", ",
                 offset + length, ") out of range for sequence ", sequence, " of length ", size);
  return {offset, length};
}

std::span<const std::byte> IndexedDatasetReader::get_bytes(int64_t sequence, int64_t offset, int64_t length) const {
  auto [begin, count] = checked_window(sequence, offset, length);
  const size_t item = token_dtype_size(dtype_);
  const int64_t pointer = load_unaligned<int64_t>(pointers_ + 8 * sequence);
  return {bin_map_->data + pointer + begin * static_cast<int64_t>(item), static_cast<size_t>(count) * item};
}

namespace {
template <class Dst>
void widen_tokens(TokenDType dtype, std::span<const std::byte> src, std::span<Dst> dst, const std::string& prefix) {
  auto copy = [&]<class T>(T) {
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<Dst>(load_unaligned<T>(src.data() + i * sizeof(T)));
  };
  switch (dtype) {
    case TokenDType::U8: copy(uint8_t{}); break;
    case TokenDType::I8: copy(int8_t{}); break;
    case TokenDType::I16: copy(int16_t{}); break;
    case TokenDType::U16: copy(uint16_t{}); break;
    case TokenDType::I32: copy(int32_t{}); break;
    case TokenDType::I64:
      if constexpr (sizeof(Dst) == 4) MEGATRON_FAIL(prefix, ": int64 tokens cannot be read as int32");
      copy(int64_t{});
      break;
    default: MEGATRON_FAIL(prefix, ": ", token_dtype_name(dtype), " data cannot be read as integer tokens");
  }
}
}  // namespace

std::vector<int64_t> IndexedDatasetReader::get(int64_t sequence, int64_t offset, int64_t length) const {
  auto bytes = get_bytes(sequence, offset, length);
  std::vector<int64_t> out(bytes.size() / token_dtype_size(dtype_));
  widen_tokens(dtype_, bytes, std::span<int64_t>(out), prefix_);
  return out;
}

void IndexedDatasetReader::read_tokens(int64_t sequence, int64_t offset, std::span<int64_t> dst) const {
  widen_tokens(dtype_, get_bytes(sequence, offset, static_cast<int64_t>(dst.size())), dst, prefix_);
}

void IndexedDatasetReader::read_tokens(int64_t sequence, int64_t offset, std::span<int32_t> dst) const {
  widen_tokens(dtype_, get_bytes(sequence, offset, static_cast<int64_t>(dst.size())), dst, prefix_);
}

// ---------------------------------------------------------------------------------------------- writer

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, TokenDType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype), buffer_(new std::byte[kBinBufferSize]) {  // not zero-filled
  MEGATRON_CHECK(is_valid_token_dtype_code(static_cast<uint8_t>(dtype)), prefix_, ": invalid dtype code ",
                 int(dtype));
  std::error_code ignored;
  std::filesystem::remove(temporary_idx_path(prefix_), ignored);
  const auto bin = temporary_bin_path(prefix_);
  bin_fd_ = ::open(bin.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MEGATRON_CHECK(bin_fd_ >= 0, bin.string(), ": cannot create: ", errno_text());
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_fd_ >= 0) ::close(bin_fd_);
  if (!committed_) {
    std::error_code ignored;
    std::filesystem::remove(temporary_idx_path(prefix_), ignored);
    std::filesystem::remove(temporary_bin_path(prefix_), ignored);
  }
}

void IndexedDatasetWriter::flush_bin() {
  if (buffered_ > 0) write_all(bin_fd_, buffer_.get(), buffered_, temporary_bin_path(prefix_));
  buffered_ = 0;
}

void IndexedDatasetWriter::write_bin(const void* data, size_t bytes) {
  MEGATRON_CHECK(!prepared_, prefix_, ": writer already prepared (no more tokens can be added)");
  bin_bytes_ += static_cast<int64_t>(bytes);
  if (buffered_ + bytes > kBinBufferSize) {
    flush_bin();
    if (bytes >= kBinBufferSize) {
      write_all(bin_fd_, data, bytes, temporary_bin_path(prefix_));
      return;
    }
  }
  std::memcpy(buffer_.get() + buffered_, data, bytes);
  buffered_ += bytes;
}

template <class T>
void IndexedDatasetWriter::add_sequence_impl(std::span<const T> tokens) {
  MEGATRON_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), prefix_,
                 ": sequence of ", tokens.size(), " tokens exceeds the int32 length field");
  std::byte chunk[4096];
  const size_t item = token_dtype_size(dtype_);
  size_t filled = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t v = static_cast<int64_t>(tokens[i]);
    std::byte* out = chunk + filled;
    auto put = [&]<class U>(U value) { std::memcpy(out, &value, sizeof(U)); };
    bool ok = true;
    switch (dtype_) {
      case TokenDType::U8: ok = fits<uint8_t>(v); put(static_cast<uint8_t>(v)); break;
      case TokenDType::I8: ok = fits<int8_t>(v); put(static_cast<int8_t>(v)); break;
      case TokenDType::I16: ok = fits<int16_t>(v); put(static_cast<int16_t>(v)); break;
      case TokenDType::U16: ok = fits<uint16_t>(v); put(static_cast<uint16_t>(v)); break;
      case TokenDType::I32: ok = fits<int32_t>(v); put(static_cast<int32_t>(v)); break;
      case TokenDType::I64: put(v); break;
      case TokenDType::F32: put(static_cast<float>(v)); break;
      case TokenDType::F64: put(static_cast<double>(v)); break;
    }
    MEGATRON_CHECK(ok, prefix_, ": token ", v, " at position ", i, " of sequence ", sequence_lengths_.size(),
                   " does not fit dtype ", token_dtype_name(dtype_));
    filled += item;
    if (filled + item > sizeof(chunk)) {
      write_bin(chunk, filled);
      filled = 0;
    }
  }
  if (filled > 0) write_bin(chunk, filled);
  sequence_lengths_.push_back(static_cast<int32_t>(tokens.size()));
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) { add_sequence_impl(tokens); }
void IndexedDatasetWriter::add_sequence(std::span<const int64_t> tokens) { add_sequence_impl(tokens); }

void IndexedDatasetWriter::end_document() { document_indices_.push_back(num_sequences()); }

void IndexedDatasetWriter::append(const IndexedDatasetReader& other) {
  MEGATRON_CHECK(other.dtype() == dtype_, other.prefix(), ": dtype ", token_dtype_name(other.dtype()),
                 " differs from the output's ", token_dtype_name(dtype_), " (", prefix_, ")");
  const int64_t offset = num_sequences();
  for (int64_t s = 0; s < other.num_sequences(); ++s) {
    auto bytes = other.get_bytes(s);
    if (!bytes.empty()) write_bin(bytes.data(), bytes.size());
  }
  auto lengths = other.sequence_lengths();
  sequence_lengths_.insert(sequence_lengths_.end(), lengths.begin(), lengths.end());
  auto documents = other.document_indices();
  for (size_t i = 1; i < documents.size(); ++i) document_indices_.push_back(offset + documents[i]);
}

void IndexedDatasetWriter::write_idx(int fd, const std::filesystem::path& path) const {
  std::vector<std::byte> header(kHeaderSize);
  const uint8_t code = static_cast<uint8_t>(dtype_);
  const uint64_t n = sequence_lengths_.size(), d = document_indices_.size();
  std::memcpy(header.data(), kMagic, 9);
  std::memcpy(header.data() + 9, &kVersion, 8);
  std::memcpy(header.data() + 17, &code, 1);
  std::memcpy(header.data() + 18, &n, 8);
  std::memcpy(header.data() + 26, &d, 8);
  write_all(fd, header.data(), header.size(), path);
  write_all(fd, sequence_lengths_.data(), n * 4, path);
  std::vector<int64_t> pointers;
  pointers.reserve(std::min<uint64_t>(n, uint64_t{1} << 20));
  const int64_t item = static_cast<int64_t>(token_dtype_size(dtype_));
  int64_t pointer = 0;
  for (uint64_t i = 0; i < n; ++i) {
    pointers.push_back(pointer);
    pointer += sequence_lengths_[i] * item;
    if (pointers.size() == pointers.capacity()) {
      write_all(fd, pointers.data(), pointers.size() * 8, path);
      pointers.clear();
    }
  }
  write_all(fd, pointers.data(), pointers.size() * 8, path);
  write_all(fd, document_indices_.data(), d * 8, path);
  MEGATRON_CHECK(::fsync(fd) == 0, path.string(), ": fsync failed: ", errno_text());
}

void IndexedDatasetWriter::prepare() {
  MEGATRON_CHECK(!prepared_, prefix_, ": prepare() called twice");
  prepared_ = true;
  const auto bin = temporary_bin_path(prefix_);
  flush_bin();
  MEGATRON_CHECK(::fsync(bin_fd_) == 0, bin.string(), ": fsync failed: ", errno_text());
  const int closed = ::close(bin_fd_);
  bin_fd_ = -1;
  MEGATRON_CHECK(closed == 0, bin.string(), ": close failed: ", errno_text());

  const auto idx = temporary_idx_path(prefix_);
  const int fd = ::open(idx.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MEGATRON_CHECK(fd >= 0, idx.string(), ": cannot create: ", errno_text());
  try {
    write_idx(fd, idx);
  } catch (...) {
    ::close(fd);
    throw;
  }
  MEGATRON_CHECK(::close(fd) == 0, idx.string(), ": close failed: ", errno_text());
}

void IndexedDatasetWriter::commit() {
  MEGATRON_CHECK(prepared_ && !committed_, prefix_, ": commit() needs one prepare() before it, and comes once");
  const auto rename = [](const std::filesystem::path& from, const std::filesystem::path& to) {
    std::error_code ec;
    std::filesystem::rename(from, to, ec);
    MEGATRON_CHECK(!ec, "cannot rename ", from.string(), " to ", to.string(), ": ", ec.message());
  };
  std::error_code ec;
  std::filesystem::remove(idx_path(prefix_), ec);  // never an old .idx beside the new .bin
  MEGATRON_CHECK(!ec, idx_path(prefix_).string(), ": cannot remove the previous index: ", ec.message());
  rename(temporary_bin_path(prefix_), bin_path(prefix_));
  rename(temporary_idx_path(prefix_), idx_path(prefix_));
  committed_ = true;
  fsync_directory_of(idx_path(prefix_));
}

void merge_indexed_datasets(const std::vector<std::string>& input_prefixes, const std::string& output_prefix) {
  MEGATRON_CHECK(!input_prefixes.empty(), output_prefix, ": merge needs at least one input prefix");
  std::vector<std::unique_ptr<IndexedDatasetReader>> inputs;
  for (const auto& prefix : input_prefixes) inputs.push_back(std::make_unique<IndexedDatasetReader>(prefix));
  IndexedDatasetWriter writer(output_prefix, inputs.front()->dtype());
  for (const auto& input : inputs) writer.append(*input);
  writer.finalize();
}

}  // namespace megatron::data
