// The host fast path as the daemon sees it (ipc::kFlagHostFast): lanes for communicators all on
// this node, the ledger that takes their requests, and the counts and checks of what the ranks
// ran among themselves.
#include <algorithm>
#include <string>

#include "daemon/daemon.hpp"
#include "ipc/validate.hpp"

namespace smddp::daemon {

bool Daemon::post_host_fast(int slot, const ipc::RequestDesc& d, Clock::time_point now) {
  auto& info = ranks_[static_cast<std::size_t>(slot)];
  if (!info.fast_ledger || info.fast_comm != d.comm_id) {
    info.fast_ledger = matcher_.fast_ledger(d.comm_id);
    info.fast_comm = d.comm_id;
  }
  FastLedger* ledger = info.fast_ledger;
  if (!ledger) return false;
  const int g = ledger->group_rank_of(slot);
  if (g < 0) return false;
  ipc::ValidationContext ctx;
  ctx.arena_bytes = segment_.header().arena_bytes;
  ctx.event_count = static_cast<int>(segment_.slot(slot).event_count.load(std::memory_order_acquire));
  ctx.group_size = ledger->comm().size();
  ctx.group_rank = g;
  if (ipc::validate_request(d, ctx)) return false;
  bool ran = false;
  auto matches = matcher_.post_host_fast(*ledger, slot, g, d, now, ran);
  if (ran) count_host_fast(ledger->ran(), ledger->comm());
  if (!matches.empty()) resolve(std::move(matches));
  return true;
}

void Daemon::count_host_fast(const FastLedger::Ran& ran, const Communicator& comm) {
  ++collectives_done_;
  ++host_fast_ops_;
  if (ran.single_copy) ++host_single_copy_ops_;
  // The bytes the members' outputs received, as the daemon's own runs count them.
  bytes_moved_ += ran.output_bytes;
  bw_window_bytes_ += ran.output_bytes;
  // No answer: the ranks finished it already, and an answer per operation would fill the
  // completion ring of a rank that posts many and then calls nothing for a while.
  for (int s : comm.slots) {
    if (s < 0) continue;
    auto& info = ranks_[static_cast<std::size_t>(s)];
    if (info.pending) --info.pending;
  }
}

int Daemon::take_fast_lane(const Communicator& comm) {
  if (!config_.host_fast_bytes || comm.local_member_count() != comm.size()) return -1;
  if (const FastLedger* ledger = matcher_.fast_ledger(comm.id)) return ledger->lane();
  std::uint32_t taken = 0;
  for (int s : comm.slots) taken |= fast_lanes_taken_[static_cast<std::size_t>(s)];
  for (int lane = 0; lane < ipc::kFastLanes; ++lane) {
    if (taken & (1u << lane)) continue;
    for (int s : comm.slots) fast_lanes_taken_[static_cast<std::size_t>(s)] |= 1u << lane;
    matcher_.open_fast_lane(comm.id, lane);
    return lane;
  }
  return -1;  // its members' lanes are all taken: the daemon path
}

std::optional<std::string> Daemon::check_host_fast(const Match& m) const {
  const std::string op(ipc::to_string(m.posted.front().desc.op));
  if (!std::all_of(m.posted.begin(), m.posted.end(), [](const Posted& p) { return (p.desc.flags & ipc::kFlagHostFast) != 0; })) {
    std::string who;
    for (const auto& p : m.posted)
      who += (who.empty() ? "" : ", ") + std::string("rank ") + std::to_string(segment_.slot(p.slot).rank) +
             ((p.desc.flags & ipc::kFlagHostFast) ? " fast" : " through the daemon");
    return "smddp " + op + ": ranks disagree on the host fast path (" + who +
           "); a rank turns it off for a communicator after a failed fast collective, and every rank must pass "
           "host tensors of the same size";
  }
  if (static_cast<int>(m.posted.size()) != m.comm->size())
    return "smddp " + op + ": the host fast path is for groups within one node (communicator " +
           std::to_string(m.comm->id) + ")";
  const auto& p0 = m.posted.front();
  if (std::any_of(m.posted.begin(), m.posted.end(), [&](const Posted& p) { return p.desc.wait_value != p0.desc.wait_value; })) {
    std::string who;
    for (const auto& p : m.posted)
      who += (who.empty() ? "" : ", ") + std::string("rank ") + std::to_string(segment_.slot(p.slot).rank) + " #" +
             std::to_string(p.desc.wait_value);
    return "smddp " + op + ": ranks numbered this host fast-path collective differently (" + who +
           "); their fast cells paired different operations";
  }
  return std::nullopt;
}

}  // namespace smddp::daemon
