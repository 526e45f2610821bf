#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <vector>

#include "client/arena_allocator.hpp"

using smddp::client::ArenaAllocator;

TEST(ArenaAllocator, RoundsToSixtyFourBytes) {
  ArenaAllocator a(4096);
  auto x = a.allocate(1);
  auto y = a.allocate(65);
  auto z = a.allocate(0);  // still a distinct region
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x % 64, 0u);
  EXPECT_EQ(*y % 64, 0u);
  EXPECT_EQ(*z % 64, 0u);
  EXPECT_EQ(a.in_use(), 64u + 128u + 64u);
  EXPECT_NE(*x, *y);
  EXPECT_NE(*y, *z);
  EXPECT_GE(*y, *x + 64);  // regions never overlap
  // The capacity itself is rounded down to whole 64-byte units.
  EXPECT_EQ(ArenaAllocator(1000).capacity(), 960u);
}

TEST(ArenaAllocator, ExhaustionReturnsNullopt) {
  ArenaAllocator a(1024);
  EXPECT_FALSE(a.allocate(1025).has_value());
  auto all = a.allocate(1024);
  ASSERT_TRUE(all);
  EXPECT_EQ(a.in_use(), 1024u);
  EXPECT_FALSE(a.allocate(1).has_value());
  a.free(*all);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.in_use(), 0u);
  EXPECT_TRUE(a.allocate(1024).has_value());
  // An empty arena has nothing to give.
  ArenaAllocator none(0);
  EXPECT_FALSE(none.allocate(1).has_value());
}

TEST(ArenaAllocator, DoubleFreeAndUnknownOffsetThrow) {
  ArenaAllocator a(1024);
  auto x = a.allocate(100);
  ASSERT_TRUE(x);
  a.free(*x);
  EXPECT_THROW(a.free(*x), std::logic_error);
  auto y = a.allocate(128);
  ASSERT_TRUE(y);
  EXPECT_THROW(a.free(*y + 64), std::logic_error);  // inside a region, not its start
  EXPECT_EQ(a.in_use(), 128u);                      // a refused free changes nothing
}

TEST(ArenaAllocator, FreedNeighboursCoalesceInAnyOrder) {
  // Every order of freeing four adjacent regions must leave one region of the whole arena.
  std::vector<int> order{0, 1, 2, 3};
  do {
    ArenaAllocator a(4 * 256);
    std::vector<std::uint64_t> at;
    for (int i = 0; i < 4; ++i) {
      auto r = a.allocate(256);
      ASSERT_TRUE(r);
      at.push_back(*r);
    }
    EXPECT_FALSE(a.allocate(64).has_value());
    for (int i : order) a.free(at[static_cast<std::size_t>(i)]);
    EXPECT_TRUE(a.empty());
    auto whole = a.allocate(4 * 256);
    ASSERT_TRUE(whole) << "free space was not coalesced for order " << order[0] << order[1] << order[2] << order[3];
    EXPECT_EQ(*whole, 0u);
  } while (std::next_permutation(order.begin(), order.end()));
}

TEST(ArenaAllocator, LongLivedRegionInTheMiddleDoesNotBlockTheRest) {
  ArenaAllocator a(3 * 1024);
  auto left = a.allocate(1024), middle = a.allocate(1024), right = a.allocate(1024);
  ASSERT_TRUE(left && middle && right);
  a.free(*left);
  a.free(*right);
  // The pending middle region splits the space: each side is usable, the sum is not contiguous.
  EXPECT_FALSE(a.allocate(2048).has_value());
  for (int round = 0; round < 100; ++round) {
    auto x = a.allocate(1024), y = a.allocate(1024);
    ASSERT_TRUE(x && y) << "round " << round;
    EXPECT_NE(*x, *middle);
    EXPECT_NE(*y, *middle);
    a.free(*y);
    a.free(*x);
  }
  a.free(*middle);
  EXPECT_TRUE(a.allocate(3 * 1024).has_value());
}

TEST(ArenaAllocator, RandomisedNeverOverlapsAndAlwaysRecoversTheWhole) {
  constexpr std::uint64_t kCap = 64 * 1024;
  ArenaAllocator a(kCap);
  std::mt19937 rng(12345);
  struct Region {
    std::uint64_t at, bytes;
  };
  std::vector<Region> live;
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || rng() % 2 == 0) {
      const std::uint64_t want = 1 + rng() % 4000;
      if (auto r = a.allocate(want)) {
        const std::uint64_t bytes = (want + 63) / 64 * 64;
        ASSERT_LE(*r + bytes, kCap);
        for (const auto& o : live) ASSERT_TRUE(*r + bytes <= o.at || o.at + o.bytes <= *r) << "overlap";
        live.push_back({*r, bytes});
      }
    } else {
      const std::size_t i = rng() % live.size();
      a.free(live[i].at);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    std::uint64_t sum = 0;
    for (const auto& o : live) sum += o.bytes;
    ASSERT_EQ(a.in_use(), sum);
  }
  for (const auto& o : live) a.free(o.at);
  EXPECT_TRUE(a.empty());
  EXPECT_TRUE(a.allocate(kCap).has_value()) << "fragments left after freeing everything";
}
