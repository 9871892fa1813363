// Megatron's rank generator against (a) the examples written out in Megatron's docstrings and (b) an
// independent brute-force enumeration: every rank's coordinates in the order string, grouped by the
// coordinates held fixed. Both list groups and members in Megatron's order, so they compare exactly.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "harness.h"
#include "megatron/parallel/parallel_context.h"
#include "megatron/comm/self_communicator.h"
#include "megatron/parallel/rank_generator.h"

namespace megatron::parallel {
namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t dash = s.find('-', start);
    if (dash == std::string::npos) dash = s.size();
    out.push_back(s.substr(start, dash - start));
    start = dash + 1;
  }
  return out;
}

// Forward map rank -> (group, position): coordinates of the rank in `order` (first name fastest); the
// group index is the linear index of the fixed coordinates, the position that of the varying ones.
RankGroups brute_force(const std::map<std::string, int>& size, const std::string& order, const std::string& token) {
  const std::vector<std::string> names = split(order);
  const std::vector<std::string> varying_names = split(token);
  const std::set<std::string> varying(varying_names.begin(), varying_names.end());
  int world = 1;
  for (const auto& n : names) world *= size.at(n);
  int group_size = 1;
  for (const auto& n : varying) group_size *= size.at(n);
  RankGroups groups(size_t(world / group_size), std::vector<int>(size_t(group_size), -1));
  for (int rank = 0; rank < world; ++rank) {
    int rest = rank, group = 0, position = 0, group_stride = 1, position_stride = 1;
    for (const auto& n : names) {
      const int coord = rest % size.at(n);
      rest /= size.at(n);
      if (varying.count(n)) {
        position += coord * position_stride;
        position_stride *= size.at(n);
      } else {
        group += coord * group_stride;
        group_stride *= size.at(n);
      }
    }
    groups[size_t(group)][size_t(position)] = rank;
  }
  return groups;
}

TEST(RankGenerator, MegatronDocstringExamples) {
  // initialize_model_parallel: 16 GPUs, TP 2, PP 4 (so DP 2), default order.
  RankGenerator g(/*tp=*/2, /*ep=*/1, /*dp=*/2, /*pp=*/4, /*cp=*/1);
  EXPECT_EQ(g.get_ranks("dp"), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(g.get_ranks("tp"), (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(g.get_ranks("pp"), (RankGroups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(g.order(), "tp-cp-ep-dp-pp");
  // Context parallelism: 8 GPUs, TP 4, CP 2.
  RankGenerator c(4, 1, 1, 1, 2);
  EXPECT_EQ(c.get_ranks("cp"), (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // generate_masked_orthogonal_rank_groups: sizes [tp 2, dp 3, pp 4], the dp groups.
  RankGroups dp = generate_masked_orthogonal_rank_groups(24, {2, 3, 4}, {false, true, false});
  ASSERT_EQ(dp.size(), 8u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(dp[7], (std::vector<int>{19, 21, 23}));
}

TEST(RankGenerator, MatchesBruteForceEnumeration) {
  struct Layout {
    int tp, ep, dp, pp, cp;
    std::string order;
  };
  const std::vector<Layout> layouts = {
      {1, 1, 1, 1, 1, "tp-cp-ep-dp-pp"}, {2, 1, 2, 2, 1, "tp-cp-ep-dp-pp"}, {2, 1, 2, 1, 2, "tp-cp-ep-dp-pp"},
      {1, 2, 4, 1, 1, "tp-cp-ep-dp-pp"}, {4, 1, 1, 2, 1, "tp-cp-ep-dp-pp"}, {2, 1, 3, 2, 1, "tp-cp-ep-dp-pp"},
      {1, 1, 2, 2, 3, "tp-cp-ep-dp-pp"}, {2, 2, 3, 2, 1, "tp-cp-ep-dp-pp"}, {2, 1, 3, 2, 2, "tp-pp-dp-cp"},
      {3, 1, 2, 2, 1, "tp-pp-dp"},       {2, 3, 1, 2, 1, "tp-ep-pp-dp"}};
  const std::vector<std::string> tokens = {"tp",    "cp",    "ep",    "dp",       "pp",    "tp-pp",
                                           "tp-dp", "dp-cp", "tp-cp", "tp-dp-cp", "tp-ep", "tp-ep-pp"};
  for (const Layout& l : layouts) {
    RankGenerator g(l.tp, l.ep, l.dp, l.pp, l.cp, l.order);
    const std::map<std::string, int> size = {{"tp", l.tp}, {"ep", l.ep}, {"dp", l.dp}, {"pp", l.pp}, {"cp", l.cp}};
    EXPECT_EQ(g.world_size(), l.tp * l.ep * l.dp * l.pp * l.cp);
    for (const std::string& token : tokens) {
      const RankGroups got = g.get_ranks(token);
      EXPECT_EQ(got, brute_force(size, g.order(), token))
          << "layout tp" << l.tp << " ep" << l.ep << " dp" << l.dp << " pp" << l.pp << " cp" << l.cp << " order "
          << l.order << " (completed " << g.order() << "), token " << token;
      // Every group kind partitions the world.
      std::set<int> seen;
      for (const auto& group : got) seen.insert(group.begin(), group.end());
      EXPECT_EQ(int(seen.size()), g.world_size());
    }
  }
}

TEST(RankGenerator, RankOffsetShiftsEveryRank) {
  RankGenerator g(2, 1, 2, 1, 1, "tp-cp-ep-dp-pp", 8);
  EXPECT_EQ(g.get_ranks("dp"), (RankGroups{{8, 10}, {9, 11}}));
}

TEST(RankGenerator, RejectsBadLayouts) {
  testing::expect_error([] { RankGenerator(2, 2, 1, 1, 2); }, {"EP (2) and CP (2)"});
  testing::expect_error([] { RankGenerator(2, 1, 2, 2, 1, "tp-dp"); }, {"pp has size 2", "tp-dp"});
  testing::expect_error([] { RankGenerator(2, 1, 1, 1, 1, "tp-xx"); }, {"unknown name 'xx'"});
  testing::expect_error([] { RankGenerator(1, 1, 1, 1, 1).get_ranks("tp-zz"); }, {"unknown name 'zz'"});
  testing::expect_error([] { RankGenerator(0, 1, 1, 1, 1); }, {"tp size must be >= 1"});
}

TEST(ParallelLayout, ViolationsNameTheSizes) {
  ParallelSizes s;
  s.tensor_model_parallel = 3;
  std::vector<std::string> v = layout_violations(4, s);
  ASSERT_EQ(v.size(), 2u);  // dense and expert generators both
  EXPECT_NE(v[0].find("world size 4 is not a multiple of TP 3 x CP 1 x PP 1 = 3"), std::string::npos) << v[0];
  s = ParallelSizes{};
  s.expert_model_parallel = 3;
  v = layout_violations(4, s);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("expert TP 1 x EP 3"), std::string::npos) << v[0];
  s = ParallelSizes{};
  s.pipeline_model_parallel = 2;
  s.context_parallel = 2;
  EXPECT_TRUE(layout_violations(8, s).empty());
  testing::expect_error([] { ParallelContext::create(std::make_shared<comm::SelfCommunicator>(), ParallelSizes{.tensor_model_parallel = 2}); },
                        {"invalid parallel layout for 1 rank", "TP 2"});
}

TEST(ParallelLayout, SingleProcessContext) {
  ParallelContext pc = ParallelContext::single();
  EXPECT_EQ(pc.world_size(), 1);
  EXPECT_EQ(pc.dp_size(), 1);
  for (const ProcessGroup* g : {&pc.tp(), &pc.dp(), &pc.dp_cp(), &pc.embedding(), &pc.expert_dp()}) {
    ASSERT_TRUE(g->member()) << g->kind;
    EXPECT_EQ(g->ranks, std::vector<int>{0});
    EXPECT_EQ(std::string(g->comm->backend()), "self");
  }
  EXPECT_NE(pc.describe().find("world 1 = TP 1 x CP 1 x DP 1 x PP 1"), std::string::npos) << pc.describe();
}

}  // namespace
}  // namespace megatron::parallel
