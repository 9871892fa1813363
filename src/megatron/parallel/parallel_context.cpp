#include "megatron/parallel/parallel_context.h"

#include <algorithm>
#include <sstream>

#include "megatron/comm/self_communicator.h"
#include "megatron/parallel/rank_generator.h"

namespace megatron::parallel {
namespace {

int expert_tp_of(const ParallelSizes& s) {
  return s.expert_tensor_parallel > 0 ? s.expert_tensor_parallel : s.tensor_model_parallel;
}

std::string join(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

std::vector<std::string> layout_violations(int n, const ParallelSizes& s) {
  std::vector<std::string> v;
  const int tp = s.tensor_model_parallel, pp = s.pipeline_model_parallel, cp = s.context_parallel;
  const int ep = s.expert_model_parallel, etp = expert_tp_of(s);
  if (tp < 1 || pp < 1 || cp < 1 || ep < 1 || etp < 1) {
    v.push_back(str_cat("parallel sizes must be >= 1 (TP ", tp, ", PP ", pp, ", CP ", cp, ", EP ", ep, ", expert TP ",
                        etp, ")"));
    return v;
  }
  if (n % (tp * cp * pp) != 0)
    v.push_back(str_cat("world size ", n, " is not a multiple of TP ", tp, " x CP ", cp, " x PP ", pp, " = ",
                        tp * cp * pp, " (world = TP x CP x DP x PP)"));
  if (n % (etp * ep * pp) != 0)
    v.push_back(str_cat("world size ", n, " is not a multiple of expert TP ", etp, " x EP ", ep, " x PP ", pp, " = ",
                        etp * ep * pp, " (expert layers: world = expert TP x EP x expert DP x PP)"));
  if (v.empty()) {
    const int dp = n / (tp * cp * pp), edp = n / (etp * ep * pp);
    const std::string& o = s.order;
    const bool pp_last = o.size() >= 2 && o.compare(o.size() - 2, 2, "pp") == 0;
    if (!pp_last && pp > 1 && edp != dp)
      v.push_back(str_cat("order '", o, "' does not end with pp, so the dense DP ", dp, " and the expert DP ", edp,
                          " must be equal (Megatron's rule)"));
    try {
      RankGenerator dense(tp, 1, dp, pp, cp, o);
      RankGenerator expert(etp, ep, edp, pp, 1, o);
      if (dense.get_ranks("pp") != expert.get_ranks("pp"))
        v.push_back(str_cat("order '", o, "' gives different pipeline groups to dense and expert layers"));
    } catch (const Error& e) {
      v.push_back(e.what());
    }
  }
  return v;
}

ParallelContext ParallelContext::create(std::shared_ptr<comm::Communicator> world, const ParallelSizes& s) {
  MEGATRON_CHECK(world != nullptr, "ParallelContext::create: no world communicator");
  const int n = world->size(), me = world->rank();
  std::vector<std::string> problems = layout_violations(n, s);
  if (!problems.empty()) {
    std::string text = str_cat("invalid parallel layout for ", n, n == 1 ? " rank" : " ranks", ":");
    for (const auto& p : problems) text += "\n  - " + p;
    throw Error(text);
  }
  const int tp = s.tensor_model_parallel, pp = s.pipeline_model_parallel, cp = s.context_parallel;
  const int ep = s.expert_model_parallel, etp = expert_tp_of(s);
  const int dp = n / (tp * cp * pp), edp = n / (etp * ep * pp);
  const RankGenerator dense(tp, 1, dp, pp, cp, s.order);
  const RankGenerator expert(etp, ep, edp, pp, 1, s.order);

  ParallelContext pc;
  pc.sizes_ = s;
  pc.world_ = ProcessGroup{"world", {}, world};
  for (int r = 0; r < n; ++r) pc.world_.ranks.push_back(r);

  RankGroups embedding;
  for (const auto& g : dense.get_ranks("pp"))
    embedding.push_back(g.size() == 1 ? std::vector<int>{g.front()} : std::vector<int>{g.front(), g.back()});
  struct Kind {
    const char* name;
    RankGroups groups;
    ProcessGroup* out;
  };
  // Megatron's creation order (dp-cp first); every rank walks the same list, so the splits match.
  std::vector<Kind> kinds = {
      {"dp-cp", dense.get_ranks("dp-cp"), &pc.dp_cp_}, {"dp", dense.get_ranks("dp"), &pc.dp_},
      {"cp", dense.get_ranks("cp"), &pc.cp_},          {"mp", dense.get_ranks("tp-pp"), &pc.mp_},
      {"tp", dense.get_ranks("tp"), &pc.tp_},          {"pp", dense.get_ranks("pp"), &pc.pp_},
      {"embd", embedding, &pc.embd_},                  {"tp-dp", dense.get_ranks("tp-dp"), &pc.tp_dp_},
      {"ep", expert.get_ranks("ep"), &pc.ep_},         {"expert-tp", expert.get_ranks("tp"), &pc.expert_tp_},
      {"expert-dp", expert.get_ranks("dp"), &pc.expert_dp_}};

  std::vector<bool> done(kinds.size(), false);
  for (size_t k = 0; k < kinds.size(); ++k) {
    if (done[k]) continue;
    // Every kind with the same rank lists shares this communicator.
    std::vector<size_t> same;
    std::string name;
    for (size_t j = k; j < kinds.size(); ++j)
      if (!done[j] && kinds[j].groups == kinds[k].groups) {
        same.push_back(j);
        if (!name.empty()) name += '|';
        name += kinds[j].name;
        done[j] = true;
      }
    const RankGroups& groups = kinds[k].groups;
    int color = -1, key = -1;
    for (size_t g = 0; g < groups.size(); ++g) {
      auto it = std::find(groups[g].begin(), groups[g].end(), me);
      if (it != groups[g].end()) color = int(g), key = int(it - groups[g].begin());
    }
    const bool all_single = std::all_of(groups.begin(), groups.end(), [](const auto& g) { return g.size() == 1; });
    std::shared_ptr<comm::Communicator> c;
    if (all_single) {
      if (color >= 0) c = std::make_shared<comm::SelfCommunicator>(world->device(), name, world->timeout());
    } else {
      c = world->split(color, key, name);
    }
    for (size_t j : same) {
      *kinds[j].out = ProcessGroup{kinds[j].name, {}, c};
      if (color >= 0) kinds[j].out->ranks = groups[size_t(color)];
    }
  }
  return pc;
}

ParallelContext ParallelContext::single(Device device) {
  return create(std::make_shared<comm::SelfCommunicator>(device, "world"));
}

std::string ParallelContext::describe() const {
  std::ostringstream os;
  os << "parallel layout: world " << world_size() << " = TP " << tp_size() << " x CP " << cp_size() << " x DP "
     << dp_size() << " x PP " << pp_size() << " (EP " << ep_size() << ", expert TP " << expert_tp().size()
     << ", expert DP " << expert_dp().size() << "), order " << sizes_.order << ", collectives on "
     << world_.comm->backend() << "\n";
  os << "  rank " << world_rank() << " groups:";
  for (const ProcessGroup* g : {&tp_, &cp_, &dp_, &pp_, &dp_cp_, &mp_, &tp_dp_, &embd_, &ep_, &expert_tp_, &expert_dp_})
    os << " " << g->kind << "=" << (g->member() ? join(g->ranks) : "none");
  os << "\n";
  return os.str();
}

}  // namespace megatron::parallel
