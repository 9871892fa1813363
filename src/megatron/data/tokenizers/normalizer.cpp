#include "megatron/data/tokenizers/normalizer.h"

#include <vector>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/data/tokenizers/regex.h"
#include "megatron/data/utf8.h"

#if MEGATRON_WITH_ICU
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#endif

namespace megatron::data {
namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::string& text) const override {
    for (const auto& p : parts_) p->apply(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(const std::string& regex, std::string content, const JsonWhere& where)
      : regex_(regex, where.str()), content_(std::move(content)) {}
  void apply(std::string& text) const override {
    std::vector<Span> matches;
    regex_.find_all(text, matches);
    if (matches.empty()) return;
    std::string out;
    size_t prev = 0;
    for (const Span& m : matches) {
      out.append(text, prev, m.begin - prev);
      out += content_;
      prev = m.end;
    }
    out.append(text, prev, std::string::npos);
    text = std::move(out);
  }

 private:
  Regex regex_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void apply(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

// Rust's char::is_whitespace (Unicode White_Space).
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t i = begin;
        if (!is_white_space(next_code_point(text, i))) break;
        begin = i;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!is_white_space(next_code_point(text, i))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

#if MEGATRON_WITH_ICU
std::u16string to_utf16(const std::string& s, const char* what) {
  std::u16string out(s.size() + 1, u'\0');
  int32_t length = 0;
  UErrorCode status = U_ZERO_ERROR;
  u_strFromUTF8(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &length, s.data(),
                static_cast<int32_t>(s.size()), &status);
  MEGATRON_CHECK(U_SUCCESS(status), what, ": UTF-8 to UTF-16 failed: ", u_errorName(status));
  out.resize(static_cast<size_t>(length));
  return out;
}

std::string to_utf8(const std::u16string& s, const char* what) {
  std::string out(s.size() * 3 + 1, '\0');
  int32_t length = 0;
  UErrorCode status = U_ZERO_ERROR;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &length, reinterpret_cast<const UChar*>(s.data()),
              static_cast<int32_t>(s.size()), &status);
  MEGATRON_CHECK(U_SUCCESS(status), what, ": UTF-16 to UTF-8 failed: ", u_errorName(status));
  out.resize(static_cast<size_t>(length));
  return out;
}

class UnicodeNormalizer final : public Normalizer {
 public:
  UnicodeNormalizer(const std::string& form, const JsonWhere& where) : form_(form) {
    UErrorCode status = U_ZERO_ERROR;
    if (form == "NFC") norm_ = unorm2_getNFCInstance(&status);
    else if (form == "NFD") norm_ = unorm2_getNFDInstance(&status);
    else if (form == "NFKC") norm_ = unorm2_getNFKCInstance(&status);
    else norm_ = unorm2_getNFKDInstance(&status);
    MEGATRON_CHECK(U_SUCCESS(status), where.str(), ": ICU has no ", form, " normalizer: ", u_errorName(status));
  }
  void apply(std::string& text) const override {
    bool ascii = true;
    for (unsigned char c : text) ascii = ascii && c < 0x80;
    if (ascii) return;  // every normal form leaves ASCII unchanged
    const std::u16string in = to_utf16(text, form_.c_str());
    UErrorCode status = U_ZERO_ERROR;
    std::u16string out(in.size() * 4 + 16, u'\0');
    const int32_t n = unorm2_normalize(norm_, reinterpret_cast<const UChar*>(in.data()), static_cast<int32_t>(in.size()),
                                       reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &status);
    MEGATRON_CHECK(U_SUCCESS(status), form_, " normalisation failed: ", u_errorName(status));
    out.resize(static_cast<size_t>(n));
    text = to_utf8(out, form_.c_str());
  }

 private:
  std::string form_;
  const UNormalizer2* norm_ = nullptr;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void apply(std::string& text) const override {
    const std::u16string in = to_utf16(text, "Lowercase");
    std::u16string out(in.size() * 3 + 16, u'\0');
    UErrorCode status = U_ZERO_ERROR;
    const int32_t n = u_strToLower(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()),
                                   reinterpret_cast<const UChar*>(in.data()), static_cast<int32_t>(in.size()), "", &status);
    MEGATRON_CHECK(U_SUCCESS(status), "Lowercase normalisation failed: ", u_errorName(status));
    out.resize(static_cast<size_t>(n));
    text = to_utf8(out, "Lowercase");
  }
};
#endif

}  // namespace

PatternSpec parse_pattern(const Json& j, const JsonWhere& where) {
  if (const Json* s = json_optional(j, "String")) return {Regex::escape(json_string(*s, where.child("String")))};
  if (const Json* r = json_optional(j, "Regex")) return {json_string(*r, where.child("Regex"))};
  MEGATRON_FAIL(where.str(), ": a pattern must be {\"String\": ...} or {\"Regex\": ...}, got ", j.dump());
}

std::unique_ptr<Normalizer> parse_normalizer(const Json& j, const JsonWhere& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(json_member(j, "type", where), where.child("type"));
  if (type == "Sequence") {
    const JsonWhere w = where.child("normalizers");
    const Json& list = json_member(j, "normalizers", where);
    MEGATRON_CHECK(list.is_array(), w.str(), " must be an array");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      if (auto p = parse_normalizer(list[i], w.index(i))) parts.push_back(std::move(p));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "Replace") {
    const PatternSpec pattern = parse_pattern(json_member(j, "pattern", where), where.child("pattern"));
    return std::make_unique<ReplaceNormalizer>(pattern.regex,
                                               json_string(json_member(j, "content", where), where.child("content")),
                                               where.child("pattern"));
  }
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(json_string(json_member(j, "prepend", where), where.child("prepend")));
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(json_bool_or(j, "strip_left", true, where),
                                             json_bool_or(j, "strip_right", true, where));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD" || type == "Lowercase") {
#if MEGATRON_WITH_ICU
    if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
    return std::make_unique<UnicodeNormalizer>(type, where);
#else
    MEGATRON_FAIL(where.str(), ": normalizer ", type, " needs ICU; rebuild with libicu-dev installed");
#endif
  }
  MEGATRON_FAIL(where.str(), ": unsupported normalizer type ", quoted_bytes(type),
                " (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip)");
}

}  // namespace megatron::data
