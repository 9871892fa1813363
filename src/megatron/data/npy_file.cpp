#include "megatron/data/npy_file.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string_view>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"

namespace megatron::data {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kAlign = 64;
constexpr size_t kGrowthAxisMaxDigits = 21;

std::string shape_repr(std::span<const int64_t> shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// The dtypes an .npy cache holds here (little-endian or byte-sized), with their element sizes.
struct NpyDType {
  const char* descr;
  size_t size;
};
constexpr NpyDType kNpyDTypes[] = {{"|i1", 1}, {"|u1", 1}, {"<i2", 2}, {"<u2", 2}, {"<i4", 4}, {"<u4", 4},
                                   {"<i8", 8}, {"<u8", 8}, {"<f4", 4}, {"<f8", 8}};

// The longest header accepted (numpy writes a few hundred bytes); a longer length field means a corrupt file.
constexpr size_t kMaxHeaderBytes = size_t{1} << 20;

// A reader of the header's Python dict literal, e.g. {'descr': '<i8', 'fortran_order': False, 'shape': (3, 2), }.
// Errors name the path, the byte offset in the file and what was expected there.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, size_t file_offset, const std::filesystem::path& path)
      : text_(text), base_(file_offset), path_(path) {}

  [[noreturn]] void fail(const std::string& expected) const {
    MEGATRON_FAIL(path_.string(), ": malformed .npy header at byte ", base_ + at_, ": expected ", expected,
                  ", found ", at_ < text_.size() ? quoted_bytes(text_.substr(at_, 16)) : std::string("the end of the header"),
                  " (header ", quoted_bytes(text_), ")");
  }
  void skip_spaces() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\t')) ++at_;
  }
  bool take(char c) {
    skip_spaces();
    if (at_ < text_.size() && text_[at_] == c) return ++at_, true;
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("'") + c + "'");
  }
  std::string string_literal() {
    skip_spaces();
    if (at_ >= text_.size() || (text_[at_] != '\'' && text_[at_] != '"')) fail("a quoted string");
    const char quote = text_[at_++];
    const size_t end = text_.find(quote, at_);
    if (end == std::string_view::npos) fail("the closing quote of a string");
    std::string out(text_.substr(at_, end - at_));
    at_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_spaces();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}})
      if (text_.substr(at_, std::string_view(word).size()) == word) return at_ += std::string_view(word).size(), value;
    fail("True or False");
  }
  int64_t dimension() {
    skip_spaces();
    int64_t value = 0;
    const auto [end, error] = std::from_chars(text_.data() + at_, text_.data() + text_.size(), value);
    if (error != std::errc() || value < 0) fail("a non-negative integer dimension");
    at_ = static_cast<size_t>(end - text_.data());
    return value;
  }
  std::vector<int64_t> shape() {
    expect('(');
    std::vector<int64_t> dims;
    while (!take(')')) {
      dims.push_back(dimension());
      if (!take(',')) {
        expect(')');
        break;
      }
    }
    return dims;
  }
  bool at_end() {
    skip_spaces();
    return at_ >= text_.size();
  }

 private:
  std::string_view text_;
  size_t base_;
  const std::filesystem::path& path_;
  size_t at_ = 0;
};

// descr, fortran_order and shape, each exactly once, in any order.
void parse_header(HeaderParser& p, NpyArray& array) {
  bool have_descr = false, have_order = false, have_shape = false;
  p.expect('{');
  while (!p.take('}')) {
    const std::string key = p.string_literal();
    p.expect(':');
    if (key == "descr" && !have_descr) {
      array.descr = p.string_literal();
      have_descr = true;
    } else if (key == "fortran_order" && !have_order) {
      if (p.boolean()) p.fail("fortran_order False (Fortran-ordered .npy arrays are not supported)");
      have_order = true;
    } else if (key == "shape" && !have_shape) {
      array.shape = p.shape();
      have_shape = true;
    } else {
      p.fail("one each of the keys 'descr', 'fortran_order' and 'shape' (got " + quoted_bytes(key) + ")");
    }
    if (!p.take(',')) {
      p.expect('}');
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape) p.fail("the keys 'descr', 'fortran_order' and 'shape'");
  if (!p.at_end()) p.fail("nothing after the dictionary but spaces");
}

}  // namespace

int64_t NpyArray::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> NpyArray::to_int64(const std::filesystem::path& where_from) const {
  std::vector<int64_t> out(static_cast<size_t>(num_elements()));
  auto widen = [&]<class T>(T) {
    const T* p = reinterpret_cast<const T*>(bytes.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(p[i]);
  };
  if (descr == "<i2") widen(int16_t{});
  else if (descr == "<u2") widen(uint16_t{});
  else if (descr == "<i4") widen(int32_t{});
  else if (descr == "<u4") widen(uint32_t{});
  else if (descr == "<i8") widen(int64_t{});
  else if (descr == "<u8") widen(uint64_t{});
  else if (descr == "|u1") widen(uint8_t{});
  else if (descr == "|i1") widen(int8_t{});
  else MEGATRON_FAIL(where_from.string(), ": expected an integer array, found dtype '", descr, "'");
  return out;
}

template <> std::string npy_descr<int8_t>() { return "|i1"; }
template <> std::string npy_descr<uint8_t>() { return "|u1"; }
template <> std::string npy_descr<int16_t>() { return "<i2"; }
template <> std::string npy_descr<uint16_t>() { return "<u2"; }
template <> std::string npy_descr<int32_t>() { return "<i4"; }
template <> std::string npy_descr<uint32_t>() { return "<u4"; }
template <> std::string npy_descr<int64_t>() { return "<i8"; }
template <> std::string npy_descr<uint64_t>() { return "<u8"; }

void save_npy(const std::filesystem::path& path, const std::string& descr, std::span<const int64_t> shape,
              std::span<const std::byte> bytes) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape_repr(shape) + ", }";
  if (!shape.empty()) header.append(kGrowthAxisMaxDigits - std::to_string(shape[0]).size(), ' ');
  size_t header_len = header.size() + 1;  // + '\n'
  size_t pad = kAlign - (kMagicSize + 2 + 2 + header_len) % kAlign;
  header.append(pad, ' ');
  header += '\n';
  MEGATRON_CHECK(header.size() <= 65535, path.string(), ": .npy header of ", header.size(),
                 " bytes does not fit format version 1.0");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  MEGATRON_CHECK(out.good(), path.string(), ": cannot open for writing");
  out.write(kMagic, kMagicSize);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                static_cast<unsigned char>(header.size() >> 8)};
  out.write(reinterpret_cast<const char*>(len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.flush();
  MEGATRON_CHECK(out.good(), path.string(), ": write failed (", bytes.size(), " data bytes)");
}

namespace {

// The magic, version and header length; returns the header's size and sets `header_start`.
size_t read_preamble(std::ifstream& in, const std::filesystem::path& path, size_t file_size, size_t& header_start) {
  char preamble[12] = {};
  in.read(preamble, static_cast<std::streamsize>(std::min<size_t>(file_size, sizeof preamble)));
  const std::string_view got(preamble, std::min<size_t>(file_size, sizeof preamble));
  MEGATRON_CHECK(got.size() >= 10 && got.substr(0, kMagicSize) == std::string_view(kMagic, kMagicSize), path.string(),
                 ": not a .npy file (expected the magic \\x93NUMPY at byte 0, found ",
                 quoted_bytes(got.substr(0, kMagicSize)), ")");
  const int major = static_cast<unsigned char>(got[6]);
  MEGATRON_CHECK(major >= 1 && major <= 3, path.string(), ": unsupported .npy version ", major,
                 " at byte 6 (expected 1, 2 or 3)");
  const size_t length_bytes = major == 1 ? 2 : 4;
  header_start = 8 + length_bytes;
  MEGATRON_CHECK(file_size >= header_start, path.string(), ": truncated: ", file_size,
                 " bytes, the header length field ends at byte ", header_start);
  size_t header_size = 0;
  for (size_t k = 0; k < length_bytes; ++k) header_size |= size_t(static_cast<unsigned char>(got[8 + k])) << (8 * k);
  MEGATRON_CHECK(header_size <= kMaxHeaderBytes && header_start + header_size <= file_size, path.string(),
                 ": the header length at byte 8 says ", header_size, " bytes but ", file_size - header_start,
                 " follow (truncated or corrupt file)");
  return header_size;
}

// Elements of `shape`, or a message naming the path when the count overflows.
size_t element_count(const std::vector<int64_t>& shape, const std::filesystem::path& path) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  size_t elements = 1;
  for (int64_t d : shape)
    MEGATRON_CHECK(!__builtin_mul_overflow(elements, size_t(d), &elements), path.string(), ": shape ",
                   shape_repr(shape), " overflows");
  return elements;
}

}  // namespace

NpyArray load_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MEGATRON_CHECK(in.good(), path.string(), ": cannot open .npy file");
  std::error_code ec;
  const auto size_on_disk = std::filesystem::file_size(path, ec);
  MEGATRON_CHECK(!ec, path.string(), ": cannot read its size: ", ec.message());
  const size_t file_size = size_t(size_on_disk);
  size_t header_start = 0;
  const size_t header_size = read_preamble(in, path, file_size, header_start);
  std::string header(header_size, '\0');
  in.seekg(std::streamoff(header_start));
  in.read(header.data(), std::streamsize(header_size));
  MEGATRON_CHECK(in.good(), path.string(), ": read of the ", header_size, "-byte header failed");
  NpyArray array;
  HeaderParser parser(header, header_start, path);
  parse_header(parser, array);
  const NpyDType* dtype = nullptr;
  for (const NpyDType& d : kNpyDTypes)
    if (array.descr == d.descr) dtype = &d;
  MEGATRON_CHECK(dtype != nullptr, path.string(), ": unsupported .npy dtype ", quoted_bytes(array.descr),
                 " (expected a little-endian integer or float such as '<i4')");
  const size_t data_start = header_start + header_size, available = file_size - data_start;
  const size_t elements = element_count(array.shape, path);
  MEGATRON_CHECK(elements <= available / dtype->size && elements * dtype->size == available, path.string(),
                 ": the data from byte ", data_start, " should be ", shape_repr(array.shape), " x ", dtype->size,
                 " bytes but the file holds ", available, elements > available / dtype->size ? " (truncated)" : "");
  array.bytes.resize(available);
  in.read(reinterpret_cast<char*>(array.bytes.data()), std::streamsize(available));
  MEGATRON_CHECK(size_t(in.gcount()) == available, path.string(), ": read ", in.gcount(), " of ", available,
                 " data bytes from byte ", data_start, " (the file shrank while being read?)");
  return array;
}

}  // namespace megatron::data
