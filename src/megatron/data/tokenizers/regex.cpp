#define PCRE2_CODE_UNIT_WIDTH 8
#include "megatron/data/tokenizers/regex.h"

#include <pcre2.h>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"

namespace megatron::data {

Regex::Regex(std::string pattern, std::string_view where) : pattern_(std::move(pattern)) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    MEGATRON_FAIL(where, ": cannot compile regex ", quoted_bytes(pattern_, 200), " at offset ", error_offset, ": ",
                  reinterpret_cast<const char*>(message));
  }
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view subject, std::vector<Span>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  MEGATRON_CHECK(md != nullptr, "out of memory for regex match data");
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t pos = 0;
  while (pos <= subject.size()) {
    const int rc = jit_ ? pcre2_jit_match(code, s, subject.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr)
                        : pcre2_match(code, s, subject.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      MEGATRON_FAIL("regex ", quoted_bytes(pattern_, 200), " failed at byte ", pos, " of a ", subject.size(),
                    "-byte text: ", reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.push_back({b, e});
      pos = e;
    } else {  // empty match: step over one code point
      if (b >= subject.size()) break;
      pos = b + 1;
      while (pos < subject.size() && (static_cast<unsigned char>(subject[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  pcre2_match_data_free(md);
}

std::string Regex::escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~ ").find(c) != std::string_view::npos) {
      // Inside UTF mode every ASCII punctuation may be escaped; a space is escaped as \x20 (x-mode safe).
      if (c == ' ') {
        out += "\\x20";
        continue;
      }
      out += '\\';
    }
    out += c;
  }
  return out;
}

}  // namespace megatron::data
