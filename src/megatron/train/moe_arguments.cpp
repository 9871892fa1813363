#include "megatron/train/moe_arguments.h"

#include <cctype>
#include <set>

#include "megatron/core/error.h"

namespace megatron::train {
namespace {

// A recursive-descent reader of the list expressions --moe-layer-freq takes:
//   sum    := term ('+' term)*
//   term   := atom ('*' integer)*
//   atom   := '[' integer (',' integer)* ']' | '(' sum ')'
class LayerFreqParser {
 public:
  explicit LayerFreqParser(const std::string& text) : text_(text) {}

  std::vector<bool> parse() {
    std::vector<bool> out = sum();
    skip_space();
    if (pos_ != text_.size()) fail("unexpected '", text_[pos_], "'");
    return out;
  }

 private:
  template <class... A>
  [[noreturn]] void fail(const A&... what) const {
    throw Error(str_cat("--moe-layer-freq '", text_, "': ", what..., " at position ", pos_,
                        " (expected an integer N or a list expression such as \"[0]*2+[1]*6\")"));
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  long integer() {
    skip_space();
    const size_t start = pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    if (start == pos_) fail("expected an integer");
    if (pos_ - start > 6) fail("integer too large");
    return std::stol(text_.substr(start, pos_ - start));
  }
  std::vector<bool> sum() {
    std::vector<bool> out = term();
    while (eat('+')) {
      std::vector<bool> more = term();
      out.insert(out.end(), more.begin(), more.end());
    }
    return out;
  }
  std::vector<bool> term() {
    std::vector<bool> out = atom();
    while (eat('*')) {
      const long n = integer();
      if (out.size() * size_t(n) > 100000) fail("list too long");
      std::vector<bool> repeated;
      for (long i = 0; i < n; ++i) repeated.insert(repeated.end(), out.begin(), out.end());
      out = std::move(repeated);
    }
    return out;
  }
  std::vector<bool> atom() {
    if (eat('(')) {
      std::vector<bool> out = sum();
      if (!eat(')')) fail("expected ')'");
      return out;
    }
    if (!eat('[')) fail("expected '[' or '('");
    std::vector<bool> out;
    do {
      const long v = integer();
      if (v != 0 && v != 1) fail("list entries must be 0 (dense) or 1 (MoE), got ", v);
      out.push_back(v == 1);
    } while (eat(','));
    if (!eat(']')) fail("expected ']'");
    return out;
  }

  const std::string& text_;
  size_t pos_ = 0;
};

bool is_integer(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

// The load-balancing, capacity and dispatch rules (defined below moe_violations).
void router_violations(const MoeArguments& m, std::vector<std::string>& v);

std::vector<bool> parse_moe_layer_freq(const std::string& text, int num_layers) {
  if (is_integer(text)) {
    const long n = text.size() > 6 ? 0 : std::stol(text);
    if (n < 1) throw Error(str_cat("--moe-layer-freq ", text, " must be a positive integer or a list expression"));
    std::vector<bool> out(size_t(std::max(num_layers, 0)));
    for (int i = 0; i < num_layers; ++i) out[size_t(i)] = i % n == 0;
    return out;
  }
  std::vector<bool> out = LayerFreqParser(text).parse();
  if (int(out.size()) != num_layers)
    throw Error(str_cat("--moe-layer-freq '", text, "' gives ", out.size(), " layers but --num-layers is ", num_layers));
  return out;
}

std::vector<std::pair<std::string, double>> moe_load_balancing(const MoeArguments& m) {
  std::vector<std::string> types = m.moe_router_load_balancing_type;
  if (types.empty()) types = {"aux_loss"};
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < types.size(); ++i) {
    double coeff = 0;
    if (m.moe_aux_loss_coeff.size() == 1) coeff = m.moe_aux_loss_coeff[0];
    else if (i < m.moe_aux_loss_coeff.size()) coeff = m.moe_aux_loss_coeff[i];
    out.emplace_back(types[i], coeff);
  }
  return out;
}

std::vector<std::string> moe_violations(const Arguments& a) {
  std::vector<std::string> v;
  auto need = [&v](bool ok, auto&&... what) {
    if (!ok) v.push_back(str_cat(what...));
  };
  const MoeArguments& m = a.moe;
  const ParallelArguments& p = a.parallel;
  const int E = m.num_experts, ep = p.expert_model_parallel_size;
  const int tp = p.tensor_model_parallel_size, etp = p.expert_tensor_parallel_size > 0 ? p.expert_tensor_parallel_size : tp;
  need(E >= 0, "--num-experts must not be negative (got ", E, ")");
  need(ep == 1 || E > 0, "--expert-model-parallel-size ", ep, " needs --num-experts");
  if (E <= 0) return v;
  need(ep >= 1 && E % ep == 0, "--num-experts ", E, " must be divisible by --expert-model-parallel-size ", ep);
  need(etp >= 1, "--expert-tensor-parallel-size must be positive (got ", etp, ")");
  const int pp = p.pipeline_model_parallel_size;
  if (ep >= 1 && etp >= 1 && pp >= 1)
    need(p.world_size % (etp * ep * pp) == 0, "world size ", p.world_size, " must be divisible by --expert-tensor-",
         "parallel-size ", etp, " x --expert-model-parallel-size ", ep, " x --pipeline-model-parallel-size ", pp);
  need(m.moe_router_topk >= 1 && m.moe_router_topk <= E, "--moe-router-topk ", m.moe_router_topk,
       " must be in [1, --num-experts ", E, "]");
  static const std::set<std::string> scores = {"softmax", "sigmoid", "sqrtsoftplus"};
  need(scores.count(m.moe_router_score_function), "--moe-router-score-function '", m.moe_router_score_function,
       "' must be softmax, sigmoid or sqrtsoftplus");
  if (m.moe_router_score_function == "softmax" && m.moe_router_topk == 1)
    need(m.moe_router_pre_softmax, "--moe-router-topk 1 with softmax scores needs --moe-router-pre-softmax (the "
         "softmax over one selected logit is always 1)");
  if (m.moe_router_num_groups > 0) {
    const int g = m.moe_router_num_groups, gk = m.moe_router_group_topk;
    need(E % g == 0, "--num-experts ", E, " must be divisible by --moe-router-num-groups ", g);
    need(gk >= 1 && gk <= g, "--moe-router-group-topk ", gk, " must be in [1, --moe-router-num-groups ", g, "]");
    need(gk >= 1 && m.moe_router_topk % gk == 0, "--moe-router-topk ", m.moe_router_topk,
         " must be divisible by --moe-router-group-topk ", gk, " (each chosen group gives topk / group_topk experts)");
    need(gk >= 1 && g >= 1 && m.moe_router_topk / std::max(gk, 1) <= E / g, "--moe-router-topk / --moe-router-group-",
         "topk = ", m.moe_router_topk / std::max(gk, 1), " exceeds the ", E / g, " experts of a group");
  } else {
    need(m.moe_router_group_topk == 0, "--moe-router-group-topk needs --moe-router-num-groups");
  }
  router_violations(m, v);
  if (tp > 1) need(p.sequence_parallel, "MoE with --tensor-model-parallel-size ", tp, " needs --sequence-parallel "
                   "(Megatron's rule: every rank routes its own token rows)");
  need(a.model.disable_bias_linear, "MoE needs --disable-bias-linear (the grouped expert GEMMs have no biases)");
  try {
    parse_moe_layer_freq(m.moe_layer_freq, a.model.num_layers);
  } catch (const Error& e) {
    v.push_back(e.what());
  }
  return v;
}

// The load-balancing, capacity and dispatch flags (MoE on).
void router_violations(const MoeArguments& m, std::vector<std::string>& v) {
  auto need = [&v](bool ok, auto&&... what) {
    if (!ok) v.push_back(str_cat(what...));
  };
  static const std::set<std::string> balancing = {"aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"};
  for (const std::string& t : m.moe_router_load_balancing_type)
    need(balancing.count(t), "--moe-router-load-balancing-type '", t,
         "' must be aux_loss, seq_aux_loss, global_aux_loss, sinkhorn or none");
  const size_t types = std::max<size_t>(1, m.moe_router_load_balancing_type.size());
  need(m.moe_aux_loss_coeff.size() <= 1 || m.moe_aux_loss_coeff.size() == types, "--moe-aux-loss-coeff gives ",
       m.moe_aux_loss_coeff.size(), " coefficients for ", types, " load-balancing types (give one, or one each)");
  for (double c : m.moe_aux_loss_coeff) need(c >= 0, "--moe-aux-loss-coeff values must not be negative (got ", c, ")");
  for (const auto& [type, coeff] : moe_load_balancing(m)) {
    if (type == "sinkhorn") {
      need(coeff == 0, "--moe-router-load-balancing-type sinkhorn does not take an aux loss (its --moe-aux-loss-coeff ",
           "must be 0, got ", coeff, "; Megatron's rule)");
      need(m.moe_router_load_balancing_type.size() == 1, "--moe-router-load-balancing-type sinkhorn cannot be ",
           "combined with other load-balancing types");
      need(m.moe_expert_capacity_factor == 0, "--moe-expert-capacity-factor works with aux_loss, seq_aux_loss, ",
           "global_aux_loss or none, not sinkhorn (Megatron's rule)");
      need(!m.moe_router_enable_expert_bias, "--moe-router-enable-expert-bias cannot be combined with sinkhorn routing");
    }
  }

  need(m.moe_z_loss_coeff >= 0, "--moe-z-loss-coeff must not be negative (got ", m.moe_z_loss_coeff, ")");
  if (m.moe_router_enable_expert_bias)
    need(m.moe_router_score_function != "softmax", "--moe-router-enable-expert-bias needs --moe-router-score-function "
         "sigmoid or sqrtsoftplus (Megatron's rule)");
  need(m.moe_router_bias_update_rate >= 0, "--moe-router-bias-update-rate must not be negative");
  need(m.moe_expert_capacity_factor >= 0, "--moe-expert-capacity-factor must not be negative (got ",
       m.moe_expert_capacity_factor, ")");
  need(m.moe_token_drop_policy == "probs" || m.moe_token_drop_policy == "position", "--moe-token-drop-policy '",
       m.moe_token_drop_policy, "' must be probs or position");
  if (m.moe_pad_expert_input_to_capacity)
    need(m.moe_expert_capacity_factor > 0, "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  need(m.moe_token_dispatcher_type == "allgather" || m.moe_token_dispatcher_type == "alltoall",
       "--moe-token-dispatcher-type '", m.moe_token_dispatcher_type, "' must be allgather or alltoall");
  if (m.moe_shared_expert_gate)
    need(m.moe_shared_expert_intermediate_size > 0, "--moe-shared-expert-gate needs shared experts "
         "(--moe-shared-expert-intermediate-size)");
  if (m.moe_shared_expert_overlap)
    need(m.moe_token_dispatcher_type == "alltoall" && m.moe_shared_expert_intermediate_size > 0,
         "--moe-shared-expert-overlap needs --moe-shared-expert-intermediate-size and --moe-token-dispatcher-type "
         "alltoall");
  need(m.moe_router_dtype.empty() || m.moe_router_dtype == "fp32", "--moe-router-dtype '", m.moe_router_dtype,
       "': the router computes its logits and routing in fp32 here (fp32 or the default); fp64 is not supported");
  need(m.moe_ffn_hidden_size >= 0 && m.moe_shared_expert_intermediate_size >= 0,
       "--moe-ffn-hidden-size and --moe-shared-expert-intermediate-size must not be negative");
}


}  // namespace megatron::train
