#include "megatron/core/quoted_bytes.h"

#include <cstdio>

namespace megatron {
namespace {

// Length of a well-formed UTF-8 sequence of 2 to 4 bytes at s[i] whose code point is printable (not a C1
// control, U+0080..U+009F), or 0.
size_t printable_utf8_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  const size_t length = lead >= 0xC2 && lead <= 0xDF ? 2 : lead >= 0xE0 && lead <= 0xEF ? 3
                       : lead >= 0xF0 && lead <= 0xF4 ? 4 : 0;
  if (length == 0 || i + length > s.size()) return 0;
  // The second byte's range excludes overlong forms (E0, F0), surrogates (ED) and code points past U+10FFFF.
  const unsigned char low = lead == 0xE0 ? 0xA0 : lead == 0xF0 ? 0x90 : 0x80;
  const unsigned char high = lead == 0xED ? 0x9F : lead == 0xF4 ? 0x8F : 0xBF;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < length; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  if (lead == 0xC2 && byte(i + 1) <= 0x9F) return 0;  // C1 controls
  return length;
}

// Appends `text`, printable ASCII and printable UTF-8 sequences as they are. With `c_escapes`: '"', '\\', \n,
// \r, \t as C escapes; without: \n and \t as they are. Every other byte as \xNN.
void append_escaped(std::string& out, std::string_view text, bool c_escapes) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      if (const size_t n = printable_utf8_length(text, i); n > 0) {
        out.append(text.substr(i, n));
        i += n;
        continue;
      }
    }
    const char* escape = !c_escapes ? nullptr : c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                                              : c == '\r' ? "\\r" : c == '\t' ? "\\t" : nullptr;
    if (escape != nullptr) {
      out += escape;
    } else if ((c >= 0x20 && c < 0x7F) || (!c_escapes && (c == '\n' || c == '\t'))) {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
    ++i;
  }
}

}  // namespace

std::string quoted_bytes(std::string_view bytes, size_t max_bytes) {
  const std::string_view shown = bytes.substr(0, max_bytes);
  std::string out = "\"";
  append_escaped(out, shown, /*c_escapes=*/true);
  out += '"';
  if (shown.size() < bytes.size()) out += "... (" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

std::string terminal_safe(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  append_escaped(out, text, /*c_escapes=*/false);
  return out;
}

}  // namespace megatron
