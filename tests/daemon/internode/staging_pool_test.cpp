// The staging pool of operations across nodes: buffers come back for reuse, the cache stays
// within its bound, and a buffer that outlives its pool frees its memory on its own.
#include "daemon/internode/staging_pool.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

using smddp::daemon::internode::StagingPool;

TEST(StagingPool, BuffersArePageAlignedPowersOfTwoAtLeastTheSizeAsked) {
  StagingPool pool(1 << 20);
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{4097}, std::size_t{300000}}) {
    auto buffer = pool.take(bytes);
    ASSERT_NE(buffer.get(), nullptr);
    EXPECT_GE(buffer.capacity(), std::max<std::size_t>(bytes, 1));
    EXPECT_GE(buffer.capacity(), 4096u);
    EXPECT_EQ(buffer.capacity() & (buffer.capacity() - 1), 0u) << buffer.capacity();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.get()) % 4096, 0u);
    std::memset(buffer.get(), 0xab, buffer.capacity());  // all of it is ours (ASan checks)
  }
}

TEST(StagingPool, AReturnedBufferIsReusedForTheSameSizeClass) {
  StagingPool pool(1 << 20);
  std::byte* first = nullptr;
  {
    auto a = pool.take(300000);
    first = a.get();
    EXPECT_EQ(pool.cached_bytes(), 0u);
  }
  EXPECT_EQ(pool.cached_bytes(), 512u << 10);
  auto b = pool.take(262145);  // the same class (512 KiB)
  EXPECT_EQ(b.get(), first);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pool.allocations(), 1u);
  auto c = pool.take(300000);  // the class is empty now: a new buffer
  EXPECT_NE(c.get(), first);
  EXPECT_EQ(pool.allocations(), 2u);
  auto d = pool.take(4096);  // another class never takes it
  EXPECT_EQ(pool.allocations(), 3u);
}

TEST(StagingPool, TheCacheKeepsNoMoreThanItsBound) {
  StagingPool pool(2 << 20);  // room for two 1 MiB buffers
  std::vector<StagingPool::Buffer> buffers;
  for (int i = 0; i < 5; ++i) buffers.push_back(pool.take(1 << 20));
  buffers.clear();  // three of the five go back to the system
  EXPECT_EQ(pool.cached_bytes(), 2u << 20);
  buffers.push_back(pool.take(1 << 20));
  buffers.push_back(pool.take(1 << 20));
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pool.allocations(), 5u);
  StagingPool none(0);  // a pool that keeps nothing still hands out buffers
  { auto l = none.take(10); }
  EXPECT_EQ(none.cached_bytes(), 0u);
}

TEST(StagingPool, MovedBuffersReturnTheirMemoryOnceAndABufferMayOutliveItsPool) {
  std::optional<StagingPool> pool(std::in_place, 1 << 20);
  auto a = pool->take(8192);
  StagingPool::Buffer b = std::move(a);
  EXPECT_EQ(a.get(), nullptr);
  StagingPool::Buffer c;
  c = std::move(b);
  EXPECT_EQ(pool->cached_bytes(), 0u);
  auto other = pool->take(8192);
  c = std::move(other);  // c's first buffer goes back
  EXPECT_EQ(pool->cached_bytes(), 8192u);
  pool.reset();  // c is still held: it frees its buffer itself (LeakSanitizer checks)
  std::memset(c.get(), 1, c.capacity());
}

TEST(StagingPool, WithARegistrarEachBufferIsRegisteredOnceWhenMade) {
  std::vector<std::pair<void*, std::size_t>> registered;
  StagingPool pool(1 << 20, [&](void* base, std::size_t bytes) {
    registered.emplace_back(base, bytes);
    return smddp::daemon::transport::MemoryRegion(base, bytes, nullptr);
  });
  std::byte* first = nullptr;
  {
    auto a = pool.take(5000);
    first = a.get();
    ASSERT_NE(a.region(), nullptr);
    EXPECT_TRUE(a.region()->contains(a.get(), a.capacity()));
    EXPECT_EQ(registered.size(), 1u);
    EXPECT_EQ(registered[0].first, static_cast<void*>(a.get()));
    EXPECT_EQ(registered[0].second, a.capacity());
  }
  auto again = pool.take(6000);  // reused: no new registration
  EXPECT_EQ(again.get(), first);
  ASSERT_NE(again.region(), nullptr);
  EXPECT_EQ(registered.size(), 1u);
  StagingPool plain(1 << 20);
  EXPECT_EQ(plain.take(10).region(), nullptr);
}

TEST(StagingPool, ABufferThatCannotBeRegisteredIsStillHandedOutWithoutARegion) {
  StagingPool pool(1 << 20, [](void*, std::size_t) -> smddp::daemon::transport::MemoryRegion {
    throw std::runtime_error("fi_mr_reg failed: no memory");
  });
  auto a = pool.take(100);
  ASSERT_NE(a.get(), nullptr);
  EXPECT_EQ(a.region(), nullptr);
  EXPECT_EQ(pool.registration_failures(), 1u);
}
