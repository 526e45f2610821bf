// ClientImpl: host reductions within a node whose ranks split the arithmetic among themselves
// (CompletionKind::Shares, ipc/protocol.hpp), the way shared-memory MPI and NCCL's SHM transport
// do. Every member's input of the chunk is in its arena; each member reduces its share of the
// chunk from all of them into its own region and bumps its shares_reduced, then copies the
// others' shares into its output once their marks say they are reduced (a reduce-scatter by the
// ranks, then the direct-read all-gather).
//
// A Shares completion whose op waits for another member's share does not hold up the
// completions behind it; only the count of reads (sources_done) waits for it, since that count
// runs in ring order (ClientImpl::reads_). Every member reduces its share as soon as it takes
// the completion, without waiting for anything, so no member can wait for ever on a live one.
#include <algorithm>
#include <array>
#include <cstring>
#include <span>

#include "client/client_impl.hpp"
#include "kernels/host/host_reduce.hpp"

namespace smddp::client {

using ipc::OpType;

namespace {

// The members whose shares this one copies: all for allreduce, all at reduce's root.
bool copies_shares(const ipc::SharesHeader& h) {
  return h.op == OpType::AllReduce || (h.op == OpType::Reduce && static_cast<std::int32_t>(h.me) == h.root);
}

}  // namespace

std::optional<std::string> ClientImpl::check_shares(const ipc::CompletionDesc& c, const OpState* op,
                                                    const Inflight* inf) const {
  const auto h = c.shares_header();
  const auto bad = [&](const std::string& why) {
    return std::string(ipc::to_string(h.op)) + ": the smddp daemon sent a share to reduce that " + why;
  };
  if (h.members < 2 || h.members > ipc::kMaxShareMembers || h.me >= h.members)
    return bad("names member " + std::to_string(h.me) + " of " + std::to_string(h.members));
  if (!ipc::reduces(h.op) || !ipc::reduce_op_supported(h.reduce_op, h.dtype)) return bad("is no reduction this rank can run");
  const std::uint64_t e = ipc::dtype_size(h.dtype);
  if (h.count == 0 || h.count > arena_.size() / e) return bad("holds " + std::to_string(h.count) + " elements");
  if (op) {
    const auto& p = op->plan_;
    if (h.op != p.base.op || h.dtype != p.base.dtype || h.reduce_op != p.base.reduce_op ||
        h.members != static_cast<std::uint32_t>(p.group_size) || h.me != static_cast<std::uint32_t>(p.group_rank) ||
        h.count != op->chunk_count(inf->chunk) || (h.op == OpType::Reduce && h.root != p.base.root))
      return bad("is not this rank's call or chunk");
  }
  const std::uint64_t want = h.count * e * (h.op == OpType::ReduceScatter ? h.members : 1);
  for (std::uint32_t q = 0; q < h.members; ++q) {
    const auto s = c.share_input(q);
    if (s.slot < 0 || s.slot >= local_world_size_ || s.bytes != want || s.offset > arena_.size() ||
        s.bytes > arena_.size() - s.offset || c.share_reader(h.members, q).slot != s.slot ||
        c.share_mark(h.members, q).slot != s.slot)
      return bad("does not fit (member " + std::to_string(q) + ": local rank " + std::to_string(s.slot) + ", " +
                 std::to_string(s.bytes) + " bytes at " + std::to_string(s.offset) + "; its input is " +
                 std::to_string(want) + " bytes)");
  }
  const auto mine = c.share_input(h.me);
  if (mine.slot != local_rank_ || (inf && mine.offset != inf->offset))
    return bad("places this rank's input elsewhere than where it staged it");
  return std::nullopt;
}

void ClientImpl::reduce_share_locked(const ipc::CompletionDesc& c, std::byte* out) {
  const auto h = c.shares_header();
  const std::uint64_t e = ipc::dtype_size(h.dtype);
  host_kernels::ReduceParams params;
  params.premul_scale = h.scale;
  params.avg_divisor = static_cast<double>(h.members);
  std::array<const void*, ipc::kMaxShareMembers> inputs{};
  const auto in = [&](std::uint32_t q, std::uint64_t at) {
    const auto s = c.share_input(q);
    return segment_.arena(s.slot).data() + s.offset + at;
  };
  const auto span = std::span<const void* const>(inputs.data(), h.members);
  if (h.op == OpType::ReduceScatter) {
    // Block `me` of every input, straight into the output (nowhere, for an op given up).
    if (!out) return;
    for (std::uint32_t q = 0; q < h.members; ++q) inputs[q] = in(q, h.me * h.count * e);
    host_kernels::host_reduce(h.dtype, h.reduce_op, span, out, h.count, params);
    return;
  }
  // In place, into this rank's own input: nobody else reads that part of it before the mark.
  const auto [lo, hi] = ipc::share_range(h.count, h.members, h.me);
  if (lo == hi) return;
  CopyPool* pool = (hi - lo) * e >= kSplitCopiesFrom ? copy_pool_locked() : nullptr;
  const auto parts = pool ? static_cast<int>(std::min<std::uint64_t>(64, (hi - lo) * e / kCopyPart)) : 1;
  if (parts < 2) {
    for (std::uint32_t q = 0; q < h.members; ++q) inputs[q] = in(q, lo * e);
    host_kernels::host_reduce(h.dtype, h.reduce_op, span, in(h.me, lo * e), hi - lo, params);
    return;
  }
  // In parts over the helpers.
  pool->run(parts, [&](int j) {
    const auto [a, b] = element_part(lo, hi, parts, j);
    if (a >= b) return;
    std::array<const void*, ipc::kMaxShareMembers> part_in{};
    for (std::uint32_t q = 0; q < h.members; ++q) part_in[q] = in(q, a * e);
    host_kernels::host_reduce(h.dtype, h.reduce_op, std::span<const void* const>(part_in.data(), h.members),
                              in(h.me, a * e), b - a, params);
  });
}

void ClientImpl::share_reduced_locked(const ipc::CompletionDesc& c) {
  const auto h = c.shares_header();
  slot_.shares_reduced.fetch_add(1, std::memory_order_seq_cst);
  if (h.op == OpType::ReduceScatter) return;  // nobody waits for it
  for (std::uint32_t q = 0; q < h.members; ++q) {
    const int s = c.share_input(q).slot;
    if (s == local_rank_ || (h.op == OpType::Reduce && static_cast<std::int32_t>(q) != h.root)) continue;
    segment_.slot(s).client_bell.ring();
  }
}

ClientImpl::ShareLook ClientImpl::look_shares(const ipc::CompletionDesc& c) const {
  const auto h = c.shares_header();
  if (!copies_shares(h)) return {ShareLook::Ready};
  ShareLook look{ShareLook::Ready};
  for (std::uint32_t q = 0; q < h.members; ++q) {
    if (q == h.me) continue;
    const auto mark = c.share_mark(h.members, q);
    const auto& peer = segment_.slot(mark.slot);
    if (peer.shares_reduced.load(std::memory_order_acquire) >= mark.seq) continue;
    const auto st = static_cast<ipc::SlotState>(peer.state.load(std::memory_order_acquire));
    if (st == ipc::SlotState::Exited || st == ipc::SlotState::Failed) return {ShareLook::Gone, {mark.slot}};
    look.kind = ShareLook::Wait;
    look.late.push_back(mark.slot);
  }
  return look;
}

void ClientImpl::copy_shares_locked(OpState& op, const Inflight& inf, const ipc::CompletionDesc& c) {
  const auto h = c.shares_header();
  if (!copies_shares(h)) return;
  const auto& p = op.plan_;
  const std::uint64_t e = ipc::dtype_size(h.dtype);
  const std::uint64_t off = inf.chunk * p.chunk;
  std::array<CopyJob, ipc::kMaxShareMembers> jobs;
  std::size_t n = 0;
  for (std::uint32_t q = 0; q < h.members; ++q) {
    const auto [lo, hi] = ipc::share_range(h.count, h.members, q);
    if (lo == hi) continue;
    const auto s = c.share_input(q);
    jobs[n++] = {p.out + (off + lo) * e, segment_.arena(s.slot).data() + s.offset + lo * e, (hi - lo) * e};
  }
  copy_split(h.count * e >= kSplitCopiesFrom ? copy_pool_locked() : nullptr, std::span<const CopyJob>(jobs.data(), n));
}

void ClientImpl::start_share_locked(const ipc::CompletionDesc& c, Deferred& callbacks) {
  ShareWait w{c, Inflight{nullptr, 0, kNoRegion, 0}, 0};
  if (auto it = inflight_.find(c.request_id); it != inflight_.end()) {
    w.inf = std::move(it->second);
    inflight_.erase(it);
  }
  OpState* op = w.inf.op.get();
  const bool live = op && !op->done() && op->status_ == Status::Ok;  // a done op's outcome stays
  std::optional<std::string> why = check_shares(c, live ? op : nullptr, live ? &w.inf : nullptr);
  if (!why) {
    try {
      // An op given up still reduces its share: the others wait for it.
      reduce_share_locked(c, live && c.shares_header().op == OpType::ReduceScatter
                                 ? op->plan_.out + w.inf.chunk * op->plan_.chunk * ipc::dtype_size(op->plan_.base.dtype)
                                 : nullptr);
    } catch (const std::exception& e) {
      why = std::string(ipc::to_string(c.shares_header().op)) + ": reducing this rank's share failed: " + e.what();
    }
  }
  // Counted even when it failed: the numbering must stay in step with the daemon's.
  share_reduced_locked(c);
  if (why && live) {
    op->status_ = Status::Internal;
    op->error_ = *why;
    op->next_ = op->nchunks_;  // submit no more of it
  }
  // Every member reads this rank's region of the chunk: it is theirs until they are all done.
  const auto h = c.shares_header();
  const std::uint32_t n = std::min<std::uint32_t>(h.members, ipc::kMaxShareMembers);
  Read r{false, {}, {}, w.inf.offset};
  for (std::uint32_t q = 0; q < n; ++q) {
    r.owners.push_back(c.share_input(q).slot);
    r.readers.push_back(c.share_reader(n, q));
  }
  w.read = note_read_locked(std::move(r));
  // A share whose peers have reduced theirs ends at once: only one that must wait is kept.
  if (end_share_locked(w, callbacks)) return;
  share_waits_.push_back(std::move(w));
  share_waiting_.store(true, std::memory_order_release);
}

bool ClientImpl::share_can_end(const ShareWait& w) const {
  const OpState* op = w.inf.op.get();
  if (!op || op->done() || op->status_ != Status::Ok) return true;
  return look_shares(w.c).kind != ShareLook::Wait || segment_.header().job_failed.load(std::memory_order_acquire) ||
         Clock::now() >= op->deadline_ - kBackstop;
}

bool ClientImpl::end_share_locked(ShareWait& w, Deferred& callbacks) {
  if (!share_can_end(w)) return false;
  OpState* op = w.inf.op.get();
  if (op && !op->done() && op->status_ == Status::Ok) {
    const ShareLook look = look_shares(w.c);
    auto& hdr = segment_.header();
    if (look.kind == ShareLook::Ready) {
      copy_shares_locked(*op, w.inf, w.c);
    } else {
      // The job failed, a member left, or the op's own timeout passed (the daemon answered long
      // ago: its waits' backstop for a daemon that never answers is not the one to keep).
      op->next_ = op->nchunks_;
      if (hdr.job_failed.load(std::memory_order_acquire)) {
        op->status_ = Status::PeerFailed;
        op->error_ = std::string(hdr.job_error, ::strnlen(hdr.job_error, sizeof hdr.job_error));
        if (look.kind == ShareLook::Wait) op->error_ += "; " + waited_for_shares(*op, look.late);
      } else if (look.kind == ShareLook::Gone) {
        op->status_ = Status::PeerFailed;
        op->error_ = "smddp " + std::string(ipc::to_string(op->plan_.base.op)) + " on communicator " +
                     std::to_string(op->plan_.base.comm_id) + ": rank " +
                     std::to_string(segment_.slot(look.late.front()).rank) + " left before reducing its share of it";
      } else {
        op->status_ = Status::Timeout;
        op->error_ = waited_for_shares(*op, look.late) + " within the timeout (stopped or stalled?)";
      }
    }
  }
  read_done_locked(w.read);
  if (op) {
    callbacks.released.push_back(w.inf.op);
    --op->inflight_;
    ++op->finished_;
    if (op->inflight_ == 0 && (op->finished_ == op->nchunks_ || op->status_ != Status::Ok)) finish_locked(*op, callbacks);
  }
  return true;
}

void ClientImpl::end_shares_locked(Deferred& callbacks) {
  if (share_waits_.empty()) return;
  std::erase_if(share_waits_, [&](ShareWait& w) { return end_share_locked(w, callbacks); });
  share_waiting_.store(!share_waits_.empty(), std::memory_order_release);
}

std::string ClientImpl::waited_for_shares(const OpState& op, const std::vector<int>& late) const {
  std::string who;
  for (int s : late) who += (who.empty() ? "" : " ") + std::to_string(segment_.slot(s).rank);
  std::string why = "smddp " + std::string(ipc::to_string(op.plan_.base.op)) + " on communicator " +
                    std::to_string(op.plan_.base.comm_id) + " (operation #" + std::to_string(op.plan_.base.seq) +
                    "): rank(s) " + who + " did not reduce their share of it";
  for (int s : late)
    if (const int pid = segment_.slot(s).pid; ipc::process_stopped(pid))
      why += "; rank " + std::to_string(segment_.slot(s).rank) + " (pid " + std::to_string(pid) +
             ") is stopped (a signal or a debugger)";
  return why;
}

bool ClientImpl::completions_ready() {
  if (!slot_.completions.empty()) return true;
  if (!share_waiting_.load(std::memory_order_acquire)) return false;
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return true;  // busy: look under the lock
  return std::any_of(share_waits_.begin(), share_waits_.end(), [&](const ShareWait& w) { return share_can_end(w); });
}

}  // namespace smddp::client
