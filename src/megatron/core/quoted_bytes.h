// Outside bytes in error messages. A message that echoes what a file or a flag held (a magic number, a
// line, a token) must not write raw bytes to the terminal: control bytes could move the cursor or change
// its colours, and binary garbage makes the message unreadable. quoted_bytes() renders them as a C string.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace megatron {

// `bytes` in double quotes: printable ASCII and well-formed UTF-8 sequences of printable characters as
// they are; '"' and '\' backslash-escaped; \n, \r, \t as such; every other byte as \xNN. A text longer than
// `max_bytes` is cut there and followed by `... (N bytes)`.
std::string quoted_bytes(std::string_view bytes, size_t max_bytes = 80);

// `text` safe to print, unquoted: '\n' and '\t' and printable characters (ASCII and well-formed UTF-8) as they
// are, every other byte as \xNN. megatron::Error applies it to every message, so outside text that reaches a
// message unescaped (a third-party library's error text, a value echoed by mistake) cannot reach the terminal
// raw either.
std::string terminal_safe(std::string_view text);

}  // namespace megatron
