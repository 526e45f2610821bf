// ClientImpl: what the daemon answers (completions, copies out), failures (a dead daemon, a
// failed job), and the threads that drive progress: callers in wait_for() and the progress
// thread. OpState, the Work the caller holds, is here too.
#include <time.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <type_traits>
#include <utility>

#include "client/client_impl.hpp"
#include "ipc/names.hpp"

namespace smddp::client {

using ipc::OpType;

void ClientImpl::finish_locked(OpState& op, Deferred& callbacks) {
  if (op.done_.load(std::memory_order_relaxed)) return;
  op.done_.store(true, std::memory_order_release);
  --active_;
  // Every member of a failed collective gets the error: all of them stop taking the host fast
  // path on this communicator together.
  if (op.status_ != Status::Ok && op.plan_.comm_state) op.plan_.comm_state->fast_off.store(true, std::memory_order_relaxed);
  for (auto& cb : op.callbacks_) callbacks.callbacks.push_back(std::move(cb));
  op.callbacks_.clear();
  untouch_locked(op, callbacks);
}

void ClientImpl::progress_locked(Deferred& callbacks) {
  // Completions and finished copies first: they free arena space for submissions.
  complete_locked(callbacks);
  reap_draining_locked();
  if (!read_held_.empty()) reap_read_held_locked();
  advance_fast_locked(callbacks);
  submit_queued_locked(callbacks);
}

void ClientImpl::fast_answer_locked(const ipc::CompletionDesc& c, Deferred& callbacks) {
  const auto found = std::find_if(fast_.begin(), fast_.end(), [&](const std::shared_ptr<OpState>& op) {
    return op->fast_request_ == c.request_id;
  });
  if (found == fast_.end() || (*found)->done()) return;  // the daemon's check matters only until it is done
  const auto holder = *found;  // advance_fast_locked may take it off fast_
  OpState& op = *holder;
  // An op whose members' cells are all there completes even when the answer is an error (the
  // job failed after they all published): its peers may have finished it already.
  if (c.status != Status::Ok) advance_fast_locked(callbacks);
  if (op.done()) return;
  if (c.status != Status::Ok) {
    fail_fast_locked(op, c.status, std::string(c.error_text()), callbacks);
  } else if (op.fast_mismatch_) {
    fail_fast_locked(op, Status::Mismatch,
                     "smddp " + std::string(ipc::to_string(op.plan_.base.op)) + " on communicator " +
                         std::to_string(op.plan_.base.comm_id) +
                         ": the members' host fast-path cells hold different calls (operation #" +
                         std::to_string(op.plan_.base.seq) + ")",
                     callbacks);
  }
}

void ClientImpl::complete_locked(Deferred& callbacks) {
  end_shares_locked(callbacks);
  // Most calls find nothing answered: look before zeroing a CompletionDesc (its error text).
  if (slot_.completions.empty()) return;
  ipc::CompletionDesc c;
  while (slot_.completions.try_pop(c) == ipc::SpscRing<ipc::CompletionDesc, ipc::kCompletionRingCapacity>::PopResult::Item) {
    if (c.kind == ipc::CompletionKind::Shares) {
      start_share_locked(c, callbacks);
      continue;
    }
    auto it = inflight_.find(c.request_id);
    if (it == inflight_.end()) {
      // Answered after we gave up on it (its region stays allocated); the other members still
      // wait for this rank's count to pass it.
      if (c.kind == ipc::CompletionKind::Sources) sources_copied_locked(c, kNoRegion);
      // Or a host fast-path request, which has no entry here.
      else fast_answer_locked(c, callbacks);
      continue;
    }
    if (it->second.op->plan_.rank_exec) {
      // In ring order, under the lock: the plugin must run plans in the daemon's order.
      if (exec_handler_) exec_handler_(it->second.op->plan_.exec_token, c);
      if (c.kind == ipc::CompletionKind::Handles) continue;  // the plan follows
    }
    auto inf = std::move(it->second);
    inflight_.erase(it);
    std::uint64_t out_ticket = 0;  // the copier's Out-lane fence after this chunk's copies out
    OpState& op = *inf.op;
    // The last reference to an op (and through it to this client) must go after unlocking.
    callbacks.released.push_back(inf.op);
    --op.inflight_;
    ++op.finished_;
    const bool sources = c.kind == ipc::CompletionKind::Sources;
    if (sources) {
      if (op.status_ == Status::Ok) {
        if (auto why = copy_sources_locked(op, inf, c)) {
          op.status_ = Status::Internal;
          op.error_ = *why;
          op.next_ = op.nchunks_;  // submit no more of it
        }
      }
      sources_copied_locked(c, inf.offset);  // the region is freed once every reader is done
    } else if (c.status == Status::Ok && op.plan_.base.op == OpType::CommCreate) {
      op.daemon_value_.store(c.daemon_value, std::memory_order_release);  // the host fast lane + 1
    } else if (c.status == Status::Ok && op.plan_.device) {
      op.daemon_value_.store(c.daemon_value, std::memory_order_release);
      op.daemon_event_.store(c.daemon_event, std::memory_order_release);
    } else if (c.status == Status::Ok && op.status_ == Status::Ok) {
      const auto& p = op.plan_;
      const std::uint64_t e = ipc::dtype_size(p.base.dtype);
      const std::byte* base = arena_.data();
      bool copied_out = false;
      // `to`: bytes into the caller's output.
      const auto copy_out = [&](std::uint64_t to, const std::byte* from, std::uint64_t len) {
        if (len == 0) return;
        if (p.copier) {
          p.copier->copy_out(to, from, len);
          copied_out = true;
          slot_.staged_to_device[static_cast<std::size_t>(p.base.op)].fetch_add(len, std::memory_order_relaxed);
        } else {
          std::memcpy(p.out + to, from, len);
        }
      };
      if (p.unchunked) {
        if (p.out_bytes_total) copy_out(0, base + inf.offset + (p.in_bytes_total + 63) / 64 * 64, p.out_bytes_total);
      } else if (p.out_blocks) {
        const std::uint64_t cc = op.chunk_count(inf.chunk);
        const std::uint64_t blk = cc * e;
        const std::uint64_t off = inf.chunk * p.chunk;
        const std::uint64_t out_off =
            p.in_place_stage ? inf.offset : inf.offset + (p.in_blocks * blk + 63) / 64 * 64;
        for (std::uint64_t b = 0; b < p.out_blocks; ++b) copy_out((b * p.user_stride + off) * e, base + out_off + b * blk, blk);
      }
      if (copied_out) {
        out_ticket = p.copier->fence(StagingCopier::Lane::Out);
        op.last_out_ticket_ = out_ticket;
        check_copier_locked(op);
      }
    } else if (c.status != Status::Ok && op.status_ == Status::Ok) {
      op.status_ = c.status;
      op.error_ = std::string(c.error_text());
      op.next_ = op.nchunks_;  // submit no more of it
    }
    // The copies out read the region until their fence passes.
    if (!sources) free_after_locked(op.plan_.copier, StagingCopier::Lane::Out, out_ticket, inf.offset);
    p2p_bytes_ -= inf.p2p_bytes;
    if (op.inflight_ == 0 && (op.finished_ == op.nchunks_ || op.status_ != Status::Ok)) finish_locked(op, callbacks);
  }
}

void ClientImpl::fail_all_locked(Status s, const std::string& why, Deferred& callbacks) {
  std::vector<std::shared_ptr<OpState>> ops;
  for (auto& [id, inf] : inflight_) ops.push_back(inf.op);
  for (auto& st : outbox_)
    if (st.inflight.op) ops.push_back(st.inflight.op);
  for (auto& op : queue_) ops.push_back(op);
  for (auto& op : p2p_) ops.push_back(op);
  for (auto& op : fast_) ops.push_back(op);
  for (auto& w : share_waits_)
    if (w.inf.op) ops.push_back(w.inf.op);
  for (auto& op : ops) {
    if (op->done()) continue;  // a done op keeps its outcome
    if (op->status_ == Status::Ok) {
      op->status_ = s;
      op->error_ = why;
    }
    finish_locked(*op, callbacks);
    callbacks.released.push_back(op);
  }
  for (auto& [id, inf] : inflight_) callbacks.released.push_back(std::move(inf.op));
  for (auto& op : queue_) callbacks.released.push_back(std::move(op));
  for (auto& op : p2p_) callbacks.released.push_back(std::move(op));
  for (auto& op : fast_) callbacks.released.push_back(std::move(op));
  for (auto& w : share_waits_) callbacks.released.push_back(std::move(w.inf.op));
  share_waits_.clear();
  share_waiting_.store(false, std::memory_order_release);
  reads_.clear();
  queue_.clear();
  p2p_.clear();
  fast_.clear();
  fast_count_.store(0, std::memory_order_relaxed);
  // Regions stay allocated: a dead daemon will never answer for them. Copies into staged
  // ones may still run: the client waits for them before the arena goes.
  for (auto& st : outbox_) drop_staged_locked(st, callbacks, false);
  outbox_.clear();
  outbox_fast_ = 0;
  inflight_.clear();
  read_held_.clear();
}

bool ClientImpl::check_liveness_locked(Deferred& callbacks) {
  auto& h = segment_.header();
  if (!failure_reported_ && failure_handler_ && (!dead_.empty() || h.job_failed.load(std::memory_order_acquire))) {
    failure_reported_ = true;
    callbacks.callbacks.push_back(failure_handler_);
  }
  if (!dead_.empty()) return false;
  const auto now = Clock::now();
  const auto hb = h.heartbeat.load(std::memory_order_relaxed);
  if (hb != last_heartbeat_) {
    last_heartbeat_ = hb;
    heartbeat_seen_ = now;
  }
  std::string why;
  if (!ipc::process_alive(daemon_pid_)) why = "exited";
  else if (now - heartbeat_seen_ > kHeartbeatStale) why = "stopped responding";
  if (why.empty()) return true;
  dead_ = "smddp daemon (pid " + std::to_string(daemon_pid_) + ") on node " + std::to_string(node_id_) + " died (" +
          why + ")";
  if (h.job_failed.load(std::memory_order_acquire))
    dead_ += "; the job had failed before: " + std::string(h.job_error, ::strnlen(h.job_error, sizeof h.job_error));
  // The daemon cannot remove its segment and socket any more; do it for it.
  if (why == "exited") {
    ipc::Segment::remove_if_stale(job_id_, node_id_);
    std::error_code ec;
    std::filesystem::remove(ipc::socket_path(job_id_, node_id_), ec);
  }
  fail_all_locked(Status::PeerFailed, dead_, callbacks);
  if (!failure_reported_ && failure_handler_) {
    failure_reported_ = true;
    callbacks.callbacks.push_back(failure_handler_);
  }
  return false;
}

bool ClientImpl::wait_for(OpState& op, Clock::time_point until) {
  {
    std::lock_guard lk(mu_);
    ++waiters_;
  }
  struct Leave {
    ClientImpl& c;
    ~Leave() {
      bool hand_over;
      {
        std::lock_guard lk(c.mu_);
        --c.waiters_;
        // The progress thread takes over only what is left to drive: waking it for nothing
        // cost a system call and a context switch per synchronous op.
        hand_over = c.waiters_ == 0 && c.left_to_drive_locked();
      }
      if (hand_over) c.work_cv_.notify_one();
    }
  } leave{*this};
  Deferred callbacks;
  std::uint64_t wakes = 0;  // copier fences seen passed as of the last progress step
  const auto ready = [&] {
    return op.done() || completions_ready() || waker_->count.load(std::memory_order_acquire) != wakes ||
           copies_in_finished() || held_regions_free() || fast_ready();
  };
  while (!op.done()) {
    wakes = waker_->count.load(std::memory_order_acquire);
    Clock::time_point now{};  // read once a round, only while the op is still running
    {
      std::lock_guard lk(mu_);
      progress_locked(callbacks);
      if (!op.done() && (now = Clock::now()) >= op.deadline_) {
        if (op.status_ == Status::Ok) {
          op.status_ = Status::Timeout;
          const auto blocker = std::find_if(op.deps_.begin(), op.deps_.end(), [](const OpState::Dep& d) {
            return d.op && !d.op->done();
          });
          op.error_ = blocker == op.deps_.end()
                          ? "no answer from the smddp daemon for " + std::string(ipc::to_string(op.plan_.base.op)) +
                                " well past its timeout"
                          : std::string(ipc::to_string(op.plan_.base.op)) +
                                " never started: it waits for an earlier " +
                                std::string(ipc::to_string(blocker->op->plan_.base.op)) +
                                " on the same memory, which has not finished (issued earlier, not waited for)";
        }
        // Its regions stay allocated; the daemon may still write them.
        for (auto it = inflight_.begin(); it != inflight_.end();) {
          if (it->second.op.get() != &op) {
            ++it;
            continue;
          }
          callbacks.released.push_back(std::move(it->second.op));
          it = inflight_.erase(it);
        }
        std::erase_if(queue_, [&](const auto& q) { return q.get() == &op; });
        std::erase_if(p2p_, [&](const auto& q) { return q.get() == &op; });
        // A fast-path op gives its lane up: the others stop waiting for this rank's cells.
        if (op.plan_.fast_k) fail_fast_locked(op, op.status_, op.error_, callbacks);
        finish_locked(op, callbacks);
        // Drops its staged chunks (its status is no longer Ok); others may go now.
        if (flush_outbox_locked(callbacks)) segment_.header().daemon_bell.ring();
      }
    }
    run(callbacks);
    if (op.done()) break;
    if (now >= until) return false;  // `now` was read: the op was still running
    ipc::spin_then_wait(slot_.client_bell, ready, std::min(until, op.deadline_), kSpin,
                        std::chrono::duration_cast<std::chrono::microseconds>(kSlice), yield_between_polls_, [&] {
                          std::lock_guard lk(mu_);
                          const bool alive = check_liveness_locked(callbacks);
                          // Staged chunks: a copy that faulted never wakes us, so look again
                          // (progress asks the copiers for errors) once per slice.
                          return alive && outbox_.empty();
                        });
    run(callbacks);
  }
  return true;
}

void ClientImpl::progress_thread() {
  Deferred callbacks;
  std::unique_lock lk(mu_);
  for (;;) {
    // Once the GPU fast path is in use nobody waits for its ops on the CPU: this thread
    // finishes them, and stays on the completion doorbell between them, so that issuing
    // one does not have to wake it.
    // Requests left in the outbox (the daemon's ring was full) must reach it even if this rank
    // calls nothing more for a while: the other members' requests wait for them in its matcher.
    const auto runnable = [&] { return stop_ || (waiters_ == 0 && left_to_drive_locked()); };
    const auto watching = [&] { return failure_handler_ && !failure_reported_; };
    bool woken = true;
    if (watching() || dead_.empty()) {
      // The GPU path is in use: a hierarchical operation's closing barrier can keep this rank's
      // GPU waiting on a peer after every operation finished here, with no thread of this
      // process in the client. A peer's death must still reach the failure handler. And the
      // daemon is watched while this rank is away: a call after it died must fail, not run on
      // the host fast path among the ranks as if the job were alive.
      woken = work_cv_.wait_for(lk, kIdleWatch, runnable);
    } else {
      work_cv_.wait(lk, [&] { return runnable() || watching(); });
      if (!runnable()) continue;  // a failure handler came (set_failure_handler): watch the job
    }
    if (stop_) return;
    if (woken) {
      const auto wakes = waker_->count.load(std::memory_order_acquire);
      progress_locked(callbacks);
      const bool idle = !left_to_drive_locked();
      // Chunks wait for their copies in: spin a little first, as a waiting user thread does, to
      // see them finish before their wake comes.
      const bool copies_due =
          std::any_of(outbox_.begin(), outbox_.end(), [](const Staged& s) { return s.ticket != 0; });
      progress_on_bell_ = !idle;
      lk.unlock();
      run(callbacks);
      if (t_client_destroyed_here) return;
      if (!idle) {
        const auto ready = [&] {
          return completions_ready() || waker_->count.load(std::memory_order_acquire) != wakes ||
                 (copies_due && copies_in_finished()) || held_regions_free() || fast_ready();
        };
        ipc::spin_then_wait(slot_.client_bell, ready, Clock::now() + kSlice,
                            copies_due ? kSpin : std::chrono::microseconds(0),
                            std::chrono::duration_cast<std::chrono::microseconds>(kSlice), yield_between_polls_,
                            [] { return false; });
      }
      lk.lock();
      progress_on_bell_ = false;
    }
    check_liveness_locked(callbacks);
    if (!callbacks.callbacks.empty() || !callbacks.released.empty()) {
      lk.unlock();
      run(callbacks);
      if (t_client_destroyed_here) return;
      lk.lock();
    }
  }
}

// ---------------------------------------------------------------------------------------
// OpState

// make_shared allocates an OpState with its 16-byte count block: within 1032 bytes glibc serves
// it from the thread's cache instead of its locked bins, a few hundred instructions an op.
#if defined(__GLIBC__) && defined(__x86_64__)
static_assert(sizeof(OpState) <= 1016, "an OpState no longer fits glibc's per-thread cache");
#endif

namespace {

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  // The coarse clock (a few ms behind, no TSC read): a deadline seconds away does not need
  // the precise one, and every small op pays for the read.
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  static_assert(std::is_same_v<Clock, std::chrono::steady_clock>, "steady_clock is CLOCK_MONOTONIC on Linux");
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)) + timeout +
         kBackstop;
}

class FinishedWork final : public Work {
 public:
  bool test() override { return true; }
  void wait(std::chrono::milliseconds) override {}
  bool done() const override { return true; }
  Status status() const override { return Status::Ok; }
  std::string error() const override { return {}; }
  void on_complete(std::function<void()> cb) override { cb(); }
};
constinit FinishedWork finished;

}  // namespace

WorkPtr finished_work() {
  // An aliasing pointer that owns nothing: copying and dropping it touch no reference count.
  return WorkPtr(WorkPtr(), &finished);
}

OpState::OpState(std::shared_ptr<ClientImpl> client, std::chrono::milliseconds timeout)
    : client_(std::move(client)), timeout_(timeout), deadline_(deadline_after(timeout)) {}

OpState::OpState(std::shared_ptr<ClientImpl> client, std::chrono::milliseconds timeout, OpPlan&& plan)
    : client_(std::move(client)), plan_(std::move(plan)), timeout_(timeout), deadline_(deadline_after(timeout)) {}

void OpState::planned() {
  if (!plan_.unchunked && plan_.block > 0) nchunks_ = (plan_.block + plan_.chunk - 1) / plan_.chunk;
  if (!plan_.device) {
    // Blocks of `block` elements, `user_stride` apart (plan() makes both the count).
    const std::uint64_t e = ipc::dtype_size(plan_.base.dtype);
    const auto span = [&](std::uint64_t blocks) {
      return blocks ? ((blocks - 1) * plan_.user_stride + plan_.block) * e : 0;
    };
    if (plan_.in) in_span_ = plan_.unchunked ? plan_.in_bytes_total : span(plan_.in_blocks);
    if (plan_.out) out_span_ = plan_.unchunked ? plan_.out_bytes_total : span(plan_.out_blocks);
  }
}

bool OpState::test() {
  if (done()) return true;
  Deferred callbacks;
  {
    std::lock_guard lk(client_->mutex());
    client_->progress_locked(callbacks);
  }
  ClientImpl::run(callbacks);
  return done();
}

void OpState::wait(std::chrono::milliseconds timeout) {
  // Finished (a host fast-path op often is when issued): its outcome was written before done_
  // and never changes after it, so no lock is needed to read it.
  if (done()) {
    if (status_ != Status::Ok) throw Error(status_, error_);
    return;
  }
  // A small host fast-path op: wait_for's rounds (a lock each, every waker polled) cost more
  // than the op itself.
  if (plan_.fast_k && !plan_.fast_single_copy) {
    Status s = Status::Ok;
    std::string why;
    if (client_->wait_fast(*this, s, why)) {
      if (s != Status::Ok) throw Error(s, why);
      return;
    }
  }
  if (!done()) {  // a host fast-path op is often finished when issued: no clock read then
    const auto until = timeout.count() > 0 ? Clock::now() + timeout : Clock::time_point::max();
    if (!client_->wait_for(*this, until))
      throw Error(Status::Timeout, std::string(ipc::to_string(plan_.base.op)) + " did not finish within " +
                                       std::to_string(timeout.count()) + " ms");
  }
  std::lock_guard lk(client_->mutex());
  if (status_ != Status::Ok) throw Error(status_, error_);
}

Status OpState::status() const {
  std::lock_guard lk(client_->mutex());
  return status_;
}

std::string OpState::error() const {
  std::lock_guard lk(client_->mutex());
  return error_;
}

void OpState::on_complete(std::function<void()> cb) {
  {
    std::lock_guard lk(client_->mutex());
    if (!done()) {
      callbacks_.push_back(std::move(cb));
      // A host fast-path op did not wake the progress thread when it was issued.
      if (plan_.fast_k) client_->wake_progress();
      return;
    }
  }
  cb();
}
}  // namespace smddp::client
