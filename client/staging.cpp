// ClientImpl: operations cut into chunks, staged in the rank's arena (by memcpy, or by a
// StagingCopier for memory the client cannot touch), and posted to the daemon in issue order.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "client/client_impl.hpp"

namespace smddp::client {

using ipc::BufferKind;
using ipc::OpType;

bool ClientImpl::submit_chunk_locked(OpState& op) {
  if (inflight_.size() + outbox_.size() >= ipc::kCompletionRingCapacity) return false;
  const std::uint64_t k = op.next_;
  const auto& p = op.plan_;
  const std::uint64_t cc = op.chunk_count(k);
  const std::uint64_t e = ipc::dtype_size(p.base.dtype);
  const std::uint64_t off = k * p.chunk;
  const std::uint64_t bytes = op.stage_bytes(k);
  if (p.device) return submit_device_locked(op);
  auto at = alloc_.allocate(bytes);
  if (!at && reap_read_held_locked()) at = alloc_.allocate(bytes);
  if (!at) {
    // Regions other ranks still read may come back soon: their copies ring our bell.
    if (!read_held_.empty()) slot_.waits_for_readers.store(1, std::memory_order_seq_cst);
    return false;
  }
  slot_.waits_for_readers.store(0, std::memory_order_relaxed);

  ipc::RequestDesc d = p.base;
  d.request_id = next_request_id_++;
  d.chunk_offset = p.unchunked ? 0 : off;
  d.chunk_count = p.unchunked ? p.base.chunk_count : cc;
  if (k + 1 == op.nchunks_) d.flags |= ipc::kFlagLastChunk;
  std::uint64_t cursor = *at;
  std::byte* base = arena_.data();
  auto region = [&](std::uint64_t len) {
    ipc::BufferRef r;
    r.kind = BufferKind::Arena;
    r.offset = cursor;
    r.bytes = len;
    cursor += (len + 63) / 64 * 64;
    return r;
  };
  StagingCopier* copier = p.copier.get();
  // What this client copies out (or reduces) itself may come straight from the members' arenas.
  if (!copier && !p.unchunked && ipc::reads_arenas(p.base.op)) d.flags |= ipc::kFlagReadSources;
  bool copied_in = false;
  // `from`: bytes into the caller's input.
  const auto copy_in = [&](std::byte* to, std::uint64_t from, std::uint64_t len) {
    if (len == 0) return;
    if (copier) {
      copier->copy_in(to, from, len);
      copied_in = true;
      slot_.staged_to_host[static_cast<std::size_t>(p.base.op)].fetch_add(len, std::memory_order_relaxed);
    } else {
      std::memcpy(to, p.in + from, len);
    }
  };
  if (p.unchunked) {
    if (p.in_bytes_total || p.base.op == OpType::AllToAll) {
      d.input = region(p.in_bytes_total);
      copy_in(base + d.input.offset, 0, p.in_bytes_total);
    }
    if (p.out_bytes_total || p.base.op == OpType::AllToAll) d.output = region(p.out_bytes_total);
  } else {
    const std::uint64_t blk = cc * e;
    if (p.in_blocks) {
      d.input = region(p.in_blocks * blk);
      if (!copier && p.in_blocks * blk >= kSplitCopiesFrom) {
        // A large chunk over the helpers, where the rank has them.
        std::vector<CopyJob> jobs;
        for (std::uint64_t b = 0; b < p.in_blocks; ++b)
          jobs.push_back({base + d.input.offset + b * blk, p.in + (b * p.user_stride + off) * e, blk});
        copy_split(copy_pool_locked(), jobs);
      } else {
        for (std::uint64_t b = 0; b < p.in_blocks; ++b) copy_in(base + d.input.offset + b * blk, (b * p.user_stride + off) * e, blk);
      }
    }
    if (p.in_place_stage) d.output = d.input;
    else if (p.out_blocks) d.output = region(p.out_blocks * blk);
  }
  if (!p.aux.empty()) {
    d.aux = region(p.aux.size());
    std::memcpy(base + d.aux.offset, p.aux.data(), p.aux.size());
  }
  const bool p2p = is_p2p(p.base.op);
  const std::uint64_t ticket = copied_in ? copier->fence(StagingCopier::Lane::In) : 0;
  if (ticket) op.last_in_ticket_ = ticket;
  post_or_stage_locked(Staged{d, Inflight{op.shared_from_this(), k, *at, p2p ? bytes : 0}, ticket});
  p2p_bytes_ += p2p ? bytes : 0;
  ++op.next_;
  ++op.inflight_;
  return true;
}

void ClientImpl::post_or_stage_locked(Staged s) {
  if (outbox_.empty() && s.ticket == 0 && slot_.requests.try_push(s.desc)) {
    inflight_.emplace(s.desc.request_id, std::move(s.inflight));
    posted_ = true;
    return;
  }
  if (s.ticket) copies_staged_.store(true, std::memory_order_relaxed);
  outbox_.push_back(std::move(s));
}

bool ClientImpl::flush_outbox_locked(Deferred& callbacks) {
  bool pushed = std::exchange(posted_, false);
  bool collectives_wait = false;           // an earlier collective chunk is still copying in
  std::vector<const OpState*> p2p_waiting;  // sends/receives with an earlier chunk copying in
  const OpState* checked = nullptr;         // the last op whose copier was asked for errors
  for (auto it = outbox_.begin(); it != outbox_.end();) {
    if (!it->inflight.op) {
      // A host fast-path request (its op may be long done): the daemon answers only an error,
      // routed by the op's fast_request_. Behind an earlier collective still copying in, as
      // every collective.
      if (collectives_wait) {
        ++it;
        continue;
      }
      if (!slot_.requests.try_push(it->desc)) break;
      pushed = true;
      it = outbox_.erase(it);
      --outbox_fast_;
      continue;
    }
    OpState& op = *it->inflight.op;
    if (it->ticket && &op != checked) {
      check_copier_locked(op);
      checked = &op;
    }
    if (op.status_ != Status::Ok) {  // failed or given up: the rest of it never goes
      drop_staged_locked(*it, callbacks, true);
      it = outbox_.erase(it);
      continue;
    }
    const bool p2p = is_p2p(op.plan_.base.op);
    const bool behind = p2p ? std::find(p2p_waiting.begin(), p2p_waiting.end(), &op) != p2p_waiting.end()
                            : collectives_wait;
    if (behind || (it->ticket && !op.plan_.copier->passed(StagingCopier::Lane::In, it->ticket))) {
      if (p2p) p2p_waiting.push_back(&op);
      else collectives_wait = true;
      ++it;
      continue;
    }
    if (!slot_.requests.try_push(it->desc)) break;  // the daemon answers first: its completions wake us
    inflight_.emplace(it->desc.request_id, std::move(it->inflight));
    pushed = true;
    it = outbox_.erase(it);
  }
  return pushed;
}

void ClientImpl::drop_staged_locked(Staged& s, Deferred& callbacks, bool free_region) {
  if (!s.inflight.op) return;  // a host fast-path request: nothing staged
  OpState& op = *s.inflight.op;
  free_after_locked(op.plan_.copier, StagingCopier::Lane::In, s.ticket, free_region ? s.inflight.offset : kNoRegion);
  p2p_bytes_ -= s.inflight.p2p_bytes;
  --op.inflight_;
  if (op.inflight_ == 0 && !op.done() && op.next_ >= op.nchunks_) finish_locked(op, callbacks);
  callbacks.released.push_back(std::move(s.inflight.op));
}

void ClientImpl::check_copier_locked(OpState& op) {
  if (op.done() || op.status_ != Status::Ok || !op.plan_.copier) return;  // a done op's outcome stays
  auto why = op.plan_.copier->error();
  if (why.empty()) return;
  op.status_ = Status::Internal;
  op.error_ = std::string(ipc::to_string(op.plan_.base.op)) + ": moving its bytes through the arena failed: " + why;
  op.next_ = op.nchunks_;  // submit no more of it
}

void ClientImpl::set_arena_release(std::function<void()> release) {
  std::lock_guard lk(mu_);
  arena_release_ = std::move(release);
}

void ClientImpl::free_after_locked(const std::shared_ptr<StagingCopier>& copier, StagingCopier::Lane lane,
                                   std::uint64_t ticket, std::uint64_t offset) {
  if (copier && ticket && !copier->passed(lane, ticket)) {
    draining_.push_back(Draining{copier, lane, ticket, offset});
  } else if (offset != kNoRegion) {
    alloc_.free(offset);
  }
}

void ClientImpl::reap_draining_locked() {
  if (draining_.empty()) return;  // as on every host fast-path op
  std::erase_if(draining_, [&](const Draining& d) {
    if (!d.copier->passed(d.lane, d.ticket)) return false;
    if (d.offset != kNoRegion) alloc_.free(d.offset);
    return true;
  });
}

bool ClientImpl::copies_in_finished() {
  if (!copies_staged_.load(std::memory_order_relaxed)) return false;
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  for (auto& s : outbox_) {
    if (!s.ticket) continue;
    if (s.seen || !s.inflight.op->plan_.copier->passed(StagingCopier::Lane::In, s.ticket)) return false;
    s.seen = true;
    return true;
  }
  copies_staged_.store(false, std::memory_order_relaxed);  // none left; the next one sets it again
  return false;
}

void ClientImpl::CopyWaker::wake() {
  count.fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard lk(mu);
  if (bell) bell->ring();
}

bool ClientImpl::submit_device_locked(OpState& op) {
  const auto& p = op.plan_;
  std::uint64_t at = kNoRegion;
  if (!p.aux.empty()) {
    auto a = alloc_.allocate(p.aux.size());
    if (!a) return false;
    at = *a;
  }
  ipc::RequestDesc d = p.base;
  d.request_id = next_request_id_++;
  d.chunk_offset = 0;
  d.flags |= ipc::kFlagLastChunk;
  d.wait_event = p.wait_event;
  d.wait_value = p.wait_value;
  if (at != kNoRegion) {
    d.aux.kind = BufferKind::Arena;
    d.aux.offset = at;
    d.aux.bytes = p.aux.size();
    std::memcpy(arena_.data() + at, p.aux.data(), p.aux.size());
  }
  post_or_stage_locked(Staged{d, Inflight{op.shared_from_this(), 0, at, 0}, 0});
  ++op.next_;
  ++op.inflight_;
  return true;
}

void ClientImpl::submit_queued_locked(Deferred& callbacks) {
  if (queue_.empty() && p2p_.empty() && outbox_.empty() && !posted_) return;  // as after every host fast-path op
  // Submissions, strictly in issue order so every rank fills its arena alike.
  while (!queue_.empty()) {
    auto& op = *queue_.front();
    if (op.status_ != Status::Ok) op.next_ = op.nchunks_;
    if (op.next_ == 0 && !op.deps_.empty() && !deps_ready_locked(op, callbacks)) break;
    while (op.next_ < op.nchunks_ && submit_chunk_locked(op)) {}
    if (op.next_ < op.nchunks_) break;
    if (op.inflight_ == 0 && !op.done()) finish_locked(op, callbacks);
    callbacks.released.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  const std::uint64_t p2p_budget = alloc_.capacity() / 2, window = alloc_.capacity() / 8;
  for (auto it = p2p_.begin(); it != p2p_.end();) {
    auto& op = **it;
    if (op.status_ != Status::Ok) op.next_ = op.nchunks_;
    if (op.next_ == 0 && !op.deps_.empty() && !deps_ready_locked(op, callbacks)) {
      ++it;
      continue;
    }
    while (op.next_ < op.nchunks_) {
      const std::uint64_t b = op.stage_bytes(op.next_);
      // At least one chunk per op may always go, so every op makes progress.
      if (op.inflight_ > 0 && (op.inflight_ * b >= window || p2p_bytes_ + b > p2p_budget)) break;
      if (!submit_chunk_locked(op)) break;
    }
    if (op.next_ < op.nchunks_) {
      ++it;
      continue;
    }
    if (op.inflight_ == 0 && !op.done()) finish_locked(op, callbacks);
    callbacks.released.push_back(std::move(*it));
    it = p2p_.erase(it);
  }
  if (flush_outbox_locked(callbacks)) segment_.header().daemon_bell.ring();
}

std::uint64_t OpState::chunk_count(std::uint64_t k) const {
  if (plan_.unchunked || plan_.block == 0) return 0;
  return std::min(plan_.chunk, plan_.block - k * plan_.chunk);
}

std::uint64_t OpState::stage_bytes(std::uint64_t k) const {
  const auto r64 = [](std::uint64_t v) { return (v + 63) / 64 * 64; };
  std::uint64_t b = r64(plan_.aux.size());
  if (plan_.unchunked) return b + r64(plan_.in_bytes_total) + r64(plan_.out_bytes_total);
  const std::uint64_t blk = chunk_count(k) * ipc::dtype_size(plan_.base.dtype);
  b += r64(plan_.in_blocks * blk);
  if (!plan_.in_place_stage) b += r64(plan_.out_blocks * blk);
  return b;
}
}  // namespace smddp::client
