#include "megatron/train/tool_flags.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/train/flags.h"

namespace megatron::train {
namespace {

std::string nearest(const std::string& unknown, const std::vector<ToolFlag>& known) {
  const size_t limit = std::max<size_t>(3, unknown.size() / 3);
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const ToolFlag& f : known) {
    if (std::max(unknown.size(), f.name.size()) - std::min(unknown.size(), f.name.size()) > limit) continue;
    if (const size_t d = edit_distance(unknown, f.name); d < best_distance) best_distance = d, best = f.name;
  }
  return best_distance <= limit ? best : "";
}

std::optional<int64_t> parse_integer(const std::string& text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

ToolFlags::ToolFlags(const std::vector<std::string>& args, const std::vector<ToolFlag>& known, const std::string& usage)
    : usage_(usage) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    const auto spec = std::find_if(known.begin(), known.end(), [&](const ToolFlag& f) { return f.name == a; });
    if (spec == known.end()) {
      const std::string near = nearest(a, known);
      MEGATRON_FAIL("unknown flag ", quoted_bytes(a), near.empty() ? std::string() : str_cat("; did you mean ", near, "?"),
                    "\n", usage_);
    }
    MEGATRON_CHECK(!values_.count(a), a, " is given twice\n", usage_);
    if (!spec->takes_value) {
      values_[a] = "";
      continue;
    }
    MEGATRON_CHECK(i + 1 < args.size(), a, " needs a value\n", usage_);
    values_[a] = args[++i];
  }
}

std::string ToolFlags::text(const std::string& name, const std::string& fallback) const {
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

int64_t ToolFlags::integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) const {
  if (!has(name)) return fallback;
  const std::string& t = values_.at(name);
  const std::optional<int64_t> value = parse_integer(t);
  MEGATRON_CHECK(value.has_value(), name, " ", quoted_bytes(t), " is not an integer");
  MEGATRON_CHECK(*value >= min && *value <= max, name, " ", *value, " is outside [", min, ", ", max, "]");
  return *value;
}

double ToolFlags::number(const std::string& name, double fallback, double min, double max) const {
  if (!has(name)) return fallback;
  const std::string& t = values_.at(name);
  char* end = nullptr;
  const double value = t.empty() ? 0.0 : std::strtod(t.c_str(), &end);
  MEGATRON_CHECK(!t.empty() && end == t.c_str() + t.size() && std::isfinite(value), name, " ", quoted_bytes(t),
                 " is not a finite number");
  MEGATRON_CHECK(value >= min && value <= max, name, " ", value, " is outside [", min, ", ", max, "]");
  return value;
}

std::string ToolFlags::choice(const std::string& name, const std::string& fallback,
                              const std::vector<std::string>& choices) const {
  const std::string value = text(name, fallback);
  std::string set;
  for (const std::string& c : choices) {
    if (c == value) return value;
    set += (set.empty() ? "" : ", ") + c;
  }
  MEGATRON_FAIL(name, " ", quoted_bytes(value), " is not one of {", set, "}");
}

void ToolFlags::require(const std::string& name) const {
  MEGATRON_CHECK(has(name), name, " is required\n", usage_);
}

std::vector<int64_t> integer_list(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  std::vector<int64_t> out;
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    const std::optional<int64_t> value = parse_integer(word);
    MEGATRON_CHECK(value.has_value(), flag, ": word ", out.size() + 1, " (", quoted_bytes(word), ") is not an integer");
    MEGATRON_CHECK(*value >= min && *value <= max, flag, ": ", *value, " (word ", out.size() + 1, ") is outside [",
                   min, ", ", max, "]");
    out.push_back(*value);
  }
  return out;
}

}  // namespace megatron::train
