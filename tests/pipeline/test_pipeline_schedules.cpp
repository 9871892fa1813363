// The pipeline schedules as data (pipeline/schedule.h), without a model:
//   - Megatron's order, written out from its algorithm (schedules.py: warm-up min(P - r - 1, M) forwards for
//     1F1B; get_schedule_table and (P - r - 1) * 2 + (V - 1) * G warm-ups for the interleaved schedule;
//     send_forward_recv_backward / send_backward_recv_forward batches): every step of every rank for
//     (P = 4, M = 8), and the computation order of every rank for (P = 2, V = 2, M = 4);
//   - every rank of many layouts simulated together, batches completing only when every message has met
//     its peer's (NCCL's rendezvous, the strictest model): no deadlock, every receive gets the tensor its
//     label says (the k-th send from A to B meets the k-th receive at B from A, per channel), every
//     forward and backward runs once with its inputs already there, and 1F1B keeps at most P - r micro-
//     batches between forward and backward on rank r.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <set>

#include "harness.h"
#include "megatron/pipeline/schedule.h"

namespace megatron::pipeline {
namespace {

TEST(PipelineSchedule, OneFOneBIsMegatronsOrderAtPipeline4With8MicroBatches) {
  const std::vector<std::string> compute = {
      "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
      "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
      "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
      "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"};
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(describe_compute(one_f_one_b({.size = 4, .rank = r}, 8)), compute[size_t(r)]) << "rank " << r;
  EXPECT_EQ(describe(one_f_one_b({.size = 4, .rank = 0}, 8)),
            "F0 [sF0] F1 [sF1] F2 [sF2] F3 [sF3 rB0] B0 F4 [sF4 rB1] B1 F5 [sF5 rB2] B2 F6 [sF6 rB3] B3 "
            "F7 [sF7 rB4] B4 [rB5] B5 [rB6] B6 [rB7] B7");
  EXPECT_EQ(describe(one_f_one_b({.size = 4, .rank = 1}, 8)),
            "[rF0] F0 [sF0] [rF1] F1 [sF1] [rF2] F2 [sF2 rB0] B0 [sB0 rF3] F3 [sF3 rB1] B1 [sB1 rF4] "
            "F4 [sF4 rB2] B2 [sB2 rF5] F5 [sF5 rB3] B3 [sB3 rF6] F6 [sF6 rB4] B4 [sB4 rF7] F7 [sF7 rB5] B5 [sB5] "
            "[rB6] B6 [sB6] [rB7] B7 [sB7]");
  EXPECT_EQ(describe(one_f_one_b({.size = 4, .rank = 3}, 8)),
            "[rF0] F0 B0 [sB0 rF1] F1 B1 [sB1 rF2] F2 B2 [sB2 rF3] F3 B3 [sB3 rF4] F4 B4 [sB4 rF5] F5 B5 "
            "[sB5 rF6] F6 B6 [sB6 rF7] F7 B7 [sB7]");
  // Forward-only (evaluation): receive, forward, send, micro-batch by micro-batch.
  EXPECT_EQ(describe(one_f_one_b({.size = 4, .rank = 2}, 2, true)), "[rF0] F0 [sF0] [rF1] F1 [sF1]");
}

TEST(PipelineSchedule, InterleavedIsMegatronsOrderAtPipeline2With2ChunksAnd4MicroBatches) {
  // get_schedule_table(4, 2, 2): (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1); warm-ups 4 and 2.
  EXPECT_EQ(describe_compute(interleaved({.size = 2, .rank = 0, .virtual_size = 2}, 4, 2)),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(describe_compute(interleaved({.size = 2, .rank = 1, .virtual_size = 2}, 4, 2)),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // Megatron's tunable table with G = 3 over 5 micro-batches (its docstring's example): 0 1 2 0 1 2 3 4 3 4.
  const std::string table = describe_compute(interleaved({.size = 2, .rank = 0, .virtual_size = 2}, 5, 3, true));
  EXPECT_EQ(table, "F0.0 F1.0 F2.0 F0.1 F1.1 F2.1 F3.0 F4.0 F3.1 F4.1");
}

// Megatron's overlap_p2p_comm batches (its default): the steady state posts send_forward_recv_forward right
// after each forward and send_backward_recv_backward right after each backward; the last warm-up forward's
// first gradient receive is a batch of its own. The computation order is the non-overlapped one.
TEST(PipelineSchedule, InterleavedWithOverlapPostsEachDirectionRightAfterItsStep) {
  const PipelinePosition first{.size = 2, .rank = 0, .virtual_size = 2}, last{.size = 2, .rank = 1, .virtual_size = 2};
  EXPECT_EQ(describe(interleaved(first, 4, 2, false, true)),
            "F0.0 [sF0.0] F1.0 [sF1.0 rF0.1] F0.1 [sF0.1 rF1.1] F1.1 [sF1.1] [rB0.1] F2.0 [sF2.0] B0.1 [sB0.1 rB1.1] "
            "F3.0 [sF3.0 rF2.1] B1.1 [sB1.1 rB0.0] F2.1 [sF2.1 rF3.1] B0.0 [rB1.0] F3.1 [sF3.1] B1.0 [rB2.1] "
            "B2.1 [sB2.1 rB3.1] B3.1 [sB3.1 rB2.0] B2.0 [rB3.0] B3.0");
  EXPECT_EQ(describe(interleaved(last, 4, 2, false, true)),
            "[rF0.0] F0.0 [sF0.0 rF1.0] F1.0 [sF1.0 rF0.1] F0.1 [rF1.1] B0.1 [sB0.1] F1.1 [rF2.0] B1.1 [sB1.1 rB0.0] "
            "F2.0 [sF2.0 rF3.0] B0.0 [sB0.0 rB1.0] F3.0 [sF3.0 rF2.1] B1.0 [sB1.0] F2.1 [rF3.1] B2.1 [sB2.1] F3.1 "
            "B3.1 [sB3.1 rB2.0] B2.0 [sB2.0 rB3.0] B3.0 [sB3.0]");
  // Without overlap the forward's send waits for the backward after it (send_forward_backward_recv_forward_backward).
  EXPECT_EQ(describe(interleaved(first, 4, 2)).substr(0, 87),
            "F0.0 [sF0.0] F1.0 [sF1.0 rF0.1] F0.1 [sF0.1 rF1.1] F1.1 [sF1.1 rB0.1] F2.0 B0.1 [sF2.0 ");
  for (int r = 0; r < 2; ++r) {
    const PipelinePosition p{.size = 2, .rank = r, .virtual_size = 2};
    EXPECT_EQ(describe_compute(interleaved(p, 8, 2, false, true)), describe_compute(interleaved(p, 8, 2)));
    EXPECT_EQ(describe(schedule_for(p, 8, 2, false, true)), describe(interleaved(p, 8, 2, false, true)));
  }
  // 1F1B has one batch layout (Megatron overlaps only the interleaved schedule's).
  const PipelinePosition one{.size = 2, .rank = 0};
  EXPECT_EQ(describe(schedule_for(one, 4, 2, false, true)), describe(one_f_one_b(one, 4)));
}

TEST(PipelineSchedule, RefusesImpossibleArguments) {
  testing::expect_error([] { interleaved({.size = 2, .rank = 0, .virtual_size = 2}, 3, 2); }, {"micro-batch group 2"});
  testing::expect_error([] { interleaved({.size = 4, .rank = 0, .virtual_size = 2}, 8, 2); }, {"[4, 8]"});
  testing::expect_error([] { one_f_one_b({.size = 2, .rank = 2}, 4); }, {"rank 2 of 2"});
  testing::expect_error([] { one_f_one_b({.size = 2, .rank = 0, .virtual_size = 2}, 4); }, {"interleaved schedule"});
}

// ---- every rank together ----

struct Label {
  int microbatch, chunk;
  bool operator==(const Label&) const = default;
};

// Where a sent tensor lands: the next rank's same chunk, or chunk + 1 on rank 0 (and backwards the mirror).
Label destination(const Message& m, int rank, int P) {
  if (m.kind == Message::Kind::SendForward) return {m.microbatch, rank == P - 1 ? m.chunk + 1 : m.chunk};
  return {m.microbatch, rank == 0 ? m.chunk - 1 : m.chunk};
}

class Simulation {
 public:
  Simulation(int P, int V, int M, int G, bool forward_only, bool overlap_p2p)
      : P_(P), V_(V), M_(M), forward_only_(forward_only) {
    for (int r = 0; r < P; ++r) {
      const PipelinePosition pos{.size = P, .rank = r, .virtual_size = V};
      steps_.push_back(schedule_for(pos, M, G, forward_only, overlap_p2p));
    }
    pc_.assign(size_t(P), 0);
    posted_.assign(size_t(P), false);
    state_.resize(size_t(P));
  }

  // Runs every rank until all are done; fails the test on deadlock or a broken dependency.
  void run(const std::string& what) {
    for (int round = 0; round < 100000; ++round) {
      bool progress = false, done = true;
      for (int r = 0; r < P_; ++r) {
        progress = advance(r, what) || progress;
        done = done && pc_[size_t(r)] == steps_[size_t(r)].size();
      }
      if (done) return check_totals(what);
      if (!progress) {
        ADD_FAILURE() << what << ": deadlock";
        return;
      }
    }
    ADD_FAILURE() << what << ": did not finish";
  }

 private:
  struct RankState {
    std::set<std::pair<int, int>> forwards, backwards, inputs, grads;  // (chunk, micro-batch)
    size_t max_in_flight = 0;
  };
  // Channel (kind, from, to) -> the labels sent, in order, and how many were received.
  struct Channel {
    std::vector<Label> sent;
    size_t received = 0;
    size_t posted_receives = 0;
  };
  using ChannelKey = std::tuple<int, int, int>;  // 0 activations / 1 gradients, from, to

  ChannelKey channel_of(const Message& m, int rank) const {
    const bool forward = m.kind == Message::Kind::SendForward || m.kind == Message::Kind::RecvForward;
    const bool send = m.kind == Message::Kind::SendForward || m.kind == Message::Kind::SendBackward;
    const int next = (rank + 1) % P_, prev = (rank + P_ - 1) % P_;
    if (forward) return send ? ChannelKey{0, rank, next} : ChannelKey{0, prev, rank};
    return send ? ChannelKey{1, rank, prev} : ChannelKey{1, next, rank};
  }

  bool advance(int r, const std::string& what);
  bool try_complete(int r, const Step& s, const std::string& what);
  void check_totals(const std::string& what);

  const int P_, V_, M_;
  const bool forward_only_;
  std::vector<std::vector<Step>> steps_;
  std::vector<size_t> pc_;
  std::vector<bool> posted_;  // the rank's current batch has been posted
  std::vector<RankState> state_;
  std::map<ChannelKey, Channel> channels_;
};

bool Simulation::advance(int r, const std::string& what) {
  bool progress = false;
  RankState& st = state_[size_t(r)];
  while (pc_[size_t(r)] < steps_[size_t(r)].size()) {
    const Step& s = steps_[size_t(r)][pc_[size_t(r)]];
    const std::pair<int, int> key{s.chunk, s.microbatch};
    const PipelinePosition pos{.size = P_, .rank = r, .virtual_size = V_};
    if (s.action == Action::Communicate) {
      if (!try_complete(r, s, what)) return progress;
    } else if (s.action == Action::Forward) {
      EXPECT_TRUE(pos.first_stage(s.chunk) || st.inputs.count(key)) << what << ": rank " << r << " F" << s.microbatch
                                                                    << "." << s.chunk << " before its input arrived";
      EXPECT_TRUE(st.forwards.insert(key).second) << what << ": rank " << r << " runs F" << s.microbatch << " twice";
    } else {
      EXPECT_TRUE(st.forwards.count(key)) << what << ": rank " << r << " B before F";
      EXPECT_TRUE(pos.last_stage(s.chunk) || st.grads.count(key)) << what << ": rank " << r << " B" << s.microbatch
                                                                  << "." << s.chunk << " before its gradient arrived";
      EXPECT_TRUE(st.backwards.insert(key).second) << what << ": rank " << r << " runs B twice";
    }
    if (s.action != Action::Communicate)
      st.max_in_flight = std::max(st.max_in_flight, st.forwards.size() - st.backwards.size());
    ++pc_[size_t(r)];
    progress = true;
  }
  return progress;
}

// Posts the rank's batch (once), and completes it when every send has met a posted receive and every receive
// a posted send (rendezvous).
bool Simulation::try_complete(int r, const Step& s, const std::string& what) {
  if (!posted_[size_t(r)]) {
    for (const Message& m : s.messages) {
      Channel& c = channels_[channel_of(m, r)];
      const bool send = m.kind == Message::Kind::SendForward || m.kind == Message::Kind::SendBackward;
      if (send) c.sent.push_back(destination(m, r, P_));
      else ++c.posted_receives;
    }
    posted_[size_t(r)] = true;
  }
  // Every message's counterpart must be posted: for a send its index < the receiver's posted receives.
  std::map<ChannelKey, size_t> sends_here, receives_here;
  for (const Message& m : s.messages) {
    const ChannelKey k = channel_of(m, r);
    const Channel& c = channels_[k];
    const bool send = m.kind == Message::Kind::SendForward || m.kind == Message::Kind::SendBackward;
    const size_t index = send ? c.sent.size() - (++sends_here[k]) : c.received + receives_here[k]++;
    if (send ? index >= c.posted_receives : index >= c.sent.size()) return false;
  }
  RankState& st = state_[size_t(r)];
  for (const Message& m : s.messages) {
    if (m.kind == Message::Kind::SendForward || m.kind == Message::Kind::SendBackward) {
      EXPECT_TRUE((m.kind == Message::Kind::SendForward ? st.forwards : st.backwards).count({m.chunk, m.microbatch}))
          << what << ": rank " << r << " sends what it has not computed";
      continue;
    }
    Channel& c = channels_[channel_of(m, r)];
    const Label got = c.sent[c.received++];
    EXPECT_EQ(got, (Label{m.microbatch, m.chunk})) << what << ": rank " << r << " receives micro-batch "
                                                   << got.microbatch << " chunk " << got.chunk << " for "
                                                   << m.microbatch << "." << m.chunk;
    (m.kind == Message::Kind::RecvForward ? st.inputs : st.grads).insert({m.chunk, m.microbatch});
  }
  posted_[size_t(r)] = false;
  return true;
}

void Simulation::check_totals(const std::string& what) {
  for (int r = 0; r < P_; ++r) {
    const RankState& st = state_[size_t(r)];
    EXPECT_EQ(st.forwards.size(), size_t(M_ * V_)) << what << ": rank " << r;
    EXPECT_EQ(st.backwards.size(), forward_only_ ? 0u : size_t(M_ * V_)) << what << ": rank " << r;
    if (V_ == 1 && !forward_only_) {
      EXPECT_LE(st.max_in_flight, size_t(P_ - r)) << what << ": rank " << r << " holds too many micro-batches";
    }
  }
  for (const auto& [key, c] : channels_)
    EXPECT_EQ(c.received, c.sent.size()) << what << ": messages left unreceived";
}

TEST(PipelineSchedule, EveryRankTogetherMatchesMessagesAndNeverDeadlocks) {
  int layouts = 0;
  for (int P : {2, 3, 4})
    for (int V : {1, 2, 3})
      for (int M = 1; M <= 9; ++M)
        for (int G = P; G <= M || (V == 1 && G == P); ++G) {
          if (V > 1 && (M < P || (M % G != 0 && M % G < P))) continue;  // the interleaved schedule's rules
          for (bool forward_only : {false, true})
            for (bool overlap_p2p : {false, true}) {
              Simulation(P, V, M, G, forward_only, overlap_p2p)
                  .run(str_cat("P ", P, " V ", V, " M ", M, " G ", G, forward_only ? " forward-only" : "",
                               overlap_p2p ? " overlap" : ""));
              ++layouts;
            }
          if (V == 1) break;  // G matters only when interleaving
        }
  EXPECT_GT(layouts, 200);
}

}  // namespace
}  // namespace megatron::pipeline
