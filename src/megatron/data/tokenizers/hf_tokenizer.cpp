#include "megatron/data/tokenizers/hf_tokenizer.h"

#include <filesystem>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/data/tokenizers/json_util.h"
#include "megatron/data/utf8.h"

namespace megatron::data {
namespace {

// A token id: an integer in [0, 2^31 - 1) (so that id + 1, a vocabulary size, fits int32).
int32_t token_id(const Json& j, const JsonWhere& where) {
  const int64_t id = json_int(j, where);
  MEGATRON_CHECK(id >= 0 && id < INT32_MAX, where.str(), ": token id ", id, " is outside [0, 2^31 - 1)");
  return static_cast<int32_t>(id);
}

std::unique_ptr<BpeModel> parse_bpe(const Json& model, const JsonWhere& where) {
  const std::string type = json_string_or(model, "type", "BPE", where);
  MEGATRON_CHECK(type == "BPE", where.child("type").str(), ": only BPE models are supported, got ", quoted_bytes(type));
  if (const Json* dropout = json_optional(model, "dropout")) {
    MEGATRON_CHECK(dropout->is_number() && dropout->get<double>() == 0.0, where.child("dropout").str(),
                   ": BPE dropout is not supported (non-deterministic), got ", dropout->dump());
  }
  BpeOptions options;
  options.unk_token = json_string_or(model, "unk_token", "", where);
  options.fuse_unk = json_bool_or(model, "fuse_unk", false, where);
  options.byte_fallback = json_bool_or(model, "byte_fallback", false, where);
  options.ignore_merges = json_bool_or(model, "ignore_merges", false, where);
  options.continuing_subword_prefix = json_string_or(model, "continuing_subword_prefix", "", where);
  options.end_of_word_suffix = json_string_or(model, "end_of_word_suffix", "", where);

  const JsonWhere vw = where.child("vocab");
  const Json& vocab_json = json_member(model, "vocab", where);
  MEGATRON_CHECK(vocab_json.is_object(), vw.str(), " must be an object token -> id");
  StringMap<int32_t> vocab;
  vocab.reserve(vocab_json.size());
  for (const auto& [token, id] : vocab_json.items()) {
    vocab.emplace(token, token_id(id, vw.child(token)));
  }
  const JsonWhere mw = where.child("merges");
  const Json& merges_json = json_member(model, "merges", where);
  MEGATRON_CHECK(merges_json.is_array(), mw.str(), " must be an array");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json.size());
  for (size_t i = 0; i < merges_json.size(); ++i) {
    const Json& m = merges_json[i];
    if (m.is_string()) {  // "left right"
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      MEGATRON_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos, mw.index(i).str(),
                     ": a merge must be \"left right\", got ", quoted_bytes(s));
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else {  // ["left", "right"]
      MEGATRON_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), mw.index(i).str(),
                     ": a merge must be \"left right\" or [left, right], got ", m.dump());
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
  return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(options), mw.str());
}

// A special token named in tokenizer_config.json: a string or {"content": ...}.
std::string config_token(const Json& config, const char* key) {
  const Json* v = json_optional(config, key);
  if (v == nullptr) return {};
  if (v->is_string()) return v->get<std::string>();
  if (const Json* c = json_optional(*v, "content"); c && c->is_string()) return c->get<std::string>();
  return {};
}

}  // namespace

HfTokenizer::HfTokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file = path;
  if (fs::is_directory(file)) file /= "tokenizer.json";
  MEGATRON_CHECK(fs::exists(file), "HuggingFaceTokenizer: ", file.string(), " does not exist");
  const Json root = load_json_file(file.string());
  const JsonWhere where{file.string(), ""};

  model_ = parse_bpe(json_member(root, "model", where), where.child("model"));
  normalizer_ = parse_normalizer(root.value("normalizer", Json()), where.child("normalizer"));
  pre_tokenizer_ = parse_pre_tokenizer(root.value("pre_tokenizer", Json()), where.child("pre_tokenizer"));
  decoder_ = parse_decoder(root.value("decoder", Json()), where.child("decoder"));

  vocab_size_ = model_->size();
  if (const Json* added = json_optional(root, "added_tokens")) {
    const JsonWhere aw = where.child("added_tokens");
    MEGATRON_CHECK(added->is_array(), aw.str(), " must be an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const Json& a = (*added)[i];
      const JsonWhere w = aw.index(i);
      AddedToken t;
      t.id = token_id(json_member(a, "id", w), w.child("id"));
      t.content = json_string(json_member(a, "content", w), w.child("content"));
      t.single_word = json_bool_or(a, "single_word", false, w);
      t.lstrip = json_bool_or(a, "lstrip", false, w);
      t.rstrip = json_bool_or(a, "rstrip", false, w);
      t.special = json_bool_or(a, "special", false, w);
      t.normalized = json_bool_or(a, "normalized", !t.special, w);
      MEGATRON_CHECK(t.id >= 0, w.child("id").str(), ": negative id ", t.id);
      added_ids_[t.content] = t.id;
      added_by_id_[t.id] = t.content;
      vocab_size_ = std::max<int64_t>(vocab_size_, t.id + 1);
      added_.push_back(std::move(t));
    }
  }
  std::vector<AddedToken> raw, normalized;
  for (const AddedToken& t : added_) (t.normalized && normalizer_ ? normalized : raw).push_back(t);
  raw_matcher_ = std::make_unique<AddedTokenMatcher>(std::move(raw));
  normalized_matcher_ = std::make_unique<AddedTokenMatcher>(std::move(normalized));

  // Special ids.
  std::string bos_name, eos_name, pad_name;
  const fs::path config_file = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config_file)) {
    const Json config = load_json_file(config_file.string());
    bos_name = config_token(config, "bos_token");
    eos_name = config_token(config, "eos_token");
    pad_name = config_token(config, "pad_token");
  }
  const auto first_of = [&](const std::string& configured, std::initializer_list<const char*> names) {
    if (!configured.empty()) return token_to_id(configured);
    for (const char* n : names)
      if (const int32_t id = token_to_id(n); id >= 0) return id;
    return -1;
  };
  bos_ = first_of(bos_name, {"<|begin_of_text|>", "<s>"});
  eos_ = first_of(eos_name, {"<|end_of_text|>", "<|endoftext|>", "</s>"});
  pad_ = first_of(pad_name, {"<pad>", "<|pad|>"});
}

int32_t HfTokenizer::token_to_id(std::string_view token) const {
  if (const auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  return model_->token_to_id(token);
}

void HfTokenizer::encode_plain(std::string text, bool at_start, std::vector<int32_t>& ids) const {
  std::vector<PreToken> pieces{{std::move(text), at_start}};
  if (pre_tokenizer_) pre_tokenizer_->apply(pieces);
  for (const PreToken& p : pieces) model_->encode_word(p.text, ids);
}

std::vector<int32_t> HfTokenizer::encode(std::string_view raw) const {
  const std::string text = sanitize_utf8(raw);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (const AddedSplit& s : raw_matcher_->split(text)) {
    if (s.id >= 0) {
      ids.push_back(s.id);
      continue;
    }
    std::string piece = text.substr(s.span.begin, s.span.end - s.span.begin);
    const bool at_start = s.span.begin == 0;
    if (normalizer_) normalizer_->apply(piece);
    if (normalized_matcher_->empty()) {
      encode_plain(std::move(piece), at_start, ids);
      continue;
    }
    for (const AddedSplit& n : normalized_matcher_->split(piece)) {
      if (n.id >= 0) ids.push_back(n.id);
      else encode_plain(piece.substr(n.span.begin, n.span.end - n.span.begin), at_start && n.span.begin == 0, ids);
    }
  }
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      tokens.push_back(it->second);
      continue;
    }
    MEGATRON_CHECK(id >= 0 && id < model_->size() && !model_->id_to_token(id).empty(),
                   "HuggingFaceTokenizer::decode: id ", id, " is not in the vocabulary (size ", vocab_size_, ")");
    tokens.push_back(model_->id_to_token(id));
  }
  if (!decoder_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  decoder_->decode_chain(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace megatron::data
