// SpscRing: a bounded single-producer single-consumer queue that lives in shared memory.
// Head and tail are free-running 64-bit counters on separate cache lines; the slot index is
// counter % Capacity. The consumer never trusts the producer's counters: a tail that is
// behind head or more than Capacity ahead marks the ring corrupt instead of reading garbage.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "ipc/prefetch.hpp"

namespace smddp::ipc {

template <class T, std::size_t Capacity>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<T>);
  static_assert(Capacity > 0 && (Capacity & (Capacity - 1)) == 0, "capacity must be a power of two");
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "ring counters must be lock-free");

 public:
  static constexpr std::size_t capacity() noexcept { return Capacity; }

  // Producer side. Returns false when full.
  bool try_push(const T& item) noexcept {
    return try_push_with([&](T& slot) { slot = item; });
  }

  // Producer side: `fill(T&)` writes the item in its slot (no copy of a large T on the way).
  // Returns false when full, without calling it.
  template <class Fill>
  bool try_push_with(Fill&& fill) noexcept {
    const std::uint64_t tail = tail_.load(std::memory_order_relaxed);
    const std::uint64_t head = head_.load(std::memory_order_acquire);
    if (tail - head >= Capacity) return false;
    fill(slots_[tail & (Capacity - 1)]);
    tail_.store(tail + 1, std::memory_order_release);
    return true;
  }

  // Producer side: the first `bytes` of the slot the next push fills, asked for owned (the
  // consumer read them the last time round): taking them back then stalls the push's next
  // fence or locked instruction.
  void prefetch_next_slot(std::size_t bytes) const noexcept {
    const std::uint64_t tail = tail_.load(std::memory_order_relaxed);
    prefetch_lines<true>(&slots_[tail & (Capacity - 1)], bytes);
  }

  enum class PopResult { Item, Empty, Corrupt };

  // Consumer side.
  PopResult try_pop(T& out) noexcept {
    return try_pop_with([&](const T& slot) { out = slot; });
  }

  // Consumer side: `take(const T&)` reads the item in its slot (a large T need not be copied
  // whole). The slot is the producer's again once it returns.
  template <class Take>
  PopResult try_pop_with(Take&& take) noexcept {
    const std::uint64_t head = head_.load(std::memory_order_relaxed);
    const std::uint64_t tail = tail_.load(std::memory_order_acquire);
    if (tail == head) return PopResult::Empty;
    if (tail - head > Capacity) return PopResult::Corrupt;
    take(slots_[head & (Capacity - 1)]);
    head_.store(head + 1, std::memory_order_release);
    return PopResult::Item;
  }

  bool empty() const noexcept {
    return tail_.load(std::memory_order_acquire) == head_.load(std::memory_order_acquire);
  }
  std::size_t size() const noexcept {
    return static_cast<std::size_t>(tail_.load(std::memory_order_acquire) -
                                    head_.load(std::memory_order_acquire));
  }

 private:
  alignas(64) std::atomic<std::uint64_t> head_{0};
  alignas(64) std::atomic<std::uint64_t> tail_{0};
  alignas(64) T slots_[Capacity];
};

}  // namespace smddp::ipc
