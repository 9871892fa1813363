#include "megatron/train/flag_spec.h"

namespace megatron::train {

const char* flag_status_name(FlagStatus s) {
  switch (s) {
    case FlagStatus::Supported: return "supported";
    case FlagStatus::NoOp: return "no-op";
    case FlagStatus::Refused: return "refused";
  }
  return "supported";
}

void refuse(Arguments& args, const std::string& flag, const std::string& value, const std::string& reason) {
  args.refused.push_back(str_cat(flag, value.empty() ? "" : " ", value, ": ", reason));
}

namespace {

FlagSpec stored_nowhere(std::string name, FlagForm form, std::string reason, std::vector<std::string> choices,
                        FlagStatus status) {
  FlagSpec f;
  f.name = std::move(name);
  f.takes_value = form != FlagForm::Switch;
  f.takes_list = form == FlagForm::List;
  f.choices = std::move(choices);
  f.status = status;
  f.reason = std::move(reason);
  f.in_args = false;
  f.get = [](const Arguments&) { return std::string(); };
  return f;
}

}  // namespace

FlagSpec noop_flag(std::string name, FlagForm form, std::string reason, std::vector<std::string> choices) {
  FlagSpec f = stored_nowhere(std::move(name), form, std::move(reason), std::move(choices), FlagStatus::NoOp);
  f.set = [](Arguments&, const std::string&) { return std::string(); };
  return f;
}

FlagSpec refused_flag(std::string name, FlagForm form, std::string reason, std::vector<std::string> choices) {
  FlagSpec f = stored_nowhere(name, form, reason, std::move(choices), FlagStatus::Refused);
  f.set = [name, reason](Arguments& a, const std::string& value) {
    refuse(a, name, value, reason);
    return std::string();
  };
  return f;
}

}  // namespace megatron::train
