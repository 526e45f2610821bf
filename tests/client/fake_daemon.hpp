// FakeDaemon: the test process plays the smddp daemon of a world of one. It owns the segment
// (so daemon_pid is the test's pid), bumps the heartbeat, pops each rank's requests and answers
// them as a single-rank job would: outputs equal inputs (an arena input region is copied to a
// distinct output region), a Recv gets bytes equal to its tag. A policy per request can hold
// the answer back (released later) or fail it with a status and text.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/client.hpp"
#include "ipc/segment.hpp"

namespace smddp::testing {

// Job ids unique per process and call, so parallel ctest processes never collide.
inline std::string unique_job(const char* tag) {
  static std::atomic<int> n{0};
  return std::string("t-client-") + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

inline ipc::SegmentSpec small_spec(const std::string& job, int local_world_size = 1, int world_size = 1) {
  ipc::SegmentSpec s;
  s.job_id = job;
  s.local_world_size = local_world_size;
  s.world_size = world_size;
  s.arena_bytes = 1ull << 20;
  s.chunk_bytes = 64ull << 10;
  s.fast_cell_bytes = 0;  // the daemon path; host_fast_test.cpp turns the fast path on
  return s;
}

inline client::AttachOptions attach_options(const std::string& job, int rank = 0, int world_size = 1,
                                            int local_world_size = 1) {
  client::AttachOptions o;
  o.job_id = job;
  o.node_id = 0;
  o.rank = rank;
  o.local_rank = rank;
  o.world_size = world_size;
  o.local_world_size = local_world_size;
  o.attach_timeout = std::chrono::milliseconds(2000);
  return o;
}

struct Answer {
  enum Kind { Ok, Hold, Fail } kind = Ok;
  client::Status status = client::Status::Ok;
  std::string text;
  std::uint64_t daemon_value = 0;  // the completion's (a communicator's host fast lane + 1)
};

class FakeDaemon {
 public:
  using Policy = std::function<Answer(const ipc::RequestDesc&, std::size_t index)>;

  explicit FakeDaemon(const ipc::SegmentSpec& spec, bool ready = true) : seg_(ipc::Segment::create(spec)) {
    if (ready) set_state(ipc::DaemonState::Ready);
  }
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;
  ~FakeDaemon() { stop(); }

  void start() {
    thread_ = std::thread([this] { loop(); });
  }
  void stop() {
    stop_.store(true);
    seg_.header().daemon_bell.ring();
    if (thread_.joinable()) thread_.join();
  }

  ipc::Segment& segment() { return seg_; }
  ipc::SegmentHeader& header() { return seg_.header(); }
  void set_state(ipc::DaemonState s) { header().state.store(static_cast<std::uint32_t>(s), std::memory_order_release); }
  // A daemon that stops its heartbeat looks hung to its ranks.
  void freeze_heartbeat(bool frozen) { frozen_.store(frozen); }
  // A daemon that stops taking requests (a busy one): the rings fill, the ranks' outboxes hold the rest.
  void pause_rings(bool paused) {
    paused_.store(paused);
    header().daemon_bell.ring();
  }

  void set_policy(Policy p) {
    std::lock_guard lk(mu_);
    policy_ = std::move(p);
  }
  // Answers every held request (Ok, with the usual world-of-one output).
  void release_held() {
    std::lock_guard lk(mu_);
    for (auto& [r, d] : held_) answer(r, d, Answer{});
    held_.clear();
  }
  std::vector<ipc::RequestDesc> requests() const {
    std::lock_guard lk(mu_);
    return seen_;
  }
  std::size_t held_count() const {
    std::lock_guard lk(mu_);
    return held_.size();
  }
  // Returns once a whole pass over the rings began after the call and ended: every request
  // posted before it has been taken and handled, so requests() then shows all that came.
  void settle() {
    const auto start = passes_.load();
    while (passes_.load() < start + 2) {
      header().daemon_bell.ring();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  // Waits until at least `n` requests arrived; false on timeout.
  bool wait_for_requests(std::size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return seen_.size() >= n; });
  }
  // Pushes a completion the test built by hand (e.g. the Handles and Plan completions of a
  // rank-side GPU request) to local rank `r`, as the daemon would.
  void push_completion(int r, const ipc::CompletionDesc& c) {
    std::lock_guard lk(mu_);  // the answering thread pushes under mu_ too: one producer at a time
    push_locked(r, c);
  }
  // Forgets held requests without answering them (the test answered them by hand).
  void drop_held() {
    std::lock_guard lk(mu_);
    held_.clear();
  }
  // Descriptor problems seen (regions outside the arena, misaligned); empty when all were sound.
  std::vector<std::string> problems() const {
    std::lock_guard lk(mu_);
    return problems_;
  }

 private:
  void loop() {
    auto& h = header();
    const int ranks = h.local_world_size;
    while (!stop_.load()) {
      if (!frozen_.load()) h.heartbeat.fetch_add(1, std::memory_order_relaxed);
      const auto ticket = h.daemon_bell.ticket();
      bool any = false;
      for (int r = 0; r < ranks && !paused_.load(); ++r) {
        ipc::RequestDesc d;
        while (seg_.slot(r).requests.try_pop(d) == decltype(seg_.slot(r).requests)::PopResult::Item) {
          any = true;
          handle(r, d);
        }
      }
      passes_.fetch_add(1);
      if (!any) h.daemon_bell.wait(ticket, std::chrono::milliseconds(5));
    }
  }

  void check(int r, const char* what, const ipc::BufferRef& b) {
    if (b.kind != ipc::BufferKind::Arena) return;
    const auto size = seg_.arena(r).size();
    if (b.offset % 64 != 0 || b.offset > size || b.bytes > size - b.offset)
      problems_.push_back(std::string(what) + " region [" + std::to_string(b.offset) + ", +" +
                          std::to_string(b.bytes) + ") does not fit the arena of " + std::to_string(size));
  }

  void handle(int r, const ipc::RequestDesc& d) {
    std::lock_guard lk(mu_);
    check(r, "input", d.input);
    check(r, "output", d.output);
    check(r, "aux", d.aux);
    const std::size_t index = seen_.size();
    seen_.push_back(d);
    cv_.notify_all();
    Answer a = policy_ ? policy_(d, index) : Answer{};
    if (a.kind == Answer::Hold) held_.emplace_back(r, d);
    else answer(r, d, a);
  }

  // Caller holds mu_.
  void answer(int r, const ipc::RequestDesc& d, const Answer& a) {
    auto arena = seg_.arena(r);
    const bool ok = a.kind == Answer::Ok;
    if (ok && d.output.kind == ipc::BufferKind::Arena && d.output.bytes > 0) {
      std::byte* out = arena.data() + d.output.offset;
      if (d.op == ipc::OpType::Recv) {
        std::memset(out, d.tag & 0xff, d.output.bytes);
      } else if (d.input.kind == ipc::BufferKind::Arena && d.input.offset != d.output.offset) {
        std::memcpy(out, arena.data() + d.input.offset, std::min(d.input.bytes, d.output.bytes));
      }
    }
    ipc::CompletionDesc c;
    c.request_id = d.request_id;
    c.comm_id = d.comm_id;
    c.seq = d.seq;
    c.status = ok ? client::Status::Ok : a.status;
    c.daemon_value = a.daemon_value;
    if (!ok) c.set_error(a.text);
    push_locked(r, c);
  }

  // Caller holds mu_.
  void push_locked(int r, const ipc::CompletionDesc& c) {
    auto& slot = seg_.slot(r);
    // The client keeps at most the ring's capacity in flight, so this never spins for long.
    while (!slot.completions.try_push(c)) std::this_thread::yield();
    slot.client_bell.ring();
  }

  ipc::Segment seg_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> frozen_{false};
  std::atomic<bool> paused_{false};
  std::atomic<std::uint64_t> passes_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Policy policy_;
  std::vector<ipc::RequestDesc> seen_;
  std::vector<std::pair<int, ipc::RequestDesc>> held_;
  std::vector<std::string> problems_;
};

}  // namespace smddp::testing
