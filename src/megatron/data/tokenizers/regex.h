// A compiled PCRE2 regular expression for pre-tokenisation: UTF and UCP modes (so \p{L}, \p{N}, \s and
// case-insensitive groups follow Unicode, like the regex engines of tiktoken and HF tokenizers), JIT-compiled
// when PCRE2 has a JIT. Subjects must be valid UTF-8 (sanitize_utf8 first): the UTF check is skipped.
// Thread-safe: find_all allocates its own match data.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megatron::data {

struct Span {
  size_t begin = 0;
  size_t end = 0;
};

class Regex {
 public:
  // `where` names the pattern's origin (file and JSON path) in error messages.
  Regex(std::string pattern, std::string_view where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the non-empty matches of the pattern in `subject`, scanning left to right (after an empty match
  // the scan moves on by one code point).
  void find_all(std::string_view subject, std::vector<Span>& out) const;
  const std::string& pattern() const { return pattern_; }
  // `text` with every regex metacharacter escaped (for literal patterns).
  static std::string escape(std::string_view text);

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace megatron::data
