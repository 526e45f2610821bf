// Doorbell: a futex-backed wake-up word in shared memory (an event count).
// The waiter reads a ticket, re-checks its condition, then sleeps until the ticket moves.
// ring() costs one atomic add, plus a futex syscall only when somebody sleeps, so a busy
// producer/consumer pair never enters the kernel.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace smddp::ipc {

class Doorbell {
 public:
  std::uint32_t ticket() const noexcept { return seq_.load(std::memory_order_acquire); }
  void ring() noexcept;
  // Sleeps until ring() moves the ticket past `ticket` or `timeout` passes. Spurious
  // wake-ups are possible: callers re-check their condition.
  void wait(std::uint32_t ticket, std::chrono::microseconds timeout) noexcept;
  // The same, but looks at `ready()` once more after counting itself a sleeper, and does not
  // sleep if it holds. Its ringers may then skip the ring where nobody sleeps:
  //   (writes that make ready() true); order_before_sleeper_checks();
  //   if (bell.has_sleepers()) bell.ring();   // for each bell
  // Either the ringer sees the sleeper, or the sleeper's last look sees the writes. A ring costs
  // a locked add on a line every ringer of the bell takes; the order, one pass of the caller's
  // store buffer for any number of bells.
  template <class Ready>
  void wait(std::uint32_t ticket, std::chrono::microseconds timeout, Ready&& ready);
  static void order_before_sleeper_checks() noexcept;
  // Under TSan, which refuses fences, always true: every bell is rung.
  bool has_sleepers() const noexcept;

 private:
  void sleep(std::uint32_t ticket, std::chrono::microseconds timeout) noexcept;  // the futex wait

  std::atomic<std::uint32_t> seq_{0};
  std::atomic<std::uint32_t> sleepers_{0};
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

// The cores this process may run on (its affinity mask), at least 1.
int usable_cores() noexcept;

// Threads a rank copies large host collectives with (itself included): one, plus its share of
// the cores that the node's ranks and its daemon leave (`cores` - `local_ranks` - 1), at most 4.
// 1 where they share cores, so that an oversubscribed node runs nothing more. The daemon's
// size rules know it too (a read split over helpers goes further).
int copy_threads(int local_ranks, int cores) noexcept;

// Whether a thread that spins should give its core away between polls: yes when the node's
// spinning processes (its ranks and the daemon: `spinners`) outnumber the cores. On 2 cores
// with 2 ranks and the daemon the process we wait for needs our core; with a core each, a
// sched_yield per poll only adds a system call to every wake-up. Open MPI decides the same way
// (mpi_yield_when_idle follows oversubscription).
bool yield_between_polls(int spinners) noexcept;

// Polls `ready()` for about `spin`, yielding the core between polls when `yield`; returns
// whether it became true. The clock is read only from the 8th poll on, every 8 polls.
template <class Ready>
bool spin_for(Ready&& ready, std::chrono::microseconds spin, bool yield);

// Spin-then-sleep: polls `ready()` for about `spin` (yielding the core between polls when
// `yield`, so an oversubscribed machine still makes progress), then sleeps on `bell` in slices
// of `slice` until `ready()` or `deadline`. `on_slice()` runs after each sleep (liveness
// checks); if it returns false the wait ends. Returns whether ready() became true.
template <class Ready, class OnSlice>
bool spin_then_wait(Doorbell& bell, Ready&& ready, std::chrono::steady_clock::time_point deadline,
                    std::chrono::microseconds spin, std::chrono::microseconds slice, bool yield,
                    OnSlice&& on_slice);

}  // namespace smddp::ipc

#include "ipc/doorbell_inl.hpp"
