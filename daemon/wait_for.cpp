#include "daemon/wait_for.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

namespace smddp::daemon {

const RankWait* find_wait(const std::vector<RankWait>& waits, int g) {
  const auto it = std::find_if(waits.begin(), waits.end(), [g](const RankWait& w) { return w.rank == g; });
  return it == waits.end() ? nullptr : &*it;
}

std::vector<RankWait> longest_per_rank(std::vector<RankWait> waits) {
  std::map<int, RankWait> by_rank;
  for (auto& w : waits) {
    auto [it, added] = by_rank.try_emplace(w.rank, w);
    if (added) continue;
    auto& kept = it->second;
    if (w.stopped && !kept.stopped) {
      kept = std::move(w);
    } else if (!kept.stopped && w.waited_s > kept.waited_s) {
      kept = std::move(w);
    }
  }
  std::vector<RankWait> out;
  for (auto& [rank, w] : by_rank) out.push_back(std::move(w));
  return out;
}

std::string explain_wait(const std::vector<int>& from, const std::function<const RankWait*(int)>& wait_of) {
  std::set<int> seen;
  // A stopped rank is the answer at once. Otherwise follow a rank that waits: one that seems to
  // wait for nobody may only be between two operations (the waits are up to a beat old), so it is
  // named only when none of the others waits.
  const auto pick = [&](const std::vector<int>& ranks) {
    for (int r : ranks)
      if (const auto* w = wait_of(r); !seen.contains(r) && w && w->stopped) return r;
    for (int r : ranks)
      if (!seen.contains(r) && wait_of(r)) return r;
    for (int r : ranks)
      if (!seen.contains(r)) return r;
    return -1;
  };
  int r = pick(from);
  std::ostringstream s;
  // A chain longer than the ranks of a few nodes says no more than its start.
  for (int step = 0; r >= 0 && step < 8; ++step) {
    seen.insert(r);
    if (step) s << "; ";
    const RankWait* w = wait_of(r);
    if (w == nullptr) {
      s << "rank " << r << " waits for no other rank in smddp (busy outside it, stuck, or stopped)";
      break;
    }
    if (w->stopped) {
      s << "rank " << r << " (pid " << w->pid << ") is stopped (a signal or a debugger)";
      break;
    }
    s << "rank " << r << " waits in " << ipc::to_string(w->op) << " on communicator " << w->comm << " (operation #"
      << w->seq << ") for ";
    const long secs = std::lround(w->waited_s);
    if (w->waits_for.empty()) {
      s << "the other node(s) to finish their part (" << secs << " s)";
      break;
    }
    s << "rank(s)";
    for (int g : w->waits_for) s << " " << g;
    s << " (" << secs << " s)";
    r = pick(w->waits_for);
    if (r < 0) s << ", which wait for it in turn (a cycle: operations called in another order on some rank)";
  }
  return s.str();
}

WireWaits to_wire(const std::vector<RankWait>& waits) {
  // Stopped ranks first, then the longest waits: those are the ones a chain ends at or passes.
  std::vector<const RankWait*> order;
  for (const auto& w : waits) order.push_back(&w);
  std::stable_sort(order.begin(), order.end(), [](const RankWait* a, const RankWait* b) {
    if (a->stopped != b->stopped) return a->stopped;
    return a->waited_s > b->waited_s;
  });
  WireWaits wire;
  for (const RankWait* w : order) {
    if (wire.count == static_cast<std::uint32_t>(WireWaits::kMaxRanks)) break;
    auto& e = wire.entries[wire.count++];
    e.rank = w->rank;
    e.pid = w->pid;
    e.stopped = w->stopped ? 1 : 0;
    e.op = static_cast<std::uint32_t>(w->op);
    e.comm = w->comm;
    e.seq = w->seq;
    e.waited_ms = static_cast<std::uint32_t>(std::clamp(w->waited_s * 1000.0, 0.0, 4.0e9));
    for (int g : w->waits_for) {
      if (e.n_for == static_cast<std::uint32_t>(WireWaits::kMaxFor)) break;
      e.waits_for[e.n_for++] = g;
    }
  }
  return wire;
}

std::vector<RankWait> from_wire(const WireWaits& wire, int world_size) {
  std::vector<RankWait> out;
  const auto in_world = [&](std::int32_t g) { return g >= 0 && g < world_size; };
  const auto n = std::min<std::uint32_t>(wire.count, WireWaits::kMaxRanks);
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto& e = wire.entries[i];
    if (!in_world(e.rank) || e.op >= static_cast<std::uint32_t>(ipc::kOpTypeCount) ||
        e.n_for > static_cast<std::uint32_t>(WireWaits::kMaxFor))
      continue;
    if (!std::all_of(e.waits_for, e.waits_for + e.n_for, in_world)) continue;
    RankWait w;
    w.rank = e.rank;
    w.pid = e.pid;
    w.stopped = e.stopped != 0;
    w.op = static_cast<ipc::OpType>(e.op);
    w.comm = e.comm;
    w.seq = e.seq;
    w.waited_s = e.waited_ms / 1000.0;
    w.waits_for.assign(e.waits_for, e.waits_for + e.n_for);
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace smddp::daemon
