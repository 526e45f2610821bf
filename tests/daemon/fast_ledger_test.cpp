// FastLedger: one communicator's host fast-path requests lined up by seq, counted when every
// member posted the same call with the same fast-op number, and handed out for the matcher when
// they disagree, when a member went elsewhere, when they wait too long or for a rank that left.
// Time is passed in explicitly.
#include "daemon/fast_ledger.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

namespace smddp::daemon {
namespace {

using namespace std::chrono_literals;
using ipc::DType;
using ipc::OpType;
using ipc::RequestDesc;
using Outcome = FastLedger::Outcome;

const Clock::time_point t0 = Clock::time_point{} + 1h;

Communicator local_comm(int n) {
  Communicator c;
  c.id = 5;
  for (int g = 0; g < n; ++g) {
    c.global_ranks.push_back(g);
    c.slots.push_back(n - 1 - g);  // slots in the other order than group ranks
  }
  return c;
}

RequestDesc fast(std::uint64_t seq, std::uint64_t k, OpType op = OpType::AllReduce, std::uint64_t count = 8) {
  RequestDesc d;
  d.comm_id = 5;
  d.seq = seq;
  d.op = op;
  d.dtype = DType::Float32;
  d.count = d.chunk_count = count;
  d.flags = ipc::kFlagHostFast;
  d.wait_value = k;
  return d;
}

// A ledger of n members; member g posts from its slot.
struct Ledger {
  explicit Ledger(int n) : c(local_comm(n)), l(c, 0, 1000ms) {}
  Ledger(const Ledger&) = delete;  // the ledger points at `c`
  Outcome post(int g, const RequestDesc& d, Clock::time_point at = t0) {
    return l.post(c.slots[static_cast<std::size_t>(g)], g, d, at);
  }
  Communicator c;
  FastLedger l;
};

TEST(FastLedger, AnOperationRunsOnceEveryMemberPostedTheSameCall) {
  Ledger f(3);
  auto& l = f.l;
  EXPECT_EQ(l.group_rank_of(2), 0);
  EXPECT_EQ(l.group_rank_of(0), 2);
  EXPECT_EQ(l.group_rank_of(3), -1);
  EXPECT_EQ(f.post(1, fast(1, 1)), Outcome::Kept);
  EXPECT_EQ(f.post(0, fast(1, 1)), Outcome::Kept);
  EXPECT_EQ(l.rows(), 1u);
  EXPECT_EQ(f.post(2, fast(1, 1)), Outcome::Ran);
  EXPECT_EQ(l.rows(), 0u);
  EXPECT_FALSE(l.ran().single_copy);
  EXPECT_EQ(l.ran().output_bytes, 3u * 8 * 4);  // each member's 8 floats
}

TEST(FastLedger, ManyOperationsInFlightRunInAnyOrderOfMembers) {
  // One member far ahead (the daemon drains one rank's ring, then the other's): rows pile up,
  // the ring grows, and each runs when its last member comes.
  Ledger f(2);
  auto& l = f.l;
  for (std::uint64_t s = 1; s <= 40; ++s) EXPECT_EQ(f.post(1, fast(s, s)), Outcome::Kept);
  EXPECT_EQ(l.rows(), 40u);
  for (std::uint64_t s = 1; s <= 40; ++s) {
    EXPECT_EQ(f.post(0, fast(s, s)), Outcome::Ran) << s;
    EXPECT_EQ(l.rows(), 40u - s);
  }
  // Seqs the daemon's path took in between are gaps, not rows.
  EXPECT_EQ(f.post(0, fast(45, 41)), Outcome::Kept);
  EXPECT_EQ(f.post(0, fast(47, 42)), Outcome::Kept);
  EXPECT_EQ(f.post(1, fast(47, 42)), Outcome::Ran);
  EXPECT_EQ(f.post(1, fast(45, 41)), Outcome::Ran);
  EXPECT_EQ(l.rows(), 0u);
}

TEST(FastLedger, OutputBytesCountEveryMembersOutput) {
  RequestDesc d = fast(1, 1, OpType::AllGather, 10);  // 10 floats in, 30 out, on each of 3
  EXPECT_EQ(FastLedger::output_bytes(d, 3), 3u * 30 * 4);
  d = fast(1, 1, OpType::Reduce, 10);  // the root alone gets an output
  d.root = 2;
  EXPECT_EQ(FastLedger::output_bytes(d, 3), 10u * 4);
  d = fast(1, 1, OpType::Gather, 10);
  d.root = 0;
  EXPECT_EQ(FastLedger::output_bytes(d, 4), 40u * 4);
  d = fast(1, 1, OpType::Broadcast, 10);
  EXPECT_EQ(FastLedger::output_bytes(d, 4), 4u * 10 * 4);
  d = fast(1, 1, OpType::Barrier, 0);
  EXPECT_EQ(FastLedger::output_bytes(d, 4), 0u);
}

TEST(FastLedger, MembersThatDisagreeHandTheirCallsOut) {
  Ledger f(2);
  auto& l = f.l;
  // Another count.
  EXPECT_EQ(f.post(0, fast(1, 1, OpType::AllReduce, 8)), Outcome::Kept);
  EXPECT_EQ(f.post(1, fast(1, 1, OpType::AllReduce, 9)), Outcome::Disagree);
  auto calls = l.take_finished();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].group_rank, 0);
  EXPECT_EQ(calls[0].slot, 1);
  EXPECT_EQ(calls[0].desc.count, 8u);
  EXPECT_EQ(calls[1].desc.count, 9u);
  EXPECT_EQ(calls[1].desc.input.kind, ipc::BufferKind::None);
  // Another fast-op number: their cells paired different operations.
  EXPECT_EQ(f.post(1, fast(2, 2)), Outcome::Kept);
  EXPECT_EQ(f.post(0, fast(2, 3)), Outcome::Disagree);
  EXPECT_EQ(l.take_finished().size(), 2u);
  // The single-copy flag is the members' own business: only counted.
  RequestDesc by_address = fast(3, 4);
  by_address.flags |= ipc::kFlagSingleCopy;
  EXPECT_EQ(f.post(0, by_address), Outcome::Kept);
  EXPECT_EQ(f.post(1, by_address), Outcome::Ran);
  EXPECT_TRUE(l.ran().single_copy);
  EXPECT_EQ(l.rows(), 0u);
}

TEST(FastLedger, ASecondPostOfOneSeqIsADuplicate) {
  Ledger f(2);
  EXPECT_EQ(f.post(0, fast(1, 1)), Outcome::Kept);
  EXPECT_EQ(f.post(0, fast(1, 1)), Outcome::Duplicate);
  EXPECT_EQ(f.post(1, fast(1, 1)), Outcome::Ran);
}

TEST(FastLedger, ASeqTakenElsewhereNeverComesBack) {
  Ledger f(2);
  auto& l = f.l;
  // A member posted seq 3 through the daemon's path before any fast request of it came.
  l.note_elsewhere(3);
  EXPECT_EQ(f.post(0, fast(3, 1)), Outcome::ToMatcher);
  EXPECT_EQ(f.post(0, fast(2, 1)), Outcome::ToMatcher);  // below it, and no row: also elsewhere
  EXPECT_EQ(f.post(0, fast(4, 1)), Outcome::Kept);       // above it: a row
  // A fast row whose seq a member then posts elsewhere leaves with its calls.
  l.note_elsewhere(4);
  auto calls = l.take(4);
  ASSERT_TRUE(calls);
  ASSERT_EQ(calls->size(), 1u);
  EXPECT_EQ((*calls)[0].group_rank, 0);
  EXPECT_EQ((*calls)[0].desc.seq, 4u);
  EXPECT_EQ(l.rows(), 0u);
  EXPECT_EQ(f.post(1, fast(4, 1)), Outcome::ToMatcher);
  EXPECT_FALSE(l.take(4));
  EXPECT_FALSE(l.take(9));
}

TEST(FastLedger, RowsThatWaitLeaveAfterAWhileOrTheirTimeout) {
  Ledger f(2);
  auto& l = f.l;
  EXPECT_EQ(f.post(0, fast(1, 1), t0), Outcome::Kept);
  RequestDesc quick = fast(2, 2);
  quick.timeout_ms = 30;
  EXPECT_EQ(f.post(0, quick, t0), Outcome::Kept);
  EXPECT_EQ(f.post(0, fast(3, 3), t0 + 50ms), Outcome::Kept);
  EXPECT_TRUE(l.take_aged(t0 + 29ms).empty());
  auto left = l.take_aged(t0 + 30ms);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0][0].desc.seq, 2u);
  left = l.take_aged(t0 + FastLedger::kHandOverAfter);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0][0].desc.seq, 1u);
  EXPECT_EQ(l.rows(), 1u);
  // The rows that left are the matcher's for good; the one that stayed still runs.
  EXPECT_EQ(f.post(1, fast(1, 1)), Outcome::ToMatcher);
  EXPECT_EQ(f.post(1, fast(2, 2)), Outcome::ToMatcher);
  EXPECT_EQ(f.post(1, fast(3, 3)), Outcome::Ran);
}

TEST(FastLedger, RowsThatWaitForAMemberLeaveWhenItIsGone) {
  Ledger f(3);
  auto& l = f.l;
  EXPECT_EQ(f.post(0, fast(1, 1)), Outcome::Kept);
  EXPECT_EQ(f.post(2, fast(1, 1)), Outcome::Kept);  // waits for member 1
  EXPECT_EQ(f.post(1, fast(2, 2)), Outcome::Kept);  // member 1 posted it
  auto left = l.take_waiting_for(1);
  ASSERT_EQ(left.size(), 1u);
  ASSERT_EQ(left[0].size(), 2u);
  EXPECT_EQ(left[0][0].group_rank, 0);
  EXPECT_EQ(left[0][1].group_rank, 2);
  EXPECT_EQ(l.rows(), 1u);
  left = l.take_all();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0][0].desc.seq, 2u);
  EXPECT_EQ(l.rows(), 0u);
}

}  // namespace
}  // namespace smddp::daemon
