#include "megatron/data/tokenizers/sentencepiece_model_check.h"

#include <cstdint>
#include <optional>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"

namespace megatron::data {
namespace {

// One protobuf message's fields, read front to back (https://protobuf.dev/programming-guides/encoding/).
// Every read is bounds-checked; a malformed message ends the walk rather than throwing.
class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : bytes_(bytes) {}

  struct Field {
    uint64_t number = 0;
    int wire_type = 0;
    std::string_view bytes;  // length-delimited fields: the payload
  };

  // The next field, or nothing at the end of the message or on malformed bytes (the walk then stops).
  std::optional<Field> next() {
    if (malformed_ || pos_ == bytes_.size()) return std::nullopt;
    const std::optional<uint64_t> key = varint();
    if (!key) return fail();
    Field f{.number = *key >> 3, .wire_type = int(*key & 7)};
    if (f.number == 0 || !(f.wire_type == 3 ? skip_group(f.number) : skip_value(f))) return fail();
    return f;
  }

 private:
  // Groups deeper than this are left to the library (protobuf's own parser stops at 100 levels too); a
  // bound, so that nesting in a large file cannot exhaust the stack or the time here.
  static constexpr size_t kMaxGroupDepth = 100;

  std::optional<Field> fail() {
    malformed_ = true;
    return std::nullopt;
  }
  std::optional<uint64_t> varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64 && pos_ < bytes_.size(); shift += 7) {
      const auto byte = uint8_t(bytes_[pos_++]);
      value |= uint64_t(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    return std::nullopt;
  }
  bool advance(uint64_t n) {
    if (n > bytes_.size() - pos_) return false;
    pos_ += size_t(n);
    return true;
  }
  // Moves past f's value (not a group); keeps a length-delimited field's payload.
  bool skip_value(Field& f) {
    switch (f.wire_type) {
      case 0: return varint().has_value();
      case 1: return advance(8);
      case 5: return advance(4);
      case 2: {
        const std::optional<uint64_t> n = varint();
        if (!n || *n > bytes_.size() - pos_) return false;
        f.bytes = bytes_.substr(pos_, size_t(*n));
        pos_ += size_t(*n);
        return true;
      }
      default: return false;  // 3 and 4 are groups' (skip_group), 6 and 7 do not exist
    }
  }
  // Moves past the group `number` just opened, through its matching end (nested groups by a stack of their
  // numbers, not by recursion).
  bool skip_group(uint64_t number) {
    std::vector<uint64_t> open{number};
    while (!open.empty()) {
      const std::optional<uint64_t> key = varint();
      if (!key) return false;
      Field inner{.number = *key >> 3, .wire_type = int(*key & 7)};
      if (inner.number == 0) return false;
      if (inner.wire_type == 4) {
        if (inner.number != open.back()) return false;
        open.pop_back();
      } else if (inner.wire_type == 3) {
        if (open.size() == kMaxGroupDepth) return false;
        open.push_back(inner.number);
      } else if (!skip_value(inner)) {
        return false;
      }
    }
    return true;
  }

  std::string_view bytes_;
  size_t pos_ = 0;
  bool malformed_ = false;
};

constexpr uint64_t kModelPieces = 1;  // ModelProto.pieces (repeated SentencePiece)
constexpr uint64_t kPieceString = 1;  // SentencePiece.piece

}  // namespace

void check_sentencepiece_pieces(std::string_view model_bytes, const std::string& path) {
  WireReader model(model_bytes);
  int64_t index = 0;
  while (const std::optional<WireReader::Field> field = model.next()) {
    if (field->number != kModelPieces || field->wire_type != 2) continue;
    WireReader piece(field->bytes);
    while (const std::optional<WireReader::Field> f = piece.next()) {
      if (f->number != kPieceString || f->wire_type != 2) continue;
      MEGATRON_CHECK(!f->bytes.empty(), path, ": piece ", index, " is empty (a sentencepiece model's pieces are non-empty)");
      MEGATRON_CHECK(f->bytes.find('\0') == std::string_view::npos, path, ": piece ", index, " (",
                     quoted_bytes(f->bytes), ") holds a NUL byte, which no sentencepiece piece may");
    }
    ++index;
  }
}

}  // namespace megatron::data
