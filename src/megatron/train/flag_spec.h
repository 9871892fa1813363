// The declaration of pretrain_gpt's flags (flags.cpp lists them by group): one FlagSpec per flag, built by
// flag() from a member of Arguments, or by noop_flag() / refused_flag() for Megatron flags that change nothing
// here or that this implementation refuses. Internal to megatron_train.
//
// Every flag has a status (docs/flags.md, `pretrain_gpt --list-flags`):
//   Supported  the flag has Megatron's meaning;
//   NoOp       accepted and validated (its value against Megatron's choices) but changes nothing, because the
//              design makes it moot (`reason` says why: "fused attention is always on");
//   Refused    accepted by the parser so that every problem is reported at once, then refused by validation
//              with `reason`, which names what to use instead (Arguments::refused collects them).
// A Supported flag may still refuse some values (--ckpt-format torch): its setter then records the refusal.
#pragma once

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/train/arguments.h"

namespace megatron::train {

enum class FlagStatus { Supported, NoOp, Refused };
const char* flag_status_name(FlagStatus s);  // "supported", "no-op", "refused"

// One flag: how to store a value into Arguments and read it back for printing.
struct FlagSpec {
  std::string name;  // "--hidden-size"
  bool takes_value = true;
  bool takes_list = false;
  std::vector<std::string> choices;
  std::string help;
  FlagStatus status = FlagStatus::Supported;
  std::string reason;    // NoOp / Refused: why (and, when refused, what to use instead); Supported: notes, if any
  bool in_args = true;   // listed by argument_values (the argument print, checkpoints' args)
  // Stores `value` (empty for switches); returns an error text or "".
  std::function<std::string(Arguments&, const std::string& value)> set;
  std::function<std::string(const Arguments&)> get;
};

template <class T>
inline std::string parse_number(const std::string& text, T& out) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  if constexpr (std::is_floating_point_v<T>) {
    // from_chars for double is in libstdc++ 11+; strtod keeps scientific notation like 3.0e-4 simple.
    char* stop = nullptr;
    errno = 0;
    double v = std::strtod(text.c_str(), &stop);
    if (text.empty() || stop != text.c_str() + text.size() || errno == ERANGE) return "a number";
    out = T(v);
    return "";
  } else {
    auto [ptr, ec] = std::from_chars(begin, end, out);
    if (ec != std::errc() || ptr != end) return "an integer";
    return "";
  }
}

template <class Group, class T>
FlagSpec flag(std::string name, Group Arguments::*group, T Group::*field, std::string help,
              std::vector<std::string> choices = {}) {
  FlagSpec f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.choices = std::move(choices);
  if constexpr (std::is_same_v<T, bool>) {
    f.takes_value = false;
    f.set = [group, field](Arguments& a, const std::string&) {
      (a.*group).*field = true;
      return std::string();
    };
    f.get = [group, field](const Arguments& a) { return std::string((a.*group).*field ? "True" : "False"); };
  } else if constexpr (std::is_same_v<T, std::string>) {
    f.set = [group, field](Arguments& a, const std::string& v) {
      (a.*group).*field = v;
      return std::string();
    };
    f.get = [group, field](const Arguments& a) { return (a.*group).*field; };
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    f.takes_list = true;
    f.set = [group, field](Arguments& a, const std::string& v) {
      int parsed = 0;
      std::string expected = parse_number(v, parsed);
      if (!expected.empty()) return str_cat("expects integers, got '", v, "'");
      ((a.*group).*field).push_back(parsed);
      return std::string();
    };
    f.get = [group, field](const Arguments& a) {
      std::string s;
      for (int x : (a.*group).*field) s += (s.empty() ? "" : " ") + std::to_string(x);
      return s;
    };
  } else if constexpr (std::is_same_v<T, std::vector<double>>) {
    f.takes_list = true;
    f.set = [group, field](Arguments& a, const std::string& v) {
      double parsed = 0;
      std::string expected = parse_number(v, parsed);
      if (!expected.empty()) return str_cat("expects numbers, got '", v, "'");
      ((a.*group).*field).push_back(parsed);
      return std::string();
    };
    f.get = [group, field](const Arguments& a) {
      std::string s;
      for (double x : (a.*group).*field) s += (s.empty() ? "" : " ") + str_cat(x);
      return s;
    };
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    f.takes_list = true;
    f.set = [group, field](Arguments& a, const std::string& v) {
      ((a.*group).*field).push_back(v);
      return std::string();
    };
    f.get = [group, field](const Arguments& a) {
      std::string s;
      for (const auto& x : (a.*group).*field) s += (s.empty() ? "" : " ") + x;
      return s;
    };
  } else {
    f.set = [group, field](Arguments& a, const std::string& v) {
      T parsed{};
      std::string expected = parse_number(v, parsed);
      if (!expected.empty()) return str_cat("expects ", expected, ", got '", v, "'");
      (a.*group).*field = parsed;
      return std::string();
    };
    f.get = [group, field](const Arguments& a) { return str_cat((a.*group).*field); };
  }
  return f;
}

// How a flag that stores nothing takes its value.
enum class FlagForm { Switch, Value, List };

// A Megatron flag accepted as a documented no-op: the value is checked against `choices` (when given) and
// dropped. `reason` says why it changes nothing here.
FlagSpec noop_flag(std::string name, FlagForm form, std::string reason, std::vector<std::string> choices = {});
// A Megatron flag this implementation refuses: accepted by the parser, then reported by validation as
// "<name> <values>: <reason>" (Arguments::refused); `reason` names what to use instead.
FlagSpec refused_flag(std::string name, FlagForm form, std::string reason, std::vector<std::string> choices = {});
// Records a refusal of `flag` (with the value given) into args.refused.
void refuse(Arguments& args, const std::string& flag, const std::string& value, const std::string& reason);

// The groups of flags (flags.cpp and the files of each group).
std::vector<FlagSpec> compat_flags();    // compat_flags.cpp: Megatron flags that are no-ops or refused here
std::vector<FlagSpec> schedule_flags();  // schedule_arguments.cpp: sample-based schedules, batch ramp-up, weight decay

}  // namespace megatron::train
