// Megatron's --split: "969,30,1" -> weights (numbers such as 969 or 0.5, separated by ',' or '/', padded
// with zeros to three, normalised by numpy) -> cumulative book-ends [(0, .969), (.969, .999), (.999, 1.0)]
// (a zero-width split is absent) -> per split the element range [round(begin * N), round(end * N)) with
// Python's round (half to even). For GPT the elements are the sequences of the indexed dataset. An item that
// is not such a number is an error naming it (Megatron's regex [.0-9]+ read "a,b,c" as no weights at all).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace megatron::data {

enum class Split { train = 0, valid = 1, test = 2 };
constexpr int kNumSplits = 3;
const char* split_name(Split split);

using SplitBookends = std::array<std::optional<std::pair<double, double>>, kNumSplits>;

struct SequenceRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// numpy: w / numpy.sum(w) with numpy's pairwise summation, element by element in float64.
std::vector<double> numpy_normalize(std::span<const double> weights);
std::array<double, kNumSplits> parse_and_normalize_split(const std::string& split);
SplitBookends split_bookends(const std::array<double, kNumSplits>& normalized);
SplitBookends split_bookends(const std::string& split);
SequenceRange split_range(const std::pair<double, double>& bookend, int64_t num_elements);

}  // namespace megatron::data
