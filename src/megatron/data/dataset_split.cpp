#include "megatron/data/dataset_split.h"

#include <cmath>
#include <regex>

#include "megatron/core/error.h"

namespace megatron::data {
namespace {

// numpy's pairwise summation of float64 (numpy/_core/src/umath/loops_utils.h.src), block size 128.
double numpy_pairwise_sum(const double* a, size_t n) {
  if (n < 8) {
    double sum = -0.0;
    for (size_t i = 0; i < n; ++i) sum += a[i];
    return sum;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += a[i];
    return sum;
  }
  size_t half = n / 2;
  half -= half % 8;
  return numpy_pairwise_sum(a, half) + numpy_pairwise_sum(a + half, n - half);
}

}  // namespace

const char* split_name(Split split) {
  switch (split) {
    case Split::train: return "train";
    case Split::valid: return "valid";
    case Split::test: return "test";
  }
  return "invalid";
}

std::vector<double> numpy_normalize(std::span<const double> weights) {
  const double sum = 0.0 + numpy_pairwise_sum(weights.data(), weights.size());
  std::vector<double> out(weights.begin(), weights.end());
  for (double& w : out) w = w / sum;
  return out;
}

std::array<double, kNumSplits> parse_and_normalize_split(const std::string& split) {
  std::vector<double> values;
  static const std::regex number("[.0-9]+");
  for (auto it = std::sregex_iterator(split.begin(), split.end(), number); it != std::sregex_iterator(); ++it) {
    const std::string text = it->str();
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MEGATRON_CHECK(used == text.size() && text != ".", "--split '", split, "': '", text, "' is not a number");
    values.push_back(v);
  }
  MEGATRON_CHECK(values.size() <= kNumSplits, "--split '", split, "': expected at most ", kNumSplits,
                 " weights (train,valid,test), found ", values.size());
  values.resize(kNumSplits, 0.0);
  double total = 0;
  for (double v : values) total += v;
  MEGATRON_CHECK(total > 0, "--split '", split, "': the weights must not all be zero");
  auto normalized = numpy_normalize(values);
  return {normalized[0], normalized[1], normalized[2]};
}

SplitBookends split_bookends(const std::array<double, kNumSplits>& normalized) {
  SplitBookends bookends;
  double begin = 0;  // Python starts the expansion with the int 0; 0 + x == x, so a double 0 is the same
  for (int i = 0; i < kNumSplits; ++i) {
    double end = begin + normalized[i];
    if (end > begin) bookends[i] = std::make_pair(begin, end);
    begin = end;
  }
  return bookends;
}

SplitBookends split_bookends(const std::string& split) { return split_bookends(parse_and_normalize_split(split)); }

SequenceRange split_range(const std::pair<double, double>& bookend, int64_t num_elements) {
  // Python's round() rounds half to even, as nearbyint does in the default rounding mode.
  return {static_cast<int64_t>(std::nearbyint(bookend.first * static_cast<double>(num_elements))),
          static_cast<int64_t>(std::nearbyint(bookend.second * static_cast<double>(num_elements)))};
}

}  // namespace megatron::data
