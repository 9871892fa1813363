#include "megatron/parallel/rank_generator.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "megatron/core/error.h"

namespace megatron::parallel {
namespace {

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, '-'))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Prefix products: {1, a0, a0*a1, ...}.
std::vector<int64_t> prefix_product(const std::vector<int>& a) {
  std::vector<int64_t> r{1};
  for (int v : a) r.push_back(r.back() * v);
  return r;
}

}  // namespace

RankGroups generate_masked_orthogonal_rank_groups(int world_size, const std::vector<int>& parallel_size,
                                                  const std::vector<bool>& mask) {
  MEGATRON_CHECK(parallel_size.size() == mask.size(), "rank groups: ", parallel_size.size(), " sizes but ",
                 mask.size(), " mask entries");
  const std::vector<int64_t> stride = prefix_product(parallel_size);
  MEGATRON_CHECK(stride.back() == world_size, "rank groups: the sizes multiply to ", stride.back(),
                 ", not the world size ", world_size);
  std::vector<int> masked_shape, unmasked_shape;
  std::vector<int64_t> masked_stride, unmasked_stride;
  for (size_t i = 0; i < mask.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(parallel_size[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(stride[i]);
  }
  // index = sum(coord[i] * stride[i]) over a dimension subset, coordinates from the index by the subset's
  // own prefix products.
  auto place = [](int64_t index, const std::vector<int>& shape, const std::vector<int64_t>& global_stride) {
    int64_t rank = 0;
    for (size_t i = 0; i < shape.size(); ++i) {
      rank += (index % shape[i]) * global_stride[i];
      index /= shape[i];
    }
    return rank;
  };
  const int64_t group_size = prefix_product(masked_shape).back();
  const int64_t num_groups = world_size / group_size;
  RankGroups groups(static_cast<size_t>(num_groups), std::vector<int>(static_cast<size_t>(group_size)));
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t base = place(g, unmasked_shape, unmasked_stride);
    for (int64_t i = 0; i < group_size; ++i) groups[g][i] = int(base + place(i, masked_shape, masked_stride));
  }
  return groups;
}

RankGenerator::RankGenerator(int tp, int ep, int dp, int pp, int cp, const std::string& order, int rank_offset)
    : rank_offset_(rank_offset) {
  const std::map<std::string, int> size_of = {{"tp", tp}, {"ep", ep}, {"dp", dp}, {"pp", pp}, {"cp", cp}};
  for (const auto& [name, size] : size_of)
    MEGATRON_CHECK(size >= 1, "RankGenerator: ", name, " size must be >= 1, got ", size);
  MEGATRON_CHECK(ep == 1 || cp == 1, "RankGenerator: EP (", ep, ") and CP (", cp,
                 ") cannot both exceed 1 in one generator (Megatron keeps CP in the dense generator and EP in the "
                 "expert one)");
  names_ = split_names(order);
  for (const std::string& n : names_) {
    MEGATRON_CHECK(size_of.count(n), "RankGenerator: unknown name '", n, "' in order '", order,
                   "' (known: tp, cp, ep, dp, pp)");
    MEGATRON_CHECK(std::count(names_.begin(), names_.end(), n) == 1, "RankGenerator: '", n, "' repeated in order '",
                   order, "'");
  }
  for (const char* n : {"tp", "pp", "dp", "ep", "cp"}) {  // Megatron's completion order
    if (std::find(names_.begin(), names_.end(), n) != names_.end()) continue;
    MEGATRON_CHECK(size_of.at(n) == 1, "RankGenerator: ", n, " has size ", size_of.at(n), " but the order '", order,
                   "' does not place it");
    names_.push_back(n);
  }
  for (const std::string& n : names_) {
    sizes_.push_back(size_of.at(n));
    world_size_ *= size_of.at(n);
    if (!order_.empty()) order_ += '-';
    order_ += n;
  }
}

RankGroups RankGenerator::get_ranks(const std::string& token) const {
  std::vector<bool> mask(names_.size(), false);
  for (const std::string& t : split_names(token)) {
    auto it = std::find(names_.begin(), names_.end(), t);
    MEGATRON_CHECK(it != names_.end(), "RankGenerator::get_ranks: unknown name '", t, "' in '", token, "' (order ",
                   order_, ")");
    mask[size_t(it - names_.begin())] = true;
  }
  RankGroups groups = generate_masked_orthogonal_rank_groups(world_size_, sizes_, mask);
  for (auto& g : groups)
    for (int& r : g) r += rank_offset_;
  return groups;
}

}  // namespace megatron::parallel
