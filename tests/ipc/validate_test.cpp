#include <gtest/gtest.h>

#include "ipc/segment.hpp"
#include "ipc/validate.hpp"
#include "tests/ipc/validate_expect.hpp"

using namespace smddp::ipc;
using smddp::ipc::testing::fails;

namespace {
ValidationContext ctx(int size = 4, int rank = 1) {
  ValidationContext c;
  c.group_size = size;
  c.group_rank = rank;
  c.arena_bytes = 1 << 20;
  return c;
}
BufferRef arena(std::uint64_t off, std::uint64_t bytes) {
  BufferRef b;
  b.kind = BufferKind::Arena;
  b.offset = off;
  b.bytes = bytes;
  return b;
}
RequestDesc allreduce(std::uint64_t n = 8) {
  RequestDesc d;
  d.op = OpType::AllReduce;
  d.dtype = DType::Float32;
  d.count = n;
  d.chunk_count = n;
  d.input = arena(0, n * 4);
  d.output = arena(0, n * 4);
  return d;
}
}  // namespace

TEST(Validate, WellFormedRequestsPass) {
  EXPECT_EQ(validate_request(allreduce(), ctx()), std::nullopt);
  RequestDesc ag;
  ag.op = OpType::AllGather;
  ag.dtype = DType::BFloat16;
  ag.count = ag.chunk_count = 10;
  ag.input = arena(0, 20);
  ag.output = arena(64, 80);
  EXPECT_EQ(validate_request(ag, ctx()), std::nullopt);
  RequestDesc b;
  b.op = OpType::Barrier;
  EXPECT_EQ(validate_request(b, ctx()), std::nullopt);
  auto zero = allreduce(0);
  EXPECT_EQ(validate_request(zero, ctx()), std::nullopt);
}

TEST(Validate, EnumsAndFlags) {
  auto d = allreduce();
  d.op = static_cast<OpType>(200);
  EXPECT_TRUE(fails(d, ctx(), "unknown operation"));
  d = allreduce();
  d.dtype = static_cast<DType>(77);
  EXPECT_TRUE(fails(d, ctx(), "unknown dtype"));
  d = allreduce();
  d.reduce_op = static_cast<ReduceOp>(99);
  EXPECT_TRUE(fails(d, ctx(), "unknown reduce op"));
  d = allreduce();
  d.flags = 1u << 30;
  EXPECT_TRUE(fails(d, ctx(), "unknown flags"));
  d = allreduce();
  d.reduce_op = ReduceOp::BXor;
  EXPECT_TRUE(fails(d, ctx(), "not defined for float32"));
  d = allreduce();
  d.dtype = DType::Int32;
  d.reduce_op = ReduceOp::Avg;
  EXPECT_TRUE(fails(d, ctx(), "not defined for int32"));
}

TEST(Validate, BuffersAreBoundsChecked) {
  auto d = allreduce();
  d.input = arena((1 << 20) - 16, 32);
  EXPECT_TRUE(fails(d, ctx(), "outside the staging arena"));
  d = allreduce();
  d.input.offset = ~0ull - 8;  // offset + bytes overflows
  EXPECT_TRUE(fails(d, ctx(), "outside the staging arena"));
  d = allreduce();
  d.input = arena(2, 32);
  EXPECT_TRUE(fails(d, ctx(), "not aligned"));
  d = allreduce();
  d.output.bytes = 31;
  EXPECT_TRUE(fails(d, ctx(), "expected 32"));
  d = allreduce();
  d.input.kind = BufferKind::None;
  EXPECT_TRUE(fails(d, ctx(), "missing"));
  d = allreduce();
  d.aux = arena(0, 8);
  EXPECT_TRUE(fails(d, ctx(), "none is expected"));
  d = allreduce();
  d.input.kind = BufferKind::CudaIpc;
  EXPECT_TRUE(fails(d, ctx(), "no GPU support"));
  d = allreduce();
  d.input.kind = static_cast<BufferKind>(9);
  EXPECT_TRUE(fails(d, ctx(), "unknown kind"));
}

TEST(Validate, CountsChunksRootsPeers) {
  auto d = allreduce();
  d.count = kMaxCount + 1;
  EXPECT_TRUE(fails(d, ctx(), "too large"));
  d = allreduce(8);
  d.chunk_offset = 4;
  d.chunk_count = 8;
  EXPECT_TRUE(fails(d, ctx(), "exceeds count"));
  d = allreduce(8);
  d.chunk_offset = ~0ull;
  EXPECT_TRUE(fails(d, ctx(), "exceeds count"));
  RequestDesc bc;
  bc.op = OpType::Broadcast;
  bc.count = bc.chunk_count = 1;
  bc.root = 4;
  bc.output = arena(0, 4);
  EXPECT_TRUE(fails(bc, ctx(), "outside the group"));
  RequestDesc s;
  s.op = OpType::Send;
  s.count = s.chunk_count = 1;
  s.root = 1;
  s.input = arena(0, 4);
  EXPECT_TRUE(fails(s, ctx(4, 1), "itself"));
  auto nm = ctx();
  nm.group_rank = 9;
  EXPECT_TRUE(fails(allreduce(), nm, "not a member"));
  d = allreduce();
  d.wait_event = 3;
  EXPECT_TRUE(fails(d, ctx(), "never exported"));
  d = allreduce();
  d.scale = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(fails(d, ctx(), "NaN"));
}

TEST(Validate, RootOnlyBuffers) {
  RequestDesc r;
  r.op = OpType::Reduce;
  r.count = r.chunk_count = 4;
  r.root = 0;
  r.input = arena(0, 16);
  EXPECT_EQ(validate_request(r, ctx(4, 1)), std::nullopt);  // non-root: no output
  r.output = arena(64, 16);
  EXPECT_TRUE(fails(r, ctx(4, 1), "none is expected"));
  EXPECT_EQ(validate_request(r, ctx(4, 0)), std::nullopt);  // root: output required
}

// GPU path: CUDA references, stream flags and their combinations.
namespace {
BufferRef cuda(std::uint64_t off, std::uint64_t bytes, std::uint64_t alloc = 1 << 20) {
  BufferRef b;
  b.kind = BufferKind::CudaIpc;
  b.offset = off;
  b.bytes = bytes;
  b.alloc_id = 7;
  b.alloc_bytes = alloc;
  return b;
}
RequestDesc device_allreduce(std::uint64_t n = 8) {
  auto d = allreduce(n);
  d.input = cuda(0, n * 4);
  d.output = cuda(0, n * 4);
  return d;
}
ValidationContext gpu_ctx() {
  auto c = ctx();
  c.cuda_enabled = true;
  return c;
}
}  // namespace

TEST(Validate, CudaBuffers) {
  EXPECT_FALSE(validate_request(device_allreduce(), gpu_ctx()));
  EXPECT_TRUE(fails(device_allreduce(), ctx(), "no GPU support"));
  auto d = device_allreduce();
  d.output = cuda(1 << 20, 32);
  EXPECT_TRUE(fails(d, gpu_ctx(), "outside its CUDA allocation"));
  d = device_allreduce();
  d.output = arena(0, 32);
  EXPECT_TRUE(fails(d, gpu_ctx(), "both be host tensors or both CUDA"));
  d = device_allreduce();
  d.op = OpType::AllToAll;
  d.flags = kFlagSplits;
  d.count = d.chunk_count = 0;
  d.aux = cuda(0, 4 * 2 * 8);
  EXPECT_TRUE(fails(d, gpu_ctx(), "aux buffer must be in the staging arena"));
}

TEST(Validate, EventsAndStreamFlags) {
  auto c = gpu_ctx();
  c.event_count = 2;
  auto d = device_allreduce();
  d.wait_event = 1;
  EXPECT_FALSE(validate_request(d, c));
  d.wait_event = 2;
  EXPECT_TRUE(fails(d, c, "never exported"));
  d.flags = kFlagStreamValue;  // stream flags: any index of the table
  d.wait_event = kMaxEvents - 1;
  d.wait_value = 5;
  EXPECT_FALSE(validate_request(d, c));
  d.wait_event = kMaxEvents;
  EXPECT_TRUE(fails(d, c, "stream flag index"));
  d.wait_event = 0;
  d.flags = kFlagStreamValue | kFlagDeviceFlags;
  EXPECT_FALSE(validate_request(d, c));
  d.flags = kFlagDeviceFlags;
  EXPECT_TRUE(fails(d, c, "device flags without stream flags"));
  d.flags = kFlagStreamValue | kFlagDaemonCpuWait;
  EXPECT_FALSE(validate_request(d, c));
  d.flags = kFlagStreamValue | kFlagDeviceFlags | kFlagDaemonCpuWait;
  EXPECT_TRUE(fails(d, c, "host memory"));
  auto h = allreduce();  // host requests carry no GPU synchronization
  h.wait_event = 0;
  EXPECT_TRUE(fails(h, c, "host request carries a CUDA event"));
  h.wait_event = -1;
  h.flags = kFlagStreamValue;
  EXPECT_TRUE(fails(h, c, "host request carries a CUDA stream flag"));
}

TEST(Validate, ReadingTheMembersArenas) {
  RequestDesc ag;
  ag.op = OpType::AllGather;
  ag.count = ag.chunk_count = 8;
  ag.input = arena(0, 32);
  ag.output = arena(64, 128);
  ag.flags = kFlagReadSources;
  EXPECT_FALSE(validate_request(ag, ctx()));
  // Reductions too (each rank reduces a share); CUDA buffers never go through the arenas, and
  // split tables stay with the daemon.
  auto ar = allreduce();
  ar.flags = kFlagReadSources;
  EXPECT_FALSE(validate_request(ar, ctx()));
  auto dev = device_allreduce();
  dev.op = OpType::AllGather;
  dev.output.bytes = dev.output.alloc_bytes = dev.input.bytes * 4;
  dev.flags = kFlagReadSources;
  EXPECT_TRUE(fails(dev, gpu_ctx(), "only host collectives that move bytes"));
}

namespace smddp::ipc {
namespace {
using testing::fails;

ValidationContext ctx_with_gpu_group_of_one() {
  auto c = gpu_ctx();
  c.group_size = 1;
  c.group_rank = 0;
  return c;
}

TEST(Validate, HierarchicalRequestsRunRankSideOnTheOpsThatHaveTheForm) {
  auto d = device_allreduce();
  d.flags = kFlagRankExec | kFlagHierarchical;
  EXPECT_EQ(validate_request(d, gpu_ctx()), std::nullopt);
  d.flags = kFlagHierarchical;  // without rank-side execution
  EXPECT_TRUE(fails(d, gpu_ctx(), "without rank-side execution"));
  d.flags = kFlagRankExec | kFlagHierarchical;
  d.op = OpType::AllToAll;  // even: as many bytes in and out
  EXPECT_TRUE(fails(d, ctx_with_gpu_group_of_one(), "run hierarchically"));
}

TEST(Validate, RailOperationsAreHostOperations) {
  auto h = allreduce();
  h.flags = kFlagRail;
  EXPECT_EQ(validate_request(h, ctx()), std::nullopt);
  auto d = device_allreduce();
  d.flags = kFlagRail;
  EXPECT_TRUE(fails(d, gpu_ctx(), "rail operation is a host operation"));
}

// The host fast path (kFlagHostFast): the ranks moved the bytes through their fast cells.
RequestDesc host_fast(OpType op = OpType::AllReduce, std::uint64_t n = 8) {
  RequestDesc d;
  d.op = op;
  d.dtype = DType::Float32;
  d.count = d.chunk_count = op == OpType::Barrier ? 0 : n;
  d.flags = kFlagHostFast;
  d.wait_value = 1;  // the lane's fast-op number
  return d;
}

TEST(ValidateHostFast, EveryCollectiveWithoutBuffersPasses) {
  for (auto op : {OpType::AllReduce, OpType::Reduce, OpType::Broadcast, OpType::AllGather, OpType::ReduceScatter,
                  OpType::Gather, OpType::Scatter, OpType::AllToAll, OpType::Barrier}) {
    SCOPED_TRACE(to_string(op));
    EXPECT_EQ(validate_request(host_fast(op), ctx()), std::nullopt);
  }
  EXPECT_EQ(validate_request(host_fast(OpType::AllReduce, 0), ctx()), std::nullopt);  // an empty one
  auto sdp = host_fast(OpType::AllGather);
  sdp.flags |= kFlagSdp | kFlagInPlace;
  EXPECT_EQ(validate_request(sdp, ctx()), std::nullopt);
  auto single = host_fast(OpType::AllGather);
  single.flags |= kFlagSingleCopy;
  EXPECT_EQ(validate_request(single, ctx()), std::nullopt);
}

TEST(ValidateHostFast, SingleCopyOutsideTheHostFastPathIsRefused) {
  RequestDesc d;
  d.op = OpType::AllGather;
  d.count = d.chunk_count = 8;
  d.flags = kFlagSingleCopy;
  EXPECT_TRUE(fails(d, ctx(), "single copy is a form of the host fast path"));
}

TEST(ValidateHostFast, PointToPointBuffersFlagsAndMissingNumbersAreRefused) {
  auto d = host_fast(OpType::Send);
  d.root = 2;
  EXPECT_TRUE(fails(d, ctx(), "collectives only"));
  d = host_fast();
  d.input = arena(0, 32);
  EXPECT_TRUE(fails(d, ctx(), "carries no buffers"));
  d = host_fast();
  d.aux = arena(0, 32);
  EXPECT_TRUE(fails(d, ctx(), "carries no buffers"));
  d = host_fast();
  d.flags |= kFlagReadSources;
  EXPECT_TRUE(fails(d, ctx(), "no other flags"));
  d = host_fast(OpType::AllToAll);
  d.flags |= kFlagSplits;
  EXPECT_TRUE(fails(d, ctx(), "no other flags"));
  d = host_fast();
  d.wait_value = 0;
  EXPECT_TRUE(fails(d, ctx(), "fast-op number"));
  d = host_fast();
  d.chunk_offset = 4;  // past the end
  EXPECT_TRUE(fails(d, ctx(), "exceeds count"));
}

}  // namespace
}  // namespace smddp::ipc
