// ClientImpl: operations issued back to back on overlapping memory run in issue order (as on
// NCCL's stream and Gloo's queue); operations on disjoint memory overlap.
#include <algorithm>

#include "client/client_impl.hpp"

namespace smddp::client {

namespace {
bool overlap(std::uintptr_t a, std::uint64_t an, std::uintptr_t b, std::uint64_t bn) {
  return an && bn && a < b + bn && b < a + an;
}
}  // namespace

bool ClientImpl::retire_touches_locked() {
  if (touching_.empty()) return true;
  // Entries whose copies are over order nothing any more.
  std::erase_if(touching_, [](const Touch& t) {
    return !t.op && (!t.copier || (t.copier->passed(StagingCopier::Lane::In, t.last_in) &&
                                   t.copier->passed(StagingCopier::Lane::Out, t.last_out)));
  });
  return touching_.empty();
}

void ClientImpl::note_order_locked(const std::shared_ptr<OpState>& op) {
  retire_touches_locked();
  if (op->in_span_ == 0 && op->out_span_ == 0) return;
  Touch me;
  me.in = reinterpret_cast<std::uintptr_t>(op->plan_.in);
  me.out = reinterpret_cast<std::uintptr_t>(op->plan_.out);
  me.in_span = op->in_span_;
  me.out_span = op->out_span_;
  for (const Touch& t : touching_) {
    const bool writes = overlap(t.out, t.out_span, me.in, me.in_span) || overlap(t.out, t.out_span, me.out, me.out_span);
    // An entry's op is alive while it is set: the client's queues hold an op until it is done.
    if (writes || overlap(t.in, t.in_span, me.out, me.out_span))
      op->deps_.push_back({t.op ? t.op->shared_from_this() : nullptr, t.copier, writes});
  }
  me.op = op.get();
  me.copier = op->plan_.copier;
  touching_.push_back(std::move(me));
}

bool ClientImpl::deps_done(const OpState& op) {
  // One that only reads this op's output is through once all of it was submitted: a host op's
  // copies in are made then, a copier's are enqueued then (and followed, deps_ready_locked).
  return std::none_of(op.deps_.begin(), op.deps_.end(), [](const OpState::Dep& d) {
    return d.op && !d.op->done() && (d.writes || d.op->next_ < d.op->nchunks_);
  });
}

bool ClientImpl::deps_ready_locked(OpState& op, Deferred& callbacks) {
  if (!deps_done(op)) return false;
  if (op.plan_.copier)
    for (const auto& d : op.deps_)
      if (d.copier) op.plan_.copier->follow(*d.copier);
  for (auto& d : op.deps_)
    if (d.op) callbacks.released.push_back(std::move(d.op));
  op.deps_.clear();
  return true;
}

void ClientImpl::untouch_locked(OpState& op, Deferred& callbacks) {
  for (auto& d : op.deps_)
    if (d.op) callbacks.released.push_back(std::move(d.op));
  op.deps_.clear();
  for (Touch& t : touching_) {
    if (t.op != &op) continue;
    t.last_in = op.last_in_ticket_;
    t.last_out = op.last_out_ticket_;
    t.op = nullptr;
    break;
  }
}
}  // namespace smddp::client
