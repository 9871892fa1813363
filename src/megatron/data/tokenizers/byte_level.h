// GPT-2's byte-level alphabet: every byte maps to one printable code point, so that any byte string becomes
// a string of "characters" a BPE vocabulary can hold. Printable Latin-1 bytes (! .. ~, ¡ .. ¬, ® .. ÿ) map to
// themselves; the other 68 bytes map, in increasing byte order, to U+0100, U+0101, ... (U+0120 is space).
// decode() inverts it; a code point outside the alphabet is kept as its own UTF-8 bytes (as HF's ByteLevel
// decoder does).
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace megatron::data {

class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();
  // Appends the alphabet string of every byte of `bytes`.
  void encode(std::string_view bytes, std::string& out) const;
  std::string encode(std::string_view bytes) const {
    std::string out;
    encode(bytes, out);
    return out;
  }
  // Appends the bytes that `text` (alphabet characters, valid UTF-8) stands for.
  void decode(std::string_view text, std::string& out) const;
  std::string decode(std::string_view text) const {
    std::string out;
    decode(text, out);
    return out;
  }
  // The byte that code point `cp` stands for, -1 when `cp` is not in the alphabet.
  int byte_of(char32_t cp) const { return cp < code_point_to_byte_.size() ? code_point_to_byte_[cp] : -1; }
  // The alphabet string of one byte (1 or 2 UTF-8 bytes).
  const std::string& of(unsigned char byte) const { return byte_to_text_[byte]; }

 private:
  std::array<std::string, 256> byte_to_text_;
  std::array<int, 324> code_point_to_byte_;  // U+0000..U+0143 -> byte, -1 when not in the alphabet
};

}  // namespace megatron::data
