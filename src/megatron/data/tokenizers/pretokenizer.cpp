#include "megatron/data/tokenizers/pretokenizer.h"

#include <algorithm>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/data/tokenizers/byte_level.h"
#include "megatron/data/tokenizers/gpt2_tokenizer.h"
#include "megatron/data/tokenizers/normalizer.h"
#include "megatron/data/tokenizers/regex.h"

namespace megatron::data {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const std::string& s, const JsonWhere& where) {
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  MEGATRON_FAIL(where.str(), ": unknown split behavior ", quoted_bytes(s));
}

struct Cut {
  Span span;
  bool is_match;
};

// HF's NormalizedString::split: matches and the gaps between them, then grouped by behaviour.
std::vector<Span> apply_behavior(std::vector<Cut> cuts, Behavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Cut& c : cuts) out.push_back(c.span);
      break;
    case Behavior::kRemoved:
      for (const Cut& c : cuts)
        if (!c.is_match) out.push_back(c.span);
      break;
    case Behavior::kMergedWithPrevious:
      for (const Cut& c : cuts) {
        if (c.is_match && !previous_match && !out.empty()) out.back().end = c.span.end;
        else out.push_back(c.span);
        previous_match = c.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = cuts.rbegin(); it != cuts.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) out.back().begin = it->span.begin;
        else out.push_back(it->span);
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::kContiguous:
      for (const Cut& c : cuts) {
        if (c.is_match == previous_match && !out.empty()) out.back().end = c.span.end;
        else out.push_back(c.span);
        previous_match = c.is_match;
      }
      break;
  }
  return out;
}

void split_pieces(std::vector<PreToken>& pieces, const Regex& regex, Behavior behavior, bool invert) {
  std::vector<PreToken> out;
  std::vector<Span> matches;
  for (PreToken& piece : pieces) {
    matches.clear();
    regex.find_all(piece.text, matches);
    std::vector<Cut> cuts;
    size_t prev = 0;
    for (const Span& m : matches) {
      if (m.begin > prev) cuts.push_back({{prev, m.begin}, invert});
      cuts.push_back({m, !invert});
      prev = m.end;
    }
    if (prev < piece.text.size()) cuts.push_back({{prev, piece.text.size()}, invert});
    for (const Span& s : apply_behavior(std::move(cuts), behavior)) {
      if (s.end > s.begin) out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
    }
  }
  pieces = std::move(out);
}

class SequencePre final : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<PreToken>& pieces) const override {
    for (const auto& p : parts_) p->apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class SplitPre final : public PreTokenizer {
 public:
  SplitPre(const std::string& regex, Behavior behavior, bool invert, const JsonWhere& where)
      : regex_(regex, where.str()), behavior_(behavior), invert_(invert) {}
  void apply(std::vector<PreToken>& pieces) const override { split_pieces(pieces, regex_, behavior_, invert_); }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPre final : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern, "ByteLevel pre-tokenizer");
  }
  void apply(std::vector<PreToken>& pieces) const override {
    if (add_prefix_space_) {
      for (PreToken& p : pieces)
        if (!p.text.empty() && p.text[0] != ' ') p.text.insert(0, " ");
    }
    if (regex_) split_pieces(pieces, *regex_, Behavior::kIsolated, false);
    for (PreToken& p : pieces) p.text = alphabet_.encode(p.text);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
  ByteLevelAlphabet alphabet_;
};

class MetaspacePre final : public PreTokenizer {
 public:
  MetaspacePre(std::string replacement, std::string prepend_scheme, bool split, const JsonWhere& where)
      : replacement_(std::move(replacement)), prepend_scheme_(std::move(prepend_scheme)), split_(split),
        split_regex_(Regex::escape(replacement_), where.str()) {}
  void apply(std::vector<PreToken>& pieces) const override {
    for (PreToken& p : pieces) {
      std::string out;
      for (char c : p.text) {
        if (c == ' ') out += replacement_;
        else out += c;
      }
      const bool starts = out.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (prepend_scheme_ == "always" || (prepend_scheme_ == "first" && p.at_start))) {
        out.insert(0, replacement_);
      }
      p.text = std::move(out);
    }
    if (split_) split_pieces(pieces, split_regex_, Behavior::kMergedWithNext, false);
  }

 private:
  std::string replacement_, prepend_scheme_;
  bool split_;
  Regex split_regex_;
};

std::unique_ptr<PreTokenizer> make_regex_split(const std::string& regex, Behavior b, bool invert, const JsonWhere& w) {
  return std::make_unique<SplitPre>(regex, b, invert, w);
}

}  // namespace

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Json& j, const JsonWhere& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(json_member(j, "type", where), where.child("type"));
  if (type == "Sequence") {
    const JsonWhere w = where.child("pretokenizers");
    const Json& list = json_member(j, "pretokenizers", where);
    MEGATRON_CHECK(list.is_array(), w.str(), " must be an array");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      if (auto p = parse_pre_tokenizer(list[i], w.index(i))) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePre>(std::move(parts));
  }
  if (type == "Split") {
    const PatternSpec pattern = parse_pattern(json_member(j, "pattern", where), where.child("pattern"));
    const Behavior b = parse_behavior(json_string(json_member(j, "behavior", where), where.child("behavior")),
                                      where.child("behavior"));
    return make_regex_split(pattern.regex, b, json_bool_or(j, "invert", false, where), where.child("pattern"));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPre>(json_bool_or(j, "add_prefix_space", true, where),
                                          json_bool_or(j, "use_regex", true, where));
  }
  if (type == "Digits") {
    const bool individual = json_bool_or(j, "individual_digits", false, where);
    return make_regex_split(R"(\p{N})", individual ? Behavior::kIsolated : Behavior::kContiguous, false, where);
  }
  if (type == "Whitespace") return make_regex_split(R"(\w+|[^\w\s]+)", Behavior::kRemoved, true, where);
  if (type == "WhitespaceSplit") return make_regex_split(R"(\s+)", Behavior::kRemoved, false, where);
  if (type == "Metaspace") {
    std::string scheme = "always";
    if (const Json* s = json_optional(j, "prepend_scheme")) {
      scheme = json_string(*s, where.child("prepend_scheme"));
      MEGATRON_CHECK(scheme == "always" || scheme == "first" || scheme == "never", where.child("prepend_scheme").str(),
                     ": must be always, first or never, got ", quoted_bytes(scheme));
    } else if (!json_bool_or(j, "add_prefix_space", true, where)) {
      scheme = "never";
    }
    return std::make_unique<MetaspacePre>(json_string_or(j, "replacement", "\xE2\x96\x81", where), scheme,
                                          json_bool_or(j, "split", true, where), where);
  }
  MEGATRON_FAIL(where.str(), ": unsupported pre_tokenizer type ", quoted_bytes(type),
                " (supported: Sequence, Split, ByteLevel, Digits, Metaspace, Whitespace, WhitespaceSplit)");
}

}  // namespace megatron::data
