// HostExecutor: every OpType run on real staging arenas of a segment made here, with matches
// built by hand (as the matcher would hand them over: indexed by group rank).
#include "daemon/host_executor.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "ipc/segment.hpp"
#include "tests/daemon/host_node.hpp"

namespace smddp::daemon {
namespace {

using namespace test_node;

TEST(HostExecutor, AllReduceSumSmallAndUnaligned) {
  const int n = 3;
  const std::uint64_t c = 10;  // not a multiple of the 64-element task alignment
  Node node(n, 2);
  for (int r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < c; ++i) node.input<float>(r)[i] = static_cast<float>((r + 1) * 100 + i);
  std::uint64_t bytes = 0;
  auto err = node.run(node.match(desc(OpType::AllReduce, DType::Float32, c), c * 4, c * 4), bytes);
  EXPECT_FALSE(err) << *err;
  EXPECT_EQ(bytes, c * 4 * n);
  for (int r = 0; r < n; ++r) {
    for (std::uint64_t i = 0; i < c; ++i) EXPECT_EQ(node.output<float>(r)[i], 600.0f + 3.0f * i) << r << "," << i;
    EXPECT_TRUE(untouched(node.output<float>(r) + c, 64)) << "wrote past the end on rank " << r;
  }
}

TEST(HostExecutor, AllReduceSplitAcrossTheWorkerPool) {
  // 1 MiB per rank: four tasks of 64-element-aligned ranges on a pool of four.
  const int n = 4;
  const std::uint64_t c = (1u << 18) + 7;
  Node node(n, 4);
  for (int r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < c; ++i) node.input<std::int32_t>(r)[i] = static_cast<std::int32_t>(i % 1000) * (r + 1);
  std::uint64_t bytes = 0;
  auto err = node.run(node.match(desc(OpType::AllReduce, DType::Int32, c), c * 4, c * 4), bytes);
  EXPECT_FALSE(err);
  for (int r = 0; r < n; ++r) {
    const auto* o = node.output<std::int32_t>(r);
    for (std::uint64_t i = 0; i < c; ++i)
      ASSERT_EQ(o[i], static_cast<std::int32_t>(i % 1000) * 10) << "rank " << r << " element " << i;
    EXPECT_TRUE(untouched(o + c, 16));
  }
}

TEST(HostExecutor, AllReduceInPlace) {
  const int n = 2;
  const std::uint64_t c = 300;
  Node node(n, 2);
  for (int r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < c; ++i) node.input<double>(r)[i] = static_cast<double>(i) + r;
  std::uint64_t bytes = 0;
  EXPECT_FALSE(node.run(node.match(desc(OpType::AllReduce, DType::Float64, c, ReduceOp::Max), c * 8, c * 8, true), bytes));
  for (int r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < c; ++i) ASSERT_EQ(node.input<double>(r)[i], static_cast<double>(i) + 1);
  EXPECT_TRUE(untouched(node.output<double>(0), 64)) << "in-place must not touch the output region";
}

TEST(HostExecutor, AllReduceAvgAndPremulSum) {
  const int n = 4;
  const std::uint64_t c = 16;
  Node node(n, 2);
  for (int r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < c; ++i) node.input<float>(r)[i] = static_cast<float>(r + 1);  // sum 10
  std::uint64_t bytes = 0;
  EXPECT_FALSE(node.run(node.match(desc(OpType::AllReduce, DType::Float32, c, ReduceOp::Avg), c * 4, c * 4), bytes));
  for (int r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < c; ++i) EXPECT_EQ(node.output<float>(r)[i], 2.5f);

  auto d = desc(OpType::AllReduce, DType::Float32, c, ReduceOp::PremulSum);
  d.scale = 0.5;
  EXPECT_FALSE(node.run(node.match(d, c * 4, c * 4), bytes));
  for (int r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < c; ++i) EXPECT_EQ(node.output<float>(r)[i], 5.0f);
}

TEST(HostExecutor, AllReduceChunkUsesChunkCountOnly) {
  // A pipelined chunk: the buffers hold just the chunk (count is the whole tensor's).
  const int n = 2;
  Node node(n, 2);
  auto d = desc(OpType::AllReduce, DType::Float32, 100);
  d.chunk_offset = 64;
  d.chunk_count = 36;
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 36; ++i) node.input<float>(r)[i] = static_cast<float>(i);
  std::uint64_t bytes = 0;
  EXPECT_FALSE(node.run(node.match(d, 36 * 4, 36 * 4), bytes));
  EXPECT_EQ(bytes, 36u * 4 * n);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 36; ++i) EXPECT_EQ(node.output<float>(r)[i], 2.0f * i);
    EXPECT_TRUE(untouched(node.output<float>(r) + 36, 64 * 4));
  }
}

TEST(HostExecutor, ReduceWritesOnlyTheRoot) {
  const int n = 3;
  const std::uint64_t c = 20;
  Node node(n, 3);
  for (int r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < c; ++i) node.input<std::int64_t>(r)[i] = static_cast<std::int64_t>(i) - r;
  std::uint64_t bytes = 0;
  EXPECT_FALSE(node.run(node.match(desc(OpType::Reduce, DType::Int64, c, ReduceOp::Min, 1), c * 8, c * 8), bytes));
  EXPECT_EQ(bytes, c * 8);
  for (std::uint64_t i = 0; i < c; ++i) EXPECT_EQ(node.output<std::int64_t>(1)[i], static_cast<std::int64_t>(i) - 2);
  EXPECT_TRUE(untouched(node.output<std::int64_t>(0), c * 8));
  EXPECT_TRUE(untouched(node.output<std::int64_t>(2), c * 8));
}

TEST(HostExecutor, ReduceScatterGivesEachRankItsReducedBlock) {
  const int n = 3;
  const std::uint64_t c = 5;  // per rank output
  Node node(n, 2);
  for (int q = 0; q < n; ++q)
    for (std::uint64_t i = 0; i < c * n; ++i) node.input<float>(q)[i] = static_cast<float>(i * 10 + q);
  std::uint64_t bytes = 0;
  EXPECT_FALSE(node.run(node.match(desc(OpType::ReduceScatter, DType::Float32, c), c * n * 4, c * 4), bytes));
  EXPECT_EQ(bytes, c * 4 * n);
  for (int r = 0; r < n; ++r) {
    for (std::uint64_t i = 0; i < c; ++i)
      EXPECT_EQ(node.output<float>(r)[i], static_cast<float>(((r * c + i) * 10) * 3 + (0 + 1 + 2))) << r << "," << i;
    EXPECT_TRUE(untouched(node.output<float>(r) + c, 16));
  }
}

// The operator's counter: bytes the reductions wrote, under the operation's type; copies add none.
TEST(HostExecutor, CountsTheBytesItReducesByOperationType) {
  const int n = 2;
  const std::uint64_t c = 16;
  Node node(n, 1);
  std::uint64_t bytes = 0;
  ASSERT_FALSE(node.run(node.match(desc(OpType::AllReduce, DType::Float32, c), c * 4, c * 4), bytes));
  ASSERT_FALSE(node.run(node.match(desc(OpType::ReduceScatter, DType::Float32, c), c * n * 4, c * 4), bytes));
  ASSERT_FALSE(node.run(node.match(desc(OpType::Broadcast, DType::Float32, c), c * 4, c * 4), bytes));
  const auto& r = node.executor().reduced();
  EXPECT_EQ(r[OpType::AllReduce], c * 4);
  EXPECT_EQ(r[OpType::ReduceScatter], c * 4 * n);
  EXPECT_EQ(r[OpType::Broadcast], 0u);
}

TEST(HostExecutor, BroadcastCopiesTheRootsInputEverywhere) {
  const int n = 4;
  const std::uint64_t c = 33;
  Node node(n, 2);
  for (int r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < c; ++i) node.input<std::uint8_t>(r)[i] = static_cast<std::uint8_t>(r * 50 + i);
  std::uint64_t bytes = 0;
  EXPECT_FALSE(node.run(node.match(desc(OpType::Broadcast, DType::UInt8, c, ReduceOp::Sum, 2), c, c), bytes));
  EXPECT_EQ(bytes, c * (n - 1));
  for (int r = 0; r < n; ++r) {
    for (std::uint64_t i = 0; i < c; ++i) EXPECT_EQ(node.output<std::uint8_t>(r)[i], static_cast<std::uint8_t>(100 + i));
    EXPECT_TRUE(untouched(node.output<std::uint8_t>(r) + c, 16));
  }
}

TEST(HostExecutor, AllGatherConcatenatesInRankOrder) {
  const int n = 3;
  const std::uint64_t c = 7;
  Node node(n, 3);
  for (int q = 0; q < n; ++q)
    for (std::uint64_t i = 0; i < c; ++i) node.input<std::int64_t>(q)[i] = q * 1000 + static_cast<std::int64_t>(i);
  std::uint64_t bytes = 0;
  EXPECT_FALSE(node.run(node.match(desc(OpType::AllGather, DType::Int64, c), c * 8, c * n * 8), bytes));
  EXPECT_EQ(bytes, c * 8 * n * n);
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q)
      for (std::uint64_t i = 0; i < c; ++i)
        EXPECT_EQ(node.output<std::int64_t>(r)[q * c + i], q * 1000 + static_cast<std::int64_t>(i));
    EXPECT_TRUE(untouched(node.output<std::int64_t>(r) + c * n, 16));
  }
}

TEST(HostExecutor, GatherWritesOnlyTheRoot) {
  const int n = 3;
  const std::uint64_t c = 4;
  Node node(n, 2);
  for (int q = 0; q < n; ++q)
    for (std::uint64_t i = 0; i < c; ++i) node.input<float>(q)[i] = static_cast<float>(q * 10 + i);
  std::uint64_t bytes = 0;
  EXPECT_FALSE(node.run(node.match(desc(OpType::Gather, DType::Float32, c, ReduceOp::Sum, 0), c * 4, c * n * 4), bytes));
  EXPECT_EQ(bytes, c * 4 * n);
  for (int q = 0; q < n; ++q)
    for (std::uint64_t i = 0; i < c; ++i) EXPECT_EQ(node.output<float>(0)[q * c + i], static_cast<float>(q * 10 + i));
  EXPECT_TRUE(untouched(node.output<float>(1), c * n * 4));
  EXPECT_TRUE(untouched(node.output<float>(2), c * n * 4));
}

TEST(HostExecutor, ScatterHandsOutTheRootsBlocks) {
  const int n = 3;
  const std::uint64_t c = 6;
  Node node(n, 2);
  for (int q = 0; q < n; ++q)
    for (std::uint64_t i = 0; i < c * n; ++i) node.input<std::int32_t>(q)[i] = q * 1000 + static_cast<std::int32_t>(i);
  std::uint64_t bytes = 0;
  EXPECT_FALSE(node.run(node.match(desc(OpType::Scatter, DType::Int32, c, ReduceOp::Sum, 1), c * n * 4, c * 4), bytes));
  EXPECT_EQ(bytes, c * 4 * n);
  for (int r = 0; r < n; ++r) {
    for (std::uint64_t i = 0; i < c; ++i)
      EXPECT_EQ(node.output<std::int32_t>(r)[i], 1000 + static_cast<std::int32_t>(r * c + i));
    EXPECT_TRUE(untouched(node.output<std::int32_t>(r) + c, 16));
  }
}

TEST(HostExecutor, AllToAllEvenSplit) {
  const int n = 4;
  const std::uint64_t c = 3;  // per peer block
  Node node(n, 4);
  for (int q = 0; q < n; ++q)
    for (std::uint64_t i = 0; i < c * n; ++i) node.input<float>(q)[i] = static_cast<float>(q * 100 + i);
  std::uint64_t bytes = 0;
  EXPECT_FALSE(node.run(node.match(desc(OpType::AllToAll, DType::Float32, c), c * n * 4, c * n * 4), bytes));
  EXPECT_EQ(bytes, c * 4 * n * n);
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q)
      for (std::uint64_t i = 0; i < c; ++i)
        EXPECT_EQ(node.output<float>(r)[q * c + i], static_cast<float>(q * 100 + r * c + i)) << r << "," << q << "," << i;
}

// Uneven all-to-all: send[r][q] elements go from r to q; aux holds send row then recv row.
struct Splits {
  std::vector<std::vector<std::int64_t>> send, recv;
};

Match alltoall_with_splits(Node& node, int n, const Splits& s) {
  Match m = node.match(desc(OpType::AllToAll, DType::Int32, 0), 0, 0);
  for (int r = 0; r < n; ++r) {
    auto& p = m.posted[static_cast<std::size_t>(r)];
    const auto ur = static_cast<std::size_t>(r);
    const std::int64_t sent = std::accumulate(s.send[ur].begin(), s.send[ur].end(), std::int64_t{0});
    const std::int64_t recvd = std::accumulate(s.recv[ur].begin(), s.recv[ur].end(), std::int64_t{0});
    p.desc.flags |= ipc::kFlagSplits;
    p.desc.input.bytes = static_cast<std::uint64_t>(sent) * 4;
    p.desc.output.bytes = static_cast<std::uint64_t>(recvd) * 4;
    p.desc.aux = {ipc::BufferKind::Arena, {}, kAuxOffset, static_cast<std::uint64_t>(2 * n) * 8};
    for (int q = 0; q < n; ++q) {
      node.aux<std::int64_t>(r)[q] = s.send[ur][static_cast<std::size_t>(q)];
      node.aux<std::int64_t>(r)[n + q] = s.recv[ur][static_cast<std::size_t>(q)];
    }
  }
  return m;
}

Splits consistent_splits() {
  // Includes empty blocks in both directions and to oneself.
  Splits s;
  s.send = {{1, 0, 3}, {2, 2, 0}, {0, 4, 1}};
  s.recv.assign(3, std::vector<std::int64_t>(3));
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t q = 0; q < 3; ++q) s.recv[r][q] = s.send[q][r];
  return s;
}

TEST(HostExecutor, AllToAllWithSplitTables) {
  const int n = 3;
  Node node(n, 3);
  const Splits s = consistent_splits();
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < 8; ++i) node.input<std::int32_t>(q)[i] = q * 100 + i;
  std::uint64_t bytes = 0;
  const Match m = alltoall_with_splits(node, n, s);
  auto err = node.run(m, bytes);
  ASSERT_FALSE(err) << *err;
  std::uint64_t expect_bytes = 0;
  for (int r = 0; r < n; ++r) {
    // Expected: for each source q in order, q's block for r (q's blocks are laid out by destination).
    std::vector<std::int32_t> expect;
    for (int q = 0; q < n; ++q) {
      std::int64_t off = 0;
      for (int k = 0; k < r; ++k) off += s.send[static_cast<std::size_t>(q)][static_cast<std::size_t>(k)];
      for (std::int64_t i = 0; i < s.send[static_cast<std::size_t>(q)][static_cast<std::size_t>(r)]; ++i)
        expect.push_back(q * 100 + static_cast<std::int32_t>(off + i));
    }
    std::vector<std::int32_t> got(node.output<std::int32_t>(r), node.output<std::int32_t>(r) + expect.size());
    EXPECT_EQ(got, expect) << "rank " << r;
    EXPECT_TRUE(untouched(node.output<std::int32_t>(r) + expect.size(), 16));
    expect_bytes += expect.size() * 4;
  }
  EXPECT_EQ(bytes, expect_bytes);
}

TEST(HostExecutor, AllToAllInconsistentSplitTablesAreAnError) {
  const int n = 3;
  Node node(n, 2);
  Splits s = consistent_splits();
  s.recv[1][0] = 3;  // rank 0 sends 2 to rank 1, which expects 3
  s.recv[1][2] -= 3;  // keep rank 1's total unchanged so only the pairwise check can catch it
  std::uint64_t bytes = 0;
  auto err = node.run(alltoall_with_splits(node, n, s), bytes);
  ASSERT_TRUE(err);
  EXPECT_EQ(*err, "alltoall split mismatch: rank 0 sends 0 elements to rank 1, which expects 3");
  for (int r = 0; r < n; ++r) EXPECT_TRUE(untouched(node.output<std::int32_t>(r), 64)) << "nothing may be copied";
}

TEST(HostExecutor, AllToAllSplitsThatDoNotAddUpOrAreNegative) {
  const int n = 3;
  Node node(n, 2);
  std::uint64_t bytes = 0;
  {
    Match m = alltoall_with_splits(node, n, consistent_splits());
    m.posted[2].desc.input.bytes += 4;  // tensor one element larger than its splits
    auto err = node.run(m, bytes);
    ASSERT_TRUE(err);
    EXPECT_EQ(*err, "alltoall splits of rank 2 do not add up to its tensor sizes");
  }
  {
    Splits s = consistent_splits();
    s.send[1][2] = -1;
    s.recv[2][1] = -1;
    auto err = node.run(alltoall_with_splits(node, n, s), bytes);
    ASSERT_TRUE(err);
    EXPECT_EQ(*err, "rank 1 gave a negative split");
  }
  for (int r = 0; r < n; ++r) EXPECT_TRUE(untouched(node.output<std::int32_t>(r), 64));
}

TEST(HostExecutor, SendRecvCopiesSenderToReceiver) {
  Node node(2, 2);
  const std::uint64_t c = 9;
  for (std::uint64_t i = 0; i < c; ++i) node.input<float>(1)[i] = static_cast<float>(i) * 1.5f;
  // posted = {send, recv}: here rank 1 sends to rank 0.
  Match m;
  Posted send, recv;
  send.slot = 1;
  send.group_rank = 1;
  send.desc = desc(OpType::Send, DType::Float32, c);
  send.desc.input = {ipc::BufferKind::Arena, {}, 0, c * 4};
  recv.slot = 0;
  recv.group_rank = 0;
  recv.desc = desc(OpType::Recv, DType::Float32, c);
  recv.desc.output = {ipc::BufferKind::Arena, {}, kOutOffset, c * 4};
  m.posted = {send, recv};
  std::uint64_t bytes = 0;
  EXPECT_FALSE(node.run(m, bytes));
  EXPECT_EQ(bytes, c * 4);
  for (std::uint64_t i = 0; i < c; ++i) EXPECT_EQ(node.output<float>(0)[i], static_cast<float>(i) * 1.5f);
  EXPECT_TRUE(untouched(node.output<float>(0) + c, 16));
  EXPECT_TRUE(untouched(node.output<float>(1), 64));
}

TEST(HostExecutor, BarrierAndCommCreateMoveNothing) {
  Node node(2, 2);
  for (OpType op : {OpType::Barrier, OpType::CommCreate}) {
    std::uint64_t bytes = 123;
    EXPECT_FALSE(node.run(node.match(desc(op, DType::Float32, 0), 0, 0), bytes));
    EXPECT_EQ(bytes, 0u);
  }
  EXPECT_TRUE(untouched(node.output<float>(0), 64));
  EXPECT_TRUE(untouched(node.output<float>(1), 64));
}

TEST(HostExecutor, ReadAuxReadsTheRanksAuxBuffer) {
  Node node(2, 1);
  Match m = node.match(desc(OpType::CommCreate, DType::Int32, 0), 0, 0);
  m.posted[1].desc.aux = {ipc::BufferKind::Arena, {}, kAuxOffset, 12};
  const std::int32_t members[3] = {4, 0, 2};
  std::memcpy(node.aux<std::int32_t>(1), members, sizeof members);
  EXPECT_EQ(node.executor().read_aux<std::int32_t>(m.posted[1], 3), (std::vector<std::int32_t>{4, 0, 2}));
}

TEST(HostExecutor, NoSegmentIsLeftBehind) {
  {
    Node node(1, 1);
    (void)node;
  }
  // Every Node above unlinked its segment: none of this process's names remain.
  const std::string prefix = "t-exec-" + std::to_string(::getpid()) + "-";
  for (int i = 0; i < 64; ++i) EXPECT_FALSE(ipc::Segment::exists(prefix + std::to_string(i), 0));
}

}  // namespace
}  // namespace smddp::daemon
