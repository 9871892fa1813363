// Megatron-LM's rank generator (megatron/core/parallel_state.py, RankGenerator and
// generate_masked_orthogonal_rank_groups): which global ranks form each TP, CP, EP, DP, PP group and each
// combination of them, from one order string.
//
// The order string names the dimensions from fastest to slowest varying: with "tp-cp-ep-dp-pp" (the
// default) a rank's coordinates are  rank = tp + TP*(cp + CP*(ep + EP*(dp + DP*pp))). Dimensions of size
// 1 may be left out of the order; one of size > 1 must be in it.
// get_ranks("dp") lists every DP group: the ranks that differ only in their dp coordinate. A token such as
// "tp-dp" lists the groups that vary in tp and dp together. Groups come in Megatron's order (by the linear
// index of the coordinates held fixed, earlier dimensions faster), ranks in a group by the linear index of
// the varying coordinates, so the lists are Megatron's, element for element.
// Megatron does not allow EP and CP > 1 in one generator (the expert generator has CP 1); neither do we.
#pragma once

#include <string>
#include <vector>

namespace megatron::parallel {

using RankGroups = std::vector<std::vector<int>>;

// parallel_size: the sizes in order (fastest first); mask: which dimensions vary within a group.
RankGroups generate_masked_orthogonal_rank_groups(int world_size, const std::vector<int>& parallel_size,
                                                  const std::vector<bool>& mask);

class RankGenerator {
 public:
  // Throws megatron::Error on sizes < 1, EP > 1 together with CP > 1, unknown or repeated names in `order`,
  // or a dimension of size > 1 missing from it.
  RankGenerator(int tp, int ep, int dp, int pp, int cp, const std::string& order = "tp-cp-ep-dp-pp", int rank_offset = 0);

  int world_size() const { return world_size_; }
  const std::string& order() const { return order_; }  // completed with the missing size-1 names
  // token: dimension names joined by '-', any order ("dp", "tp-dp", "dp-cp"). Throws on unknown names.
  RankGroups get_ranks(const std::string& token) const;

 private:
  std::vector<std::string> names_;  // the completed order
  std::vector<int> sizes_;          // in that order
  std::string order_;
  int world_size_ = 1;
  int rank_offset_ = 0;
};

}  // namespace megatron::parallel
