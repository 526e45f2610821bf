// arena_sources: for every collective that only moves bytes, the blocks a rank copies from the
// sources must be exactly what the daemon's own copies (HostExecutor::run) write into its
// output region; and only such collectives, offered by every member, above the bound, take it.
#include "daemon/arena_sources.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/daemon/host_node.hpp"

namespace smddp::daemon {
namespace {

using namespace test_node;

constexpr std::uint64_t kInputStride = 64ull << 10;  // rank r's input starts r strides into its arena

// `m` with every member offering to read sources and its input moved r strides in, filled
// with bytes that name the rank and the position.
Match offered(Node& node, Match m, std::uint64_t in_bytes) {
  for (auto& p : m.posted) {
    p.desc.flags |= ipc::kFlagReadSources;
    if (p.desc.input.bytes == 0) continue;
    p.desc.input.offset = static_cast<std::uint64_t>(p.slot) * kInputStride;
    auto* in = node.input<std::uint8_t>(p.slot) + p.desc.input.offset;
    for (std::uint64_t i = 0; i < in_bytes; ++i) in[i] = static_cast<std::uint8_t>(p.slot * 37 + i * 7);
  }
  return m;
}

// What rank r's client would copy into its output, block after block.
std::vector<std::uint8_t> apply(Node& node, const std::vector<ipc::ArenaSource>& sources) {
  std::vector<std::uint8_t> out;
  for (const auto& s : sources) {
    const auto* from = node.input<std::uint8_t>(s.slot) + s.offset;
    out.insert(out.end(), from, from + s.bytes);
  }
  return out;
}

struct Case {
  const char* name;
  OpType op;
  int root;
  std::uint64_t in_blocks_root, in_blocks_other;    // blocks of input per rank
  std::uint64_t out_blocks_root, out_blocks_other;  // blocks of output the rank copies
};

TEST(ArenaSources, SourcesGiveExactlyWhatTheDaemonsCopiesWrite) {
  const int n = 3;
  const std::uint64_t c = 40;  // elements per block (float32)
  const std::uint64_t blk = c * 4;
  const Case cases[] = {
      {"allgather", OpType::AllGather, 0, 1, 1, n, n},
      {"broadcast", OpType::Broadcast, 1, 1, 0, 0, 1},
      {"gather", OpType::Gather, 2, 1, 1, n, 0},
      {"scatter", OpType::Scatter, 1, n, 0, 1, 1},
      {"alltoall", OpType::AllToAll, 0, n, n, n, n},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.name);
    Node node(n, 1);
    Match m = node.match(desc(k.op, DType::Float32, c, ReduceOp::Sum, k.root), 0, 0);
    for (auto& p : m.posted) {
      const bool root = p.group_rank == k.root;
      p.desc.input = {ipc::BufferKind::Arena, {}, 0, (root ? k.in_blocks_root : k.in_blocks_other) * blk};
      p.desc.output = {ipc::BufferKind::Arena, {}, kOutOffset, (root ? k.out_blocks_root : k.out_blocks_other) * blk};
      if (p.desc.input.bytes == 0) p.desc.input.kind = ipc::BufferKind::None;
    }
    m = offered(node, std::move(m), n * blk);
    const auto sources = arena_sources(m, 0);
    ASSERT_TRUE(sources);
    ASSERT_EQ(sources->size(), static_cast<std::size_t>(n));
    std::uint64_t bytes = 0;
    ASSERT_FALSE(node.run(m, bytes));  // the reference: the daemon's copies into the output regions
    for (int r = 0; r < n; ++r) {
      const auto& mine = (*sources)[static_cast<std::size_t>(r)];
      const std::uint64_t want_blocks = r == k.root ? k.out_blocks_root : k.out_blocks_other;
      ASSERT_EQ(mine.size(), want_blocks) << "rank " << r;
      for (const auto& s : mine) EXPECT_EQ(s.bytes, blk);
      const auto got = apply(node, mine);
      ASSERT_EQ(got.size(), want_blocks * blk);
      // (An empty vector's data() may be null, which memcmp must not get even for 0 bytes.)
      if (!got.empty()) {
        EXPECT_EQ(std::memcmp(got.data(), node.output<std::uint8_t>(r), got.size()), 0) << "rank " << r;
      }
    }
  }
}

TEST(ArenaSources, OnlyWhenEveryMemberOfferedAndTheOpOnlyMovesBytes) {
  const int n = 2;
  const std::uint64_t c = 16;
  Node node(n, 1);
  const auto allgather = [&] { return offered(node, node.match(desc(OpType::AllGather, DType::Float32, c), c * 4, c * 8), c * 4); };
  EXPECT_TRUE(arena_sources(allgather(), 0));

  Match one_did_not = allgather();
  one_did_not.posted[1].desc.flags &= ~ipc::kFlagReadSources;
  EXPECT_FALSE(arena_sources(one_did_not, 0));

  // Reductions need the daemon's arithmetic.
  EXPECT_FALSE(arena_sources(offered(node, node.match(desc(OpType::AllReduce, DType::Float32, c), c * 4, c * 4), c * 4), 0));
  EXPECT_FALSE(arena_sources(offered(node, node.match(desc(OpType::ReduceScatter, DType::Float32, c), c * 8, c * 4), c * 8), 0));
  // Split tables are checked and applied by the daemon.
  Match splits = offered(node, node.match(desc(OpType::AllToAll, DType::Float32, c), c * 8, c * 8), c * 8);
  for (auto& p : splits.posted) p.desc.flags |= ipc::kFlagSplits;
  EXPECT_FALSE(arena_sources(splits, 0));
  // Nothing to read.
  EXPECT_FALSE(arena_sources(offered(node, node.match(desc(OpType::AllGather, DType::Float32, 0), 0, 0), 0), 0));
}

TEST(ArenaSources, BelowTheBoundTheDaemonCopies) {
  const int n = 2;
  const std::uint64_t c = 16;  // each rank copies n * c * 4 = 128 bytes
  Node node(n, 1);
  const Match m = offered(node, node.match(desc(OpType::AllGather, DType::Float32, c), c * 4, c * 8), c * 4);
  EXPECT_TRUE(arena_sources(m, 128));
  EXPECT_FALSE(arena_sources(m, 129));
}

}  // namespace
}  // namespace smddp::daemon
