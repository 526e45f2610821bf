// The job's wait-for graph: which operation each rank has been waiting in, and for whom.
//
// A timeout names the ranks that never posted; those are often themselves stuck behind another
// rank (a rank that stopped holds up the groups it is in, and through them other groups). Each
// daemon knows its own ranks' waits (matcher, inter-node engine, split-reduction shares) and
// sends them in its beats; a timeout follows the graph from the ranks it waited for to one that
// is stopped or waits for nobody, and names it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ipc/types.hpp"

namespace smddp::daemon {

struct RankWait {
  int rank = -1;
  // Its process is stopped (a signal or a debugger): whatever it posted, it waits for nobody.
  bool stopped = false;
  int pid = 0;
  ipc::OpType op = ipc::OpType::AllReduce;
  std::uint64_t comm = 0, seq = 0;
  double waited_s = 0;
  std::vector<int> waits_for;  // global ranks; empty: for the other node(s) to finish their part
};

// Rank `g`'s entry in `waits`, or null.
const RankWait* find_wait(const std::vector<RankWait>& waits, int g);

// One entry a rank: its longest wait, a stopped process before any wait. Sorted by rank.
std::vector<RankWait> longest_per_rank(std::vector<RankWait> waits);

// The chain from `from` (ranks an operation waited for) to the rank holding them up, as text:
// "rank 2 waits in allreduce on communicator 5 (operation #57) for rank(s) 0 1 (7 s); rank 1
// (pid 4242) is stopped (a signal or a debugger)". `wait_of` gives a rank's entry, or null when it
// waits for nobody as far as its node knows. Empty when `from` is.
std::string explain_wait(const std::vector<int>& from, const std::function<const RankWait*(int)>& wait_of);

// The form that travels in a beat: fixed size, so a daemon of the same build reads it as is.
struct WireWaits {
  static constexpr int kMaxRanks = 32;  // a node's ranks shown (longest waits first)
  static constexpr int kMaxFor = 8;     // ranks shown of each wait (the others are not followed)
  struct Entry {
    std::int32_t rank = -1;
    std::int32_t pid = 0;
    std::uint32_t stopped = 0;
    std::uint32_t op = 0;
    std::uint64_t comm = 0, seq = 0;
    std::uint32_t waited_ms = 0;
    std::uint32_t n_for = 0;
    std::int32_t waits_for[kMaxFor] = {};
  };
  std::uint32_t count = 0;
  Entry entries[kMaxRanks] = {};
};
WireWaits to_wire(const std::vector<RankWait>& waits);
// Drops entries that cannot be right (counts or ranks out of range, an unknown operation).
std::vector<RankWait> from_wire(const WireWaits& wire, int world_size);

}  // namespace smddp::daemon
