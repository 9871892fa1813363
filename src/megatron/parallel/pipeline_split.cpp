#include "megatron/parallel/pipeline_split.h"

#include <algorithm>
#include <cctype>

#include "megatron/core/error.h"

namespace megatron::parallel {
namespace {

using Violations = std::vector<std::string>;

bool uneven(const PipelineSplitConfig& c) { return c.first_stage_layers >= 0 || c.last_stage_layers >= 0; }

// Megatron's uneven split: the first/last ranks' counts as given, the middle ranks share the rest.
PipelineSplit uneven_split(const PipelineSplitConfig& c, Violations& v) {
  const int P = c.pipeline_size, V = c.virtual_size;
  const int first = c.first_stage_layers >= 0 ? c.first_stage_layers : 0;
  const int last = c.last_stage_layers >= 0 ? c.last_stage_layers : 0;
  const int middle_stages = P - (c.first_stage_layers >= 0) - (c.last_stage_layers >= 0);
  const int middle_layers = c.num_layers - first - last;
  if (middle_stages > 0 && middle_layers % middle_stages != 0)
    v.push_back(str_cat("with uneven pipeline stages the ", middle_layers, " layers left after --decoder-first-",
                        "pipeline-num-layers / --decoder-last-pipeline-num-layers must be divisible by the ",
                        middle_stages, " other stages"));
  const int per_middle = middle_stages > 0 ? middle_layers / middle_stages : 0;
  for (const auto& [count, flag] : {std::pair{c.first_stage_layers, "--decoder-first-pipeline-num-layers"},
                                    std::pair{c.last_stage_layers, "--decoder-last-pipeline-num-layers"}})
    if (count >= 0 && count % V != 0)
      v.push_back(str_cat(flag, " ", count, " must be divisible by the ", V, " model chunks per pipeline rank"));
  if (per_middle % V != 0)
    v.push_back(str_cat("the ", per_middle, " layers of each middle pipeline stage must be divisible by the ", V,
                        " model chunks per pipeline rank"));
  const int first_chunk = first / V, last_chunk = last / V, middle_chunk = middle_layers / V;
  const int per_middle_chunk = middle_stages > 0 ? middle_chunk / middle_stages : 0;
  const int per_virtual_round = first_chunk + middle_chunk + last_chunk;  // layers of one chunk on every rank
  PipelineSplit split{std::vector<std::vector<ChunkLayers>>(size_t(P))};
  for (int r = 0; r < P; ++r) {
    int count = per_middle;
    if (r == 0 && c.first_stage_layers >= 0) count = c.first_stage_layers;
    if (r == P - 1 && c.last_stage_layers >= 0) count = c.last_stage_layers;
    const int middle_rank = c.first_stage_layers >= 0 ? r - 1 : r;
    for (int chunk = 0; chunk < V; ++chunk) {
      const int offset = r == 0 ? chunk * per_virtual_round
                                : chunk * per_virtual_round + first_chunk + middle_rank * per_middle_chunk;
      split.chunks[size_t(r)].push_back({offset, count / V});
    }
  }
  return split;
}

// Megatron's even split, the embedding and the loss optionally counted as layers.
PipelineSplit even_split(const PipelineSplitConfig& c, Violations& v) {
  const int P = c.pipeline_size, V = c.virtual_size;
  const int counted = c.num_layers + c.account_for_embedding + c.account_for_loss;
  const std::string what = str_cat("--num-layers ", c.num_layers,
                                    c.account_for_embedding ? " + 1 (--account-for-embedding-in-pipeline-split)" : "",
                                    c.account_for_loss ? " + 1 (--account-for-loss-in-pipeline-split)" : "");
  if (counted % P != 0)
    v.push_back(str_cat(what, " must be divisible by --pipeline-model-parallel-size ", P));
  else if ((counted / P) % V != 0)
    v.push_back(str_cat("the ", counted / P, " layers per pipeline stage must be divisible by the ", V,
                        " model chunks per pipeline rank"));
  const int per_chunk = counted / P / V;
  PipelineSplit split{std::vector<std::vector<ChunkLayers>>(size_t(P))};
  for (int r = 0; r < P; ++r)
    for (int chunk = 0; chunk < V; ++chunk) {
      const bool first_chunk = r == 0 && chunk == 0, last_chunk = r == P - 1 && chunk == V - 1;
      int offset = chunk * (counted / V) + r * per_chunk;
      int count = per_chunk;
      if (c.account_for_embedding && !first_chunk) offset -= 1;
      if (c.account_for_embedding && first_chunk) count -= 1;
      if (c.account_for_loss && last_chunk) count -= 1;
      if (count < 0)
        v.push_back(str_cat("model chunk ", chunk, " of pipeline rank ", r, " would hold ", count,
                            " layers: too few layers for the embedding/loss to count as one"));
      split.chunks[size_t(r)].push_back({offset, std::max(count, 0)});
    }
  return split;
}

// Expands a layout text's repeats: sequence := item*, item := atom ['*' count], atom := letter | '|' | '(' sequence ')'.
// Megatron expands (...)*n and then x*n with two regular expressions; this grammar accepts the same texts and
// nested parentheses besides.
class LayoutExpander {
 public:
  explicit LayoutExpander(std::string text) : text_(std::move(text)) {}

  std::string expand() {
    std::string out = sequence();
    if (pos_ < text_.size()) fail("')' without a matching '('");
    return out;
  }

 private:
  std::string sequence() {
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != ')') out += repeated(atom());
    return out;
  }

  std::string atom() {
    const char c = text_[pos_];
    if (c == '(') {
      ++pos_;
      std::string inner = sequence();
      if (pos_ >= text_.size()) fail("'(' is never closed");
      ++pos_;
      return inner;
    }
    if (c == 'E' || c == 't' || c == 'L' || c == 'm' || c == '|') {
      ++pos_;
      return std::string(1, c);
    }
    fail(str_cat("unknown character '", c, "' (E embedding, t transformer layer, L output layer and loss, | between "
                 "stages, x*n and (...)*n repeat, ',' is cosmetic)"));
  }

  std::string repeated(const std::string& item) {
    if (pos_ >= text_.size() || text_[pos_] != '*') return item;
    const size_t start = ++pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    if (pos_ == start || pos_ - start > 6) fail("'*' needs a count of 1 to 6 digits");
    const int count = std::stoi(text_.substr(start, pos_ - start));
    std::string out;
    for (int i = 0; i < count; ++i) out += item;
    return out;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(str_cat("--pipeline-model-parallel-layout \"", text_, "\": ", what, " at character ", pos_ + 1));
  }

  std::string text_;
  size_t pos_ = 0;
};

// Megatron's custom layout: virtual stage s (chunk s / P of rank s % P) holds the transformer layers its text
// names, numbered in stage order; the embedding opens the first stage and the loss closes the last.
PipelineSplit layout_split(const PipelineSplitConfig& c, Violations& v) {
  const int P = c.pipeline_size, V = c.virtual_size;
  PipelineSplit split{std::vector<std::vector<ChunkLayers>>(size_t(P), std::vector<ChunkLayers>(size_t(V)))};
  std::vector<std::string> stages;
  try {
    stages = parse_pipeline_layout(c.layout);
  } catch (const Error& e) {
    v.push_back(e.what());
    return split;
  }
  const std::string flag = str_cat("--pipeline-model-parallel-layout \"", c.layout, "\"");
  const int S = int(stages.size());
  if (S % P != 0 || S / P != V) {
    v.push_back(S % P != 0 ? str_cat(flag, " has ", S, " stages: not a multiple of --pipeline-model-parallel-size ", P)
                           : str_cat(flag, " gives ", S / P, " model chunks per pipeline rank but the run has ", V,
                                     " (the layout alone sets the interleaving)"));
    return split;
  }
  std::string all;
  for (const std::string& stage : stages) all += stage;
  auto count = [&](char x) { return int(std::count(all.begin(), all.end(), x)); };
  if (count('m') > 0) v.push_back(str_cat(flag, ": multi-token prediction layers ('m') are not supported"));
  if (count('E') != 1 || stages.front().empty() || stages.front().front() != 'E')
    v.push_back(str_cat(flag, ": the embedding 'E' must appear once, opening the first stage"));
  if (count('L') != 1 || stages.back().empty() || stages.back().back() != 'L')
    v.push_back(str_cat(flag, ": the loss 'L' must appear once, closing the last stage"));
  if (count('t') != c.num_layers)
    v.push_back(str_cat(flag, " places ", count('t'), " transformer layers ('t') but --num-layers is ", c.num_layers));
  int offset = 0;
  for (int s = 0; s < S; ++s) {
    const int layers = int(std::count(stages[size_t(s)].begin(), stages[size_t(s)].end(), 't'));
    split.chunks[size_t(s % P)][size_t(s / P)] = {offset, layers};
    offset += layers;
  }
  return split;
}

PipelineSplit split_by_rule(const PipelineSplitConfig& c, Violations& v) {
  if (!c.layout.empty()) return layout_split(c, v);
  return uneven(c) ? uneven_split(c, v) : even_split(c, v);
}

// The virtual stages (chunk c of rank r is stage c * P + r) must hold consecutive layers covering [0, L).
void check_tiling(const PipelineSplitConfig& c, const PipelineSplit& split, Violations& v) {
  int next = 0;
  for (int chunk = 0; chunk < c.virtual_size; ++chunk)
    for (int r = 0; r < c.pipeline_size; ++r) {
      const ChunkLayers& l = split.chunks[size_t(r)][size_t(chunk)];
      if (l.first_layer != next || l.num_layers < 0) {
        v.push_back(str_cat("the split would not give every layer to exactly one stage (", describe(split),
                            " for ", c.num_layers, " layers): check the uneven-stage flags"));
        return;
      }
      next += l.num_layers;
    }
  if (next != c.num_layers)
    v.push_back(str_cat("the split places ", next, " of the ", c.num_layers, " layers (", describe(split),
                        "): layers would be dropped; check --decoder-first/last-pipeline-num-layers"));
}

}  // namespace

std::vector<std::string> pipeline_split_violations(const PipelineSplitConfig& c) {
  Violations v;
  if (c.num_layers <= 0 || c.pipeline_size <= 0 || c.virtual_size <= 0) {
    v.push_back(str_cat("pipeline split of ", c.num_layers, " layers over ", c.pipeline_size, " ranks x ",
                        c.virtual_size, " chunks: all must be positive"));
    return v;
  }
  if (!c.layout.empty() && (uneven(c) || c.account_for_embedding || c.account_for_loss))
    v.push_back("--pipeline-model-parallel-layout places every layer itself: it cannot be combined with "
                "--decoder-first/last-pipeline-num-layers or --account-for-embedding/loss-in-pipeline-split");
  if (uneven(c) && (c.account_for_embedding || c.account_for_loss))
    v.push_back("--decoder-first/last-pipeline-num-layers cannot be combined with --account-for-embedding-in-"
                "pipeline-split or --account-for-loss-in-pipeline-split (Megatron's rule)");
  if (uneven(c) && c.pipeline_size == 1)
    v.push_back("--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1");
  for (const auto& [count, flag] : {std::pair{c.first_stage_layers, "--decoder-first-pipeline-num-layers"},
                                    std::pair{c.last_stage_layers, "--decoder-last-pipeline-num-layers"}})
    if (count > c.num_layers) v.push_back(str_cat(flag, " ", count, " exceeds --num-layers ", c.num_layers));
  if (!v.empty()) return v;
  const PipelineSplit split = split_by_rule(c, v);
  if (v.empty()) check_tiling(c, split, v);
  return v;
}

PipelineSplit split_layers(const PipelineSplitConfig& c) {
  const Violations v = pipeline_split_violations(c);
  if (!v.empty()) {
    std::string msg = "invalid pipeline split:";
    for (const std::string& s : v) msg += "\n  - " + s;
    MEGATRON_FAIL(msg);
  }
  Violations unused;
  return split_by_rule(c, unused);
}

std::vector<std::string> parse_pipeline_layout(const std::string& text) {
  std::string without_commas;
  for (char ch : text)
    if (ch != ',') without_commas += ch;
  const std::string expanded = LayoutExpander(without_commas).expand();
  std::vector<std::string> stages(1);
  for (char ch : expanded) {
    if (ch == '|')
      stages.emplace_back();
    else
      stages.back() += ch;
  }
  return stages;
}

std::string describe(const PipelineSplit& split) {
  std::string out;
  for (size_t r = 0; r < split.chunks.size(); ++r) {
    out += str_cat(r ? "; " : "", "rank ", r, ":");
    for (const ChunkLayers& l : split.chunks[r]) out += str_cat(" [", l.first_layer, ", ", l.first_layer + l.num_layers, ")");
  }
  return out;
}

}  // namespace megatron::parallel
