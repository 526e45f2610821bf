// Request and completion descriptors: what travels through the per-rank rings.
// Fixed-size, trivially copyable, no pointers: every field is checked by the daemon
// (ipc/validate.hpp) before use.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>
#include <type_traits>

#include "ipc/types.hpp"

namespace smddp::ipc {

enum class BufferKind : std::uint8_t {
  None = 0,
  Arena = 1,    // offset/bytes inside the posting rank's host staging arena
  CudaIpc = 2,  // a CUDA IPC memory handle + offset (GPU path)
};

inline constexpr std::size_t kCudaIpcHandleBytes = 64;

struct BufferRef {
  BufferKind kind = BufferKind::None;
  std::uint8_t reserved[7] = {};
  std::uint64_t offset = 0;  // byte offset in the arena, or in the IPC allocation
  std::uint64_t bytes = 0;   // bytes this reference covers
  // CUDA only: the allocation's IPC handle, its buffer id (cache key) and size.
  std::uint64_t alloc_id = 0;
  std::uint64_t alloc_bytes = 0;
  std::uint8_t ipc_handle[kCudaIpcHandleBytes] = {};
};

// Request flags.
inline constexpr std::uint32_t kFlagInPlace = 1u << 0;
inline constexpr std::uint32_t kFlagSdp = 1u << 1;        // sharded-data-parallel AllGather path
inline constexpr std::uint32_t kFlagSplits = 1u << 2;     // AllToAll with explicit splits in aux
inline constexpr std::uint32_t kFlagLastChunk = 1u << 3;  // last chunk of a chunked collective
// GPU path: wait_event indexes the rank's stream flags (RankSlot::stream_flags) and the
// daemon's GPU waits until that flag reaches wait_value; the completion answers with
// daemon_value (RankSlot::done_flag) instead of an event.
inline constexpr std::uint32_t kFlagStreamValue = 1u << 4;
// With kFlagStreamValue: the flags live in the rank's GPU flag block (RankSlot::
// flag_block_handle) rather than in the segment. GPUs re-poll their own memory at once but
// host memory only every few milliseconds, so this is the fast form.
inline constexpr std::uint32_t kFlagDeviceFlags = 1u << 5;
// With kFlagStreamValue (host-memory flags): the daemon waits for the stream flag on its CPU
// and enqueues the GPU work only then, so its GPU streams never block on a rank's context
// (on a GPU shared by two processes a blocked cross-process wait can cost a ~2 ms timeslice).
// The completion comes at once, with the done value the daemon's GPU will write.
inline constexpr std::uint32_t kFlagDaemonCpuWait = 1u << 6;
// GPU path, rank-side execution (the default): the daemon matches and validates, and answers
// every member with a plan (CompletionKind::Plan: the members' buffers), preceded by the IPC
// handles the member has not been sent yet (CompletionKind::Handles). Each rank then runs its
// part on its own stream, in its own CUDA context, against peer-mapped buffers, ordered by
// flags in the ranks' GPU flag blocks. No GPU work runs in the daemon, so no GPU is
// time-sliced between two processes' contexts. wait_event/wait_value are unused.
// wait_value carries the rank's schedule key (PeerExecutor::schedule_key): the tuning that
// decides how many barriers each collective takes, which the members must share.
inline constexpr std::uint32_t kFlagRankExec = 1u << 7;
// GPU path, the ranks' fast path (small AllReduce, AllGather and ReduceScatter of a group
// within one node; client/gpu/peer_executor.hpp): the ranks already enqueued the work, each
// against the others' staging buffers, when they post this. It carries no buffers; the
// daemon matches and checks it like any collective and answers with a plain completion
// (an error when the members disagree, which makes the ranks release their waiting kernels).
// wait_value carries the rank's fast-op number, counted over every group: the members of
// a match must agree on it, or their kernels paired different operations.
inline constexpr std::uint32_t kFlagRankFast = 1u << 8;
// The fast-op number of a rank whose fast path is off after a failure: a match with it fails,
// which makes the other members release their kernels and stop taking the path too.
inline constexpr std::uint64_t kFastSeqOff = ~std::uint64_t{0};
// Host path: this rank can read the members' arenas itself. For a collective that only moves
// bytes (allgather, broadcast, gather, scatter, even alltoall) it copies its part of the output
// from them (CompletionKind::Sources) instead of from its own output region after the daemon's
// copies; for a reducing one (allreduce, reduce, reduce-scatter) it reduces its share of the
// chunk from them and copies the others' shares (CompletionKind::Shares). The daemon answers
// so when every member of the chunk set it, within one node; otherwise it ignores the flag.
inline constexpr std::uint32_t kFlagReadSources = 1u << 9;
// GPU path, rank-side execution (with kFlagRankExec) in a group that spans nodes: the daemon
// answers the members on this node with a plan of them alone. The ranks run their in-node part
// (a reduce-scatter over NVLink, copies) and move only their shard across nodes, as a host
// operation on a rail communicator (kFlagRail): the members of the group with the same local
// index, one per node (client/gpu/hier_schedule.hpp). Every node must hold as many members.
inline constexpr std::uint32_t kFlagHierarchical = 1u << 10;
// Host path: this operation carries one GPU's shard of a hierarchical operation across nodes
// (its bytes are staged from and to CUDA memory). It runs as any host operation; the daemon
// counts it apart for the operator.
inline constexpr std::uint32_t kFlagRail = 1u << 11;
// Host path, the ranks' fast path (small host collectives of a group within one node): the
// ranks already exchanged the bytes through their fast cells (ipc/segment.hpp, FastCell) when
// they post this, and do not wait for it. It carries no buffers: the rank writes only the fields
// before `input` into its ring slot, and the daemon clears the three buffer fields it finds
// there (what an earlier request left) before it looks at the request. The daemon matches and checks
// it like any collective and counts it, and answers only when it fails (its error is the
// members' error): an answer per operation would fill the completion ring of a rank that posts
// many and then calls nothing for a while. wait_value is the lane's fast-op number, the same on
// every member. chunk_count is the count (one chunk).
inline constexpr std::uint32_t kFlagHostFast = 1u << 12;
// With kFlagHostFast: the members read each other's inputs where they are, by single copy
// (FastCell::by_address). Only counted by the daemon, for the operator.
inline constexpr std::uint32_t kFlagSingleCopy = 1u << 13;
inline constexpr std::uint32_t kKnownFlags = kFlagInPlace | kFlagSdp | kFlagSplits | kFlagLastChunk |
                                             kFlagStreamValue | kFlagDeviceFlags | kFlagDaemonCpuWait |
                                             kFlagRankExec | kFlagRankFast | kFlagReadSources |
                                             kFlagHierarchical | kFlagRail | kFlagHostFast | kFlagSingleCopy;

struct RequestDesc {
  std::uint64_t request_id = 0;  // client-chosen, echoed in the completion
  std::uint64_t comm_id = 0;
  std::uint64_t seq = 0;  // per communicator (collectives) or per peer pair (send/recv)
  OpType op = OpType::Barrier;
  DType dtype = DType::Float32;
  ReduceOp reduce_op = ReduceOp::Sum;
  std::uint8_t reserved0 = 0;
  std::uint32_t flags = 0;
  std::int32_t root = 0;  // group rank of the root, or the peer for send/recv
  std::int32_t tag = 0;
  std::uint64_t count = 0;         // the whole collective's count, meaning per OpType
  std::uint64_t chunk_offset = 0;  // first element of this chunk (within a block)
  std::uint64_t chunk_count = 0;   // elements of this chunk (within a block)
  double scale = 1.0;              // PREMUL_SUM factor
  std::uint32_t timeout_ms = 0;    // the process group's timeout; 0: daemon default
  std::int32_t wait_event = -1;    // index in the rank's event table to wait on (GPU)
  std::uint32_t reserved1 = 0;
  std::uint64_t wait_value = 0;    // kFlagStreamValue: the stream flag value to wait for
  BufferRef input;
  BufferRef output;
  BufferRef aux;  // AllToAll splits (2*size int64: send then recv), CommCreate members
};

inline constexpr std::size_t kErrorTextBytes = 960;

// What a completion carries besides its status (kFlagRankExec requests only use the others).
enum class CompletionKind : std::uint8_t {
  Final = 0,    // the request is done (or failed: error text)
  Handles = 1,  // not final: IPC handles of peers' allocations (PlanHandle[]) and the
                // allocations they freed (kPlanHandleReleased), a plan follows
  Plan = 2,     // final, status Ok: the members' buffers (PlanHeader, PlanMember[])
  Sources = 3,  // final, status Ok (kFlagReadSources): copy the output blocks from the members'
                // arenas (SourcesHeader, ArenaSource[] in output-block order, SourceReader[])
  Shares = 4,   // final, status Ok (kFlagReadSources, a reduction): reduce this rank's share
                // from the members' arenas, then copy the others' (SharesHeader, see there)
};

// A Sources completion's payload, in its error bytes. The receiver copies the blocks, then bumps
// its RankSlot::sources_done. Its own region of the chunk stays in use, since the others read
// it, until every reader's sources_done reached its `seq` (or the reader left).
struct SourcesHeader {
  std::uint32_t count = 0;    // ArenaSource entries that follow
  std::uint32_t readers = 0;  // SourceReader entries after them: every member of the chunk
};
struct ArenaSource {
  std::int32_t slot = -1;  // whose arena (local rank)
  std::uint32_t reserved = 0;
  std::uint64_t offset = 0;  // bytes into that arena
  std::uint64_t bytes = 0;
};
struct SourceReader {
  std::int32_t slot = -1;
  std::uint32_t reserved = 0;
  std::uint64_t seq = 0;  // the reader is done with this chunk once its sources_done >= seq
};
// Every member reads (allgather, alltoall) or is read (gather): n sources and n readers.
inline constexpr std::size_t kMaxSourceMembers =
    (kErrorTextBytes - sizeof(SourcesHeader)) / (sizeof(ArenaSource) + sizeof(SourceReader));

// A Shares completion's payload, in its error bytes: SharesHeader, then per member by group
// rank its input region of the chunk (ArenaSource[members]), its number as a reader
// (SourceReader[members], as for Sources) and the mark of its share (SourceReader[members]:
// its share is reduced once its RankSlot::shares_reduced >= seq).
// - allreduce and reduce: member r reduces elements share_range(count, members, r) of every
//   input into its own input region (in place), bumps shares_reduced, then copies every share
//   into its output once its owner's mark is there (reduce: only the root).
// - reduce-scatter: each input holds `members` blocks of `count`; member r reduces block r of
//   every input straight into its output.
// The rank then bumps sources_done; its region stays the others' until they are all done.
struct SharesHeader {
  std::uint32_t members = 0;
  std::uint32_t me = 0;     // the receiver's group rank
  std::uint64_t count = 0;  // elements of the chunk (of one block)
  double scale = 1.0;       // PREMUL_SUM factor
  std::int32_t root = 0;    // reduce: the group rank that copies the shares
  OpType op = OpType::AllReduce;
  DType dtype = DType::Float32;
  ReduceOp reduce_op = ReduceOp::Sum;
  std::uint8_t reserved = 0;
};
inline constexpr std::size_t kMaxShareMembers =
    (kErrorTextBytes - sizeof(SharesHeader)) / (sizeof(ArenaSource) + 2 * sizeof(SourceReader));
// Member r's share of `count` elements split `members` ways: [first, second). Whole 64-element
// runs (cache lines unshared between writers), so late members may get nothing.
constexpr std::pair<std::uint64_t, std::uint64_t> share_range(std::uint64_t count, std::uint32_t members,
                                                              std::uint32_t r) noexcept {
  std::uint64_t per = members ? (count + members - 1) / members : count;
  per = (per + 63) / 64 * 64;
  const std::uint64_t lo = per * r < count ? per * r : count;
  return {lo, lo + per < count ? lo + per : count};
}

// Rank-side plans live in the completion's error bytes (unused on success).
inline constexpr int kPlanMaxMembers = 8;
struct PlanRef {
  std::uint64_t alloc_id = 0;  // 0: no buffer
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};
struct PlanMember {
  std::int32_t slot = -1;  // local rank (segment slot)
  std::uint32_t reserved = 0;
  PlanRef in, out;
};
// PlanHeader::flags: an uneven AllToAll; a PlanSplit per member follows the members.
inline constexpr std::uint16_t kPlanSplits = 1u << 0;
struct PlanHeader {
  std::uint16_t members = 0;  // PlanMember entries that follow, by group rank (p2p: send, recv)
  std::uint16_t me = 0;       // the receiver's index among them
  std::uint16_t handles = 0;  // Handles completions: PlanHandle entries that follow
  std::uint16_t flags = 0;
};
// Uneven AllToAll (kPlanSplits), for the receiver r and member q, in elements: r's block for q
// (its length, and where it goes in q's output) and q's block for r (its length, and where it
// starts in q's input). The daemon derives them from every member's split table.
struct PlanSplit {
  std::uint64_t send = 0;      // r -> q
  std::uint64_t send_dst = 0;  // offset of that block in q's output
  std::uint64_t recv = 0;      // q -> r
  std::uint64_t recv_src = 0;  // offset of that block in q's input
};
// PlanHandle::flags: the owner freed this allocation; close the mapping (no handle bytes).
inline constexpr std::uint32_t kPlanHandleReleased = 1u << 0;
struct PlanHandle {
  std::int32_t slot = -1;  // owner of the allocation
  std::uint32_t flags = 0;
  std::uint64_t alloc_id = 0;
  std::uint8_t handle[kCudaIpcHandleBytes] = {};
};
inline constexpr std::size_t kPlanHandlesPerCompletion = (kErrorTextBytes - sizeof(PlanHeader)) / sizeof(PlanHandle);
inline constexpr std::size_t kPlanSplitsOffset = sizeof(PlanHeader) + kPlanMaxMembers * sizeof(PlanMember);
static_assert(kPlanSplitsOffset + kPlanMaxMembers * sizeof(PlanSplit) <= kErrorTextBytes);

struct CompletionDesc {
  std::uint64_t request_id = 0;
  std::uint64_t comm_id = 0;
  std::uint64_t seq = 0;
  Status status = Status::Ok;
  CompletionKind kind = CompletionKind::Final;
  std::uint8_t reserved[2] = {};
  std::int32_t daemon_event = -1;  // GPU: index of the daemon event that marks it done
  std::uint64_t daemon_value = 0;  // GPU, kFlagStreamValue: done_flag reaches it when done
  char error[kErrorTextBytes] = {};

  void set_error(std::string_view text) noexcept {
    std::size_t n = text.size() < kErrorTextBytes - 1 ? text.size() : kErrorTextBytes - 1;
    std::memcpy(error, text.data(), n);
    error[n] = '\0';
    if (n < text.size() && n >= 3) std::memcpy(error + n - 3, "...", 3);
  }
  std::string_view error_text() const noexcept { return {error, ::strnlen(error, kErrorTextBytes)}; }

  // Plan payload (kind Handles or Plan); the setters assume the counts fit.
  PlanHeader plan_header() const noexcept {
    PlanHeader h;
    std::memcpy(&h, error, sizeof h);
    return h;
  }
  void set_plan_header(const PlanHeader& h) noexcept { std::memcpy(error, &h, sizeof h); }
  PlanMember plan_member(int i) const noexcept {
    PlanMember m;
    std::memcpy(&m, error + sizeof(PlanHeader) + static_cast<std::size_t>(i) * sizeof m, sizeof m);
    return m;
  }
  void set_plan_member(int i, const PlanMember& m) noexcept {
    std::memcpy(error + sizeof(PlanHeader) + static_cast<std::size_t>(i) * sizeof m, &m, sizeof m);
  }
  PlanSplit plan_split(int i) const noexcept {
    PlanSplit x;
    std::memcpy(&x, error + kPlanSplitsOffset + static_cast<std::size_t>(i) * sizeof x, sizeof x);
    return x;
  }
  void set_plan_split(int i, const PlanSplit& x) noexcept {
    std::memcpy(error + kPlanSplitsOffset + static_cast<std::size_t>(i) * sizeof x, &x, sizeof x);
  }
  SourcesHeader sources_header() const noexcept {
    SourcesHeader h;
    std::memcpy(&h, error, sizeof h);
    return h;
  }
  void set_sources_header(const SourcesHeader& h) noexcept { std::memcpy(error, &h, sizeof h); }
  ArenaSource source(std::size_t i) const noexcept {
    ArenaSource x;
    std::memcpy(&x, error + sizeof(SourcesHeader) + i * sizeof x, sizeof x);
    return x;
  }
  void set_source(std::size_t i, const ArenaSource& x) noexcept {
    std::memcpy(error + sizeof(SourcesHeader) + i * sizeof x, &x, sizeof x);
  }
  // Reader i, after `sources` ArenaSource entries.
  SourceReader source_reader(std::size_t sources, std::size_t i) const noexcept {
    SourceReader x;
    std::memcpy(&x, error + sizeof(SourcesHeader) + sources * sizeof(ArenaSource) + i * sizeof x, sizeof x);
    return x;
  }
  void set_source_reader(std::size_t sources, std::size_t i, const SourceReader& x) noexcept {
    std::memcpy(error + sizeof(SourcesHeader) + sources * sizeof(ArenaSource) + i * sizeof x, &x, sizeof x);
  }
  SharesHeader shares_header() const noexcept {
    SharesHeader h;
    std::memcpy(&h, error, sizeof h);
    return h;
  }
  void set_shares_header(const SharesHeader& h) noexcept { std::memcpy(error, &h, sizeof h); }
  // Member i's input, its number as a reader, and its share's mark, of `members`.
  ArenaSource share_input(std::size_t i) const noexcept { return at<ArenaSource>(sizeof(SharesHeader) + i * sizeof(ArenaSource)); }
  void set_share_input(std::size_t i, const ArenaSource& x) noexcept { put(sizeof(SharesHeader) + i * sizeof x, x); }
  SourceReader share_reader(std::size_t members, std::size_t i) const noexcept {
    return at<SourceReader>(share_readers_at(members) + i * sizeof(SourceReader));
  }
  void set_share_reader(std::size_t members, std::size_t i, const SourceReader& x) noexcept {
    put(share_readers_at(members) + i * sizeof x, x);
  }
  SourceReader share_mark(std::size_t members, std::size_t i) const noexcept {
    return at<SourceReader>(share_readers_at(members) + (members + i) * sizeof(SourceReader));
  }
  void set_share_mark(std::size_t members, std::size_t i, const SourceReader& x) noexcept {
    put(share_readers_at(members) + (members + i) * sizeof x, x);
  }
  PlanHandle plan_handle(int i) const noexcept {
    PlanHandle h;
    std::memcpy(&h, error + sizeof(PlanHeader) + static_cast<std::size_t>(i) * sizeof h, sizeof h);
    return h;
  }
  void set_plan_handle(int i, const PlanHandle& h) noexcept {
    std::memcpy(error + sizeof(PlanHeader) + static_cast<std::size_t>(i) * sizeof h, &h, sizeof h);
  }

 private:
  static constexpr std::size_t share_readers_at(std::size_t members) noexcept {
    return sizeof(SharesHeader) + members * sizeof(ArenaSource);
  }
  template <class T>
  T at(std::size_t offset) const noexcept {
    T x;
    std::memcpy(&x, error + offset, sizeof x);
    return x;
  }
  template <class T>
  void put(std::size_t offset, const T& x) noexcept {
    std::memcpy(error + offset, &x, sizeof x);
  }
};

static_assert(std::is_trivially_copyable_v<RequestDesc>);
static_assert(std::is_trivially_copyable_v<CompletionDesc>);

}  // namespace smddp::ipc
