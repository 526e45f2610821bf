// CopyPool and the single-copy read split over it (client/copy_pool.hpp, host_fast::read_output).
// The cells here name buffers of this process, read through process_vm_readv as a peer's are.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

#include "client/copy_pool.hpp"
#include "client/host_fast.hpp"
#include "ipc/cross_memory.hpp"

namespace {

using smddp::client::copy_threads;
using smddp::client::copy_threads_from;
using smddp::client::CopyPool;
namespace host_fast = smddp::client::host_fast;
namespace ipc = smddp::ipc;

TEST(CopyThreads, OneWhereTheRanksAndTheDaemonShareTheCoresAndAtMostFour) {
  EXPECT_EQ(copy_threads(2, 2), 1);    // 2 ranks and the daemon on 2 cores
  EXPECT_EQ(copy_threads(2, 3), 1);    // a core each, none to spare
  EXPECT_EQ(copy_threads(2, 5), 2);    // 2 to spare: one more each
  EXPECT_EQ(copy_threads(2, 16), 4);   // 13 to spare: capped
  EXPECT_EQ(copy_threads(4, 16), 3);   // 11 to spare among 4
  EXPECT_EQ(copy_threads(8, 16), 1);   // 7 to spare among 8
  EXPECT_EQ(copy_threads(8, 96), 4);
  EXPECT_EQ(copy_threads(0, 16), 1);
}

TEST(CopyThreads, TheEnvironmentOverridesTheRuleAndABadValueIsNamed) {
  EXPECT_EQ(copy_threads_from(nullptr, 2, 16), 4);
  EXPECT_EQ(copy_threads_from("", 2, 16), 4);
  EXPECT_EQ(copy_threads_from("1", 2, 16), 1);
  EXPECT_EQ(copy_threads_from("8", 2, 2), 8);
  for (const char* bad : {"0", "9", "-1", "two", "3x", " 3"}) {
    try {
      copy_threads_from(bad, 2, 16);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("SMDDP_COPY_THREADS"), std::string::npos) << e.what();
    }
  }
}

TEST(CopyPool, RunsEveryPartOnceTheFirstOnTheCaller) {
  CopyPool pool(4);
  for (int parts = 0; parts <= 4; ++parts) {
    std::vector<std::atomic<int>> ran(4);
    std::atomic<bool> first_here{false};
    const auto caller = std::this_thread::get_id();
    pool.run(parts, [&](int j) {
      ran[static_cast<std::size_t>(j)].fetch_add(1);
      if (j == 0) first_here = std::this_thread::get_id() == caller;
    });
    for (int j = 0; j < 4; ++j) EXPECT_EQ(ran[static_cast<std::size_t>(j)].load(), j < parts ? 1 : 0) << parts;
    if (parts > 0) {
      EXPECT_TRUE(first_here.load());
    }
  }
  EXPECT_THROW(pool.run(5, [](int) {}), std::logic_error);
}

TEST(CopyPool, AFailingPartIsRethrownAfterTheOthersEnd) {
  CopyPool pool(3);
  std::atomic<int> finished{0};
  try {
    pool.run(3, [&](int j) {
      if (j == 2) throw std::runtime_error("part 2 failed");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      finished.fetch_add(1);
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "part 2 failed");
  }
  EXPECT_EQ(finished.load(), 2);  // the others had ended: nothing still writes the caller's memory
}

// Two members by single copy, this process both: cells by address, pids this process.
struct TwoMembers {
  explicit TwoMembers(ipc::OpType op, std::uint64_t count, int root = 0) {
    for (int m = 0; m < 2; ++m) {
      in[m].resize(count * (op == ipc::OpType::AllToAll || op == ipc::OpType::Scatter ? 2 : 1));
      std::iota(in[m].begin(), in[m].end(), static_cast<std::uint32_t>(m) << 28);
      auto& c = cells[m];
      c.tag = 1;
      c.comm_id = 7;
      c.seq = 1;
      c.count = count;
      c.root = root;
      c.op = op;
      c.dtype = ipc::DType::Int32;
      c.by_address = 1;
      ipc::Segment::set_fast_address(c, reinterpret_cast<std::uintptr_t>(in[m].data()));
      ptrs[m] = &c;
      pids[m] = ::getpid();
    }
  }
  std::vector<std::uint32_t> in[2];
  ipc::FastCell cells[2];
  ipc::FastCell* ptrs[2];
  int pids[2];
};

TEST(HostFastSplitRead, EveryByteLandsWhereTheSequentialReadPutsItForAnyThreads) {
  if (ipc::peer_reads_unavailable()) GTEST_SKIP() << *ipc::peer_reads_unavailable();
  // Uneven sizes: parts cut across the members' blocks and within pages.
  for (const std::uint64_t count : {std::uint64_t{(1u << 18) + 3}, std::uint64_t{(3u << 19) + 1021}}) {
    for (const auto op : {ipc::OpType::AllGather, ipc::OpType::AllToAll, ipc::OpType::Gather, ipc::OpType::Scatter}) {
      TwoMembers t(op, count);
      const std::size_t out_elems = op == ipc::OpType::Scatter ? count : 2 * count;
      for (int me = 0; me < 2; ++me) {
        std::vector<std::uint32_t> want(out_elems, 0xdeadbeef), got(out_elems, 0xdeadbeef);
        host_fast::read_output({t.ptrs, 2}, {t.pids, 2}, me, 1.0, reinterpret_cast<std::byte*>(want.data()));
        for (int threads : {2, 3, 4}) {
          CopyPool pool(threads);
          std::fill(got.begin(), got.end(), 0xdeadbeef);
          host_fast::read_output({t.ptrs, 2}, {t.pids, 2}, me, 1.0, reinterpret_cast<std::byte*>(got.data()), &pool);
          ASSERT_EQ(got, want) << ipc::to_string(op) << " count " << count << " member " << me << " threads " << threads;
        }
        if (op == ipc::OpType::AllGather) {  // the reference itself: block m is member m's input
          for (int m = 0; m < 2; ++m) {
            ASSERT_EQ(0, std::memcmp(want.data() + m * count, t.in[m].data(), count * 4));
          }
        }
      }
    }
  }
}

TEST(HostFastSplitRead, AReadThatFailsInAHelperIsTheCallersError) {
  if (ipc::peer_reads_unavailable()) GTEST_SKIP() << *ipc::peer_reads_unavailable();
  TwoMembers t(ipc::OpType::AllGather, 1u << 20);
  ipc::Segment::set_fast_address(t.cells[1], 4096);  // not mapped: the kernel refuses the read
  std::vector<std::uint32_t> out(2u << 20);
  CopyPool pool(4);
  EXPECT_THROW(host_fast::read_output({t.ptrs, 2}, {t.pids, 2}, 0, 1.0, reinterpret_cast<std::byte*>(out.data()), &pool),
               std::runtime_error);
}

TEST(HostFastSplitRead, AnOwnBlockThatOverlapsItsPlaceMovesInOnePiece) {
  if (ipc::peer_reads_unavailable()) GTEST_SKIP() << *ipc::peer_reads_unavailable();
  // Member 0's input lies inside its output, shifted by one element: a split memmove would read
  // bytes an earlier part already overwrote.
  const std::uint64_t count = 1u << 20;
  TwoMembers t(ipc::OpType::AllGather, count);
  std::vector<std::uint32_t> out(2 * count + 1);
  std::iota(out.begin() + 1, out.begin() + 1 + count, 0u);  // member 0's input at out + 1
  ipc::Segment::set_fast_address(t.cells[0], reinterpret_cast<std::uintptr_t>(out.data() + 1));
  CopyPool pool(4);
  host_fast::read_output({t.ptrs, 2}, {t.pids, 2}, 0, 1.0, reinterpret_cast<std::byte*>(out.data()), &pool);
  for (std::uint64_t i = 0; i < count; ++i) ASSERT_EQ(out[i], i) << i;
  ASSERT_EQ(0, std::memcmp(out.data() + count, t.in[1].data(), count * 4));
}

}  // namespace
