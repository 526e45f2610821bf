#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <new>
#include <random>
#include <thread>

#include "ipc/doorbell.hpp"
#include "ipc/protocol.hpp"
#include "ipc/ring.hpp"

using namespace smddp::ipc;

TEST(SpscRing, FifoAndFull) {
  auto ring = std::make_unique<SpscRing<int, 4>>();
  int v = 0;
  EXPECT_EQ(ring->try_pop(v), (SpscRing<int, 4>::PopResult::Empty));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(ring->try_push(i));
  EXPECT_FALSE(ring->try_push(99));
  EXPECT_EQ(ring->size(), 4u);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(ring->try_pop(v), (SpscRing<int, 4>::PopResult::Item));
    EXPECT_EQ(v, i);
  }
  EXPECT_TRUE(ring->empty());
  // Wrap-around many times.
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(ring->try_push(i));
    ASSERT_EQ(ring->try_pop(v), (SpscRing<int, 4>::PopResult::Item));
    ASSERT_EQ(v, i);
  }
}

TEST(SpscRing, PushWithFillsTheSlotInPlaceAndNeverWhenFull) {
  auto ring = std::make_unique<SpscRing<int, 4>>();
  int calls = 0;
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(ring->try_push_with([&](int& slot) {
      ++calls;
      slot = 10 + i;
    }));
  EXPECT_FALSE(ring->try_push_with([&](int& slot) {
    ++calls;
    slot = 99;
  }));
  EXPECT_EQ(calls, 4);  // a full ring does not call it: the oldest item stays
  int v = 0;
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(ring->try_pop(v), (SpscRing<int, 4>::PopResult::Item));
    EXPECT_EQ(v, 10 + i);
  }
  EXPECT_TRUE(ring->empty());
}

TEST(SpscRing, CorruptCountersAreDetected) {
  auto ring = std::make_unique<SpscRing<int, 4>>();
  ASSERT_TRUE(ring->try_push(1));
  // A hostile producer scribbles a tail far ahead of head.
  auto* words = reinterpret_cast<std::atomic<std::uint64_t>*>(ring.get());
  words[64 / sizeof(std::uint64_t)].store(1000);  // tail lives on the second cache line
  int v = 0;
  EXPECT_EQ(ring->try_pop(v), (SpscRing<int, 4>::PopResult::Corrupt));
}

namespace {
struct Shared {
  SpscRing<RequestDesc, 64> ring;
  Doorbell bell;
};
std::uint64_t checksum(const RequestDesc& d) { return d.seq * 0x9E3779B97F4A7C15ull ^ d.count ^ (d.chunk_count << 7); }
}  // namespace

// Two processes hammer one ring in shared memory: random burst sizes and payloads,
// every item arrives once, in order, intact.
TEST(SpscRing, TwoProcessesHammer) {
  constexpr std::uint64_t kItems = 200000;
  void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* sh = new (mem) Shared();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::mt19937_64 rng(42);
    std::uint64_t sent = 0;
    while (sent < kItems) {
      const std::uint64_t burst = 1 + rng() % 97;
      for (std::uint64_t b = 0; b < burst && sent < kItems;) {
        RequestDesc d;
        d.seq = sent;
        d.count = rng();
        d.chunk_count = rng() % 100000;
        d.chunk_offset = checksum(d);
        if (sh->ring.try_push(d)) {
          ++sent;
          ++b;
          sh->bell.ring();
        } else {
          sched_yield();
        }
      }
    }
    ::_exit(0);
  }
  std::uint64_t got = 0, bad = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (got < kItems && std::chrono::steady_clock::now() < deadline) {
    RequestDesc d;
    auto r = sh->ring.try_pop(d);
    if (r == decltype(sh->ring)::PopResult::Item) {
      if (d.seq != got || d.chunk_offset != checksum(d)) ++bad;
      ++got;
    } else {
      ASSERT_NE(r, decltype(sh->ring)::PopResult::Corrupt);
      const auto t = sh->bell.ticket();
      if (sh->ring.empty()) sh->bell.wait(t, std::chrono::microseconds(1000));
    }
  }
  int st = 0;
  ::waitpid(child, &st, 0);
  EXPECT_EQ(got, kItems);
  EXPECT_EQ(bad, 0u);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ::munmap(mem, sizeof(Shared));
}

TEST(Doorbell, WaitTimesOutAndWakes) {
  Doorbell bell;
  const auto t0 = std::chrono::steady_clock::now();
  bell.wait(bell.ticket(), std::chrono::microseconds(20000));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(15));
  // A ring between ticket() and wait() is never lost.
  const auto t = bell.ticket();
  bell.ring();
  const auto t1 = std::chrono::steady_clock::now();
  bell.wait(t, std::chrono::seconds(5));
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(1));
}

// Spinning yields only when the node's spinning processes outnumber the cores this process may
// run on: its affinity mask, not the machine's core count.
TEST(Doorbell, YieldsBetweenPollsOnlyWhenSpinnersOutnumberCores) {
  cpu_set_t all;
  ASSERT_EQ(::sched_getaffinity(0, sizeof all, &all), 0);
  const int cores = CPU_COUNT(&all);
  EXPECT_EQ(usable_cores(), cores);
  EXPECT_FALSE(yield_between_polls(cores));
  EXPECT_TRUE(yield_between_polls(cores + 1));
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
  const int pinned = usable_cores();
  const bool two_yield = yield_between_polls(2);
  ASSERT_EQ(::sched_setaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(pinned, 1);
  EXPECT_TRUE(two_yield);
}

// Both spin forms see a condition another thread sets while they spin.
TEST(Doorbell, SpinThenWaitSeesReadyWithAndWithoutYield) {
  for (const bool yield : {false, true}) {
    Doorbell bell;
    std::atomic<bool> flag{false};
    std::thread setter([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      flag.store(true, std::memory_order_release);
      bell.ring();
    });
    const bool ok = spin_then_wait(
        bell, [&] { return flag.load(std::memory_order_acquire); },
        std::chrono::steady_clock::now() + std::chrono::seconds(5), std::chrono::microseconds(50),
        std::chrono::microseconds(20000), yield, [] { return true; });
    setter.join();
    EXPECT_TRUE(ok) << "yield " << yield;
  }
}

// A ringer that rings only bells with sleepers (order_before_sleeper_checks, has_sleepers) never
// leaves a waiter asleep. Each round the waiter spins only briefly, then sleeps with a 500 ms
// slice, while the ringer sets the flag after a delay spread over the waiter's way to its sleep
// (its last polls, its count, its last look): a lost wake-up shows as a round that waited for its
// slice. Without the waiter's last look the check below fails in about 2% of the rounds.
TEST(Doorbell, ARingerThatSkipsBellsWithoutSleepersNeverLosesAWaiter) {
  constexpr int kRounds = 5000;
  constexpr auto kSlice = std::chrono::milliseconds(500);
  Doorbell bell;
  std::atomic<int> round{0}, done{0};
  std::atomic<int> late{0};
  std::thread waiter([&] {
    for (int r = 1; r <= kRounds && late.load() == 0; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      spin_then_wait(
          bell, [&] { return round.load(std::memory_order_acquire) >= r; },
          std::chrono::steady_clock::now() + std::chrono::seconds(10), std::chrono::microseconds(0),
          std::chrono::duration_cast<std::chrono::microseconds>(kSlice), false, [] { return true; });
      if (std::chrono::steady_clock::now() - t0 >= kSlice * 4 / 5) late.store(r);
      done.store(r, std::memory_order_release);
    }
  });
  std::minstd_rand random(7);
  for (int r = 1; r <= kRounds && late.load() == 0; ++r) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(random() % 2000);
    while (std::chrono::steady_clock::now() < until) {
    }
    round.store(r, std::memory_order_release);
    Doorbell::order_before_sleeper_checks();
    if (bell.has_sleepers()) bell.ring();
    while (done.load(std::memory_order_acquire) < r) std::this_thread::yield();
  }
  waiter.join();
  EXPECT_EQ(late.load(), 0) << "round " << late.load() << " waited for its slice: a lost wake-up";
}
