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
  for (int parts = 0; parts <= 9; ++parts) {  // more parts than threads too
    std::vector<std::atomic<int>> ran(9);
    std::atomic<bool> first_here{false};
    const auto caller = std::this_thread::get_id();
    pool.run(parts, [&](int j) {
      ran[static_cast<std::size_t>(j)].fetch_add(1);
      if (j == 0) first_here = std::this_thread::get_id() == caller;
    });
    for (int j = 0; j < 9; ++j) EXPECT_EQ(ran[static_cast<std::size_t>(j)].load(), j < parts ? 1 : 0) << parts;
    if (parts > 0) {
      EXPECT_TRUE(first_here.load());
    }
  }
}

// Batches back to back, while helpers still look at the one before: no part runs twice, none of
// an ended batch runs, and each batch's writes are the caller's once run returns.
TEST(CopyPool, BatchesBackToBackRunEachPartOnce) {
  CopyPool pool(4);
  std::vector<int> ran(8);  // plain ints: the pool orders each part's write before run returns
  for (int b = 0; b < 20000; ++b) {
    const int parts = 1 + b % 8;
    std::fill(ran.begin(), ran.end(), 0);
    pool.run(parts, [&](int j) { ++ran[static_cast<std::size_t>(j)]; });
    for (int j = 0; j < 8; ++j) ASSERT_EQ(ran[static_cast<std::size_t>(j)], j < parts ? 1 : 0) << "batch " << b;
  }
}

// Helpers that went to sleep (no spin, and a pause between batches) are woken by the next batch
// and take parts; a batch of more parts than the pool takes is refused.
TEST(CopyPool, SleepingHelpersWakeForTheNextBatch) {
  CopyPool pool(3, std::chrono::microseconds(0));
  const auto caller = std::this_thread::get_id();
  bool helped = false;
  for (int b = 0; b < 50 && !helped; ++b) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::atomic<int> elsewhere{0};
    pool.run(3, [&](int) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // long enough for a helper to come
      if (std::this_thread::get_id() != caller) elsewhere.fetch_add(1);
    });
    helped = elsewhere.load() > 0;
  }
  EXPECT_TRUE(helped);
  EXPECT_THROW(pool.run(CopyPool::kMaxParts + 1, [](int) {}), std::invalid_argument);
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

// Members of this process whose cells hold their inputs (not by address), each cell followed by
// room for its input as in the segment.
struct CellMembers {
  CellMembers(ipc::OpType op, std::uint64_t count, int members, int root = 0) : n(members) {
    const std::uint64_t bytes = count * 4;
    for (int m = 0; m < n; ++m) {
      storage[m].resize(sizeof(ipc::FastCell) + bytes + 64);
      auto* at = storage[m].data() + (64 - reinterpret_cast<std::uintptr_t>(storage[m].data()) % 64) % 64;
      auto* c = new (at) ipc::FastCell();
      c->tag = 1;
      c->comm_id = 7;
      c->seq = 1;
      c->count = count;
      c->root = root;
      c->op = op;
      c->dtype = ipc::DType::Int32;
      for (std::uint64_t i = 0; i < count; ++i) {
        const auto v = static_cast<std::uint32_t>((static_cast<std::uint64_t>(m) << 28) + i);
        std::memcpy(ipc::Segment::fast_input(*c) + i * 4, &v, 4);
      }
      ptrs[m] = c;
    }
  }
  int n;
  std::vector<std::byte> storage[4];
  ipc::FastCell* ptrs[4];
};

// From the cells a read of at least kSplitCopiesFrom is cut into parts of kCopyPart, more
// parts than threads: every byte lands where the sequential read puts it, for any threads.
TEST(HostFastSplitRead, FromTheCellsEveryByteLandsWhereTheSequentialReadPutsIt) {
  for (const std::uint64_t count : {std::uint64_t{(1u << 16) + 3}, std::uint64_t{(1u << 17) - 5}}) {
    for (const auto op : {ipc::OpType::AllGather, ipc::OpType::Gather, ipc::OpType::Broadcast}) {
      CellMembers t(op, count, 4);
      ASSERT_GE((op == ipc::OpType::Broadcast ? 1 : 4) * count * 4, smddp::client::kSplitCopiesFrom);
      const std::size_t out_elems = op == ipc::OpType::Broadcast ? count : 4 * count;
      const int me = op == ipc::OpType::Broadcast ? 1 : 0;  // a broadcast's reader, the gather's root
      std::vector<std::uint32_t> want(out_elems, 0xdeadbeef), got(out_elems, 0xdeadbeef);
      host_fast::read_output({t.ptrs, 4}, {}, me, 1.0, reinterpret_cast<std::byte*>(want.data()));
      for (std::uint64_t i = 0; i < out_elems; ++i)  // block m is member m's input (a broadcast's: the root's)
        ASSERT_EQ(want[i], static_cast<std::uint32_t>(((i / count) << 28) + i % count)) << ipc::to_string(op) << " " << i;
      for (int threads : {2, 3, 4}) {
        CopyPool pool(threads);
        std::fill(got.begin(), got.end(), 0xdeadbeef);
        host_fast::read_output({t.ptrs, 4}, {}, me, 1.0, reinterpret_cast<std::byte*>(got.data()), &pool);
        ASSERT_EQ(got, want) << ipc::to_string(op) << " count " << count << " threads " << threads;
      }
    }
  }
}

// An all-reduce by single copy over helper threads: a share of at least 2 parts is reduced in
// parts, and the others' shares read in parts, to the same bits as on one thread.
TEST(HostFastSplitRead, AnAllReduceByShareGivesTheSameBitsForAnyThreads) {
  if (ipc::peer_reads_unavailable()) GTEST_SKIP() << *ipc::peer_reads_unavailable();
  const std::uint64_t count = (3u << 20) + 77;  // float32: shares of 6 MiB, parts cut within them
  std::vector<float> in[2], out[2];
  ipc::FastCell cells[2];
  ipc::FastCell* ptrs[2];
  const int pids[2] = {::getpid(), ::getpid()};
  for (int m = 0; m < 2; ++m) {
    in[m].resize(count);
    for (std::uint64_t i = 0; i < count; ++i) in[m][i] = 0.1f * static_cast<float>(i % 1000) + 0.37f * static_cast<float>(m + 1);
    auto& c = cells[m];
    c.tag = 1;
    c.count = count;
    c.op = ipc::OpType::AllReduce;
    c.dtype = ipc::DType::Float32;
    c.reduce_op = ipc::ReduceOp::Sum;
    c.by_address = 1;
    ptrs[m] = &c;
  }
  const auto run = [&](CopyPool* pool) {
    std::vector<std::byte> scratch;
    for (int m = 0; m < 2; ++m) {
      out[m].assign(count, -1.f);
      ipc::Segment::set_fast_address(cells[m], reinterpret_cast<std::uintptr_t>(in[m].data()));
      ipc::Segment::set_fast_output_address(cells[m], reinterpret_cast<std::uintptr_t>(out[m].data()));
    }
    for (int m = 0; m < 2; ++m)
      host_fast::reduce_share({ptrs, 2}, {pids, 2}, m, 1.0, reinterpret_cast<std::byte*>(out[m].data()), scratch, pool);
    for (int m = 0; m < 2; ++m)
      host_fast::gather_shares({ptrs, 2}, {pids, 2}, m, reinterpret_cast<std::byte*>(out[m].data()), pool);
  };
  run(nullptr);
  const std::vector<float> want = out[0];
  for (std::uint64_t i = 0; i < count; ++i) ASSERT_EQ(want[i], in[0][i] + in[1][i]) << i;
  ASSERT_EQ(out[1], want);
  for (int threads : {2, 3, 4}) {
    CopyPool pool(threads);
    run(&pool);
    ASSERT_EQ(0, std::memcmp(out[0].data(), want.data(), count * 4)) << threads;
    ASSERT_EQ(0, std::memcmp(out[1].data(), want.data(), count * 4)) << threads;
  }
}

// Copies from the cells or the arenas, and chunks staged into the arena: jobs of uneven sizes cut
// into parts of kCopyPart across their boundaries land as one memcpy each would put them, for any
// threads; below kSplitCopiesFrom, or without helpers, one memcpy each.
TEST(CopySplit, EveryByteLandsWhereAMemcpyPutsIt) {
  using smddp::client::copy_split;
  using smddp::client::CopyJob;
  const std::vector<std::uint64_t> sizes = {100003, 3, 262144, 65537, 0, 131071};
  std::uint64_t total = 0;
  for (auto b : sizes) total += b;
  std::vector<std::byte> src(total), want(total + 128), got(total + 128);
  for (std::uint64_t i = 0; i < total; ++i) src[i] = static_cast<std::byte>(i * 131 + 7);
  // Destinations in reverse order with gaps, so that a part cut at the wrong place shows.
  const auto jobs_into = [&](std::vector<std::byte>& dst) {
    std::vector<CopyJob> jobs;
    std::uint64_t from = 0, to = dst.size();
    for (auto b : sizes) {
      to -= b;
      jobs.push_back({dst.data() + to, src.data() + from, b});
      from += b;
      to -= to >= 16 ? 16 : 0;
    }
    return jobs;
  };
  std::fill(want.begin(), want.end(), std::byte{0xee});
  auto reference = jobs_into(want);
  for (const auto& j : reference) std::memcpy(j.dst, j.src, j.bytes);
  for (int threads : {1, 2, 3, 4}) {
    CopyPool pool(threads);
    std::fill(got.begin(), got.end(), std::byte{0xee});
    const auto jobs = jobs_into(got);
    copy_split(&pool, jobs);
    ASSERT_EQ(got, want) << threads;
  }
  std::fill(got.begin(), got.end(), std::byte{0xee});
  const auto jobs = jobs_into(got);
  copy_split(nullptr, jobs);
  ASSERT_EQ(got, want);
}

}  // namespace
