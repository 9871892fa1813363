#include "megatron/data/tokenizers/sentencepiece_model_check.h"

#include <cstdint>
#include <optional>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"

namespace megatron::data {
namespace {

// One protobuf message's fields, read front to back (https://protobuf.dev/programming-guides/encoding/).
// Every read is bounds-checked; a malformed message ends the walk (ok() false) rather than throwing.
class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : bytes_(bytes) {}

  struct Field {
    uint64_t number = 0;
    int wire_type = 0;
    std::string_view bytes;  // length-delimited fields: the payload
  };

  // The next field, or nothing at the end of the message or on malformed bytes (then ok() is false).
  std::optional<Field> next() {
    if (!ok_ || pos_ == bytes_.size()) return std::nullopt;
    const std::optional<uint64_t> key = varint();
    if (!key) return fail();
    Field f{.number = *key >> 3, .wire_type = int(*key & 7)};
    if (f.number == 0 || !skip_value(f)) return fail();
    return f;
  }
  bool ok() const { return ok_; }

 private:
  std::optional<Field> fail() {
    ok_ = false;
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
  // Moves past f's value (a group: past its matching end, nested groups included); keeps a payload's bytes.
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
      case 3: {  // a group: fields until the end-group key of the same number
        for (;;) {
          const std::optional<uint64_t> key = varint();
          if (!key) return false;
          Field inner{.number = *key >> 3, .wire_type = int(*key & 7)};
          if (inner.wire_type == 4) return inner.number == f.number;
          if (inner.number == 0 || !skip_value(inner)) return false;
        }
      }
      default: return false;  // 4 (an end without a start), 6, 7
    }
  }

  std::string_view bytes_;
  size_t pos_ = 0;
  bool ok_ = true;
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
