// Cross-memory attach (ipc/cross_memory.hpp), on this process's own memory and on a child's.
#include "ipc/cross_memory.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <numeric>
#include <vector>

namespace {

using smddp::ipc::peer_reads_unavailable;
using smddp::ipc::read_peer;

TEST(CrossMemory, ReadsARangeOfAProcessWhole) {
  if (const auto why = peer_reads_unavailable()) GTEST_SKIP() << *why;
  std::vector<unsigned char> src(3 << 20);
  std::iota(src.begin(), src.end(), 0);
  std::vector<unsigned char> dst(src.size() - 5);
  read_peer(::getpid(), reinterpret_cast<std::uintptr_t>(src.data() + 5), reinterpret_cast<std::byte*>(dst.data()),
            dst.size());
  EXPECT_TRUE(std::equal(dst.begin(), dst.end(), src.begin() + 5));
}

TEST(CrossMemory, ReadsAChildsMemory) {
  if (const auto why = peer_reads_unavailable()) GTEST_SKIP() << *why;
  // The child's copy of `value` (copy on write) changes after the fork; the parent reads that.
  auto* value = static_cast<std::uint64_t*>(
      ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(value, MAP_FAILED);
  *value = 1;
  int ready[2], stop[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(stop), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    smddp::ipc::allow_peer_reads();
    *value = 42;
    char c = 1;
    (void)!::write(ready[1], &c, 1);
    (void)!::read(stop[0], &c, 1);
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  std::uint64_t got = 0;
  read_peer(child, reinterpret_cast<std::uintptr_t>(value), reinterpret_cast<std::byte*>(&got), sizeof got);
  EXPECT_EQ(got, 42u);
  EXPECT_EQ(*value, 1u);
  (void)!::write(stop[1], &c, 1);
  ::waitpid(child, nullptr, 0);
  ::munmap(value, 4096);
}

TEST(CrossMemory, AnUnmappedRangeOrAGoneProcessIsANamedError) {
  if (const auto why = peer_reads_unavailable()) GTEST_SKIP() << *why;
  // A mapping with its second page taken away: the read stops there.
  auto* two = static_cast<std::byte*>(::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(two, MAP_FAILED);
  ASSERT_EQ(::munmap(two + 4096, 4096), 0);
  std::vector<std::byte> out(8192);
  try {
    read_peer(::getpid(), reinterpret_cast<std::uintptr_t>(two), out.data(), out.size());
    FAIL() << "expected the unmapped page to stop the read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("process " + std::to_string(::getpid())), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at byte 4096"), std::string::npos) << e.what();
  }
  ::munmap(two, 4096);
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  try {
    read_peer(gone, 4096, out.data(), 8);
    FAIL() << "expected a process that ended to fail the read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("No such process"), std::string::npos) << e.what();
  }
}

}  // namespace
