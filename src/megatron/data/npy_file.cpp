#include "megatron/data/npy_file.h"

#include <cstring>
#include <fstream>

#include "megatron/core/error.h"

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

int element_size(const std::string& descr, const std::filesystem::path& path) {
  MEGATRON_CHECK(descr.size() >= 3 && (descr[0] == '<' || descr[0] == '|'),
                 path.string(), ": unsupported .npy dtype '", descr, "' (expected little-endian, e.g. '<i4')");
  return std::stoi(descr.substr(2));
}

std::string header_field(const std::string& header, const std::string& key, const std::filesystem::path& path) {
  auto at = header.find("'" + key + "':");
  MEGATRON_CHECK(at != std::string::npos, path.string(), ": .npy header has no '", key, "': ", header);
  at += key.size() + 3;
  while (at < header.size() && header[at] == ' ') ++at;
  size_t end = at;
  if (header[at] == '\'') end = header.find('\'', at + 1) + 1;
  else if (header[at] == '(') end = header.find(')', at) + 1;
  else end = header.find(',', at);
  MEGATRON_CHECK(end != std::string::npos && end > at, path.string(), ": malformed .npy header: ", header);
  return header.substr(at, end - at);
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

NpyArray load_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MEGATRON_CHECK(in.good(), path.string(), ": cannot open .npy file");
  char prefix[8] = {};
  in.read(prefix, 8);
  MEGATRON_CHECK(in.gcount() == 8 && std::memcmp(prefix, kMagic, kMagicSize) == 0, path.string(),
                 ": not a .npy file (expected magic \\x93NUMPY)");
  int major = prefix[6];
  MEGATRON_CHECK(major >= 1 && major <= 3, path.string(), ": unsupported .npy version ", major, " (expected 1, 2 or 3)");
  size_t header_size = 0;
  if (major == 1) {
    unsigned char len[2];
    in.read(reinterpret_cast<char*>(len), 2);
    header_size = len[0] | (size_t(len[1]) << 8);
  } else {
    unsigned char len[4];
    in.read(reinterpret_cast<char*>(len), 4);
    header_size = len[0] | (size_t(len[1]) << 8) | (size_t(len[2]) << 16) | (size_t(len[3]) << 24);
  }
  std::string header(header_size, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_size));
  MEGATRON_CHECK(in.good(), path.string(), ": truncated .npy header (expected ", header_size, " bytes)");
  NpyArray array;
  std::string descr = header_field(header, "descr", path);
  array.descr = descr.substr(1, descr.size() - 2);
  MEGATRON_CHECK(header_field(header, "fortran_order", path) == "False", path.string(),
                 ": Fortran-ordered .npy arrays are not supported");
  std::string shape = header_field(header, "shape", path);
  for (size_t at = 1; at < shape.size();) {
    size_t end = shape.find_first_of(",)", at);
    std::string item = shape.substr(at, end - at);
    if (item.find_first_not_of(' ') != std::string::npos) array.shape.push_back(std::stoll(item));
    at = end + 1;
  }
  size_t data_size = static_cast<size_t>(array.num_elements()) * element_size(array.descr, path);
  array.bytes.resize(data_size);
  in.read(reinterpret_cast<char*>(array.bytes.data()), static_cast<std::streamsize>(data_size));
  MEGATRON_CHECK(static_cast<size_t>(in.gcount()) == data_size, path.string(), ": truncated .npy data: expected ",
                 data_size, " bytes for shape ", shape, ", found ", in.gcount());
  return array;
}

}  // namespace megatron::data
