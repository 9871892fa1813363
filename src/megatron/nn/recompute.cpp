#include "megatron/nn/recompute.h"

#include <algorithm>

namespace megatron::nn {

std::vector<std::pair<int, int>> RecomputeConfig::units(int layers) const {
  std::vector<std::pair<int, int>> out;
  if (!full() || num_layers < 1) return out;
  if (method == RecomputeMethod::Block) {
    for (int i = 0; i < std::min(num_layers, layers); ++i) out.emplace_back(i, 1);
    return out;
  }
  for (int first = 0; first < layers; first += num_layers) out.emplace_back(first, std::min(num_layers, layers - first));
  return out;
}

}  // namespace megatron::nn
