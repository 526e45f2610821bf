#include "ipc/validate.hpp"

#include <string>

#include "ipc/segment.hpp"
#include "ipc/types.hpp"

namespace smddp::ipc {
namespace {

bool mul_ok(std::uint64_t a, std::uint64_t b, std::uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

std::string describe(const RequestDesc& r) {
  return std::string(to_string(r.op)) + " (comm " + std::to_string(r.comm_id) + ", seq " + std::to_string(r.seq) + ")";
}

std::optional<std::string> check_buffer(const char* which, const BufferRef& b, std::optional<std::uint64_t> want,
                                        const ValidationContext& ctx, std::size_t elem) {
  if (!want) {
    if (b.kind != BufferKind::None) return std::string(which) + " buffer given where none is expected";
    return std::nullopt;
  }
  switch (b.kind) {
    case BufferKind::None:
      if (*want == 0) return std::nullopt;
      return std::string(which) + " buffer missing (" + std::to_string(*want) + " bytes expected)";
    case BufferKind::Arena: {
      if (b.bytes != *want)
        return std::string(which) + " buffer covers " + std::to_string(b.bytes) + " bytes, expected " +
               std::to_string(*want);
      std::uint64_t end = 0;
      if (__builtin_add_overflow(b.offset, b.bytes, &end) || end > ctx.arena_bytes)
        return std::string(which) + " buffer [" + std::to_string(b.offset) + ", +" + std::to_string(b.bytes) +
               ") lies outside the staging arena of " + std::to_string(ctx.arena_bytes) + " bytes";
      if (elem > 1 && b.offset % elem != 0)
        return std::string(which) + " buffer offset " + std::to_string(b.offset) + " is not aligned to " +
               std::to_string(elem) + " bytes";
      return std::nullopt;
    }
    case BufferKind::CudaIpc: {
      if (!ctx.cuda_enabled) return std::string(which) + " is a CUDA buffer but this daemon has no GPU support";
      if (b.bytes != *want)
        return std::string(which) + " buffer covers " + std::to_string(b.bytes) + " bytes, expected " +
               std::to_string(*want);
      std::uint64_t end = 0;
      if (__builtin_add_overflow(b.offset, b.bytes, &end) || end > b.alloc_bytes)
        return std::string(which) + " buffer lies outside its CUDA allocation of " + std::to_string(b.alloc_bytes) +
               " bytes";
      return std::nullopt;
    }
  }
  return std::string(which) + " buffer has an unknown kind " + std::to_string(static_cast<int>(b.kind));
}

}  // namespace

std::optional<ExpectedBytes> expected_bytes(const RequestDesc& r, int group_size, int group_rank) {
  const std::uint64_t e = dtype_size(r.dtype);
  const std::uint64_t n = static_cast<std::uint64_t>(group_size);
  std::uint64_t c = 0, nc = 0;
  if (!mul_ok(r.chunk_count, e, c) || !mul_ok(c, n, nc)) return std::nullopt;
  const bool root = group_rank == r.root;
  ExpectedBytes x;
  switch (r.op) {
    case OpType::AllReduce: x.input = c; x.output = c; break;
    case OpType::Broadcast: if (root) x.input = c; x.output = c; break;
    case OpType::Reduce: x.input = c; if (root) x.output = c; break;
    case OpType::AllGather: x.input = c; x.output = nc; break;
    case OpType::ReduceScatter: x.input = nc; x.output = c; break;
    case OpType::AllToAll:
      if (r.flags & kFlagSplits) {
        // Buffer sizes follow the split table; the daemon checks them against it.
        x.input = r.input.bytes; x.output = r.output.bytes;
        std::uint64_t aux = 0;
        if (!mul_ok(2 * n, 8, aux)) return std::nullopt;
        x.aux = aux;
      } else {
        x.input = nc; x.output = nc;
      }
      break;
    case OpType::Barrier: break;
    case OpType::Send: x.input = c; break;
    case OpType::Recv: x.output = c; break;
    case OpType::Gather: x.input = c; if (root) x.output = nc; break;
    case OpType::Scatter: if (root) x.input = nc; x.output = c; break;
    case OpType::CommCreate: {
      std::uint64_t aux = 0;
      if (!mul_ok(r.count, 4, aux)) return std::nullopt;
      x.aux = aux;
      break;
    }
  }
  return x;
}

std::optional<std::string> validate_request(const RequestDesc& r, const ValidationContext& ctx) {
  const auto bad = [&](const std::string& why) -> std::optional<std::string> {
    return "invalid request " + describe(r) + ": " + why;
  };
  if (static_cast<int>(r.op) >= kOpTypeCount) return bad("unknown operation " + std::to_string(static_cast<int>(r.op)));
  if (static_cast<int>(r.dtype) >= kDTypeCount) return bad("unknown dtype " + std::to_string(static_cast<int>(r.dtype)));
  if (static_cast<int>(r.reduce_op) >= kReduceOpCount)
    return bad("unknown reduce op " + std::to_string(static_cast<int>(r.reduce_op)));
  if (r.flags & ~kKnownFlags) return bad("unknown flags 0x" + std::to_string(r.flags & ~kKnownFlags));
  if (ctx.group_size < 1 || ctx.group_rank < 0 || ctx.group_rank >= ctx.group_size)
    return bad("the posting rank is not a member of communicator " + std::to_string(r.comm_id));
  if (r.count > kMaxCount) return bad("count " + std::to_string(r.count) + " is too large");
  const bool reduces = r.op == OpType::AllReduce || r.op == OpType::Reduce || r.op == OpType::ReduceScatter;
  if (reduces && !reduce_op_supported(r.reduce_op, r.dtype))
    return bad("reduce op " + std::string(to_string(r.reduce_op)) + " is not defined for " +
               std::string(to_string(r.dtype)));
  const bool rooted = r.op == OpType::Broadcast || r.op == OpType::Reduce || r.op == OpType::Gather ||
                      r.op == OpType::Scatter || r.op == OpType::Send || r.op == OpType::Recv;
  if (rooted && (r.root < 0 || r.root >= ctx.group_size))
    return bad("root/peer " + std::to_string(r.root) + " is outside the group of " + std::to_string(ctx.group_size));
  if ((r.op == OpType::Send || r.op == OpType::Recv) && r.root == ctx.group_rank)
    return bad("a rank cannot send to or receive from itself");
  if (r.op == OpType::CommCreate) {
    if (r.count < 1 || r.count > static_cast<std::uint64_t>(1) << 24) return bad("bad member count");
    if (r.chunk_offset != 0 || r.chunk_count != 0) return bad("comm_create is not chunked");
  } else if (r.op == OpType::Barrier) {
    if (r.count != 0 || r.chunk_count != 0 || r.chunk_offset != 0) return bad("a barrier carries no data");
  } else if (r.op == OpType::AllToAll && (r.flags & kFlagSplits)) {
    if (r.chunk_offset != 0 || r.chunk_count != r.count) return bad("alltoall with splits is not chunked");
  } else {
    std::uint64_t end = 0;
    if (__builtin_add_overflow(r.chunk_offset, r.chunk_count, &end) || end > r.count)
      return bad("chunk [" + std::to_string(r.chunk_offset) + ", +" + std::to_string(r.chunk_count) +
                 ") exceeds count " + std::to_string(r.count));
    if (r.chunk_count == 0 && r.count != 0) return bad("empty chunk of a non-empty collective");
  }
  if (r.flags & kFlagStreamValue) {
    if (r.wait_event < -1 || r.wait_event >= kMaxEvents)
      return bad("stream flag index " + std::to_string(r.wait_event) + " is outside the table of " +
                 std::to_string(kMaxEvents));
  } else if (r.wait_event < -1 || r.wait_event >= ctx.event_count) {
    if (r.wait_event != -1) return bad("event index " + std::to_string(r.wait_event) + " was never exported");
  }
  if (!(r.scale == r.scale)) return bad("scale is NaN");
  if ((r.flags & kFlagSingleCopy) && !(r.flags & kFlagHostFast)) return bad("single copy is a form of the host fast path");

  if (r.flags & kFlagRankFast) {
    // The ranks moved the bytes themselves: nothing for the daemon to read or write.
    if (r.op != OpType::AllReduce && r.op != OpType::AllGather && r.op != OpType::ReduceScatter)
      return bad("the fast path takes allreduce, allgather and reduce_scatter only");
    if (r.input.kind != BufferKind::None || r.output.kind != BufferKind::None || r.aux.kind != BufferKind::None)
      return bad("a fast-path request carries no buffers");
    if (r.flags & ~(kFlagRankFast | kFlagInPlace | kFlagLastChunk | kFlagSdp))
      return bad("the fast path takes no other flags");
    if (r.wait_event != -1) return bad("a fast-path request carries no CUDA event");
    if (r.count == 0) return bad("an empty fast-path request");
    if (r.wait_value == 0) return bad("a fast-path request without its fast-op number");
    return std::nullopt;
  }
  if (r.flags & kFlagHostFast) {
    // The ranks moved the bytes through their fast cells: nothing for the daemon to touch.
    if (r.op == OpType::Send || r.op == OpType::Recv || r.op == OpType::CommCreate)
      return bad("the host fast path takes collectives only");
    if (r.input.kind != BufferKind::None || r.output.kind != BufferKind::None || r.aux.kind != BufferKind::None)
      return bad("a host fast-path request carries no buffers");
    if (r.flags & ~(kFlagHostFast | kFlagSingleCopy | kFlagInPlace | kFlagLastChunk | kFlagSdp))
      return bad("the host fast path takes no other flags");
    if (r.wait_event != -1) return bad("a host fast-path request carries no CUDA event");
    if (r.wait_value == 0) return bad("a host fast-path request without its fast-op number");
    return std::nullopt;
  }
  const auto want = expected_bytes(r, ctx.group_size, ctx.group_rank);
  if (!want) return bad("buffer size overflows");
  const std::size_t elem = r.op == OpType::CommCreate ? 4 : dtype_size(r.dtype);
  if (auto err = check_buffer("input", r.input, want->input, ctx, elem)) return bad(*err);
  if (auto err = check_buffer("output", r.output, want->output, ctx, elem)) return bad(*err);
  if (auto err = check_buffer("aux", r.aux, want->aux, ctx, r.op == OpType::CommCreate ? 4 : 8)) return bad(*err);
  // Split tables and member lists are read by the daemon's CPU: they live in the arena.
  if (r.aux.kind == BufferKind::CudaIpc) return bad("the aux buffer must be in the staging arena, not CUDA memory");
  // One request is all host or all device: the daemon runs it on one executor.
  if (r.input.kind != BufferKind::None && r.output.kind != BufferKind::None && r.input.kind != r.output.kind)
    return bad("input and output must both be host tensors or both CUDA tensors");
  const bool device = r.input.kind == BufferKind::CudaIpc || r.output.kind == BufferKind::CudaIpc;
  if (r.wait_event != -1 && !device) return bad("a host request carries a CUDA event to wait on");
  if ((r.flags & kFlagStreamValue) && !device) return bad("a host request carries a CUDA stream flag");
  if ((r.flags & kFlagDeviceFlags) && !(r.flags & kFlagStreamValue)) return bad("device flags without stream flags");
  if ((r.flags & kFlagDaemonCpuWait) && (!(r.flags & kFlagStreamValue) || (r.flags & kFlagDeviceFlags)))
    return bad("a CPU-side wait needs stream flags in host memory");
  if ((r.flags & kFlagReadSources) && (device || !reads_arenas(r.op) || (r.flags & kFlagSplits)))
    return bad("only host collectives that move bytes (no split tables) or reduce read the members' arenas");
  if (r.flags & kFlagRankExec) {
    // An uneven AllToAll member that sends and receives nothing has no buffers at all, yet
    // runs the plan's barriers with the others. Any other request without CUDA buffers is
    // a host request.
    const bool idle_member = r.op == OpType::AllToAll && (r.flags & kFlagSplits) &&
                             r.input.kind == BufferKind::None && r.output.kind == BufferKind::None;
    if (!device && !idle_member) return bad("rank-side GPU execution of a host request");
    if (r.flags & (kFlagStreamValue | kFlagDaemonCpuWait)) return bad("rank-side GPU execution with daemon-side flags");
  }
  if (r.flags & kFlagHierarchical) {
    if (!(r.flags & kFlagRankExec)) return bad("a hierarchical GPU operation without rank-side execution");
    if (r.op != OpType::AllReduce && r.op != OpType::ReduceScatter && r.op != OpType::AllGather &&
        r.op != OpType::Reduce && r.op != OpType::Broadcast)
      return bad("only allreduce, reduce_scatter, allgather, reduce and broadcast run hierarchically across nodes");
    if (r.flags & kFlagSplits) return bad("a hierarchical operation carries no split tables");
  }
  if ((r.flags & kFlagRail) && device) return bad("a rail operation is a host operation");
  return std::nullopt;
}

}  // namespace smddp::ipc
