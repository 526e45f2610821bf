// The wait-for graph: a rank's longest wait, the chain a timeout follows to the rank holding the
// others up, and the form that travels in the beats.
#include "daemon/wait_for.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace smddp::daemon {
namespace {

using ipc::OpType;

RankWait wait(int rank, OpType op, std::uint64_t comm, std::uint64_t seq, double s, std::vector<int> waits_for) {
  return {rank, false, 0, op, comm, seq, s, std::move(waits_for)};
}

RankWait stopped(int rank, int pid) { return {rank, true, pid}; }

struct Graph {
  std::map<int, RankWait> by_rank;
  explicit Graph(std::vector<RankWait> waits) {
    for (auto& w : waits) by_rank.emplace(w.rank, std::move(w));
  }
  std::string explain(const std::vector<int>& from) const {
    return explain_wait(from, [this](int g) -> const RankWait* {
      const auto it = by_rank.find(g);
      return it == by_rank.end() ? nullptr : &it->second;
    });
  }
};

TEST(WaitFor, TheChainEndsAtAStoppedRank) {
  // Rank 0's operation waited for rank 2; rank 2 waits for rank 3, rank 3 for 0 and 1; 1 is stopped.
  const Graph g({wait(2, OpType::AllGather, 9, 58, 7.2, {3}), wait(3, OpType::AllReduce, 5, 12, 8.6, {0, 1}),
                 wait(0, OpType::Scatter, 7, 57, 8.0, {2}), stopped(1, 4242)});
  EXPECT_EQ(g.explain({2}),
            "rank 2 waits in allgather on communicator 9 (operation #58) for rank(s) 3 (7 s); "
            "rank 3 waits in allreduce on communicator 5 (operation #12) for rank(s) 0 1 (9 s); "
            "rank 1 (pid 4242) is stopped (a signal or a debugger)");
  // A stopped rank is the answer at once, wherever it stands among those waited for.
  EXPECT_EQ(g.explain({3, 1}), "rank 1 (pid 4242) is stopped (a signal or a debugger)");
  EXPECT_EQ(g.explain({}), "");
}

// A rank in no operation is where the chain ends; a rank that waits is followed first (one that
// seems to wait for nobody may be between two operations).
TEST(WaitFor, ARankInNoOperationIsNamedAsTheOneHoldingUpTheRest) {
  const Graph g({wait(2, OpType::AllReduce, 0, 4, 3.0, {1, 0}), wait(0, OpType::AllReduce, 0, 4, 3.0, {1})});
  EXPECT_EQ(g.explain({2}),
            "rank 2 waits in allreduce on communicator 0 (operation #4) for rank(s) 1 0 (3 s); "
            "rank 0 waits in allreduce on communicator 0 (operation #4) for rank(s) 1 (3 s); "
            "rank 1 waits for no other rank in smddp (busy outside it, stuck, or stopped)");
  EXPECT_EQ(g.explain({1}), "rank 1 waits for no other rank in smddp (busy outside it, stuck, or stopped)");
}

TEST(WaitFor, ACycleIsSaidToBeOne) {
  // Two groups' operations called in opposite orders: 0 waits for 1 in one, 1 for 0 in the other.
  const Graph g({wait(0, OpType::AllReduce, 5, 1, 9.0, {1}), wait(1, OpType::Broadcast, 6, 1, 9.0, {0})});
  const auto text = g.explain({1});
  EXPECT_EQ(text,
            "rank 1 waits in broadcast on communicator 6 (operation #1) for rank(s) 0 (9 s); "
            "rank 0 waits in allreduce on communicator 5 (operation #1) for rank(s) 1 (9 s), which wait for it in "
            "turn (a cycle: operations called in another order on some rank)");
}

TEST(WaitFor, AWaitForTheOtherNodesToFinishEndsTheChain) {
  const Graph g({wait(2, OpType::AllReduce, 0, 8, 2.0, {})});
  EXPECT_EQ(g.explain({2}),
            "rank 2 waits in allreduce on communicator 0 (operation #8) for the other node(s) to finish their part "
            "(2 s)");
}

TEST(WaitFor, EachRankKeepsItsLongestWaitAndStoppedComesFirst) {
  const auto kept = longest_per_rank({wait(1, OpType::AllReduce, 0, 1, 2.0, {0}), wait(0, OpType::AllReduce, 0, 2, 1.0, {1}),
                                      wait(1, OpType::Barrier, 0, 3, 5.0, {0}), stopped(0, 77),
                                      wait(0, OpType::AllReduce, 0, 4, 9.0, {1})});
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].rank, 0);
  EXPECT_TRUE(kept[0].stopped);
  EXPECT_EQ(kept[0].pid, 77);
  EXPECT_EQ(kept[1].rank, 1);
  EXPECT_EQ(kept[1].op, OpType::Barrier);
  EXPECT_DOUBLE_EQ(kept[1].waited_s, 5.0);
}

TEST(WaitFor, TheWireFormKeepsWhatMattersAndDropsWhatCannotBeRight) {
  std::vector<RankWait> waits{wait(3, OpType::ReduceScatter, 11, 22, 1.5, {0, 1, 2, 4, 5, 6, 7, 8, 9, 10}),
                              stopped(2, 99)};
  const auto back = from_wire(to_wire(waits), 16);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_TRUE(back[0].stopped);  // stopped ranks go first: a chain ends there
  EXPECT_EQ(back[0].rank, 2);
  EXPECT_EQ(back[0].pid, 99);
  EXPECT_EQ(back[1].rank, 3);
  EXPECT_EQ(back[1].op, OpType::ReduceScatter);
  EXPECT_EQ(back[1].comm, 11u);
  EXPECT_EQ(back[1].seq, 22u);
  EXPECT_DOUBLE_EQ(back[1].waited_s, 1.5);
  EXPECT_EQ(back[1].waits_for, (std::vector<int>{0, 1, 2, 4, 5, 6, 7, 8}));  // the first kMaxFor

  // More ranks than a beat holds: the longest waits travel.
  std::vector<RankWait> many;
  for (int r = 0; r < WireWaits::kMaxRanks + 4; ++r) many.push_back(wait(r, OpType::AllReduce, 0, 1, r, {0}));
  const auto kept = from_wire(to_wire(many), 64);
  ASSERT_EQ(kept.size(), static_cast<std::size_t>(WireWaits::kMaxRanks));
  EXPECT_EQ(kept.front().rank, WireWaits::kMaxRanks + 3);

  // Whatever arrives is checked: a rank outside the job, an unknown operation, a bad count.
  auto wire = to_wire({wait(1, OpType::AllReduce, 0, 1, 2.0, {0}), wait(2, OpType::AllReduce, 0, 1, 2.0, {0}),
                       wait(3, OpType::AllReduce, 0, 1, 2.0, {0}), wait(0, OpType::AllReduce, 0, 1, 1.0, {1})});
  wire.entries[0].rank = 40;
  wire.entries[1].op = ipc::kOpTypeCount;
  wire.entries[2].waits_for[0] = -1;
  const auto checked = from_wire(wire, 4);
  ASSERT_EQ(checked.size(), 1u);
  EXPECT_EQ(checked[0].rank, 0);
  wire.count = 1000;
  wire.entries[3].n_for = 1000;
  EXPECT_TRUE(from_wire(wire, 4).empty());
}

}  // namespace
}  // namespace smddp::daemon
