#include "megatron/data/tokenizers/decoder.h"

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/data/tokenizers/byte_level.h"
#include "megatron/data/utf8.h"

namespace megatron::data {
namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t prev = 0;
  for (size_t pos; (pos = s.find(from, prev)) != std::string::npos; prev = pos + from.size()) {
    out.append(s, prev, pos - prev);
    out += to;
  }
  out.append(s, prev, std::string::npos);
  s = std::move(out);
}

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string out;
    for (const std::string& t : tokens) {
      // A token with a character outside the alphabet is kept as it is (HF: the token's own bytes).
      std::string bytes;
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        const int b = alphabet_.byte_of(next_code_point(t, i));
        all = b >= 0;
        if (all) bytes += static_cast<char>(b);
      }
      out += all ? bytes : t;
    }
    tokens.assign(1, std::move(out));
  }

 private:
  ByteLevelAlphabet alphabet_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first) : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      // As HF: in the first token every replacement character is dropped (not only a leading one).
      replace_all(tokens[i], replacement_, i == 0 && strip_first_ ? "" : " ");
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) replace_all(t, from_, to_);
  }

 private:
  std::string from_, to_;
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    bool in_bytes = false;
    for (const std::string& t : tokens) {
      const auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
      };
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex(t[3]) >= 0 && hex(t[4]) >= 0) {
        bytes += static_cast<char>(hex(t[3]) * 16 + hex(t[4]));
        in_bytes = true;
        continue;
      }
      if (in_bytes) out.push_back(std::move(bytes));
      bytes.clear();
      in_bytes = false;
      out.push_back(t);
    }
    if (in_bytes) out.push_back(std::move(bytes));
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, int64_t start, int64_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      for (int64_t k = 0; k < start_ && t.compare(0, content_.size(), content_) == 0 && !content_.empty(); ++k)
        t.erase(0, content_.size());
      for (int64_t k = 0; k < stop_ && t.size() >= content_.size() && !content_.empty() &&
                          t.compare(t.size() - content_.size(), content_.size(), content_) == 0;
           ++k)
        t.erase(t.size() - content_.size());
    }
  }

 private:
  std::string content_;
  int64_t start_, stop_;
};

}  // namespace

std::unique_ptr<Decoder> parse_decoder(const Json& j, const JsonWhere& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(json_member(j, "type", where), where.child("type"));
  if (type == "Sequence") {
    const JsonWhere w = where.child("decoders");
    const Json& list = json_member(j, "decoders", where);
    MEGATRON_CHECK(list.is_array(), w.str(), " must be an array");
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      if (auto p = parse_decoder(list[i], w.index(i))) parts.push_back(std::move(p));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    bool strip_first = json_bool_or(j, "add_prefix_space", true, where);
    if (const Json* s = json_optional(j, "prepend_scheme")) strip_first = json_string(*s, where.child("prepend_scheme")) != "never";
    return std::make_unique<MetaspaceDecoder>(json_string_or(j, "replacement", "\xE2\x96\x81", where), strip_first);
  }
  if (type == "Replace") {
    const Json& pattern = json_member(j, "pattern", where);
    const Json* literal = json_optional(pattern, "String");
    MEGATRON_CHECK(literal != nullptr, where.child("pattern").str(), ": only {\"String\": ...} patterns are supported in decoders");
    return std::make_unique<ReplaceDecoder>(json_string(*literal, where.child("pattern").child("String")),
                                            json_string(json_member(j, "content", where), where.child("content")));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(json_string(json_member(j, "content", where), where.child("content")),
                                          json_int(json_member(j, "start", where), where.child("start")),
                                          json_int(json_member(j, "stop", where), where.child("stop")));
  }
  MEGATRON_FAIL(where.str(), ": unsupported decoder type ", quoted_bytes(type),
                " (supported: Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip)");
}

}  // namespace megatron::data
