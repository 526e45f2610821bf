// Host reductions split among the ranks (CompletionKind::Shares): how a chunk is cut into the
// members' shares, and the payload a completion carries (encoded in its error bytes).
#include <gtest/gtest.h>

#include "ipc/protocol.hpp"

using namespace smddp::ipc;

namespace {

TEST(Shares, CoverTheChunkOnceInWholeRuns) {
  for (const std::uint64_t count : {1ull, 63ull, 64ull, 65ull, 1000ull, 16384ull, 100003ull})
    for (const std::uint32_t n : {2u, 3u, 8u, static_cast<std::uint32_t>(kMaxShareMembers)}) {
      std::uint64_t next = 0;
      for (std::uint32_t r = 0; r < n; ++r) {
        const auto [lo, hi] = share_range(count, n, r);
        ASSERT_EQ(lo, next) << count << " / " << n << " member " << r;
        ASSERT_LE(lo, hi);
        if (hi < count) {
          ASSERT_EQ(hi % 64, 0u) << count << " / " << n << " member " << r;  // cache lines unshared
        }
        next = hi;
      }
      ASSERT_EQ(next, count) << count << " / " << n;
    }
}

TEST(Shares, PayloadRoundTripsForTheLargestGroup) {
  static_assert(kMaxShareMembers >= 8, "the ranks of a node's 8 GPUs fit one completion");
  const std::size_t n = kMaxShareMembers;
  CompletionDesc c;
  SharesHeader h;
  h.members = static_cast<std::uint32_t>(n);
  h.me = 3;
  h.count = 12345;
  h.scale = 0.5;
  h.root = 2;
  h.op = OpType::Reduce;
  h.dtype = DType::BFloat16;
  h.reduce_op = ReduceOp::Max;
  c.set_shares_header(h);
  for (std::size_t q = 0; q < n; ++q) {
    c.set_share_input(q, ArenaSource{static_cast<std::int32_t>(q), 0, 1000 + q, 2000 + q});
    c.set_share_reader(n, q, SourceReader{static_cast<std::int32_t>(q + 100), 0, 3000 + q});
    c.set_share_mark(n, q, SourceReader{static_cast<std::int32_t>(q + 200), 0, 4000 + q});
  }
  const auto g = c.shares_header();
  EXPECT_EQ(g.members, n);
  EXPECT_EQ(g.me, 3u);
  EXPECT_EQ(g.count, 12345u);
  EXPECT_EQ(g.scale, 0.5);
  EXPECT_EQ(g.root, 2);
  EXPECT_EQ(g.op, OpType::Reduce);
  EXPECT_EQ(g.dtype, DType::BFloat16);
  EXPECT_EQ(g.reduce_op, ReduceOp::Max);
  for (std::size_t q = 0; q < n; ++q) {
    EXPECT_EQ(c.share_input(q).slot, static_cast<std::int32_t>(q));
    EXPECT_EQ(c.share_input(q).offset, 1000 + q);
    EXPECT_EQ(c.share_input(q).bytes, 2000 + q);
    EXPECT_EQ(c.share_reader(n, q).slot, static_cast<std::int32_t>(q + 100));
    EXPECT_EQ(c.share_reader(n, q).seq, 3000 + q);
    EXPECT_EQ(c.share_mark(n, q).slot, static_cast<std::int32_t>(q + 200));
    EXPECT_EQ(c.share_mark(n, q).seq, 4000 + q);
  }
}

}  // namespace
