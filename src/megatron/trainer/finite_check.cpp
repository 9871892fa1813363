#include "megatron/trainer/finite_check.h"

#include <cmath>

#include "megatron/core/error.h"
#include "megatron/optim/grad_clip.h"

namespace megatron::trainer {

std::vector<std::string> nonfinite_gradients(Context& ctx, const nn::ParameterList& params) {
  std::vector<std::string> names;
  for (const nn::Parameter* p : params)
    if (p->main_grad.defined() && p->main_grad.numel() > 0 &&
        !std::isfinite(optim::global_grad_norm(ctx, {p->main_grad})))
      names.push_back(p->name);
  return names;
}

namespace {
std::string value_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Inf" : "-Inf";
  return str_cat(v);
}
}  // namespace

void check_finite_step(Context& ctx, int64_t iteration, double loss, std::optional<double> grad_norm,
                       const nn::ParameterList& params, int rank) {
  const bool bad_loss = !std::isfinite(loss), bad_norm = grad_norm && !std::isfinite(*grad_norm);
  if (!bad_loss && !bad_norm) return;
  std::string what = bad_loss ? str_cat("the loss is ", value_text(loss))
                              : str_cat("the gradient norm is ", value_text(*grad_norm));
  if (bad_loss && bad_norm) what += str_cat(" and the gradient norm ", value_text(*grad_norm));
  const std::vector<std::string> names = nonfinite_gradients(ctx, params);
  std::string where;
  if (names.empty()) {
    where = str_cat("no gradient that rank ", rank, " holds whole has a NaN or Inf; sharded ones, as Megatron FSDP's, ",
                    "are not searched");
  } else {
    // The first four and the last four: the backward runs from the last layer down, so the last names show
    // where the NaN entered and the first ones how far it spread.
    where = str_cat("rank ", rank, " holds NaN or Inf gradients in ", names.size(), " of ", params.size(),
                    " parameters: ");
    for (size_t i = 0; i < names.size(); ++i) {
      if (names.size() > 8 && i == 4) where += ", ...";
      if (names.size() > 8 && i >= 4 && i < names.size() - 4) continue;
      where += (i ? ", " : "") + names[i];
    }
  }
  throw Error(str_cat("iteration ", iteration, ": ", what, " (", where,
                      "); the run stops here before the optimizer step, as Megatron's "
                      "--check-for-nan-in-loss-and-grad does (--no-check-for-nan-in-loss-and-grad trains on)"));
}

void check_finite_evaluation(const std::string& where, double loss) {
  if (std::isfinite(loss)) return;
  throw Error(str_cat("the validation loss at ", where, " is ", value_text(loss),
                      "; the run stops here, as Megatron's --check-for-nan-in-loss-and-grad does for its evaluation "
                      "too (--no-check-for-nan-in-loss-and-grad goes on)"));
}

}  // namespace megatron::trainer
