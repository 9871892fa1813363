#include "megatron/train/batch_size_schedule.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "megatron/core/error.h"
#include "megatron/train/arguments.h"

namespace megatron::train {
namespace {

// Megatron's _parse_numeric_value: an optional K/M/B/T suffix (case-insensitive), int(float(rest) * multiplier).
int64_t parse_scaled(std::string text, const std::string& entry) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.erase(text.begin());
  for (char& c : text) c = char(std::toupper(static_cast<unsigned char>(c)));
  double multiplier = 1;
  if (!text.empty()) {
    const char suffix = text.back();
    if (suffix == 'T') multiplier = 1e12;
    if (suffix == 'B') multiplier = 1e9;
    if (suffix == 'M') multiplier = 1e6;
    if (suffix == 'K') multiplier = 1e3;
    if (multiplier != 1) text.pop_back();
  }
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  MEGATRON_CHECK(!text.empty() && end == text.c_str() + text.size(), "--step-batch-size-schedule: '", entry,
                 "' is not THRESHOLD:BATCH_SIZE with numbers (optionally suffixed K, M, B or T)");
  return int64_t(value * multiplier);
}

}  // namespace

BatchSizeSchedule BatchSizeSchedule::constant(int64_t global_batch_size) {
  BatchSizeSchedule s;
  s.final_ = global_batch_size;
  return s;
}

BatchSizeSchedule BatchSizeSchedule::rampup(int64_t start, int64_t increment, int64_t rampup_samples,
                                            int64_t global_batch_size) {
  MEGATRON_CHECK(start > 0 && increment > 0 && rampup_samples >= 0, "--rampup-batch-size ", start, " ", increment, " ",
                 rampup_samples, ": the start batch size and the increment must be positive and the ramp-up samples >= 0");
  const int64_t diff = global_batch_size - start;
  MEGATRON_CHECK(diff > 0 && diff % increment == 0, "--rampup-batch-size ", start, " ", increment, " ", rampup_samples,
                 ": --global-batch-size ", global_batch_size, " minus the start batch size ", start,
                 " must be a positive multiple of the increment ", increment,
                 " (to train at one batch size, leave --rampup-batch-size out)");
  BatchSizeSchedule s;
  s.kind_ = Kind::Rampup;
  s.final_ = global_batch_size;
  s.start_ = start;
  s.increment_ = increment;
  s.rampup_samples_ = rampup_samples;
  s.samples_per_increment_ = double(rampup_samples) / double(diff / increment);
  return s;
}

BatchSizeSchedule BatchSizeSchedule::step(const std::string& text, int64_t seq_length) {
  MEGATRON_CHECK(seq_length > 0, "--step-batch-size-schedule needs --seq-length (its thresholds are tokens)");
  std::string normalized = text;
  std::replace(normalized.begin(), normalized.end(), ',', ' ');
  BatchSizeSchedule s;
  s.kind_ = Kind::Step;
  size_t pos = 0;
  while (pos < normalized.size()) {
    const size_t begin = normalized.find_first_not_of(" \t\n", pos);
    if (begin == std::string::npos) break;
    size_t end = normalized.find_first_of(" \t\n", begin);
    if (end == std::string::npos) end = normalized.size();
    const std::string entry = normalized.substr(begin, end - begin);
    pos = end;
    const size_t colon = entry.find(':');
    MEGATRON_CHECK(colon != std::string::npos, "--step-batch-size-schedule: invalid entry '", entry,
                   "'; expected THRESHOLD:BATCH_SIZE");
    const int64_t threshold = parse_scaled(entry.substr(0, colon), entry) / seq_length;
    s.steps_.emplace_back(threshold, parse_scaled(entry.substr(colon + 1), entry));
  }
  std::stable_sort(s.steps_.begin(), s.steps_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  MEGATRON_CHECK(!s.steps_.empty(), "--step-batch-size-schedule '", text, "' has no entries");
  MEGATRON_CHECK(s.steps_[0].first == 0, "--step-batch-size-schedule '", text,
                 "': the first threshold must be 0, got ", s.steps_[0].first, " samples");
  for (size_t i = 0; i < s.steps_.size(); ++i) {
    MEGATRON_CHECK(s.steps_[i].second > 0, "--step-batch-size-schedule '", text, "': batch size ", s.steps_[i].second,
                   " must be positive");
    if (i > 0)
      MEGATRON_CHECK(s.steps_[i].first > s.steps_[i - 1].first, "--step-batch-size-schedule '", text,
                     "': thresholds must be strictly increasing (in samples of --seq-length ", seq_length, " tokens), got ",
                     s.steps_[i - 1].first, " before ", s.steps_[i].first);
  }
  s.final_ = s.steps_.back().second;
  return s;
}

BatchSizeSchedule BatchSizeSchedule::from_arguments(const Arguments& args) {
  const TrainingArguments& t = args.training;
  if (!t.step_batch_size_schedule.empty()) return step(t.step_batch_size_schedule, args.model.seq_length);
  if (t.rampup_batch_size.size() == 3)
    return rampup(t.rampup_batch_size[0], t.rampup_batch_size[1], t.rampup_batch_size[2], t.global_batch_size);
  return constant(t.global_batch_size);
}

int64_t BatchSizeSchedule::global_batch_size(int64_t consumed) const {
  switch (kind_) {
    case Kind::Constant: return final_;
    case Kind::Rampup:
      if (consumed > rampup_samples_) return final_;
      return start_ + int64_t(double(consumed) / samples_per_increment_) * increment_;
    case Kind::Step: {
      int64_t size = steps_.front().second;
      for (const auto& [threshold, batch] : steps_) {
        if (consumed < threshold) break;
        size = batch;
      }
      return size;
    }
  }
  return final_;
}

std::vector<int64_t> BatchSizeSchedule::sizes() const {
  std::vector<int64_t> out;
  if (kind_ == Kind::Constant) out = {final_};
  if (kind_ == Kind::Rampup)
    for (int64_t b = start_; b <= final_; b += increment_) out.push_back(b);
  if (kind_ == Kind::Step)
    for (const auto& [threshold, batch] : steps_) out.push_back(batch);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int64_t BatchSizeSchedule::train_iters(int64_t train_samples) const {
  int64_t iterations = 0, consumed = 0;
  switch (kind_) {
    case Kind::Constant: return train_samples / final_;
    case Kind::Rampup:
      while (consumed <= rampup_samples_ && consumed <= train_samples) {
        consumed += global_batch_size(consumed);
        ++iterations;
      }
      if (train_samples > consumed) iterations += (train_samples - consumed) / final_;
      return iterations;
    case Kind::Step:
      while (consumed < train_samples) {
        consumed += global_batch_size(consumed);
        ++iterations;
      }
      return iterations;
  }
  return iterations;
}

}  // namespace megatron::train
