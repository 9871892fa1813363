#include "megatron/data/tokenizers/tiktoken.h"

#include <fstream>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/data/tokenizers/bpe_merge.h"
#include "megatron/data/tokenizers/json_util.h"
#include "megatron/data/utf8.h"

namespace megatron::data {
namespace {

constexpr size_t kCacheCapacity = 1 << 17;

bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+' || c == '-') v = 62;
    else if (c == '/' || c == '_') v = 63;
    else if (c == '=') break;
    else return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return true;
}

// Megatron's JSON list: [{"rank", "token_bytes" (base64), ...}, ...].
std::vector<std::pair<std::string, int64_t>> read_json_ranks(const std::string& path) {
  std::vector<std::pair<std::string, int64_t>> entries;
  std::string bytes;
  const Json list = load_json_file(path);
  MEGATRON_CHECK(list.is_array(), path, ": a JSON ranks file must be a list of {\"rank\", \"token_bytes\"}, it is ",
                 list.type_name());
  for (size_t i = 0; i < list.size(); ++i) {
    const JsonWhere w{path, str_cat("[", i, "]")};
    const std::string b64 = json_string(json_member(list[i], "token_bytes", w), w.child("token_bytes"));
    MEGATRON_CHECK(base64_decode(b64, bytes), w.child("token_bytes").str(), ": invalid base64 ", quoted_bytes(b64));
    const int64_t rank = json_int(json_member(list[i], "rank", w), w.child("rank"));
    MEGATRON_CHECK(rank >= 0, w.child("rank").str(), ": a rank must not be negative, got ", rank);
    entries.emplace_back(bytes, rank);
  }
  return entries;
}

// tiktoken's text format: one "base64 rank" per line; blank lines and a trailing '\r' are ignored.
std::vector<std::pair<std::string, int64_t>> parse_text_ranks(const std::string& path, const std::string& content) {
  std::vector<std::pair<std::string, int64_t>> entries;
  std::string bytes;
  std::istringstream lines(content);
  std::string line;
  for (size_t line_no = 1; std::getline(lines, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    MEGATRON_CHECK(space != std::string::npos, path, ":", line_no, ": expected \"base64 rank\", got ", quoted_bytes(line));
    MEGATRON_CHECK(base64_decode(std::string_view(line).substr(0, space), bytes), path, ":", line_no,
                   ": invalid base64 ", quoted_bytes(line.substr(0, space)));
    int64_t rank = -1;
    try {
      size_t used = 0;
      rank = std::stoll(line.substr(space + 1), &used);
      if (used != line.size() - space - 1) rank = -1;
    } catch (const std::exception&) {
    }
    MEGATRON_CHECK(rank >= 0, path, ":", line_no, ": invalid rank ", quoted_bytes(line.substr(space + 1)));
    entries.emplace_back(bytes, rank);
  }
  return entries;
}

// The (token bytes, rank) pairs of a ranks file in either format (see tiktoken.h), in file order.
std::vector<std::pair<std::string, int64_t>> read_ranks_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MEGATRON_CHECK(in.good(), "TikTokenizer: cannot open ranks file ", path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string content = buffer.str();
  const size_t first = content.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (content[first] == '[' || content[first] == '{')) return read_json_ranks(path);
  return parse_text_ranks(path, content);
}

}  // namespace

std::string tiktoken_pattern(const std::string& name) {
  if (name == "v2" || name == "llama3" || name == "cl100k" || name.empty())
    return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (name == "qwen2")
    return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (name == "v1" || name == "gpt2")
    return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  return name;
}

TikTokenizer::TikTokenizer(const std::string& path, TikTokenOptions options) {
  std::vector<std::pair<std::string, int64_t>> entries = read_ranks_file(path);
  MEGATRON_CHECK(!entries.empty(), "TikTokenizer: ", path, " holds no ranks");

  const bool megatron_layout = options.num_special_tokens > 0;
  if (megatron_layout) {
    specials_ = options.special_tokens.empty() ? std::vector<std::string>{"<unk>", "<s>", "</s>"} : options.special_tokens;
    MEGATRON_CHECK(static_cast<int64_t>(specials_.size()) <= options.num_special_tokens, "TikTokenizer: ",
                   specials_.size(), " special tokens do not fit in --tiktoken-num-special-tokens ",
                   options.num_special_tokens);
    for (int64_t i = static_cast<int64_t>(specials_.size()); i < options.num_special_tokens; ++i)
      specials_.push_back(str_cat("<SPECIAL_", i, ">"));
    offset_ = static_cast<int32_t>(options.num_special_tokens);
  } else {
    specials_ = options.special_tokens.empty() ? std::vector<std::string>{"<|begin_of_text|>", "<|end_of_text|>"}
                                               : options.special_tokens;
  }
  const int64_t max_rank = options.max_vocab > 0 ? options.max_vocab - (megatron_layout ? offset_ : 0) : INT32_MAX;
  // rank -> bytes is a table as long as the largest rank: ranks far beyond their count mean a corrupt file.
  const int64_t rank_limit = std::max<int64_t>(2 * static_cast<int64_t>(entries.size()), int64_t{1} << 20);
  for (auto& [token, rank] : entries) {
    if (rank >= max_rank) continue;
    MEGATRON_CHECK(rank < rank_limit, path, ": rank ", rank, " is far beyond the ", entries.size(),
                   " ranks of the file (ranks must stay below ", rank_limit, ")");
    if (static_cast<size_t>(rank) >= rank_bytes_.size()) rank_bytes_.resize(static_cast<size_t>(rank) + 1);
    MEGATRON_CHECK(ranks_.emplace(token, static_cast<int32_t>(rank)).second, path, ": token of rank ", rank,
                   " appears twice");
    rank_bytes_[static_cast<size_t>(rank)] = token;
  }
  for (int b = 0; b < 256; ++b) {
    MEGATRON_CHECK(ranks_.count(std::string(1, static_cast<char>(b))) == 1, path, ": no rank for the single byte ", b,
                   " (every byte needs one)");
  }
  if (megatron_layout) {
    first_special_id_ = 0;
    vocab_size_ = offset_ + static_cast<int64_t>(rank_bytes_.size());
    bos_ = 1;
    eos_ = 2;
  } else {
    first_special_id_ = static_cast<int32_t>(rank_bytes_.size());
    vocab_size_ = first_special_id_ + static_cast<int64_t>(specials_.size());
    for (size_t i = 0; i < specials_.size(); ++i) {
      const int32_t id = first_special_id_ + static_cast<int32_t>(i);
      const std::string& s = specials_[i];
      if (bos_ < 0 && (s == "<|begin_of_text|>" || s == "<s>")) bos_ = id;
      if (eos_ < 0 && (s == "<|end_of_text|>" || s == "<|endoftext|>" || s == "</s>")) eos_ = id;
      if (pad_ < 0 && (s == "<pad>" || s == "<|pad|>")) pad_ = id;
    }
  }
  regex_ = std::make_unique<Regex>(tiktoken_pattern(options.pattern), "TikTokenizer pattern");
}

void TikTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (const auto it = ranks_.find(piece); it != ranks_.end()) {
    out.push_back(it->second + offset_);
    return;
  }
  {
    std::lock_guard lock(cache_mutex_);
    if (const auto it = cache_.find(piece); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<BpeSymbol> symbols(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    symbols[i] = {0, static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1), static_cast<int32_t>(i) - 1,
                  i + 1 < piece.size() ? static_cast<int32_t>(i + 1) : -1};
  }
  bpe_merge(symbols, [&](const BpeSymbol& a, const BpeSymbol& b) -> BpeCandidate {
    const auto it = ranks_.find(piece.substr(a.begin, b.end - a.begin));
    return it == ranks_.end() ? BpeCandidate{-1, -1} : BpeCandidate{it->second, it->second};
  });
  const size_t first = out.size();
  for (const BpeSymbol& s : symbols) {
    if (s.id < 0) continue;
    const auto it = ranks_.find(piece.substr(s.begin, s.end - s.begin));
    out.push_back(it->second + offset_);  // single bytes always have a rank
  }
  std::lock_guard lock(cache_mutex_);
  if (cache_.size() < kCacheCapacity) cache_.try_emplace(std::string(piece), out.begin() + first, out.end());
}

std::vector<int32_t> TikTokenizer::encode(std::string_view raw) const {
  const std::string text = sanitize_utf8(raw);
  std::vector<Span> pieces;
  regex_->find_all(text, pieces);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (const Span& p : pieces) encode_piece(std::string_view(text).substr(p.begin, p.end - p.begin), ids);
  return ids;
}

std::string TikTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    const int64_t special = static_cast<int64_t>(id) - first_special_id_;
    if (offset_ > 0 ? (id >= 0 && id < offset_) : (special >= 0 && special < static_cast<int64_t>(specials_.size()))) {
      out += specials_[static_cast<size_t>(offset_ > 0 ? id : special)];
      continue;
    }
    const int64_t rank = static_cast<int64_t>(id) - offset_;
    MEGATRON_CHECK(rank >= 0 && rank < static_cast<int64_t>(rank_bytes_.size()) && !rank_bytes_[rank].empty(),
                   "TikTokenizer::decode: id ", id, " is not in the vocabulary (size ", vocab_size_, ")");
    out += rank_bytes_[static_cast<size_t>(rank)];
  }
  return out;
}

}  // namespace megatron::data
