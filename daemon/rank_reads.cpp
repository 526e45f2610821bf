// The daemon's side of host collectives whose ranks read each other's arenas within a node:
// byte-moving ones, whose ranks copy their outputs (Sources, daemon/arena_sources.hpp), and
// reductions, whose ranks each reduce a share of the chunk (Shares, ipc/protocol.hpp). The
// daemon matches and checks the chunk, tells each member what to read, and numbers the reads,
// so that a member knows when its region is free again and when another's share is ready.
// It stays off the data path, but watches the shares: a member that does not reduce its share
// holds the others up, and shows as a stall.
#include <algorithm>
#include <map>
#include <utility>

#include "daemon/daemon.hpp"

namespace smddp::daemon {

using ipc::OpType;

namespace {
// Bumps slot's entry of a per-slot count and returns its new value.
std::uint64_t next_number(std::vector<std::uint64_t>& counts, int slot) {
  const auto s = static_cast<std::size_t>(slot);
  if (counts.size() <= s) counts.resize(s + 1);
  return ++counts[s];
}
}  // namespace

bool Daemon::send_sources(const Match& m) {
  if (!config_.direct_read_min_bytes) return false;
  const auto sources = arena_sources(m, *config_.direct_read_min_bytes);
  if (!sources) return false;
  ++collectives_done_;
  ++direct_read_ops_;
  // Every member's copy of this chunk, numbered in its own count: a member's region is free
  // again once every reader's count reached its number.
  std::vector<ipc::SourceReader> readers;
  for (const auto& p : m.posted) {
    ipc::SourceReader x;
    x.slot = p.slot;
    x.seq = next_number(sources_sent_, p.slot);
    readers.push_back(x);
  }
  for (std::size_t r = 0; r < m.posted.size(); ++r) {
    const Posted& p = m.posted[r];
    const auto& mine = (*sources)[r];
    ipc::CompletionDesc c;
    address(c, p, ipc::CompletionKind::Sources);
    ipc::SourcesHeader h;
    h.count = static_cast<std::uint32_t>(mine.size());
    h.readers = static_cast<std::uint32_t>(readers.size());
    c.set_sources_header(h);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      c.set_source(i, mine[i]);
      bytes_moved_ += mine[i].bytes;
      bw_window_bytes_ += mine[i].bytes;
    }
    for (std::size_t i = 0; i < readers.size(); ++i) c.set_source_reader(mine.size(), i, readers[i]);
    auto& info = ranks_[static_cast<std::size_t>(p.slot)];
    if (info.pending) --info.pending;
    if (!push_completion(p.slot, c)) break;  // the job failed
  }
  return true;
}

bool Daemon::send_shares(const Match& m) {
  if (!split_reduce_min_ || m.posted.size() < 2 || m.posted.size() > ipc::kMaxShareMembers) return false;
  const auto& d0 = m.posted.front().desc;
  if (!ipc::reduces(d0.op) || !ipc::reduce_op_supported(d0.reduce_op, d0.dtype)) return false;  // the daemon says why
  if (!std::all_of(m.posted.begin(), m.posted.end(),
                   [](const Posted& p) { return (p.desc.flags & ipc::kFlagReadSources) != 0; }))
    return false;
  const auto n = static_cast<std::uint32_t>(m.posted.size());
  const std::uint64_t cb = d0.chunk_count * ipc::dtype_size(d0.dtype);
  const std::uint64_t in_bytes = d0.op == OpType::ReduceScatter ? cb * n : cb;
  // Members of a reduce-scatter never wait for each other's shares: less work than the
  // daemon's at every size. Those of an allreduce or a reduce do, which costs more than it
  // saves on small chunks (measured: docs/performance.md).
  const std::uint64_t min = d0.op == OpType::ReduceScatter ? 0 : *split_reduce_min_;
  if (cb == 0 || in_bytes < min) return false;
  ++collectives_done_;
  ++split_reduce_ops_;
  ipc::SharesHeader h;
  h.members = n;
  h.count = d0.chunk_count;
  h.scale = d0.scale;
  h.root = d0.root;
  h.op = d0.op;
  h.dtype = d0.dtype;
  h.reduce_op = d0.reduce_op;
  ipc::CompletionDesc c;
  c.kind = ipc::CompletionKind::Shares;
  const auto now = Clock::now();
  for (std::uint32_t q = 0; q < n; ++q) {
    const Posted& p = m.posted[q];
    ipc::ArenaSource in;
    in.slot = p.slot;
    in.offset = p.desc.input.offset;
    in.bytes = in_bytes;
    c.set_share_input(q, in);
    ipc::SourceReader reader;
    reader.slot = p.slot;
    reader.seq = next_number(sources_sent_, p.slot);
    c.set_share_reader(n, q, reader);
    ipc::SourceReader mark;
    mark.slot = p.slot;
    mark.seq = next_number(shares_sent_, p.slot);
    c.set_share_mark(n, q, mark);
    shares_due_.push_back(ShareDue{p.slot, mark.seq, d0.comm_id, d0.seq, d0.op, now});
  }
  // What each member's output receives, as the daemon's own runs count it.
  const std::uint64_t out_bytes = d0.op == OpType::Reduce ? cb : cb * n;
  bytes_moved_ += out_bytes;
  bw_window_bytes_ += out_bytes;
  for (std::uint32_t r = 0; r < n; ++r) {
    const Posted& p = m.posted[r];
    address(c, p, ipc::CompletionKind::Shares);
    h.me = r;
    c.set_shares_header(h);
    auto& info = ranks_[static_cast<std::size_t>(p.slot)];
    if (info.pending) --info.pending;
    if (!push_completion(p.slot, c)) break;  // the job failed
  }
  return true;
}

bool Daemon::share_settled(const ShareDue& d) const {
  const auto& slot = segment_.slot(d.slot);
  const auto st = static_cast<ipc::SlotState>(slot.state.load(std::memory_order_acquire));
  // The rank's own count: trusted for reports only. A rank that left is the failure's news.
  return slot.shares_reduced.load(std::memory_order_acquire) >= d.mark || st == ipc::SlotState::Exited ||
         st == ipc::SlotState::Failed;
}

StallInfo Daemon::stall_of(const ShareDue& d, Clock::time_point now) const {
  return StallInfo{d.comm_id, d.seq, d.op, std::chrono::duration<double>(now - d.since).count(), {segment_.slot(d.slot).rank}};
}

void Daemon::watch_shares(Clock::time_point now, std::vector<StallInfo>& new_stalls) {
  std::erase_if(shares_due_, [&](const ShareDue& d) { return share_settled(d); });
  std::vector<StallInfo> fresh;
  for (auto& d : shares_due_) {
    if (d.warned || now - d.since < config_.stall_warning) continue;
    d.warned = true;
    fresh.push_back(stall_of(d, now));
  }
  for (auto& s : merge_stalls(std::move(fresh))) new_stalls.push_back(std::move(s));
}

std::vector<StallInfo> Daemon::share_stalls(Clock::time_point now) const {
  std::vector<StallInfo> late;
  for (const auto& d : shares_due_)
    if (now - d.since >= config_.stall_warning && !share_settled(d)) late.push_back(stall_of(d, now));
  return merge_stalls(std::move(late));
}

std::vector<StallInfo> Daemon::merge_stalls(std::vector<StallInfo> stalls) {
  // One line per operation (its chunks and late members together), the longest wait.
  std::map<std::pair<std::uint64_t, std::uint64_t>, StallInfo> by_op;
  for (auto& s : stalls) {
    auto [it, added] = by_op.try_emplace({s.comm_id, s.seq}, s);
    if (added) continue;
    it->second.waiting_s = std::max(it->second.waiting_s, s.waiting_s);
    for (int g : s.missing_global_ranks)
      if (std::find(it->second.missing_global_ranks.begin(), it->second.missing_global_ranks.end(), g) ==
          it->second.missing_global_ranks.end())
        it->second.missing_global_ranks.push_back(g);
  }
  std::vector<StallInfo> out;
  for (auto& [key, s] : by_op) {
    std::sort(s.missing_global_ranks.begin(), s.missing_global_ranks.end());
    out.push_back(std::move(s));
  }
  return out;
}

std::uint64_t Daemon::shares_behind() const {
  std::uint64_t behind = 0;
  for (std::size_t s = 0; s < shares_sent_.size(); ++s) {
    if (ranks_[s].exited) continue;
    const auto done = segment_.slot(static_cast<int>(s)).shares_reduced.load(std::memory_order_acquire);
    if (done < shares_sent_[s]) behind += shares_sent_[s] - done;  // display only
  }
  return behind;
}

}  // namespace smddp::daemon
