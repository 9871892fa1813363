// The command lines of the small tools (generate, convert_checkpoint): `--flag value` and switches, each
// flag at most once, values read with their type and range checked. Every error names the flag, the text
// given (escaped: it is outside text) and what was expected; pretrain_gpt's much larger command line is
// flags.h's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace megatron::train {

struct ToolFlag {
  std::string name;       // "--top-k"
  bool takes_value = true;
};

class ToolFlags {
 public:
  // `args` without the program name. Throws megatron::Error on an unknown flag (naming the nearest known
  // one), a missing value or a repeated flag; `usage` ends those messages. --help / -h set help().
  ToolFlags(const std::vector<std::string>& args, const std::vector<ToolFlag>& known, const std::string& usage);

  bool help() const { return help_; }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string text(const std::string& name, const std::string& fallback = "") const;
  // The value as an integer in [min, max] (fallback when absent).
  int64_t integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) const;
  // The value as a finite number in [min, max] (fallback when absent).
  double number(const std::string& name, double fallback, double min, double max) const;
  // The value, which must be one of `choices` (fallback when absent).
  std::string choice(const std::string& name, const std::string& fallback, const std::vector<std::string>& choices) const;
  // Throws naming `name` unless it was given.
  void require(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;
  std::string usage_;
  bool help_ = false;
};

// Whitespace-separated integers in [min, max] (generate --prompt-ids); errors name `flag` and the word.
std::vector<int64_t> integer_list(const std::string& flag, const std::string& text, int64_t min, int64_t max);

}  // namespace megatron::train
