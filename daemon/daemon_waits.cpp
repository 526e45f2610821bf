// This node's part of the job's wait-for graph (wait_for.hpp) and the text a timeout gets from it.
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "daemon/daemon.hpp"

namespace smddp::daemon {

namespace {

// Updated as often as the beats go out. Every wait counts, however short: a rank left out would
// read as waiting for nobody, the answer a chain ends at.
constexpr auto kWaitsEvery = std::chrono::milliseconds(200);

}  // namespace

void Daemon::add_share_waits(Clock::time_point now, std::vector<RankWait>& out) const {
  // The members of a split reduction whose shares are in wait for the ranks that owe theirs.
  struct Owed {
    ipc::OpType op;
    Clock::time_point since;
    std::set<int> owing;
  };
  std::map<std::pair<std::uint64_t, std::uint64_t>, Owed> by_op;
  for (const auto& d : shares_due_) {
    if (share_settled(d)) continue;
    auto [it, added] = by_op.try_emplace({d.comm_id, d.seq}, Owed{d.op, d.since, {}});
    it->second.since = std::min(it->second.since, d.since);
    it->second.owing.insert(segment_.slot(d.slot).rank);
  }
  for (const auto& [key, owed] : by_op) {
    const Communicator* comm = matcher_.find(key.first);
    if (!comm) continue;
    const std::vector<int> owing(owed.owing.begin(), owed.owing.end());
    for (int g = 0; g < comm->size(); ++g) {
      const int global = comm->global_ranks[static_cast<std::size_t>(g)];
      if (comm->slots[static_cast<std::size_t>(g)] < 0 || owed.owing.contains(global)) continue;
      out.push_back({global, false, 0, owed.op, key.first, key.second,
                     std::chrono::duration<double>(now - owed.since).count(), owing});
    }
  }
}

void Daemon::update_waits(Clock::time_point now) {
  if (now - waits_updated_ < kWaitsEvery) return;
  waits_updated_ = now;
  std::vector<RankWait> waits;
  matcher_.add_waits(now, waits);
  if (engine_) engine_->add_waits(now, waits);
  add_share_waits(now, waits);
  for (std::size_t s = 0; s < ranks_.size(); ++s) {
    if (ranks_[s].exited) continue;
    const int pid = ranks_[s].pid > 0 ? ranks_[s].pid : segment_.slot(static_cast<int>(s)).pid;
    if (ipc::process_stopped(pid))
      waits.push_back({layout_.node_id * layout_.nproc_per_node + static_cast<int>(s), true, pid});
  }
  local_waits_ = longest_per_rank(std::move(waits));
  if (engine_) engine_->set_waits(local_waits_);
}

std::string Daemon::explain_wait(const std::vector<int>& from) const {
  if (engine_) return engine_->explain_wait(from);
  return daemon::explain_wait(from, [this](int g) { return find_wait(local_waits_, g); });
}

std::vector<int> Daemon::unposted_local_ranks(const Match& m) {
  std::vector<int> out;
  if (!m.comm || m.posted.empty()) return out;
  const auto& d = m.posted.front().desc;
  if (d.op == ipc::OpType::Send || d.op == ipc::OpType::Recv) {
    if (d.root >= 0 && d.root < m.comm->size()) out.push_back(m.comm->global_ranks[static_cast<std::size_t>(d.root)]);
    return out;
  }
  std::vector<char> posted(static_cast<std::size_t>(m.comm->size()), 0);
  for (const auto& p : m.posted)
    if (p.group_rank >= 0 && p.group_rank < m.comm->size()) posted[static_cast<std::size_t>(p.group_rank)] = 1;
  for (int g = 0; g < m.comm->size(); ++g)
    if (!posted[static_cast<std::size_t>(g)] && m.comm->slots[static_cast<std::size_t>(g)] >= 0)
      out.push_back(m.comm->global_ranks[static_cast<std::size_t>(g)]);
  return out;
}

}  // namespace smddp::daemon
