// Matcher: collectives by (comm, seq, chunk), p2p by (comm, src, dst, seq, chunk), CommCreate,
// timeouts, stalls and failure of what waits for a dead rank. Time is passed in explicitly, so
// nothing here depends on the clock.
#include "daemon/matcher.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace smddp::daemon {
namespace {

using namespace std::chrono_literals;
using ipc::DType;
using ipc::OpType;
using ipc::ReduceOp;
using ipc::RequestDesc;
using ipc::Status;

const Clock::time_point t0 = Clock::time_point{} + 1h;

RequestDesc coll(OpType op, std::uint64_t seq, std::uint64_t count = 8, std::uint64_t comm = 0) {
  RequestDesc d;
  d.op = op;
  d.comm_id = comm;
  d.seq = seq;
  d.dtype = DType::Float32;
  d.reduce_op = ReduceOp::Sum;
  d.count = count;
  d.chunk_offset = 0;
  d.chunk_count = count;
  return d;
}

RequestDesc p2p(OpType op, int peer, std::uint64_t seq, int tag = 0, std::uint64_t count = 8) {
  RequestDesc d = coll(op, seq, count);
  d.root = peer;
  d.tag = tag;
  return d;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
#define EXPECT_CONTAINS(s, part) EXPECT_TRUE(contains((s), (part))) << "in: " << (s)

std::vector<int> local(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

// --- collectives ---------------------------------------------------------------------------

TEST(Matcher, WorldHoldsEveryGlobalRank) {
  Matcher m({0, 1, -1, -1}, 1000ms);
  const Communicator* w = m.find(0);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->global_ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(w->slots, (std::vector<int>{0, 1, -1, -1}));
  EXPECT_EQ(w->local_member_count(), 2);
  EXPECT_EQ(m.find(1), nullptr);
  EXPECT_EQ(m.communicator_count(), 1u);
}

TEST(Matcher, AllReduceMatchesOnceEveryLocalRankPosted) {
  Matcher m(local(4), 1000ms);
  // Posted out of order: the match is still indexed by group rank.
  for (int r : {2, 0, 3}) {
    EXPECT_TRUE(m.post(r, r, coll(OpType::AllReduce, 1), t0).empty());
  }
  EXPECT_EQ(m.pending_count(), 1u);
  auto out = m.post(1, 1, coll(OpType::AllReduce, 1), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
  EXPECT_TRUE(out[0].error.empty());
  EXPECT_EQ(out[0].comm, m.find(0));
  ASSERT_EQ(out[0].posted.size(), 4u);
  for (int g = 0; g < 4; ++g) {
    EXPECT_EQ(out[0].posted[static_cast<std::size_t>(g)].group_rank, g);
    EXPECT_EQ(out[0].posted[static_cast<std::size_t>(g)].slot, g);
  }
  EXPECT_EQ(m.pending_count(), 0u);
}

TEST(Matcher, SequencesAreMatchedIndependently) {
  Matcher m(local(2), 1000ms);
  EXPECT_TRUE(m.post(0, 0, coll(OpType::AllReduce, 1), t0).empty());
  EXPECT_TRUE(m.post(0, 0, coll(OpType::AllReduce, 2), t0).empty());
  EXPECT_EQ(m.pending_count(), 2u);
  auto second = m.post(1, 1, coll(OpType::AllReduce, 2), t0);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].posted[0].desc.seq, 2u);
  auto first = m.post(1, 1, coll(OpType::AllReduce, 1), t0);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].posted[0].desc.seq, 1u);
  EXPECT_EQ(m.pending_count(), 0u);
}

TEST(Matcher, ChunksOfOneSeqAreMatchedSeparately) {
  Matcher m(local(2), 1000ms);
  auto chunk = [](std::uint64_t off) {
    RequestDesc d = coll(OpType::AllReduce, 7, 8);
    d.chunk_offset = off;
    d.chunk_count = 4;
    return d;
  };
  EXPECT_TRUE(m.post(0, 0, chunk(0), t0).empty());
  EXPECT_TRUE(m.post(0, 0, chunk(4), t0).empty());
  EXPECT_TRUE(m.post(1, 1, chunk(4), t0).size() == 1u);
  EXPECT_EQ(m.pending_count(), 1u);
  auto out = m.post(1, 1, chunk(0), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
  EXPECT_EQ(out[0].posted[0].desc.chunk_offset, 0u);
  EXPECT_EQ(out[0].posted[1].desc.chunk_offset, 0u);
}

TEST(Matcher, RemoteRanksAreNotWaitedFor) {
  Matcher m({-1, -1, 0, 1}, 1000ms);  // node 1 of two, global ranks 2 and 3 local
  EXPECT_TRUE(m.post(0, 2, coll(OpType::Barrier, 0), t0).empty());
  auto out = m.post(1, 3, coll(OpType::Barrier, 0), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
  ASSERT_EQ(out[0].posted.size(), 2u);
  EXPECT_EQ(out[0].posted[0].group_rank, 2);
  EXPECT_EQ(out[0].posted[1].group_rank, 3);
}

TEST(Matcher, SignatureMismatchNamesEachRanksCall) {
  Matcher m(local(3), 1000ms);
  EXPECT_TRUE(m.post(0, 0, coll(OpType::AllReduce, 4, 8), t0).empty());
  // Judged once every local member posted, so the error can name every call.
  EXPECT_TRUE(m.post(1, 1, coll(OpType::AllReduce, 4, 16), t0).empty());
  auto out = m.post(2, 2, coll(OpType::AllReduce, 4, 8), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Mismatch);
  ASSERT_EQ(out[0].posted.size(), 3u);
  EXPECT_EQ(out[0].error,
            "collective mismatch on communicator 0 (operation #4): "
            "rank 0 called allreduce(float32, count=8, op=sum), "
            "rank 1 called allreduce(float32, count=16, op=sum), "
            "rank 2 called allreduce(float32, count=8, op=sum)");
  EXPECT_EQ(m.pending_count(), 0u);
}

TEST(Matcher, FailedSeqStaysFailedForLaterChunks) {
  Matcher m(local(2), 1000ms);
  auto chunk = [](std::uint64_t off, DType t) {
    RequestDesc d = coll(OpType::AllReduce, 4, 8);
    d.dtype = t;
    d.chunk_offset = off;
    d.chunk_count = 4;
    return d;
  };
  EXPECT_TRUE(m.post(0, 0, chunk(0, DType::Float32), t0).empty());
  auto out = m.post(1, 1, chunk(0, DType::Float64), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Mismatch);
  const std::string e = out[0].error;
  EXPECT_CONTAINS(e, "rank 0 called allreduce(float32, count=8, chunk=0+4, op=sum)");
  EXPECT_CONTAINS(e, "rank 1 called allreduce(float64, count=8, chunk=0+4, op=sum)");

  // The next chunk of the failed collective fails at once, on each rank, with the same error.
  for (int r : {0, 1}) {
    auto late = m.post(r, r, chunk(4, r == 0 ? DType::Float32 : DType::Float64), t0);
    ASSERT_EQ(late.size(), 1u);
    EXPECT_EQ(late[0].status, Status::Mismatch);
    EXPECT_EQ(late[0].error, e);
    ASSERT_EQ(late[0].posted.size(), 1u);
    EXPECT_EQ(late[0].posted[0].slot, r);
  }
  EXPECT_EQ(m.pending_count(), 0u);
  // Other seqs are unaffected.
  EXPECT_TRUE(m.post(0, 0, coll(OpType::AllReduce, 5, 8), t0).empty());
  EXPECT_EQ(m.post(1, 1, coll(OpType::AllReduce, 5, 8), t0).size(), 1u);
}

// A chunk of the failed seq that a rank had posted before the failure fails with it, at once,
// instead of waiting out the collective timeout.
TEST(Matcher, FailedSeqAlsoFailsChunksAlreadyPending) {
  Matcher m(local(2), 1000ms);
  auto chunk = [](std::uint64_t off, DType t) {
    RequestDesc d = coll(OpType::AllReduce, 4, 8);
    d.dtype = t;
    d.chunk_offset = off;
    d.chunk_count = 4;
    return d;
  };
  EXPECT_TRUE(m.post(0, 0, chunk(0, DType::Float32), t0).empty());
  EXPECT_TRUE(m.post(0, 0, chunk(4, DType::Float32), t0).empty());  // pipelined: posted before any result
  auto out = m.post(1, 1, chunk(0, DType::Float64), t0);
  // The mismatch, and at once rank 0's chunk 4 that was already waiting.
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].status, Status::Mismatch);
  EXPECT_EQ(out[1].status, Status::Mismatch);
  ASSERT_EQ(out[1].posted.size(), 1u);
  EXPECT_EQ(out[1].posted[0].desc.chunk_offset, 4u) << "rank 0's pending chunk must fail too";
  auto late = m.post(1, 1, chunk(4, DType::Float64), t0);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].status, Status::Mismatch);
  EXPECT_EQ(m.pending_count(), 0u);
}

TEST(Matcher, EachSignatureFieldMustAgree) {
  struct Case {
    const char* what;
    void (*change)(RequestDesc&);
  };
  const Case cases[] = {
      {"op", [](RequestDesc& d) { d.op = OpType::AllGather; }},
      {"dtype", [](RequestDesc& d) { d.dtype = DType::Float64; }},
      {"count", [](RequestDesc& d) { d.count = 9; d.chunk_count = 9; }},
      {"chunk_count", [](RequestDesc& d) { d.chunk_count = 4; }},
      {"reduce_op", [](RequestDesc& d) { d.reduce_op = ReduceOp::Max; }},
      {"sdp flag", [](RequestDesc& d) { d.flags |= ipc::kFlagSdp; }},
  };
  std::uint64_t seq = 0;
  for (const auto& c : cases) {
    Matcher m(local(2), 1000ms);
    RequestDesc a = coll(OpType::AllReduce, seq), b = a;
    c.change(b);
    EXPECT_TRUE(m.post(0, 0, a, t0).empty()) << c.what;
    auto out = m.post(1, 1, b, t0);
    ASSERT_EQ(out.size(), 1u) << c.what;
    EXPECT_EQ(out[0].status, Status::Mismatch) << c.what;
    ++seq;
  }
}

TEST(Matcher, FieldsAnOpDoesNotUseNeedNotAgree) {
  Matcher m(local(2), 1000ms);
  // Broadcast does not reduce: the reduce op may differ. In-place is per rank.
  RequestDesc a = coll(OpType::Broadcast, 0), b = a;
  b.reduce_op = ReduceOp::Max;
  b.flags |= ipc::kFlagInPlace;
  EXPECT_TRUE(m.post(0, 0, a, t0).empty());
  auto out = m.post(1, 1, b, t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
  // AllReduce has no root.
  RequestDesc c = coll(OpType::AllReduce, 1), d = c;
  d.root = 1;
  EXPECT_TRUE(m.post(0, 0, c, t0).empty());
  out = m.post(1, 1, d, t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
}

TEST(Matcher, RootMismatchIsNamed) {
  Matcher m(local(2), 1000ms);
  RequestDesc a = coll(OpType::Broadcast, 3), b = a;
  a.root = 0;
  b.root = 1;
  EXPECT_TRUE(m.post(0, 0, a, t0).empty());
  auto out = m.post(1, 1, b, t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Mismatch);
  EXPECT_CONTAINS(out[0].error, "rank 0 called broadcast(float32, count=8, root=0)");
  EXPECT_CONTAINS(out[0].error, "rank 1 called broadcast(float32, count=8, root=1)");
}

TEST(Matcher, DuplicatePostIsRejectedAndTheOriginalStillMatches) {
  Matcher m(local(2), 1000ms);
  EXPECT_TRUE(m.post(0, 0, coll(OpType::AllReduce, 1), t0).empty());
  auto dup = m.post(0, 0, coll(OpType::AllReduce, 1), t0);
  ASSERT_EQ(dup.size(), 1u);
  EXPECT_EQ(dup[0].status, Status::InvalidRequest);
  EXPECT_CONTAINS(dup[0].error, "twice with seq 1");
  auto out = m.post(1, 1, coll(OpType::AllReduce, 1), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
}

TEST(Matcher, UnknownCommunicatorIsInvalid) {
  Matcher m(local(2), 1000ms);
  auto out = m.post(0, 0, coll(OpType::AllReduce, 1, 8, 42), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::InvalidRequest);
  EXPECT_EQ(out[0].comm, nullptr);
  EXPECT_CONTAINS(out[0].error, "communicator 42 does not exist");
  EXPECT_EQ(m.pending_count(), 0u);
}

TEST(Matcher, DescribeCall) {
  EXPECT_EQ(describe_call(coll(OpType::Barrier, 0)), "barrier()");
  EXPECT_EQ(describe_call(coll(OpType::AllReduce, 0, 8)), "allreduce(float32, count=8, op=sum)");
  RequestDesc chunk = coll(OpType::AllGather, 0, 100);
  chunk.chunk_offset = 50;
  chunk.chunk_count = 25;
  EXPECT_EQ(describe_call(chunk), "allgather(float32, count=100, chunk=50+25)");
  RequestDesc a2a = coll(OpType::AllToAll, 0, 4);
  a2a.flags = ipc::kFlagSplits;
  EXPECT_EQ(describe_call(a2a), "alltoall(float32, count=4, uneven splits)");
  EXPECT_EQ(describe_call(p2p(OpType::Send, 3, 0, 9)), "send(float32, count=8, peer=3, tag=9)");
}

// --- send/recv -----------------------------------------------------------------------------

TEST(Matcher, SendAndRecvPairUpSendFirstInTheMatch) {
  Matcher m(local(2), 1000ms);
  EXPECT_TRUE(m.post(1, 1, p2p(OpType::Recv, 0, 0), t0).empty());  // recv from 0
  EXPECT_EQ(m.pending_count(), 1u);
  auto out = m.post(0, 0, p2p(OpType::Send, 1, 0), t0);  // send to 1
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
  ASSERT_EQ(out[0].posted.size(), 2u);
  EXPECT_EQ(out[0].posted[0].desc.op, OpType::Send);
  EXPECT_EQ(out[0].posted[0].slot, 0);
  EXPECT_EQ(out[0].posted[1].desc.op, OpType::Recv);
  EXPECT_EQ(out[0].posted[1].slot, 1);
  EXPECT_EQ(m.pending_count(), 0u);
}

TEST(Matcher, P2pKeysIncludeDirectionSeqAndChunk) {
  Matcher m(local(3), 1000ms);
  EXPECT_TRUE(m.post(0, 0, p2p(OpType::Send, 1, 0), t0).empty());
  EXPECT_TRUE(m.post(1, 1, p2p(OpType::Recv, 0, 1), t0).empty());  // other seq
  EXPECT_TRUE(m.post(2, 2, p2p(OpType::Recv, 0, 0), t0).empty());  // other receiver
  EXPECT_TRUE(m.post(0, 0, p2p(OpType::Recv, 1, 0), t0).empty());  // other direction
  RequestDesc chunk = p2p(OpType::Recv, 0, 0);
  chunk.chunk_offset = 4;
  chunk.chunk_count = 4;
  EXPECT_TRUE(m.post(1, 1, chunk, t0).empty());  // other chunk
  EXPECT_EQ(m.pending_count(), 5u);
  auto out = m.post(1, 1, p2p(OpType::Recv, 0, 0), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
  EXPECT_EQ(m.pending_count(), 4u);
}

TEST(Matcher, P2pTagMismatchNamesBothCalls) {
  Matcher m(local(2), 1000ms);
  EXPECT_TRUE(m.post(0, 0, p2p(OpType::Send, 1, 0, /*tag=*/1), t0).empty());
  auto out = m.post(1, 1, p2p(OpType::Recv, 0, 0, /*tag=*/2), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Mismatch);
  EXPECT_EQ(out[0].posted.size(), 2u);
  EXPECT_EQ(out[0].error,
            "send/recv mismatch on communicator 0: rank 0 called send(float32, count=8, peer=1, tag=1), "
            "rank 1 called recv(float32, count=8, peer=0, tag=2)");
  EXPECT_EQ(m.pending_count(), 0u);
}

TEST(Matcher, P2pCountMismatch) {
  Matcher m(local(2), 1000ms);
  EXPECT_TRUE(m.post(0, 0, p2p(OpType::Send, 1, 0, 0, 8), t0).empty());
  auto out = m.post(1, 1, p2p(OpType::Recv, 0, 0, 0, 16), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Mismatch);
}

TEST(Matcher, DuplicateSendIsRejected) {
  Matcher m(local(2), 1000ms);
  EXPECT_TRUE(m.post(0, 0, p2p(OpType::Send, 1, 5), t0).empty());
  auto dup = m.post(0, 0, p2p(OpType::Send, 1, 5), t0);
  ASSERT_EQ(dup.size(), 1u);
  EXPECT_EQ(dup[0].status, Status::InvalidRequest);
  EXPECT_CONTAINS(dup[0].error, "duplicate send(");
  EXPECT_CONTAINS(dup[0].error, "with seq 5");
  // The first send is still there for its recv.
  auto out = m.post(1, 1, p2p(OpType::Recv, 0, 5), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
}

// --- CommCreate ----------------------------------------------------------------------------

RequestDesc create(std::uint64_t id, std::uint32_t timeout_ms = 0) {
  RequestDesc d;
  d.op = OpType::CommCreate;
  d.comm_id = id;
  d.timeout_ms = timeout_ms;
  return d;
}

TEST(Matcher, CommCreateRegistersTheGroupOnceEveryLocalMemberAsked) {
  Matcher m(local(4), 1000ms);
  EXPECT_TRUE(m.post_create(3, create(7), {3, 1}, t0).empty());
  EXPECT_EQ(m.find(7), nullptr);
  auto out = m.post_create(1, create(7), {3, 1}, t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
  const Communicator* c = m.find(7);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(out[0].comm, c);
  EXPECT_EQ(c->id, 7u);
  EXPECT_EQ(c->global_ranks, (std::vector<int>{3, 1}));  // group rank order is the list's order
  EXPECT_EQ(c->slots, (std::vector<int>{3, 1}));
  ASSERT_EQ(out[0].posted.size(), 2u);
  EXPECT_EQ(out[0].posted[0].slot, 3);
  EXPECT_EQ(out[0].posted[0].group_rank, 0);
  EXPECT_EQ(out[0].posted[1].slot, 1);
  EXPECT_EQ(out[0].posted[1].group_rank, 1);
  EXPECT_EQ(m.communicator_count(), 2u);
  EXPECT_EQ(m.pending_count(), 0u);

  // Collectives on the new communicator wait only for its members, named by global rank.
  EXPECT_TRUE(m.post(3, 0, coll(OpType::AllReduce, 0, 8, 7), t0).empty());
  auto bad = m.post(1, 1, coll(OpType::AllReduce, 0, 4, 7), t0);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].status, Status::Mismatch);
  EXPECT_CONTAINS(bad[0].error, "communicator 7");
  EXPECT_CONTAINS(bad[0].error, "rank 3 called allreduce(float32, count=8");
  EXPECT_CONTAINS(bad[0].error, "rank 1 called allreduce(float32, count=4");
  EXPECT_TRUE(m.post(3, 0, coll(OpType::Barrier, 1, 0, 7), t0).empty());
  auto ok = m.post(1, 1, coll(OpType::Barrier, 1, 0, 7), t0);
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].status, Status::Ok);

  // The id is taken now.
  auto again = m.post_create(0, create(7), {0, 2}, t0);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].status, Status::InvalidRequest);
  EXPECT_CONTAINS(again[0].error, "communicator 7 already exists");
}

TEST(Matcher, CommCreateWaitsOnlyForLocalMembers) {
  Matcher m({0, 1, -1, -1}, 1000ms);
  auto out = m.post_create(0, create(9), {0, 2, 3}, t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
  const Communicator* c = m.find(9);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->slots, (std::vector<int>{0, -1, -1}));
  EXPECT_EQ(c->local_member_count(), 1);
}

TEST(Matcher, CommCreateWithDifferentListsFailsEveryPoster) {
  Matcher m(local(3), 1000ms);
  EXPECT_TRUE(m.post_create(0, create(5), {0, 1}, t0).empty());
  auto out = m.post_create(1, create(5), {0, 1, 2}, t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Mismatch);
  EXPECT_EQ(out[0].posted.size(), 2u);
  EXPECT_EQ(out[0].error,
            "communicator 5 created with different member lists: slot 0 asked for [0,1]; slot 1 asked for [0,1,2]");
  EXPECT_EQ(m.find(5), nullptr);
  EXPECT_EQ(m.pending_count(), 0u);
}

TEST(Matcher, CommCreateRejectsBadRequestsAlone) {
  Matcher m(local(3), 1000ms);
  auto expect_invalid = [&](int slot, std::uint64_t id, std::vector<int> members, const std::string& part) {
    auto out = m.post_create(slot, create(id), std::move(members), t0);
    ASSERT_EQ(out.size(), 1u) << part;
    EXPECT_EQ(out[0].status, Status::InvalidRequest) << part;
    EXPECT_EQ(out[0].comm, nullptr);
    ASSERT_EQ(out[0].posted.size(), 1u);
    EXPECT_EQ(out[0].posted[0].slot, slot);
    EXPECT_CONTAINS(out[0].error, part);
  };
  expect_invalid(0, 0, {0, 1}, "communicator id 0 is the world");
  expect_invalid(2, 5, {0, 1}, "rank 2 asked to create a communicator it is not a member of");
  expect_invalid(0, 5, {0, 0, 1}, "contain a rank twice");
  expect_invalid(0, 5, {0, 3}, "communicator member 3 is not a rank of the job");
  expect_invalid(0, 5, {0, -1}, "communicator member -1 is not a rank of the job");
  EXPECT_EQ(m.pending_count(), 0u);
  EXPECT_EQ(m.communicator_count(), 1u);
}

// --- timeouts and stalls -------------------------------------------------------------------

TEST(Matcher, CollectiveTimesOutNamingTheMissingRanks) {
  Matcher m(local(4), 10000ms);
  RequestDesc d = coll(OpType::AllReduce, 3);
  d.timeout_ms = 1500;
  EXPECT_TRUE(m.post(0, 0, d, t0).empty());
  std::vector<StallInfo> stalls;
  EXPECT_TRUE(m.expire(t0 + 1499ms, 60s, stalls).empty());
  EXPECT_TRUE(stalls.empty());
  auto out = m.expire(t0 + 1500ms, 60s, stalls);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Timeout);
  ASSERT_EQ(out[0].posted.size(), 1u);
  EXPECT_EQ(out[0].posted[0].slot, 0);
  EXPECT_EQ(out[0].error,
            "allreduce(float32, count=8, op=sum) on communicator 0 (operation #3) timed out after 1.5 s: "
            "rank(s) 1 2 3 never posted it");
  EXPECT_EQ(m.pending_count(), 0u);
  // A rank that posts it late fails at once instead of waiting again.
  auto late = m.post(1, 1, coll(OpType::AllReduce, 3), t0 + 2s);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_NE(late[0].status, Status::Ok);
  EXPECT_CONTAINS(late[0].error, "timed out");
  EXPECT_EQ(m.pending_count(), 0u);
}

TEST(Matcher, DefaultTimeoutAndTheShortestPostersTimeoutApply) {
  Matcher m(local(3), 2000ms);
  std::vector<StallInfo> stalls;
  EXPECT_TRUE(m.post(0, 0, coll(OpType::Barrier, 0), t0).empty());  // default 2 s
  EXPECT_TRUE(m.expire(t0 + 1999ms, 60s, stalls).empty());
  EXPECT_EQ(m.expire(t0 + 2000ms, 60s, stalls).size(), 1u);

  RequestDesc slow = coll(OpType::Barrier, 1), quick = slow;
  slow.timeout_ms = 5000;
  quick.timeout_ms = 500;
  EXPECT_TRUE(m.post(0, 0, slow, t0).empty());
  EXPECT_TRUE(m.post(1, 1, quick, t0).empty());
  EXPECT_TRUE(m.expire(t0 + 499ms, 60s, stalls).empty());
  EXPECT_EQ(m.expire(t0 + 500ms, 60s, stalls).size(), 1u);
}

TEST(Matcher, StallsAreReportedOnceAndListedUntilResolved) {
  Matcher m({0, 1, 2, -1}, 100000ms);
  EXPECT_TRUE(m.post(1, 1, coll(OpType::AllGather, 9), t0).empty());
  std::vector<StallInfo> fresh;
  EXPECT_TRUE(m.expire(t0 + 1s, 2s, fresh).empty());
  EXPECT_TRUE(fresh.empty());
  EXPECT_TRUE(m.expire(t0 + 3s, 2s, fresh).empty());
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0].comm_id, 0u);
  EXPECT_EQ(fresh[0].seq, 9u);
  EXPECT_EQ(fresh[0].op, OpType::AllGather);
  EXPECT_DOUBLE_EQ(fresh[0].waiting_s, 3.0);
  EXPECT_EQ(fresh[0].missing_global_ranks, (std::vector<int>{0, 2}));  // rank 3 is remote

  fresh.clear();
  EXPECT_TRUE(m.expire(t0 + 4s, 2s, fresh).empty());
  EXPECT_TRUE(fresh.empty()) << "a stall is reported once";

  auto now = m.stalls(t0 + 5s, 2s);
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].seq, 9u);
  EXPECT_EQ(now[0].op, OpType::AllGather);
  EXPECT_DOUBLE_EQ(now[0].waiting_s, 5.0);
  EXPECT_EQ(now[0].missing_global_ranks, (std::vector<int>{0, 2}));
  EXPECT_TRUE(m.stalls(t0 + 5s, 10s).empty());

  EXPECT_TRUE(m.post(0, 0, coll(OpType::AllGather, 9), t0 + 6s).empty());
  EXPECT_EQ(m.post(2, 2, coll(OpType::AllGather, 9), t0 + 6s).size(), 1u);
  EXPECT_TRUE(m.stalls(t0 + 7s, 2s).empty());
}

TEST(Matcher, P2pTimesOutAndStallsNamingThePeer) {
  Matcher m(local(2), 100000ms);
  RequestDesc send = p2p(OpType::Send, 1, 0);
  send.timeout_ms = 10000;
  EXPECT_TRUE(m.post(0, 0, send, t0).empty());
  std::vector<StallInfo> fresh;
  EXPECT_TRUE(m.expire(t0 + 5s, 2s, fresh).empty());
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0].op, OpType::Send);
  EXPECT_EQ(fresh[0].missing_global_ranks, (std::vector<int>{1}));
  auto out = m.expire(t0 + 10s, 2s, fresh);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Timeout);
  ASSERT_EQ(out[0].posted.size(), 1u);
  EXPECT_EQ(out[0].posted[0].slot, 0);
  EXPECT_CONTAINS(out[0].error, "timed out: rank 1 never posted the matching recv");

  RequestDesc recv = p2p(OpType::Recv, 1, 1);
  recv.timeout_ms = 1000;
  EXPECT_TRUE(m.post(0, 0, recv, t0).empty());
  out = m.expire(t0 + 1s, 60s, fresh);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_CONTAINS(out[0].error, "rank 1 never posted the matching send");
  EXPECT_EQ(m.pending_count(), 0u);
}

// The job's wait-for graph, this node's part: each poster waits in its operation for the local
// ranks that have not posted it (remote ranks are the engine's to name), a sender for its receiver.
TEST(Matcher, WaitsNameEachPosterAndTheLocalRanksItWaitsFor) {
  Matcher m({0, 1, 2, -1}, 100000ms);
  EXPECT_TRUE(m.post(0, 0, coll(OpType::AllReduce, 3), t0).empty());
  EXPECT_TRUE(m.post(2, 2, coll(OpType::AllReduce, 3), t0 + 1s).empty());
  EXPECT_TRUE(m.post(1, 1, p2p(OpType::Send, 0, 0), t0 + 2s).empty());
  std::vector<RankWait> waits;
  m.add_waits(t0 + 5s, waits);
  std::sort(waits.begin(), waits.end(), [](const RankWait& a, const RankWait& b) { return a.rank < b.rank; });
  ASSERT_EQ(waits.size(), 3u);
  EXPECT_EQ(waits[0].rank, 0);
  EXPECT_EQ(waits[0].op, OpType::AllReduce);
  EXPECT_EQ(waits[0].seq, 3u);
  EXPECT_DOUBLE_EQ(waits[0].waited_s, 5.0);
  EXPECT_EQ(waits[0].waits_for, (std::vector<int>{1}));
  EXPECT_EQ(waits[1].rank, 1);
  EXPECT_EQ(waits[1].op, OpType::Send);
  EXPECT_EQ(waits[1].waits_for, (std::vector<int>{0}));
  EXPECT_DOUBLE_EQ(waits[1].waited_s, 3.0);
  EXPECT_EQ(waits[2].rank, 2);
  EXPECT_DOUBLE_EQ(waits[2].waited_s, 4.0);
  EXPECT_EQ(waits[2].waits_for, (std::vector<int>{1}));
  EXPECT_FALSE(waits[0].stopped || waits[1].stopped || waits[2].stopped);
}

TEST(Matcher, CommCreateTimesOut) {
  Matcher m(local(3), 100000ms);
  EXPECT_TRUE(m.post_create(0, create(4, 1000), {0, 1, 2}, t0).empty());
  std::vector<StallInfo> fresh;
  EXPECT_TRUE(m.expire(t0 + 999ms, 60s, fresh).empty());
  auto out = m.expire(t0 + 1s, 60s, fresh);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Timeout);
  EXPECT_CONTAINS(out[0].error, "creating communicator 4 timed out");
  EXPECT_EQ(m.find(4), nullptr);
  EXPECT_EQ(m.pending_count(), 0u);
}

// --- failures ------------------------------------------------------------------------------

TEST(Matcher, FailWaitingForFailsOnlyWhatWaitsForThatSlot) {
  Matcher m(local(4), 100000ms);
  for (int r : {0, 1, 2}) EXPECT_TRUE(m.post(r, r, coll(OpType::AllReduce, 1), t0).empty());
  EXPECT_TRUE(m.post(3, 3, coll(OpType::AllReduce, 2), t0).empty());  // slot 3 already posted seq 2
  EXPECT_TRUE(m.post(0, 0, p2p(OpType::Send, 3, 0), t0).empty());     // waits for 3
  EXPECT_TRUE(m.post(0, 0, p2p(OpType::Send, 1, 0), t0).empty());     // waits for 1
  EXPECT_TRUE(m.post(3, 3, p2p(OpType::Recv, 2, 0), t0).empty());     // 3 posted; waits for 2
  EXPECT_EQ(m.pending_count(), 5u);

  auto out = m.fail_waiting_for(3, Status::PeerFailed, "rank 3 exited with status 1");
  ASSERT_EQ(out.size(), 2u);
  for (const auto& f : out) {
    EXPECT_EQ(f.status, Status::PeerFailed);
    EXPECT_EQ(f.error, "rank 3 exited with status 1");
  }
  auto coll_fail = std::find_if(out.begin(), out.end(), [](const Match& f) { return f.posted.size() == 3; });
  ASSERT_NE(coll_fail, out.end());
  EXPECT_EQ(coll_fail->posted[0].desc.op, OpType::AllReduce);
  auto p2p_fail = std::find_if(out.begin(), out.end(), [](const Match& f) { return f.posted.size() == 1; });
  ASSERT_NE(p2p_fail, out.end());
  EXPECT_EQ(p2p_fail->posted[0].desc.op, OpType::Send);
  EXPECT_EQ(p2p_fail->posted[0].desc.root, 3);
  EXPECT_EQ(m.pending_count(), 3u);

  // The failed collective stays failed for chunks still to come.
  auto late = m.post(1, 1, coll(OpType::AllReduce, 1), t0);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_NE(late[0].status, Status::Ok);
  EXPECT_EQ(late[0].error, "rank 3 exited with status 1");
}

// A request the daemon refused fails what its partners posted for the same operation, now or
// when they post: a collective's other members, a send's receive, a receive's send.
TEST(Matcher, RefusedRequestFailsItsPartnersNowOrWhenTheyPost) {
  Matcher m(local(3), 1000ms);
  // Collective: rank 0 posted, rank 1 was refused, rank 2 posts afterwards.
  EXPECT_TRUE(m.post(0, 0, coll(OpType::AllReduce, 1), t0).empty());
  auto out = m.fail_partners(1, coll(OpType::AllReduce, 1), Status::InvalidRequest, "rank 1 was refused");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::InvalidRequest);
  EXPECT_EQ(out[0].error, "rank 1 was refused");
  ASSERT_EQ(out[0].posted.size(), 1u);
  EXPECT_EQ(out[0].posted[0].slot, 0);
  out = m.post(2, 2, coll(OpType::AllReduce, 1), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::InvalidRequest);
  // A refused send 0 -> 1 fails the receive already waiting; other pairs and seqs go on.
  EXPECT_TRUE(m.post(1, 1, p2p(OpType::Recv, 0, 1), t0).empty());
  EXPECT_TRUE(m.post(2, 2, p2p(OpType::Recv, 0, 1), t0).empty());
  out = m.fail_partners(0, p2p(OpType::Send, 1, 1), Status::InvalidRequest, "send refused");
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].posted.size(), 1u);
  EXPECT_EQ(out[0].posted[0].slot, 1);
  EXPECT_EQ(out[0].error, "send refused");
  // A refused receive 2 <- 1 fails the send when it comes.
  EXPECT_TRUE(m.fail_partners(2, p2p(OpType::Recv, 1, 1), Status::InvalidRequest, "recv refused").empty());
  out = m.post(1, 1, p2p(OpType::Send, 2, 1), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::InvalidRequest);
  EXPECT_EQ(out[0].error, "recv refused");
  // The receive 2 <- 0 still pairs with its send, and the next collective matches.
  out = m.post(0, 0, p2p(OpType::Send, 2, 1), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
  for (int r : {0, 1}) EXPECT_TRUE(m.post(r, r, coll(OpType::AllReduce, 2), t0).empty());
  out = m.post(2, 2, coll(OpType::AllReduce, 2), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
  EXPECT_EQ(m.pending_count(), 0u);
}

TEST(Matcher, FailAllEmptiesEverything) {
  Matcher m(local(3), 100000ms);
  EXPECT_TRUE(m.post(0, 0, coll(OpType::AllReduce, 1), t0).empty());
  EXPECT_TRUE(m.post(1, 1, coll(OpType::AllReduce, 1), t0).empty());
  EXPECT_TRUE(m.post(0, 0, p2p(OpType::Send, 2, 0), t0).empty());
  EXPECT_TRUE(m.post_create(2, create(8), {1, 2}, t0).empty());
  EXPECT_EQ(m.pending_count(), 3u);
  auto out = m.fail_all(Status::Shutdown, "daemon is stopping");
  ASSERT_EQ(out.size(), 3u);
  std::size_t posted = 0;
  for (const auto& f : out) {
    EXPECT_EQ(f.status, Status::Shutdown);
    EXPECT_EQ(f.error, "daemon is stopping");
    posted += f.posted.size();
  }
  EXPECT_EQ(posted, 4u);
  EXPECT_EQ(m.pending_count(), 0u);
  EXPECT_TRUE(m.fail_all(Status::Shutdown, "again").empty());
}


// --- the host fast path's ledger -----------------------------------------------------------

RequestDesc fast(std::uint64_t seq, std::uint64_t k, std::uint64_t count = 8) {
  RequestDesc d = coll(OpType::AllReduce, seq, count);
  d.flags = ipc::kFlagHostFast;
  d.wait_value = k;
  return d;
}

// A matcher of n local ranks whose world has a fast lane; rank r posts as group rank r.
struct FastWorld {
  FastWorld(int n, std::chrono::milliseconds timeout) : m(local(n), timeout) {
    m.open_fast_lane(0, 0);
    l = m.fast_ledger(0);
  }
  std::vector<Match> post(int r, const RequestDesc& d, Clock::time_point at = t0) {
    return m.post_host_fast(*l, r, r, d, at, ran);
  }
  Matcher m;
  FastLedger* l = nullptr;
  bool ran = false;
};

TEST(MatcherHostFast, AnOperationEveryMemberRanIsCountedWithoutAMatch) {
  FastWorld f(2, 1000ms);
  auto& m = f.m;
  ASSERT_NE(f.l, nullptr);
  EXPECT_EQ(m.fast_ledger(1), nullptr);
  EXPECT_TRUE(f.post(0, fast(1, 1)).empty());
  EXPECT_FALSE(f.ran);
  EXPECT_EQ(m.pending_count(), 1u);
  EXPECT_TRUE(f.post(1, fast(1, 1)).empty());
  EXPECT_TRUE(f.ran);
  EXPECT_EQ(f.l->ran().output_bytes, 2u * 8 * 4);
  EXPECT_EQ(m.pending_count(), 0u);
  // Through post(), the general entry, the same operation comes back as its match.
  EXPECT_TRUE(m.post(1, 1, fast(2, 2), t0).empty());
  auto out = m.post(0, 0, fast(2, 2), t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
  ASSERT_EQ(out[0].posted.size(), 2u);
  EXPECT_EQ(out[0].posted[1].slot, 1);
}

// A member that took the daemon's path meets the fast ones in one match, in either order, for
// the daemon to name every call (Daemon::check_host_fast); the communicator's next operations go on.
TEST(MatcherHostFast, AMemberOnTheDaemonsPathMeetsTheFastOnesInOneMatch) {
  FastWorld f(3, 1000ms);
  auto& m = f.m;
  // Fast first.
  EXPECT_TRUE(f.post(0, fast(1, 1)).empty());
  EXPECT_TRUE(m.post(1, 1, coll(OpType::AllReduce, 1), t0).empty());
  auto out = f.post(2, fast(1, 1));
  EXPECT_FALSE(f.ran);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Ok);
  ASSERT_EQ(out[0].posted.size(), 3u);
  EXPECT_TRUE(out[0].posted[0].desc.flags & ipc::kFlagHostFast);
  EXPECT_FALSE(out[0].posted[1].desc.flags & ipc::kFlagHostFast);
  EXPECT_TRUE(out[0].posted[2].desc.flags & ipc::kFlagHostFast);
  // The daemon's path first.
  EXPECT_TRUE(m.post(2, 2, coll(OpType::AllReduce, 2), t0).empty());
  EXPECT_TRUE(f.post(0, fast(2, 2)).empty());
  out = f.post(1, fast(2, 2));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].posted.size(), 3u);
  EXPECT_FALSE(out[0].posted[2].desc.flags & ipc::kFlagHostFast);
  // Large operations of the communicator go the daemon's path on every member, small ones fast.
  for (int r : {0, 1}) EXPECT_TRUE(m.post(r, r, coll(OpType::AllReduce, 3, 1 << 20), t0).empty());
  for (int r : {0, 1}) EXPECT_TRUE(f.post(r, fast(4, 3)).empty());
  EXPECT_EQ(m.post(2, 2, coll(OpType::AllReduce, 3, 1 << 20), t0).size(), 1u);
  EXPECT_TRUE(f.post(2, fast(4, 3)).empty());
  EXPECT_TRUE(f.ran);
  EXPECT_EQ(m.pending_count(), 0u);
}

TEST(MatcherHostFast, FastCallsThatDisagreeAreAMismatchNamingEveryCall) {
  FastWorld f(2, 1000ms);
  EXPECT_TRUE(f.post(0, fast(1, 1, 8)).empty());
  auto out = f.post(1, fast(1, 1, 16));
  EXPECT_FALSE(f.ran);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Mismatch);
  EXPECT_EQ(out[0].error,
            "collective mismatch on communicator 0 (operation #1): rank 0 called allreduce(float32, count=8, "
            "op=sum), rank 1 called allreduce(float32, count=16, op=sum)");
  // The same seq stays failed.
  out = f.post(1, fast(1, 1, 16));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Mismatch);
}

TEST(MatcherHostFast, AFastOperationThatWaitsIsReportedTimedOutAndFailedLikeAnyOther) {
  FastWorld f(3, 100000ms);
  auto& m = f.m;
  RequestDesc d = fast(7, 1);
  d.timeout_ms = 2000;
  EXPECT_TRUE(f.post(0, d).empty());
  EXPECT_TRUE(f.post(2, d, t0 + 10ms).empty());
  std::vector<StallInfo> fresh;
  EXPECT_TRUE(m.expire(t0 + 1s, 1s, fresh).empty());
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0].seq, 7u);
  EXPECT_EQ(fresh[0].missing_global_ranks, (std::vector<int>{1}));
  std::vector<RankWait> waits;
  m.add_waits(t0 + 1s, waits);
  EXPECT_EQ(waits.size(), 2u);
  auto out = m.expire(t0 + 2s, 1s, fresh);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Timeout);
  EXPECT_EQ(out[0].posted.size(), 2u);
  EXPECT_CONTAINS(out[0].error, "(operation #7) timed out after 2 s: rank(s) 1 never posted it");
  // The late member fails at once.
  out = f.post(1, d, t0 + 3s);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::Timeout);
  EXPECT_EQ(m.pending_count(), 0u);
}

TEST(MatcherHostFast, WaitingFastOperationsFailWithAMemberThatLeftARefusedOneOrTheJob) {
  FastWorld f(3, 100000ms);
  auto& m = f.m;
  // Waits for slot 1, which exits.
  EXPECT_TRUE(f.post(0, fast(1, 1)).empty());
  auto out = m.fail_waiting_for(1, Status::PeerFailed, "rank 1 exited");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, Status::PeerFailed);
  EXPECT_EQ(out[0].posted.size(), 1u);
  out = f.post(2, fast(1, 1));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].error, "rank 1 exited");
  // Member 1's request of seq 2 was refused: member 0's waiting one fails now, member 2's when it comes.
  EXPECT_TRUE(f.post(0, fast(2, 2)).empty());
  out = m.fail_partners(1, fast(2, 2), Status::InvalidRequest, "refused");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].posted[0].slot, 0);
  out = f.post(2, fast(2, 2));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].error, "refused");
  // The job fails: what waits in the ledger fails with it.
  EXPECT_TRUE(f.post(0, fast(3, 3)).empty());
  out = m.fail_all(Status::PeerFailed, "the job failed");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].error, "the job failed");
  EXPECT_EQ(m.pending_count(), 0u);
}

}  // namespace
}  // namespace smddp::daemon
