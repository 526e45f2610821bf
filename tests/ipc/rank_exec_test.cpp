// Rank-side GPU execution (kFlagRankExec): the plan payload a completion carries (encoded in
// its error bytes) and the request checks the flag adds to validate_request.
#include <gtest/gtest.h>

#include <cstring>

#include "ipc/protocol.hpp"
#include "ipc/validate.hpp"
#include "tests/ipc/validate_expect.hpp"

using namespace smddp::ipc;
using smddp::ipc::testing::fails;

namespace {

// Distinct, position-dependent values, so a member or handle read from the wrong place shows.
PlanMember member(int i) {
  PlanMember m;
  m.slot = 10 + i;
  m.in = {1000u + static_cast<std::uint64_t>(i), 64u * static_cast<std::uint64_t>(i), 4096u + static_cast<std::uint64_t>(i)};
  m.out = {2000u + static_cast<std::uint64_t>(i), 128u * static_cast<std::uint64_t>(i), 8192u + static_cast<std::uint64_t>(i)};
  return m;
}

PlanHandle handle(int i) {
  PlanHandle h;
  h.slot = 20 + i;
  h.alloc_id = 0xA110C000u + static_cast<std::uint64_t>(i);
  for (std::size_t b = 0; b < kCudaIpcHandleBytes; ++b) h.handle[b] = static_cast<std::uint8_t>(i * 31 + static_cast<int>(b));
  return h;
}

void expect_ref(const PlanRef& got, const PlanRef& want, const char* what, int i) {
  EXPECT_EQ(got.alloc_id, want.alloc_id) << what << " of member " << i;
  EXPECT_EQ(got.offset, want.offset) << what << " of member " << i;
  EXPECT_EQ(got.bytes, want.bytes) << what << " of member " << i;
}

}  // namespace

TEST(Plan, LayoutFitsTheErrorBytes) {
  // The payload replaces the error text: everything must fit in it, and the handle count
  // per completion is the most that fits.
  EXPECT_LE(sizeof(PlanHeader) + kPlanMaxMembers * sizeof(PlanMember), kErrorTextBytes);
  EXPECT_GE(kPlanHandlesPerCompletion, 1u);
  EXPECT_LE(sizeof(PlanHeader) + kPlanHandlesPerCompletion * sizeof(PlanHandle), kErrorTextBytes);
  EXPECT_GT(sizeof(PlanHeader) + (kPlanHandlesPerCompletion + 1) * sizeof(PlanHandle), kErrorTextBytes);
  // The header's counts must be able to name every entry.
  EXPECT_GE(static_cast<std::size_t>(UINT16_MAX), kPlanHandlesPerCompletion);
  // A completion that carries nothing is a plain final one.
  CompletionDesc c;
  EXPECT_EQ(c.kind, CompletionKind::Final);
}

TEST(Plan, PlanRoundTripsWithTheMostMembers) {
  CompletionDesc c;
  std::memset(c.error, 0xEE, sizeof c.error);  // what the setters must not touch stays 0xEE
  c.request_id = 42;
  c.comm_id = 3;
  c.seq = 9;
  c.kind = CompletionKind::Plan;
  // The daemon writes the members once, then the header per receiver: the header must not
  // clobber member 0.
  for (int i = 0; i < kPlanMaxMembers; ++i) c.set_plan_member(i, member(i));
  PlanHeader h;
  h.members = static_cast<std::uint16_t>(kPlanMaxMembers);
  h.me = 5;
  c.set_plan_header(h);

  const CompletionDesc copy = c;  // what a ring copy delivers
  EXPECT_EQ(copy.kind, CompletionKind::Plan);
  EXPECT_EQ(copy.status, Status::Ok);
  EXPECT_EQ(copy.request_id, 42u);
  EXPECT_EQ(copy.seq, 9u);
  const PlanHeader got = copy.plan_header();
  EXPECT_EQ(got.members, kPlanMaxMembers);
  EXPECT_EQ(got.me, 5);
  EXPECT_EQ(got.handles, 0);
  for (int i = 0; i < kPlanMaxMembers; ++i) {
    const PlanMember m = copy.plan_member(i);
    EXPECT_EQ(m.slot, 10 + i) << "member " << i;
    expect_ref(m.in, member(i).in, "input", i);
    expect_ref(m.out, member(i).out, "output", i);
  }
  const std::size_t used = sizeof(PlanHeader) + kPlanMaxMembers * sizeof(PlanMember);
  for (std::size_t b = used; b < kErrorTextBytes; ++b)
    ASSERT_EQ(static_cast<unsigned char>(copy.error[b]), 0xEE) << "byte " << b << " past the plan was written";

  // A later header (the next receiver's `me`) leaves the members alone.
  h.me = 2;
  c.set_plan_header(h);
  EXPECT_EQ(c.plan_header().me, 2);
  EXPECT_EQ(c.plan_member(0).slot, 10);
  expect_ref(c.plan_member(0).in, member(0).in, "input", 0);
}

TEST(Plan, HandlesRoundTripAtFullCapacity) {
  CompletionDesc c;
  c.kind = CompletionKind::Handles;
  const int n = static_cast<int>(kPlanHandlesPerCompletion);
  PlanHeader h;
  h.handles = static_cast<std::uint16_t>(n);
  c.set_plan_header(h);
  for (int i = 0; i < n; ++i) c.set_plan_handle(i, handle(i));

  const CompletionDesc copy = c;
  EXPECT_EQ(copy.kind, CompletionKind::Handles);
  const PlanHeader got = copy.plan_header();
  EXPECT_EQ(got.handles, n);
  EXPECT_EQ(got.members, 0);
  for (int i = 0; i < n; ++i) {
    const PlanHandle x = copy.plan_handle(i);
    const PlanHandle want = handle(i);
    EXPECT_EQ(x.slot, want.slot) << "handle " << i;
    EXPECT_EQ(x.alloc_id, want.alloc_id) << "handle " << i;
    EXPECT_EQ(std::memcmp(x.handle, want.handle, kCudaIpcHandleBytes), 0) << "bytes of handle " << i;
  }
}

TEST(Plan, MembersAndHandlesAreIndependentlyAddressed) {
  // Setting entry i must not change entry i-1 or i+1 (the strides are the entry sizes).
  CompletionDesc c;
  c.set_plan_member(0, member(0));
  c.set_plan_member(2, member(2));
  c.set_plan_member(1, member(1));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.plan_member(i).slot, 10 + i);
  CompletionDesc d;
  d.set_plan_handle(1, handle(1));
  d.set_plan_handle(0, handle(0));
  d.set_plan_handle(2, handle(2));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(d.plan_handle(i).alloc_id, handle(i).alloc_id);
    EXPECT_EQ(d.plan_handle(i).handle[kCudaIpcHandleBytes - 1], handle(i).handle[kCudaIpcHandleBytes - 1]);
  }
}

// --- validate_request and kFlagRankExec ------------------------------------------------------
namespace {

ValidationContext gpu_ctx(int size = 4, int rank = 1) {
  ValidationContext c;
  c.group_size = size;
  c.group_rank = rank;
  c.arena_bytes = 1 << 20;
  c.cuda_enabled = true;  // the daemon sets it for every kFlagRankExec device request
  return c;
}

BufferRef arena(std::uint64_t off, std::uint64_t bytes) {
  BufferRef b;
  b.kind = BufferKind::Arena;
  b.offset = off;
  b.bytes = bytes;
  return b;
}

BufferRef cuda(std::uint64_t bytes, std::uint64_t alloc_id = 7) {
  BufferRef b;
  b.kind = BufferKind::CudaIpc;
  b.bytes = bytes;
  b.alloc_id = alloc_id;
  b.alloc_bytes = 1 << 20;
  std::memset(b.ipc_handle, 0x5A, sizeof b.ipc_handle);  // fake handle bytes: nothing maps them
  return b;
}

RequestDesc rank_exec_allreduce(std::uint64_t n = 8) {
  RequestDesc d;
  d.op = OpType::AllReduce;
  d.dtype = DType::Float32;
  d.count = d.chunk_count = n;
  d.flags = kFlagRankExec;
  d.input = cuda(n * 4);
  d.output = cuda(n * 4);
  return d;
}


}  // namespace

TEST(ValidateRankExec, DeviceCollectivesWithTheFlagPass) {
  EXPECT_NE(kKnownFlags & kFlagRankExec, 0u);
  EXPECT_EQ(validate_request(rank_exec_allreduce(), gpu_ctx()), std::nullopt);
  // Rank-side requests do not name a CUDA event: -1 is the only value needed.
  auto d = rank_exec_allreduce();
  EXPECT_EQ(d.wait_event, -1);
  d.flags |= kFlagInPlace;
  EXPECT_EQ(validate_request(d, gpu_ctx()), std::nullopt);
  // An even alltoall is fine (only the split form is refused).
  RequestDesc a;
  a.op = OpType::AllToAll;
  a.count = a.chunk_count = 4;
  a.flags = kFlagRankExec;
  a.input = cuda(4 * 4 * 4);
  a.output = cuda(4 * 4 * 4, 8);
  EXPECT_EQ(validate_request(a, gpu_ctx()), std::nullopt);
  // A device send (one CUDA buffer, the other absent) with the flag.
  RequestDesc s;
  s.op = OpType::Send;
  s.count = s.chunk_count = 8;
  s.root = 0;
  s.flags = kFlagRankExec;
  s.input = cuda(32);
  EXPECT_EQ(validate_request(s, gpu_ctx()), std::nullopt);
}

TEST(ValidateRankExec, CudaBuffersStillNeedCudaEnabled) {
  auto c = gpu_ctx();
  c.cuda_enabled = false;
  EXPECT_TRUE(fails(rank_exec_allreduce(), c, "no GPU support"));
}

TEST(ValidateRankExec, HostRequestWithTheFlagIsRefused) {
  auto d = rank_exec_allreduce();
  d.input = arena(0, 32);
  d.output = arena(64, 32);
  EXPECT_TRUE(fails(d, gpu_ctx(), "rank-side GPU execution of a host request"));
  // Without the flag the same request is a valid host allreduce.
  d.flags = 0;
  EXPECT_EQ(validate_request(d, gpu_ctx()), std::nullopt);
  // A barrier has no buffers at all: it is a host request too.
  RequestDesc b;
  b.op = OpType::Barrier;
  b.flags = kFlagRankExec;
  EXPECT_TRUE(fails(b, gpu_ctx(), "rank-side GPU execution of a host request"));
}

TEST(ValidateRankExec, DaemonSideStreamFlagsAreRefused) {
  auto d = rank_exec_allreduce();
  d.flags = kFlagRankExec | kFlagStreamValue;
  d.wait_event = 0;
  d.wait_value = 1;
  EXPECT_TRUE(fails(d, gpu_ctx(), "rank-side GPU execution with daemon-side flags"));
  d.flags = kFlagRankExec | kFlagStreamValue | kFlagDeviceFlags;
  EXPECT_TRUE(fails(d, gpu_ctx(), "rank-side GPU execution with daemon-side flags"));
  d.flags = kFlagRankExec | kFlagStreamValue | kFlagDaemonCpuWait;
  EXPECT_TRUE(fails(d, gpu_ctx(), "rank-side GPU execution with daemon-side flags"));
  // The same stream-flag request without kFlagRankExec is valid: the refusal is the flag's.
  d.flags = kFlagStreamValue;
  EXPECT_EQ(validate_request(d, gpu_ctx()), std::nullopt);
}

TEST(ValidateRankExec, AllToAllWithSplitsIsAccepted) {
  RequestDesc d;
  d.op = OpType::AllToAll;
  d.flags = kFlagSplits;
  d.count = d.chunk_count = 0;
  d.input = cuda(96);
  d.output = cuda(160, 8);
  d.aux = arena(0, 4 * 2 * 8);  // the split table (2 * group size int64) in the arena
  EXPECT_EQ(validate_request(d, gpu_ctx()), std::nullopt);
  d.flags |= kFlagRankExec;  // the daemon checks the tables against each other and plans the blocks
  EXPECT_EQ(validate_request(d, gpu_ctx()), std::nullopt);
  d.aux = arena(0, 4 * 2 * 8 - 8);  // a table one entry short
  EXPECT_FALSE(validate_request(d, gpu_ctx()) == std::nullopt);
  // A member that sends and receives nothing has no buffers, and still runs the plan.
  d.aux = arena(0, 4 * 2 * 8);
  d.input = BufferRef{};
  d.output = BufferRef{};
  EXPECT_EQ(validate_request(d, gpu_ctx()), std::nullopt);
  // Without the split table it is a host request.
  d.flags = kFlagRankExec;
  d.aux = BufferRef{};
  EXPECT_TRUE(fails(d, gpu_ctx(), "rank-side GPU execution of a host request"));
}

namespace {

// A fast-path request (kFlagRankFast): no buffers, the ranks moved the bytes themselves.
RequestDesc fast_request(OpType op = OpType::AllReduce, std::uint64_t n = 8) {
  RequestDesc d;
  d.op = op;
  d.dtype = DType::BFloat16;
  d.count = d.chunk_count = n;
  d.flags = kFlagRankFast;
  d.wait_value = 1;  // the rank's fast-op number
  return d;
}

}  // namespace

TEST(ValidateRankFast, TheThreeCollectivesWithoutBuffersPass) {
  ValidationContext host_only = gpu_ctx();
  host_only.cuda_enabled = false;  // the daemon needs no GPU for them
  for (auto op : {OpType::AllReduce, OpType::AllGather, OpType::ReduceScatter}) {
    SCOPED_TRACE(to_string(op));
    EXPECT_EQ(validate_request(fast_request(op), host_only), std::nullopt);
  }
  auto in_place = fast_request();
  in_place.flags |= kFlagInPlace;
  EXPECT_EQ(validate_request(in_place, gpu_ctx()), std::nullopt);
  // What the client adds to every device request, and the SDP AllGather's mark.
  auto sdp = fast_request(OpType::AllGather);
  sdp.flags |= kFlagSdp | kFlagLastChunk;
  EXPECT_EQ(validate_request(sdp, gpu_ctx()), std::nullopt);
}

TEST(ValidateRankFast, OtherCollectivesBuffersFlagsAndEventsAreRefused) {
  EXPECT_TRUE(fails(fast_request(OpType::Broadcast), gpu_ctx(), "allreduce, allgather and reduce_scatter only"));
  EXPECT_TRUE(fails(fast_request(OpType::AllToAll), gpu_ctx(), "allreduce, allgather and reduce_scatter only"));
  auto d = fast_request();
  d.input = cuda(16);
  EXPECT_TRUE(fails(d, gpu_ctx(), "carries no buffers"));
  d = fast_request();
  d.output = arena(0, 16);
  EXPECT_TRUE(fails(d, gpu_ctx(), "carries no buffers"));
  d = fast_request();
  d.flags |= kFlagRankExec;
  EXPECT_TRUE(fails(d, gpu_ctx(), "no other flags"));
  d = fast_request();
  d.wait_event = 0;  // an index, though no event was ever exported
  EXPECT_TRUE(fails(d, gpu_ctx(), "never exported"));
  d = fast_request(OpType::AllReduce, 0);
  d.chunk_count = 0;
  EXPECT_TRUE(fails(d, gpu_ctx(), "empty fast-path request"));
  d = fast_request();
  d.wait_value = 0;
  EXPECT_TRUE(fails(d, gpu_ctx(), "fast-op number"));
}
