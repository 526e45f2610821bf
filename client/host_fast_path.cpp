// ClientImpl: the host fast path (ipc::kFlagHostFast). A small collective of a group within
// this node does not wait for the daemon. Each member writes its input and its call into its
// fast cell and publishes the op's number; once every member published, each checks that the
// calls agree and computes its own output from the cells (client/host_fast.hpp). It also posts
// a request that the daemon only matches and counts, without waking it. The daemon answers it
// only with an error (the members disagree, a rank died, a timeout), which fails the op if it
// has not finished yet.
//
// Cells are reused every other op of a lane (ipc/segment.hpp): a member publishes number k
// only once every member's fast_done reached k - 2, and reads its lane's ops in order. A member
// whose op failed marks its lane given up there; the others then stop waiting for its cells.
//
// By single copy (OpPlan::fast_single_copy; collectives that only move bytes, from a size on) a
// member publishes its input's address instead of the bytes, the others read it from its process
// (process_vm_readv), and it returns only once every member's fast_done reached k: until then its
// input is being read. A reader that finds the owner gave up at k after reading fails too: the
// owner may have returned, and its caller written over the input, during the read.
//
// An all-reduce by single copy (beyond the cells; host_fast::single_copy_reduce) takes two
// phases: each member reduces its share of every member's input into its own output and marks
// it (FastDone::reduced), then, once every member's mark reached k, reads the others' shares
// from their outputs and publishes k in fast_done. Its output's address is in its cell too. An
// in-place member writes share s of its tensor only once member s, the only other reader of it,
// marked its share: done reading.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>

#include "client/client_impl.hpp"
#include "client/host_fast.hpp"
#include "ipc/prefetch.hpp"

namespace smddp::client {

namespace {

std::string rank_of_slot(const ipc::Segment& seg, int slot) { return std::to_string(seg.slot(slot).rank); }

// A single-copy read whose owner gave up meanwhile: the owner's failure, not this rank's.
struct OwnerGaveUp : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An all-reduce by single copy: two phases (reduce a share, read the others').
bool by_shares(const OpPlan& p) { return p.fast_single_copy && p.base.op == ipc::OpType::AllReduce; }

}  // namespace

bool ClientImpl::submit_fast_locked(const std::shared_ptr<OpState>& op, Deferred& callbacks) {
  note_order_locked(op);
  fast_.push_back(op);
  fast_count_.store(fast_.size(), std::memory_order_relaxed);
  ++active_;
  progress_locked(callbacks);
  return op->fast_published_;
}

void ClientImpl::ring_members(const OpPlan& p) const {
  // Where the ranks have cores of their own only members that sleep on their bell (or are about
  // to) are rung: a ring of every bell cost a locked add on a line the other members' rings take
  // too (95 ns an op with 2 ranks, 400 with 4, in a probe of the exchange alone). Where they
  // share cores (they yield between polls) ringing every member measured faster (1.2 against
  // 1.3-1.6 us an 8 B all-reduce of 2 ranks on 2 vCPUs; why is not known).
  const bool every = yield_between_polls_;
  if (!every) ipc::Doorbell::order_before_sleeper_checks();  // this rank's writes come first
  for (int s : p.comm_state->fast_slots) {
    if (s == local_rank_) continue;
    auto& bell = segment_.slot(s).client_bell;
    if (every || bell.has_sleepers()) bell.ring();
  }
}

bool ClientImpl::member_done(int slot, int lane, std::uint64_t k) const {
  // The mark the member's cell of k + 1 carried (any cell of it carries a lower bound of its
  // mark, so a stale or half-written one only sends this to the mark itself). 32 bits: the
  // members' numbers on a lane stay within a few of each other.
  const auto then = segment_.fast_cell(slot, lane, k + 1).done_then.load(std::memory_order_acquire);
  if (static_cast<std::int32_t>(then - static_cast<std::uint32_t>(k)) >= 0) return true;
  return segment_.slot(slot).fast_done[lane].k.load(std::memory_order_acquire) >= k;
}

void ClientImpl::fail_fast_locked(OpState& op, Status s, const std::string& why, Deferred& callbacks) {
  const int lane = op.plan_.fast_lane;
  const std::uint64_t k = op.plan_.fast_k;
  if (op.status_ == Status::Ok) {
    op.status_ = s;
    op.error_ = why;
  }
  // The others may wait for this rank's cells of this number and later ones: they never come.
  auto& given_up = slot_.fast_done[lane].given_up;
  if (const auto g = given_up.load(std::memory_order_relaxed); g == 0 || g > k)
    given_up.store(k, std::memory_order_release);
  ring_members(op.plan_);
  finish_locked(op, callbacks);
  for (auto& later : fast_) {
    if (later->done() || later->plan_.fast_lane != lane || later->plan_.fast_k <= k) continue;
    later->status_ = s;
    later->error_ = "an earlier collective of this communicator failed on the host fast path: " + why;
    finish_locked(*later, callbacks);
  }
}

ClientImpl::FastLook ClientImpl::look_fast_locked(const OpState& op) const {
  const OpPlan& p = op.plan_;
  const int lane = p.fast_lane;
  const std::uint64_t k = p.fast_k;
  // Member `s` stops a wait that needs its number `upto` if it gave the lane up at or before it.
  const auto blocked_by = [&](int s, std::uint64_t upto) {
    const auto g = segment_.slot(s).fast_done[lane].given_up.load(std::memory_order_acquire);
    return g != 0 && g <= upto ? FastLook{FastLook::PeerGaveUp, s, g} : FastLook{FastLook::Wait};
  };
  if (!op.fast_published_) {
    // This rank gave the lane up at an earlier op (an op issued while that failure was being
    // handled still got a number on it): it can never publish.
    if (const auto g = slot_.fast_done[lane].given_up.load(std::memory_order_relaxed); g != 0 && g < k)
      return {FastLook::SelfGaveUp, local_rank_, g};
    if (fast_published_[static_cast<std::size_t>(lane)] != k - 1) return {FastLook::Wait};  // its lane's earlier op first
    if (!deps_done(op)) return {FastLook::Wait};
    // This rank's cell last held number k - 2: every member must be done reading it.
    if (k > 2)
      for (int s : p.comm_state->fast_slots)
        if (!member_done(s, lane, k - 2)) return blocked_by(s, k - 2);
    return {FastLook::Publish};
  }
  if (op.fast_mismatch_) return {FastLook::Wait};  // the daemon's answer decides
  if (op.fast_reduced_ && !op.fast_read_) {
    // Every member's share must be reduced before this rank reads it.
    for (int s : p.comm_state->fast_slots)
      if (segment_.slot(s).fast_done[lane].reduced.load(std::memory_order_acquire) < k) return blocked_by(s, k);
    return {FastLook::Gather};
  }
  if (op.fast_read_) {
    // Single copy: the others read this rank's input until their marks reach k. One that gave
    // the lane up at or before k reads no more.
    for (int s : p.comm_state->fast_slots) {
      const auto& done = segment_.slot(s).fast_done[lane];
      const auto g = done.given_up.load(std::memory_order_acquire);
      if (done.k.load(std::memory_order_acquire) < k && (g == 0 || g > k)) return {FastLook::Wait};
    }
    return {FastLook::Finish};
  }
  // Read in order: this rank finished every earlier op of the lane.
  if (slot_.fast_done[lane].k.load(std::memory_order_relaxed) != k - 1) return {FastLook::Wait};
  if (const int s = missing_cell(p); s >= 0) return blocked_by(s, k);
  return {FastLook::Read};
}

int ClientImpl::missing_cell(const OpPlan& p) const {
  for (int s : p.comm_state->fast_slots)
    if (segment_.fast_cell(s, p.fast_lane, p.fast_k).tag.load(std::memory_order_acquire) != p.fast_k) return s;
  return -1;
}

void ClientImpl::publish_fast_locked(OpState& op) {
  published(op, publish_cell_locked(op.plan_, op.in_span_, op.out_span_));
}

void ClientImpl::published(OpState& op, std::uint64_t request) {
  op.fast_published_ = true;
  // Its input is read (copied into the cell): later ops may write over it. By single copy only
  // once the op is done.
  if (!op.plan_.fast_single_copy) op.next_ = op.nchunks_;
  op.fast_request_ = request;
}

std::uint64_t ClientImpl::publish_cell_locked(OpPlan& p, std::uint64_t in_span, std::uint64_t out_span) {
  const int lane = p.fast_lane;
  const std::uint64_t k = p.fast_k;
  auto& cell = segment_.fast_cell(local_rank_, lane, k);
  const std::uint64_t bytes =
      host_fast::input_bytes(p.base.op, p.base.count, p.base.dtype, p.group_size, p.group_rank, p.base.root);
  if (p.fast_single_copy) {
    const std::byte* source = p.in;
    // The spans the op's memory order already measured: what it reads of p.in, writes of p.out.
    if (bytes && !host_fast::input_stays_put(p.base.op, p.base.count, p.base.dtype, p.group_rank, p.in, in_span,
                                             p.out, out_span)) {
      p.aux.assign(p.in, p.in + bytes);
      source = p.aux.data();
    }
    cell.by_address = 1;
    ipc::Segment::set_fast_address(cell, reinterpret_cast<std::uintptr_t>(source));
    if (by_shares(p)) ipc::Segment::set_fast_output_address(cell, reinterpret_cast<std::uintptr_t>(p.out));
  } else {
    cell.by_address = 0;
    if (bytes >= kSplitCopiesFrom) {
      // Over the helpers too: the members wait for it before they read.
      const CopyJob job{ipc::Segment::fast_input(cell), p.in, bytes};
      copy_split(copy_pool_locked(), {&job, 1});
    } else if (bytes) {
      std::memcpy(ipc::Segment::fast_input(cell), p.in, bytes);  // a small op's: no call out of line
    }
  }
  cell.comm_id = p.base.comm_id;
  cell.seq = static_cast<std::uint32_t>(p.base.seq);
  cell.done_then.store(static_cast<std::uint32_t>(slot_.fast_done[lane].k.load(std::memory_order_relaxed)),
                       std::memory_order_release);
  cell.count = p.base.count;
  cell.root = p.base.root;
  cell.op = p.base.op;
  cell.dtype = p.base.dtype;
  cell.reduce_op = p.base.reduce_op;
  cell.tag.store(k, std::memory_order_release);
  fast_published_[static_cast<std::size_t>(lane)] = k;
  // The members are rung by the caller (advance_fast_locked, run_fast_now_locked), once if it
  // also reads the op in the same pass.
  // The daemon hears of it without being woken: it needs the request only to check it.
  const std::uint64_t request = next_request_id_++;
  // The call's fields only: the daemon only checks it, and clears the buffer fields it finds
  // (ipc::kFlagHostFast). Writing them too took 7 cache lines of the ring an op instead of 2,
  // each pulled back from the daemon, which read it the last time round.
  const auto fill = [&](ipc::RequestDesc& d) {
    std::memcpy(static_cast<void*>(&d), &p.base, offsetof(ipc::RequestDesc, input));
    d.request_id = request;
    d.flags |= ipc::kFlagHostFast | (p.fast_single_copy ? ipc::kFlagSingleCopy : 0);
    d.chunk_offset = 0;
    d.chunk_count = d.count;
    d.wait_value = k;
  };
  if (outbox_.empty() && slot_.requests.try_push_with(fill)) {
    // No inflight_ entry: the daemon answers only an error, which complete_locked routes by
    // fast_request_ among the fast ops not done (an entry cost an allocation per op).
    // Wake the daemon once the ring is half full, so that it drains while this rank fills the
    // other half: a full ring sends the requests through the outbox, each flush rings again.
    const bool half = slot_.requests.size() >= ipc::kRequestRingCapacity / 2;
    if (half && !fast_rang_daemon_) segment_.header().daemon_bell.ring();
    fast_rang_daemon_ = half;
    slot_.requests.prefetch_next_slot(offsetof(ipc::RequestDesc, input));
  } else {
    // The ring is full (the daemon is slow to drain it): wake it, and the progress thread, which
    // pushes the rest if this rank calls nothing more. Without its op: the request outlives it
    // (and the client, whose end hands the rest over: hand_over_outbox).
    const bool first = outbox_.empty();
    ipc::RequestDesc d;
    fill(d);
    outbox_.push_back(Staged{d, Inflight{nullptr, 0, kNoRegion, 0}, 0});
    ++outbox_fast_;
    if (first) {
      segment_.header().daemon_bell.ring();
      work_cv_.notify_one();
    }
  }
  return request;
}

ClientImpl::FastNow ClientImpl::run_fast_now_locked(OpPlan& p, std::uint64_t& request) {
  // Only on an idle client: anything before it (on its lane, on memory it touches, answers and
  // requests the progress steps would move) is the general path's to order, and no call but
  // this one's drives the client meanwhile.
  if (p.fast_single_copy || active_ != 0 || !outbox_.empty() || !share_waits_.empty() || !read_held_.empty() ||
      !draining_.empty() || !slot_.completions.empty() || !retire_touches_locked())
    return FastNow::NotStarted;
  const int lane = p.fast_lane;
  const std::uint64_t k = p.fast_k;
  if (fast_published_[static_cast<std::size_t>(lane)] != k - 1) return FastNow::NotStarted;
  if (slot_.fast_done[lane].given_up.load(std::memory_order_relaxed) != 0) return FastNow::NotStarted;
  // Its cell last held number k - 2 (look_fast_locked's Publish).
  if (k > 2)
    for (int s : p.comm_state->fast_slots)
      if (!member_done(s, lane, k - 2)) return FastNow::NotStarted;
  request = publish_cell_locked(p, 0, 0);
  if (missing_cell(p) >= 0) {
    // The members may sleep waiting for this cell. Where the ranks share cores a spin only
    // keeps the core from the member it waits for.
    ring_members(p);
    if (yield_between_polls_ || !ipc::spin_for([&] { return missing_cell(p) < 0; }, kFastNowSpin, false))
      return FastNow::Published;
  }
  try {
    if (!read_fast_locked(p)) return FastNow::Published;  // the general path asks the daemon to name the calls
  } catch (const std::exception&) {
    return FastNow::Published;  // the general path reads it again and fails it with the reason
  }
  slot_.fast_done[lane].k.store(k, std::memory_order_release);
  prefetch_next_cell(p);
  ring_members(p);
  return FastNow::Done;
}

void ClientImpl::prefetch_next_cell(const OpPlan& p) const {
  // The others have read it by now where the calls come one after the other: asked for owned
  // before the next publish stores to it (as many lines as this op's input took).
  ipc::prefetch_lines<true>(&segment_.fast_cell(local_rank_, p.fast_lane, p.fast_k + 1),
                            offsetof(ipc::FastCell, input) + p.fast_largest_input);
}

template <class ReadFn>
void ClientImpl::read_peers_locked(const OpPlan& p, ReadFn&& read) {
  const auto& slots = p.comm_state->fast_slots;
  std::array<int, ipc::kMaxLocalRanks> pids{};
  for (std::size_t m = 0; m < slots.size(); ++m) pids[m] = segment_.slot(slots[m]).pid;
  copy_pool_locked();
  try {
    read(std::span<const int>(pids.data(), slots.size()));
  } catch (const std::runtime_error& e) {
    // A member that ended meanwhile is the failure (the job's error follows), not the mechanism.
    for (std::size_t m = 0; m < slots.size(); ++m)
      if (!ipc::process_alive(pids[m]))
        throw OwnerGaveUp("rank " + rank_of_slot(segment_, slots[m]) + " (pid " + std::to_string(pids[m]) +
                          ") ended while this rank read its memory");
    throw std::runtime_error(std::string(e.what()) +
                             " (host collectives by single copy; daemon.host_single_copy_kib=off copies through "
                             "shared memory instead)");
  }
  // An owner that gave up at this number may have returned during the read, and its caller
  // written over what was read: the marks are looked at after the bytes (the fence orders them).
  // TSan refuses fences, and it does not see the kernel's reads in any case.
#if !defined(__SANITIZE_THREAD__)
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
  for (std::size_t m = 0; m < slots.size(); ++m) {
    const auto g = segment_.slot(slots[m]).fast_done[p.fast_lane].given_up.load(std::memory_order_acquire);
    if (static_cast<int>(m) != p.group_rank && g != 0 && g <= p.fast_k)
      throw OwnerGaveUp("rank " + rank_of_slot(segment_, slots[m]) +
                        " gave up on this collective while its memory was read (its fast op #" + std::to_string(g) +
                        ")");
  }
}

// Reads op's output from the members' cells; false when the cells hold different calls.
bool ClientImpl::read_fast_locked(const OpPlan& p) {
  const auto& slots = p.comm_state->fast_slots;
  // Only the members' entries are filled and read: zeroing all 64 cost more than the reading.
  std::array<ipc::FastCell*, ipc::kMaxLocalRanks> cells;
  for (std::size_t m = 0; m < slots.size(); ++m) cells[m] = &segment_.fast_cell(slots[m], p.fast_lane, p.fast_k);
  const auto members = std::span<ipc::FastCell* const>(cells.data(), slots.size());
  const auto& mine = *cells[static_cast<std::size_t>(p.group_rank)];
  if (!std::all_of(members.begin(), members.end(),
                   [&](const ipc::FastCell* c) { return c == &mine || host_fast::same_call(mine, *c); }))
    return false;
  if (!p.fast_single_copy) {
    // At most the largest input times the members is read: only then can it be large enough to
    // split (read_output decides), and only then are the helpers started.
    const bool large = p.fast_largest_input * static_cast<std::uint64_t>(p.group_size) >= kSplitCopiesFrom;
    host_fast::read_output(members, {}, p.group_rank, p.base.scale, p.out, large ? copy_pool_locked() : nullptr);
    return true;
  }
  read_peers_locked(p, [&](std::span<const int> pids) {
    if (by_shares(p))
      host_fast::reduce_share(members, pids, p.group_rank, p.base.scale, p.out, share_scratch_, copy_pool_.get());
    else
      host_fast::read_output(members, pids, p.group_rank, p.base.scale, p.out, copy_pool_.get());
  });
  return true;
}

void ClientImpl::gather_fast_locked(const OpPlan& p) {
  const auto& slots = p.comm_state->fast_slots;
  std::array<ipc::FastCell*, ipc::kMaxLocalRanks> cells;
  for (std::size_t m = 0; m < slots.size(); ++m) cells[m] = &segment_.fast_cell(slots[m], p.fast_lane, p.fast_k);
  read_peers_locked(p, [&](std::span<const int> pids) {
    host_fast::gather_shares(std::span<ipc::FastCell* const>(cells.data(), slots.size()), pids, p.group_rank, p.out,
                             copy_pool_.get());
  });
}

void ClientImpl::advance_fast_locked(Deferred& callbacks) {
  if (fast_.empty()) return;
  auto& h = segment_.header();
  // Read before the pass: an op whose members' cells are all there still completes after the
  // job failed (its peers may have finished it already, as the daemon's answers would have).
  const bool job_failed = h.job_failed.load(std::memory_order_acquire);
  const auto job_error = [&] { return std::string(h.job_error, ::strnlen(h.job_error, sizeof h.job_error)); };
  bool finished = false;
  for (auto& holder : fast_) {
    OpState& op = *holder;
    const OpPlan& p = op.plan_;
    bool ring = false;  // the op's cell or this rank's mark moved: the members may wait for it
    for (bool again = true; again && !op.done();) {
      again = false;
      const FastLook look = look_fast_locked(op);
      // Only for the errors: building it costs an allocation on every small op.
      const auto what = [&] {
        return "smddp " + std::string(ipc::to_string(p.base.op)) + " on communicator " + std::to_string(p.base.comm_id);
      };
      // Runs a read of the members' cells or memory; false when it failed, and failed the op (a
      // member that ended or gave up meanwhile is the cause, named as such).
      const auto reading = [&](auto&& read) {
        try {
          read();
          return true;
        } catch (const OwnerGaveUp& e) {
          fail_fast_locked(op, Status::PeerFailed, what() + ": " + e.what(), callbacks);
        } catch (const std::exception& e) {
          fail_fast_locked(op, Status::Internal, std::string("host fast path: ") + e.what(), callbacks);
        }
        return false;
      };
      switch (look.kind) {
        case FastLook::Wait: break;
        case FastLook::SelfGaveUp:
          fail_fast_locked(op, Status::PeerFailed,
                           what() + ": an earlier collective of this communicator failed on this rank's host fast path "
                                  "(its fast op #" + std::to_string(look.at) + ")",
                           callbacks);
          break;
        case FastLook::PeerGaveUp:
          // A member gives its lane up when the job fails: the job's error says why.
          fail_fast_locked(op, Status::PeerFailed,
                           h.job_failed.load(std::memory_order_acquire)
                               ? job_error()
                               : what() + ": rank " + rank_of_slot(segment_, look.slot) +
                                     " gave up on this communicator's host fast path after a failed collective (its "
                                     "fast op #" + std::to_string(look.at) + "); this collective (fast op #" +
                                     std::to_string(p.fast_k) + ") cannot complete",
                           callbacks);
          break;
        case FastLook::Publish:
          deps_ready_locked(op, callbacks);  // done (look_fast_locked saw it): releases them
          publish_fast_locked(op);
          ring = true;
          again = true;  // the others may all be there already
          break;
        case FastLook::Read: {
          bool same = true;
          if (!reading([&] { same = read_fast_locked(op.plan_); })) break;
          if (!same) {
            // The daemon's matcher names every rank's call; its answer fails the op (complete_locked).
            h.daemon_bell.ring();
            op.fast_mismatch_ = true;
            break;
          }
          ring = true;
          if (by_shares(p)) {
            // Its share is in its output: the others read it from there.
            slot_.fast_done[p.fast_lane].reduced.store(p.fast_k, std::memory_order_release);
            op.fast_reduced_ = true;
            again = true;
            break;
          }
          slot_.fast_done[p.fast_lane].k.store(p.fast_k, std::memory_order_release);
          if (p.fast_single_copy) {
            op.fast_read_ = true;  // the others may still read its input
            again = true;
            break;
          }
          prefetch_next_cell(p);
          finish_locked(op, callbacks);
          finished = true;
          break;
        }
        case FastLook::Gather:
          if (!reading([&] { gather_fast_locked(p); })) break;
          slot_.fast_done[p.fast_lane].k.store(p.fast_k, std::memory_order_release);
          ring = true;
          op.fast_read_ = true;  // the others may still read its output's share, and its input
          again = true;
          break;
        case FastLook::Finish:
          finish_locked(op, callbacks);
          finished = true;
          break;
      }
    }
    if (ring) ring_members(op.plan_);
  }
  if (job_failed)
    for (auto& op : fast_)
      if (!op->done()) fail_fast_locked(*op, Status::PeerFailed, job_error(), callbacks);
  // Done ops leave in one pass that keeps the others in order (an erase per op cost more than
  // the rest of the pass).
  auto kept = fast_.begin();
  for (auto& op : fast_) {
    if (op->done()) callbacks.released.push_back(std::move(op));
    else *kept++ = std::move(op);
  }
  fast_.erase(kept, fast_.end());
  fast_count_.store(fast_.size(), std::memory_order_relaxed);
  // Another thread of this process may sleep waiting for one of them.
  if (finished && (waiters_ > 0 || progress_on_bell_)) slot_.client_bell.ring();
}

bool ClientImpl::wait_fast(OpState& op, Status& status, std::string& error) {
  // Where the ranks share cores (they yield between polls) the general wait measured faster: 2.1
  // against 1.9 us an 8 B all-reduce of 2 ranks on 2 vCPUs.
  if (yield_between_polls_) return false;
  const OpPlan& p = op.plan_;
  const int lane = p.fast_lane;
  const std::uint64_t k = p.fast_k;
  // Its own cell carries k once it is published (it held k - 2 before): an op still waiting to
  // publish is the general wait's.
  if (segment_.fast_cell(local_rank_, lane, k).tag.load(std::memory_order_acquire) != k) return false;
  // A member that gave up, a failed job or a timeout never fills the cells: after kSpin the
  // general wait, which looks for all of them, takes over.
  if (!ipc::spin_for([&] { return op.done() || missing_cell(p) < 0; }, kSpin, false)) return false;
  // The members' inputs (all published unless the op is done), asked for while the lock is
  // taken and the op looked at: the first line came with the tag, the rest of a larger input
  // lies past it.
  if (!op.done() && p.fast_largest_input > ipc::kFastInlineBytes)
    for (int s : p.comm_state->fast_slots) {
      auto& cell = segment_.fast_cell(s, lane, k);
      if (s != local_rank_)
        ipc::prefetch_lines<false>(&cell + 1, p.fast_largest_input - ipc::kFastInlineBytes);
    }
  Deferred callbacks;
  bool finished = false, hand_over = false;
  {
    std::lock_guard lk(mu_);
    progress_locked(callbacks);
    finished = op.done();
    if (finished) {
      status = op.status_;
      if (status != Status::Ok) error = op.error_;
      // As wait_for's end: what is left for the progress thread to drive.
      hand_over = waiters_ == 0 && left_to_drive_locked();
    }
  }
  if (hand_over) work_cv_.notify_one();
  run(callbacks);
  return finished;
}

bool ClientImpl::fast_ready_locked() const {
  if (fast_.empty()) return false;
  if (segment_.header().job_failed.load(std::memory_order_acquire)) return true;
  return std::any_of(fast_.begin(), fast_.end(), [&](const std::shared_ptr<OpState>& op) {
    return op->done() || look_fast_locked(*op).kind != FastLook::Wait;
  });
}

bool ClientImpl::fast_ready() {
  if (fast_count_.load(std::memory_order_relaxed) == 0) return false;
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return true;  // whoever holds it may be finishing ours: look again
  return fast_ready_locked();
}

}  // namespace smddp::client
