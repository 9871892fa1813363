// safetensors against the reference (the `safetensors` PyPI package): files it writes we read, files we
// write it reads, and our bytes equal its bytes for the same tensors; malformed files are refused with the
// path, the tensor and the mismatch in the message.
#include <gtest/gtest.h>

#include <fstream>
#include <cstring>
#include <iterator>
#include <map>
#include <sstream>

#include "harness.h"
#include "megatron/checkpoint/safetensors.h"

namespace megatron::checkpoint {
namespace {

namespace fs = std::filesystem;

// The value both sides put at element k (small multiples of 1/4: exact in every float format used).
double value_at(int64_t k) { return double((k * 7) % 50 - 20) / 4.0; }
int64_t int_at(int64_t k) { return (k * 7) % 50 - 20; }

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// Python helpers shared by the scripts: expected values and the header-dtype -> TensorSpec-dtype names.
const char* kPyCommon = R"PY(
import sys, struct, json, ctypes
import numpy as np
from safetensors import TensorSpec, serialize, safe_open
def value_at(k): return ((k * 7) % 50 - 20) / 4.0
def int_at(k): return (k * 7) % 50 - 20
NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
      "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
SPEC = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
        "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "U16": "uint16", "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2"}
def expected(dtype, shape):
    n = int(np.prod(shape)) if len(shape) else 1
    if dtype == "BOOL": return (np.arange(n) % 3 == 0).reshape(shape)
    if dtype == "U8": return np.array([(k * 7) % 50 for k in range(n)], np.uint8).reshape(shape)
    if dtype[0] == "F": return np.array([value_at(k) for k in range(n)], np.float64).astype(NP[dtype]).reshape(shape)
    return np.array([int_at(k) for k in range(n)], np.int64).astype(NP[dtype]).reshape(shape)
def bf16_bytes(shape):
    n = int(np.prod(shape)) if len(shape) else 1
    f = np.array([value_at(k) for k in range(n)], np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16).tobytes()
)PY";

struct Case {
  std::string name, file_dtype;
  std::vector<int64_t> shape;
};
const std::vector<Case> kCases = {
    {"a.f64", "F64", {3, 2}},  {"b.f32", "F32", {2, 3, 4}}, {"c.f16", "F16", {5}},  {"d.bf16", "BF16", {4, 3}},
    {"e.i64", "I64", {7}},     {"f.i32", "I32", {2, 2}},    {"g.i16", "I16", {3}},  {"h.i8", "I8", {9}},
    {"i.u8", "U8", {2, 5}},    {"j.bool", "BOOL", {6}},     {"k.empty", "F32", {0, 4}}, {"l.scalar", "F32", {}},
};

// Our in-memory version of a case (bytes as Python's expected() makes them).
struct Owned {
  SafetensorsTensor t;
  std::vector<uint8_t> bytes;
};
Owned make_case(const Case& c) {
  Owned o;
  o.t.name = c.name;
  o.t.shape = Shape(c.shape);
  o.t.is_bool = c.file_dtype == "BOOL";
  const std::map<std::string, DType> dtypes = {{"F64", DType::F64}, {"F32", DType::F32}, {"F16", DType::F16},
                                               {"BF16", DType::BF16}, {"I64", DType::I64}, {"I32", DType::I32},
                                               {"I16", DType::I16}, {"I8", DType::I8},   {"U8", DType::U8},
                                               {"BOOL", DType::U8}};
  o.t.dtype = dtypes.at(c.file_dtype);
  const int64_t n = o.t.shape.numel();
  o.bytes.resize(size_t(n) * dtype_size(o.t.dtype));
  visit_dtype(o.t.dtype, [&]<class T>() {
    T* p = reinterpret_cast<T*>(o.bytes.data());
    for (int64_t k = 0; k < n; ++k) {
      if (o.t.is_bool) p[k] = T(k % 3 == 0);
      else if (c.file_dtype == "U8") p[k] = T((k * 7) % 50);
      else if constexpr (std::is_integral_v<T>) p[k] = T(int_at(k));
      else p[k] = from_double<T>(value_at(k));
    }
  });
  o.t.data = o.bytes.data();
  return o;
}

TEST(Safetensors, ReadsWhatThePythonPackageWrites) {
  fs::path dir = testing::make_temp_dir("st_read");
  std::string script = std::string(kPyCommon) + R"PY(
cases = json.loads(sys.argv[2])
keep, specs = [], {}
for name, dtype, shape in cases:
    data = bf16_bytes(shape) if dtype == "BF16" else np.ascontiguousarray(expected(dtype, shape)).tobytes()
    buf = ctypes.create_string_buffer(data, max(len(data), 1)); keep.append(buf)
    specs[name] = TensorSpec(dtype=SPEC[dtype], shape=shape, data_ptr=ctypes.addressof(buf), data_len=len(data))
open(sys.argv[1], "wb").write(bytes(serialize(specs, metadata={"format": "pt", "note": "written by python"})))
)PY";
  std::ostringstream json;  // [[name, dtype, shape], ...]
  json << "[";
  for (size_t i = 0; i < kCases.size(); ++i) {
    json << (i ? "," : "") << "[\"" << kCases[i].name << "\",\"" << kCases[i].file_dtype << "\",[";
    for (size_t j = 0; j < kCases[i].shape.size(); ++j) json << (j ? "," : "") << kCases[i].shape[j];
    json << "]]";
  }
  json << "]";
  const std::string cases = json.str();
  testing::run_python(dir, script, (dir / "py.safetensors").string() + " '" + cases + "'");

  auto file = SafetensorsFile::open(dir / "py.safetensors");
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("note"), "written by python");
  EXPECT_EQ(file->entries().size(), kCases.size());
  EXPECT_EQ(file->data_start() % 8, 0u) << "the reference pads the header to 8 bytes";
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    Owned want = make_case(c);
    const SafetensorsEntry& e = file->entry(c.name);
    EXPECT_EQ(e.file_dtype, c.file_dtype);
    EXPECT_EQ(e.is_bool, c.file_dtype == "BOOL");
    EXPECT_EQ(e.shape, Shape(c.shape));
    Tensor t = file->tensor(c.name);
    EXPECT_EQ(t.dtype(), want.t.dtype);
    ASSERT_EQ(t.nbytes(), want.bytes.size());
    // An empty tensor has no data pointer, and memcmp's arguments must not be null even for 0 bytes.
    if (!want.bytes.empty()) {
      EXPECT_EQ(std::memcmp(t.data_ptr(), want.bytes.data(), want.bytes.size()), 0);
    }
  }
  // A tensor view keeps the mapping alive after the file object is gone.
  Tensor kept = file->tensor("b.f32");
  file.reset();
  EXPECT_EQ(kept.data<float>()[1], float(value_at(1)));
}

TEST(Safetensors, PythonReadsWhatWeWriteAndTheBytesAreIdentical) {
  fs::path dir = testing::make_temp_dir("st_write");
  std::vector<Owned> owned;
  for (const Case& c : kCases) owned.push_back(make_case(c));
  std::vector<SafetensorsTensor> tensors;
  for (const Owned& o : owned) tensors.push_back(o.t);
  std::vector<SafetensorsTensor> ordered;
  for (size_t i : canonical_order(tensors)) ordered.push_back(tensors[i]);
  write_safetensors(dir / "ours.safetensors", ordered, {{"format", "pt"}});

  // Python checks every value with safe_open (numpy) and re-serialises the same tensors itself; the
  // bytes must be equal.
  std::string script = std::string(kPyCommon) + R"PY(
path = sys.argv[1]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
with safe_open(path, framework="np") as f:
    assert f.metadata() == {"format": "pt"}, f.metadata()
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] == "BF16": continue
        got, want = f.get_tensor(name), expected(info["dtype"], info["shape"])
        assert got.dtype == want.dtype and got.shape == want.shape and (got == want).all(), name
b = header["d.bf16"]
assert raw[8 + n + b["data_offsets"][0]: 8 + n + b["data_offsets"][1]] == bf16_bytes(b["shape"])
keep, specs = [], {}
for name, info in header.items():
    if name == "__metadata__": continue
    data = raw[8 + n + info["data_offsets"][0]: 8 + n + info["data_offsets"][1]]
    buf = ctypes.create_string_buffer(data, max(len(data), 1)); keep.append(buf)
    specs[name] = TensorSpec(dtype=SPEC[info["dtype"]], shape=info["shape"], data_ptr=ctypes.addressof(buf), data_len=len(data))
again = bytes(serialize(specs, metadata={"format": "pt"}))
if again != raw:
    sys.exit("bytes differ: reference header %r vs ours %r" % (again[8:8 + n + 8], raw[8:8 + n + 8]))
)PY";
  testing::run_python(dir, script, (dir / "ours.safetensors").string());
}

TEST(Safetensors, WriterKeepsTheGivenOrderAndAlignsTheBuffer) {
  fs::path dir = testing::make_temp_dir("st_order");
  std::vector<float> a = {1, 2, 3};
  std::vector<int8_t> b = {4, 5};
  std::vector<SafetensorsTensor> t = {{"z", DType::I8, Shape{2}, b.data()}, {"a", DType::F32, Shape{3}, a.data()}};
  write_safetensors(dir / "x.safetensors", t, {{"k", "v"}, {"j", "w"}});
  auto f = SafetensorsFile::open(dir / "x.safetensors");
  ASSERT_EQ(f->entries().size(), 2u);
  EXPECT_EQ(f->entries()[0].name, "z");
  EXPECT_EQ(f->entries()[0].begin, 0u);
  EXPECT_EQ(f->entries()[1].begin, 2u);
  EXPECT_EQ(f->data_start() % 8, 0u);
  // "a" starts 2 bytes into the buffer: tensor() hands out an aligned copy (a view would be a misaligned
  // float pointer, undefined behaviour that UBSan reports).
  const Tensor a_read = f->tensor("a");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a_read.data_ptr()) % alignof(float), 0u);
  EXPECT_EQ(a_read.data<float>()[0], 1.0f);
  EXPECT_EQ(a_read.data<float>()[2], 3.0f);
  EXPECT_EQ(f->tensor("z").data<int8_t>()[1], 5);
  EXPECT_EQ(f->metadata().size(), 2u);
  testing::expect_error([&] { write_safetensors(dir / "y.safetensors", std::vector<SafetensorsTensor>{t[0], t[0]}); },
                        {"'z'", "twice"});
  testing::expect_error([&] { f->entry("nope"); }, {"x.safetensors", "'nope'"});
}

// Writes a valid two-tensor file and returns its bytes.
std::string valid_file(const fs::path& dir) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<int32_t> b = {7, 8};
  std::vector<SafetensorsTensor> t = {{"w", DType::F32, Shape{2, 3}, a.data()}, {"b", DType::I32, Shape{2}, b.data()}};
  write_safetensors(dir / "valid.safetensors", t);
  return read_bytes(dir / "valid.safetensors");
}

std::string with_header(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint8_t(uint64_t(header.size()) >> (8 * i)));
  return out + header + data;
}

TEST(Safetensors, RefusesMalformedFiles) {
  fs::path dir = testing::make_temp_dir("st_bad");
  const std::string good = valid_file(dir);
  const fs::path p = dir / "bad.safetensors";
  auto expect_refused = [&](const std::string& bytes, const std::vector<std::string>& parts) {
    write_bytes(p, bytes);
    std::vector<std::string> all = parts;
    all.push_back(p.string());
    testing::expect_error([&] { SafetensorsFile::open(p); }, all);
  };
  // Truncations: inside the length, inside the header, inside the data.
  expect_refused(good.substr(0, 5), {"shorter than the 8-byte header length"});
  expect_refused(good.substr(0, 20), {"runs past the end of the file"});
  expect_refused(good.substr(0, good.size() - 3), {"'b'", "run past the end of the data", "truncated"});
  // Trailing bytes after the last tensor.
  expect_refused(good + "xx", {"trailing bytes"});
  // Absurd header length.
  std::string huge = good;
  huge[7] = char(0x7f);
  expect_refused(huge, {"exceeds the 100 MB limit"});
  const std::string data(32, '\0');
  expect_refused(with_header("{\"w\": {\"dtype\": \"F32\", ", data), {"not valid JSON"});
  expect_refused(with_header("[1, 2]", data), {"does not start with '{'"});
  expect_refused(with_header(R"({"w":{"dtype":"F33","shape":[8],"data_offsets":[0,32]}})", data),
                 {"tensor 'w'", "unknown dtype 'F33'"});
  expect_refused(with_header(R"({"w":{"dtype":"F32","shape":[7],"data_offsets":[0,32]}})", data),
                 {"tensor 'w'", "is 28 bytes but data_offsets [0, 32] hold 32"});
  expect_refused(with_header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,32]}})", data),
                 {"tensor 'w'", "not a non-negative integer"});
  expect_refused(with_header(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", data),
                 {"tensor 'w'", "end before they begin"});
  expect_refused(with_header(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})", data),
                 {"tensor 'w'", "starts at data offset 16", "holes or overlaps"});
  expect_refused(with_header(R"({"w":{"dtype":"F32","shape":[4]}})", data), {"tensor 'w'", "data_offsets"});
  expect_refused(with_header(R"({"__metadata__":{"a":1}})", ""), {"__metadata__", "not a string"});
  testing::expect_error([&] { SafetensorsFile::open(dir / "missing.safetensors"); },
                        {"cannot open", "missing.safetensors"});
}

}  // namespace
}  // namespace megatron::checkpoint
