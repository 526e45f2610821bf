// ClientImpl: host collectives that only move bytes, copied by this rank straight from the
// members' arenas (CompletionKind::Sources), and the regions held for the other readers (of
// these and of the shares of reductions, arena_shares.cpp).
#include <algorithm>
#include <array>
#include <cstring>
#include <span>

#include "client/client_impl.hpp"

namespace smddp::client {

std::optional<std::string> ClientImpl::copy_sources_locked(OpState& op, const Inflight& inf,
                                                           const ipc::CompletionDesc& c) {
  const auto& p = op.plan_;
  const auto h = c.sources_header();
  const std::uint64_t e = ipc::dtype_size(p.base.dtype);
  const std::uint64_t blk = op.chunk_count(inf.chunk) * e;
  const std::uint64_t off = inf.chunk * p.chunk;
  const auto bad = [&](const std::string& why) {
    return std::string(ipc::to_string(p.base.op)) + ": the smddp daemon named arena sources that " + why;
  };
  if (h.count != p.out_blocks || h.count > ipc::kMaxSourceMembers)
    return bad("list " + std::to_string(h.count) + " blocks where this rank's output has " +
               std::to_string(p.out_blocks) + " per chunk");
  if (h.readers > ipc::kMaxSourceMembers)
    return bad("name " + std::to_string(h.readers) + " readers, more than a completion holds");
  for (std::uint32_t b = 0; b < h.count; ++b) {
    const auto s = c.source(b);
    if (s.slot < 0 || s.slot >= local_world_size_ || s.bytes != blk || s.offset > arena_.size() ||
        s.bytes > arena_.size() - s.offset)
      return bad("do not fit this chunk (block " + std::to_string(b) + ": local rank " + std::to_string(s.slot) +
                 ", " + std::to_string(s.bytes) + " bytes at " + std::to_string(s.offset) + "; a block is " +
                 std::to_string(blk) + " bytes)");
  }
  std::array<CopyJob, ipc::kMaxSourceMembers> jobs;
  for (std::uint32_t b = 0; b < h.count; ++b) {
    const auto s = c.source(b);
    jobs[b] = {p.out + (b * p.user_stride + off) * e, segment_.arena(s.slot).data() + s.offset, blk};
  }
  copy_split(h.count * blk >= kSplitCopiesFrom ? copy_pool_locked() : nullptr,
             std::span<const CopyJob>(jobs.data(), h.count));
  return std::nullopt;
}

void ClientImpl::sources_copied_locked(const ipc::CompletionDesc& c, std::uint64_t region) {
  const auto h = c.sources_header();
  const std::uint32_t count = std::min<std::uint32_t>(h.count, ipc::kMaxSourceMembers);
  const std::uint32_t readers = std::min<std::uint32_t>(h.readers, ipc::kMaxSourceMembers);
  Read r{true, {}, {}, region};
  for (std::uint32_t b = 0; b < count; ++b) r.owners.push_back(c.source(b).slot);
  for (std::uint32_t i = 0; i < readers; ++i) r.readers.push_back(c.source_reader(count, i));
  note_read_locked(std::move(r));
}

std::uint64_t ClientImpl::note_read_locked(Read r) {
  const std::uint64_t number = reads_counted_ + reads_.size();
  reads_.push_back(std::move(r));
  count_reads_locked();
  return number;
}

void ClientImpl::read_done_locked(std::uint64_t number) {
  if (number >= reads_counted_ && number - reads_counted_ < reads_.size()) reads_[number - reads_counted_].done = true;
  count_reads_locked();
}

void ClientImpl::count_reads_locked() {
  while (!reads_.empty() && reads_.front().done) {
    Read& r = reads_.front();
    // Our reads are done before the count says so. An owner that waits for space hears of it.
    slot_.sources_done.fetch_add(1, std::memory_order_seq_cst);
    ++reads_counted_;
    for (const int owner : r.owners) {
      if (owner == local_rank_ || owner < 0 || owner >= local_world_size_) continue;
      auto& o = segment_.slot(owner);
      if (o.waits_for_readers.load(std::memory_order_seq_cst)) o.client_bell.ring();
    }
    if (r.region != kNoRegion) {
      ReadHeld held{r.region, {}};
      for (const auto& x : r.readers)
        if (x.slot >= 0 && x.slot < local_world_size_ && x.slot != local_rank_) held.readers.push_back(x);
      if (held.readers.empty()) alloc_.free(r.region);
      else read_held_.push_back(std::move(held));
    }
    reads_.pop_front();
  }
}

bool ClientImpl::readers_done(const ReadHeld& h) const {
  return std::all_of(h.readers.begin(), h.readers.end(), [&](const ipc::SourceReader& x) {
    const auto& peer = segment_.slot(x.slot);
    // A reader that left reads nothing any more.
    const auto st = static_cast<ipc::SlotState>(peer.state.load(std::memory_order_acquire));
    return peer.sources_done.load(std::memory_order_acquire) >= x.seq || st == ipc::SlotState::Exited ||
           st == ipc::SlotState::Failed;
  });
}

bool ClientImpl::reap_read_held_locked() {
  const auto before = read_held_.size();
  std::erase_if(read_held_, [&](const ReadHeld& h) {
    const bool done = readers_done(h);
    if (done) alloc_.free(h.offset);
    return done;
  });
  if (read_held_.empty()) slot_.waits_for_readers.store(0, std::memory_order_relaxed);  // nothing to wait for
  return read_held_.size() != before;
}

bool ClientImpl::held_regions_free() {
  if (!slot_.waits_for_readers.load(std::memory_order_acquire)) return false;
  std::unique_lock lk(mu_, std::try_to_lock);
  // Busy: say maybe, so the caller looks under the lock. A false here could sleep through the
  // reader's count (it rang nobody: it saw no waiter) until the next slice.
  if (!lk.owns_lock()) return true;
  return std::any_of(read_held_.begin(), read_held_.end(), [&](const ReadHeld& h) { return readers_done(h); });
}
}  // namespace smddp::client
