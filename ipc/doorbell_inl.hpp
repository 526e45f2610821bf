#pragma once

#include <sched.h>

#include <algorithm>

namespace smddp::ipc {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

inline void Doorbell::order_before_sleeper_checks() noexcept {
#if !defined(__SANITIZE_THREAD__)
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

inline bool Doorbell::has_sleepers() const noexcept {
#if defined(__SANITIZE_THREAD__)
  return true;
#else
  return sleepers_.load(std::memory_order_relaxed) != 0;
#endif
}

template <class Ready>
void Doorbell::wait(std::uint32_t ticket, std::chrono::microseconds timeout, Ready&& ready) {
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
#if !defined(__SANITIZE_THREAD__)
  // Orders the count before the look at `ready()` (the ringer's order_before_sleeper_checks
  // pairs with it). Under TSan, which refuses fences, every ringer rings (has_sleepers).
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
  if (seq_.load(std::memory_order_seq_cst) == ticket && !ready()) sleep(ticket, timeout);
  sleepers_.fetch_sub(1, std::memory_order_seq_cst);
}

template <class Ready>
bool spin_for(Ready&& ready, std::chrono::microseconds spin, bool yield) {
  using clock = std::chrono::steady_clock;
  // Yield after every poll when oversubscribed (yield_between_polls): the thread we wait for
  // needs our core. Measured for an 8 B allreduce with 2 ranks on 2 cores: 21 us yielding
  // every poll, 26-28 us yielding every 16-32 polls.
  // The clock is read every 8 polls: a read costs about as much as a poll (28 ns in a VM); a
  // wait that ends within 8 polls reads it never.
  clock::time_point spin_end{};
  for (unsigned polls = 1;; ++polls) {
    if (ready()) return true;
    cpu_relax();
    if (polls % 8 == 0) {
      const auto now = clock::now();
      if (polls == 8) spin_end = now + spin;
      else if (now >= spin_end) return false;
    }
    if (yield) ::sched_yield();
  }
}

template <class Ready, class OnSlice>
bool spin_then_wait(Doorbell& bell, Ready&& ready, std::chrono::steady_clock::time_point deadline,
                    std::chrono::microseconds spin, std::chrono::microseconds slice, bool yield,
                    OnSlice&& on_slice) {
  using clock = std::chrono::steady_clock;
  if (spin_for(ready, spin, yield)) return true;
  for (;;) {
    const std::uint32_t t = bell.ticket();
    if (ready()) return true;
    const auto now = clock::now();
    if (now >= deadline) return false;
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
    bell.wait(t, std::min(left, slice), ready);
    if (ready()) return true;
    if (!on_slice()) return false;
  }
}

}  // namespace smddp::ipc
