#include "megatron/data/dataset_split.h"

#include <cmath>
#include <cstdlib>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"

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
  // Megatron reads the numbers its regex [.0-9]+ finds anywhere in the text, so "a,b,c" became three
  // zeros; here the text must be numbers of that form separated by ',' or '/', each named when it is not.
  std::vector<double> values;
  size_t start = 0;
  while (start <= split.size()) {
    size_t end = split.find_first_of(",/", start);
    if (end == std::string::npos) end = split.size();
    const size_t first = split.find_first_not_of(" \t", start);
    const size_t last = split.find_last_not_of(" \t", end == 0 ? 0 : end - 1);
    const std::string item =
        first < end && last != std::string::npos && last >= first ? split.substr(first, last - first + 1) : "";
    const bool digits_and_one_point = !item.empty() && item.find_first_not_of(".0123456789") == std::string::npos &&
                                      item.find_first_of("0123456789") != std::string::npos &&
                                      item.find('.') == item.rfind('.');
    MEGATRON_CHECK(digits_and_one_point, "--split ", quoted_bytes(split), ": item ", values.size() + 1, " (", quoted_bytes(item),
                   ") is not a number (expected non-negative weights such as 969,30,1)");
    values.push_back(std::strtod(item.c_str(), nullptr));
    start = end + 1;
  }
  MEGATRON_CHECK(values.size() <= kNumSplits, "--split ", quoted_bytes(split), ": expected at most ", kNumSplits,
                 " weights (train,valid,test), found ", values.size());
  values.resize(kNumSplits, 0.0);
  double total = 0;
  for (double v : values) total += v;
  MEGATRON_CHECK(total > 0 && std::isfinite(total), "--split ", quoted_bytes(split),
                 ": the weights must not all be zero (and their sum must be finite)");
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
