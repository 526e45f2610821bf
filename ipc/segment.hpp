// The node's shared-memory segment: header, one RankSlot per local rank (rings, doorbell,
// CUDA event table), the ranks' fast cells, and one host staging arena per rank.
//
//   [SegmentHeader][RankSlot 0][RankSlot 1]...[fast cells 0][fast cells 1]...[arena 0][arena 1]...
//
// The daemon creates it (Segment::create: O_EXCL, mode 0600, stale segments of dead daemons
// removed first) and unlinks it when the owning object dies; ranks attach (Segment::attach),
// which refuses a segment of another layout version naming both versions.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ipc/doorbell.hpp"
#include "ipc/protocol.hpp"
#include "ipc/ring.hpp"

namespace boost::interprocess {
class mapped_region;
}

namespace smddp::ipc {

inline constexpr std::uint64_t kSegmentMagic = 0x31474553'50444d53ULL;  // "SMDPSEG1"
inline constexpr std::uint32_t kLayoutVersion = 17;  // 3: completion kinds and rank-side plans; 4: kFlagRankFast;
                                                     // 5: released allocations; 6: reads from the members' arenas;
                                                     // 7: hierarchical GPU operations, staged bytes;
                                                     // 8: the host fast path's cells; 9: shares reduced by the ranks;
                                                     // 10: the host fast path's read limit;
                                                     // 11: its own limit for all-reduce and reduce;
                                                     // 12: that limit shrinking with the members;
                                                     // 13: single copy (FastCell::address)
                                                     // 14: FastCell::done_then, a 32-bit FastCell::seq
                                                     // 15: the input from the cell's first line,
                                                     //     FastDone::given_up on a line of its own
                                                     // 16: all-reduce by single copy (FastDone::reduced)
                                                     // 17: gathers of 3-4 members by single copy
inline constexpr std::size_t kRequestRingCapacity = 256;
inline constexpr std::size_t kCompletionRingCapacity = 256;
inline constexpr int kMaxLocalRanks = 64;
inline constexpr int kMaxEvents = 256;
inline constexpr int kMaxDaemonEvents = 64;
inline constexpr int kMaxReleased = 256;
inline constexpr std::size_t kJobIdBytes = 64;
inline constexpr std::size_t kBusIdBytes = 32;

// The host fast path (kFlagHostFast). A communicator within one node gets a lane from the
// daemon when it is created (the world's is lane 0, when the job has one node): the same lane
// index in every member's slot. Each member has two cells per lane; its k-th fast operation on
// the lane (k from 1) writes its input into cell k % 2 and then publishes k in the cell's tag.
// The members read each other's cells of that k and compute their outputs themselves; each
// then publishes k in its RankSlot::fast_done of the lane. A member writes cell k % 2 again
// (for k + 2) only once every member's fast_done reached k.
inline constexpr int kFastLanes = 16;
struct FastCell {
  std::atomic<std::uint64_t> tag{0};  // the fast-op number whose input and signature are here
  // The call's signature, which the members compare before they read each other's bytes.
  std::uint64_t comm_id = 0;
  std::uint32_t seq = 0;  // the low 32 bits of the call's sequence number
  // The member's fast_done of the lane when it wrote the cell, low 32 bits: a lower bound of its
  // fast_done now. The others read it with the cell, so that the check before their next
  // publish (every member done with number k - 2) usually needs no look at the member's
  // fast_done line, which it has just written (a cache miss per member per operation).
  std::atomic<std::uint32_t> done_then{0};
  std::uint64_t count = 0;
  std::int32_t root = 0;
  OpType op = OpType::Barrier;
  DType dtype = DType::Float32;
  ReduceOp reduce_op = ReduceOp::Sum;
  // 1: single copy (SegmentHeader::fast_single_copy_bytes): the input stays in the member's own
  // memory, at the address the input's place holds (Segment::fast_address), in the process of
  // its slot's pid, and the others read it from there (ipc/cross_memory.hpp); the member waits
  // for their fast_done before it returns. An all-reduce by single copy also holds its output's
  // address (Segment::fast_output_address), where the others read its reduced share.
  std::uint8_t by_address = 0;
  // The input starts here, in the tag's line, and runs on into the SegmentHeader::fast_cell_bytes
  // that follow the cell: a member that sees the tag of a small input (a loss scalar, a count:
  // kFastInlineBytes at most) has its bytes too, one line from each member instead of two.
  std::byte input[24];
};
inline constexpr std::size_t kFastInlineBytes = sizeof(FastCell::input);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(sizeof(FastCell) == 64 && offsetof(FastCell, input) % 8 == 0);
// The lane's marks, each on a line of its own: `k` is written after every operation and read by
// the members only now and then, `given_up` read by every member that waits for a cell; on one
// line, every such look took the line from its writer, whose next mark then waited to take it
// back.
struct alignas(64) FastDone {
  std::atomic<std::uint64_t> k{0};  // the last fast-op number of the lane this rank finished reading
  // The first fast-op number of the lane whose operation failed on this rank (0: none). The
  // others stop waiting for its cells from there on: it may never publish them.
  alignas(64) std::atomic<std::uint64_t> given_up{0};
  // An all-reduce by single copy (SegmentHeader::fast_single_copy_reduce_bytes): the last
  // fast-op number of the lane whose share this rank reduced into its output, where the others
  // then read it. Written once such an operation, read by the members that wait for the share.
  alignas(64) std::atomic<std::uint64_t> reduced{0};
};

enum class DaemonState : std::uint32_t { Starting = 0, Ready = 1, Failed = 2, Stopping = 3 };
enum class SlotState : std::uint32_t { Empty = 0, Claiming = 1, Registered = 2, Exited = 3, Failed = 4 };

struct SegmentHeader {
  std::uint64_t magic = 0;
  std::uint32_t layout_version = 0;
  std::uint32_t header_bytes = 0;
  std::uint64_t segment_bytes = 0;
  std::int32_t daemon_pid = 0;
  std::int32_t node_id = 0;
  std::int32_t num_nodes = 1;
  std::int32_t local_world_size = 0;
  std::int32_t world_size = 0;
  std::int32_t first_rank = 0;  // global rank of local rank 0
  std::uint64_t arena_bytes = 0;
  std::uint64_t chunk_bytes = 0;  // pipeline chunk target; every rank must chunk alike
  std::uint64_t slots_offset = 0;
  std::uint64_t slot_bytes = 0;
  std::uint64_t arenas_offset = 0;
  std::uint64_t fast_offset = 0;      // the fast cells of slot 0 (FastCell)
  std::uint64_t fast_cell_bytes = 0;  // input bytes a fast cell holds; 0: no host fast path
  std::uint64_t fast_read_bytes = 0;  // the most bytes a member may read from the cells in one operation
  std::uint64_t fast_reduce_bytes = 0;  // ... and reduce, in an all-reduce or a reduce (every input, every member)
  std::uint64_t fast_reduce_shrinks = 0;  // 1: fast_reduce_bytes is 2 members' limit, x 2 / n for n members
  // Collectives that only move bytes (all-gather, broadcast, gather, scatter, alltoall) whose
  // largest input is at least this many bytes take the fast path by single copy, at any size:
  // the members read each other's inputs where they are (FastCell::by_address). 0: never (off,
  // or the ranks cannot read each other's memory: ipc::peer_reads_unavailable).
  std::uint64_t fast_single_copy_bytes = 0;
  // An all-reduce that does not take the cells (fast_cell_bytes, fast_read_bytes,
  // fast_reduce_bytes) takes the fast path by single copy in two phases: each member reduces
  // its share (ipc::share_range) of every member's input, read where it is, into its own
  // output, then reads the others' shares from their outputs. With 2 members from
  // fast_single_copy_reduce_bytes of input (0: never) up to fast_single_copy_reduce_upto_bytes
  // (0: any size); with 3 or 4 from fast_single_copy_reduce_wide_bytes (0: never). Never with
  // more, nor where single copy is off.
  std::uint64_t fast_single_copy_reduce_bytes = 0;
  std::uint64_t fast_single_copy_reduce_upto_bytes = 0;
  std::uint64_t fast_single_copy_reduce_wide_bytes = 0;
  // A gather of 3 or 4 members takes the fast path by single copy from this input size (0:
  // never): its root reads the others' inputs where they are, over its copy helpers, so only
  // where the ranks have them.
  std::uint64_t fast_single_copy_gather_wide_bytes = 0;
  char job_id[kJobIdBytes] = {};
  std::atomic<std::uint32_t> state{0};
  std::atomic<std::uint64_t> heartbeat{0};
  // Set once when the job fails (a rank or daemon died); job_error is written first.
  std::atomic<std::uint32_t> job_failed{0};
  char job_error[kErrorTextBytes] = {};
  Doorbell daemon_bell;  // rung by ranks after posting requests or registering
};

struct RankSlot {
  std::atomic<std::uint32_t> state{0};
  std::int32_t pid = 0;
  std::int32_t rank = -1;
  std::int32_t local_rank = -1;
  char device_bus_id[kBusIdBytes] = {};  // "" for CPU-only ranks
  Doorbell client_bell;                  // rung by the daemon after posting completions
  SpscRing<RequestDesc, kRequestRingCapacity> requests;
  SpscRing<CompletionDesc, kCompletionRingCapacity> completions;
  // Rank -> daemon: interprocess events the rank exported (append-only; a request's
  // wait_event indexes here). The rank writes a handle, then publishes it by bumping the count.
  std::atomic<std::uint32_t> event_count{0};
  std::uint8_t event_handles[kMaxEvents][kCudaIpcHandleBytes] = {};
  // Daemon -> rank: the daemon's interprocess events, created on this rank's GPU (a rank may
  // wait on them only from its own GPU); a completion's daemon_event indexes here. Written
  // once by the daemon before the first completion that names them.
  std::atomic<std::uint32_t> daemon_event_count{0};
  std::uint8_t daemon_event_handles[kMaxDaemonEvents][kCudaIpcHandleBytes] = {};
  // GPU path with stream memory operations (kFlagStreamValue; interprocess event waits are
  // slow): the rank's GPU writes stream_flags[s] (one per CUDA stream of the rank, values
  // increasing) after a request's inputs; the daemon's GPU waits until it reaches the
  // request's wait_value. The daemon's GPU writes done_flag (increasing) after the work; the
  // rank's GPU waits until it reaches the completion's daemon_value. Both processes register
  // these pages with CUDA (cudaHostRegister) and only GPUs write them.
  alignas(64) std::uint64_t stream_flags[kMaxEvents] = {};
  alignas(64) std::uint64_t done_flag = 0;
  // kFlagDeviceFlags: the same flags in GPU memory the rank allocated on its GPU
  // (kMaxEvents stream flags, then the done flag), exported for the daemon to map; published
  // by setting flag_block_published after the handle is written.
  std::uint8_t flag_block_handle[kCudaIpcHandleBytes] = {};
  std::atomic<std::uint32_t> flag_block_published{0};
  // kFlagRankExec: what this rank's GPU ran, by operation type (index: OpType). Written by the
  // rank only; the daemon, which launches nothing then, shows the sums in its status.
  std::atomic<std::uint64_t> gpu_ops[kOpTypeCount] = {};
  std::atomic<std::uint64_t> gpu_kernels[kOpTypeCount] = {};
  std::atomic<std::uint64_t> gpu_copies{0};
  // Bytes this rank copied from its GPU into its arena, and from its arena into its GPU, for
  // operations whose bytes cross nodes (by operation type). Written by the rank only.
  std::atomic<std::uint64_t> staged_to_host[kOpTypeCount] = {};
  std::atomic<std::uint64_t> staged_to_device[kOpTypeCount] = {};
  // Rank -> daemon: ids (CU_POINTER_ATTRIBUTE_BUFFER_ID) of exported CUDA allocations the rank
  // freed. Whoever mapped one must close the mapping: an open mapping keeps the owner's freed
  // memory held. Id i (i < released_count) is released_ids[i % kMaxReleased]; the rank
  // writes the id, then bumps the count. The daemon reads them in order and reports those a
  // writer kMaxReleased ahead of it overwrote.
  std::atomic<std::uint64_t> released_count{0};
  std::uint64_t released_ids[kMaxReleased] = {};
  // Rank -> its peers: how many Sources completions (CompletionKind::Sources) this rank has
  // answered by copying, in ring order. A member whose region others read frees it once every
  // reader's count reached the number the daemon gave that reader's copy of the chunk.
  alignas(64) std::atomic<std::uint64_t> sources_done{0};
  // Set by this rank while a chunk of its waits for arena space that readers still hold: a
  // reader that bumps its sources_done then rings this rank's bell (and only then: a ring
  // would wake a sleeping rank for nothing).
  std::atomic<std::uint32_t> waits_for_readers{0};
  // Rank -> its peers: how many Shares completions (CompletionKind::Shares) this rank has
  // reduced its share of, in ring order. A member copies the others' shares of a chunk once
  // each one's count reached the number the daemon gave it (the daemon shows a late one).
  alignas(64) std::atomic<std::uint64_t> shares_reduced{0};
  // The host fast path: per lane, the last fast-op number this rank finished reading (the
  // others may then write over their cells of it). Written by this rank only.
  FastDone fast_done[kFastLanes];
};
inline constexpr std::size_t kFlagBlockBytes = 4096;  // >= (kMaxEvents + 1) * 8
static_assert((kMaxEvents + 1) * 8 <= kFlagBlockBytes);
// kFlagRankExec: word kBarrierFlagBase + w of a rank's flag block is written by local rank w
// (counts of the barriers the two ranks passed together), waited on by the block's owner.
inline constexpr std::size_t kBarrierFlagBase = kMaxEvents + 8;
// kFlagHierarchical: the closing barriers of hierarchical operations, counted apart (word
// kTailFlagBase + w, written by local rank w). They run when the operation's bytes are back
// from the other nodes, later than the plans after it, whose barriers keep their own count.
inline constexpr std::size_t kTailFlagBase = kBarrierFlagBase + kMaxLocalRanks;
static_assert((kTailFlagBase + kMaxLocalRanks) * 8 <= kFlagBlockBytes);

// A segment removed by a sweep, for the log line that says so.
struct StaleSegment {
  std::string name;
  std::string job_id;  // empty where the header was unreadable
  int node_id = -1;
  int daemon_pid = 0;
};

struct SegmentSpec {
  std::string job_id;
  int node_id = 0;
  int num_nodes = 1;
  int local_world_size = 1;
  int world_size = 1;
  int first_rank = 0;
  std::uint64_t arena_bytes = 32ull << 20;
  std::uint64_t chunk_bytes = 1ull << 20;
  std::uint64_t fast_cell_bytes = 32ull << 10;  // 0: no host fast path
  std::uint64_t fast_read_bytes = 1ull << 20;   // see SegmentHeader::fast_read_bytes
  std::uint64_t fast_reduce_bytes = 1ull << 20; // see SegmentHeader::fast_reduce_bytes
  bool fast_reduce_shrinks = false;              // see SegmentHeader::fast_reduce_shrinks
  std::uint64_t fast_single_copy_bytes = 0;      // see SegmentHeader::fast_single_copy_bytes
  // see SegmentHeader::fast_single_copy_reduce_bytes and the two after it
  std::uint64_t fast_single_copy_reduce_bytes = 0;
  std::uint64_t fast_single_copy_reduce_upto_bytes = 0;
  std::uint64_t fast_single_copy_reduce_wide_bytes = 0;
  std::uint64_t fast_single_copy_gather_wide_bytes = 0;  // see SegmentHeader's
};

std::uint64_t segment_bytes_for(const SegmentSpec& spec);

// A slot's fast cells: two per lane, each a FastCell and its input, in whole pages.
constexpr std::uint64_t fast_area_bytes(std::uint64_t cell_bytes) {
  constexpr std::uint64_t page = 4096;
  return cell_bytes ? (2 * kFastLanes * (sizeof(FastCell) + cell_bytes) + page - 1) / page * page : 0;
}

class Segment {
 public:
  // Daemon side. Throws std::runtime_error with a clear message when a live daemon already
  // owns the name ("job X already has a daemon on this node, pid P").
  static Segment create(const SegmentSpec& spec);
  // Rank side. Throws std::runtime_error when absent, of another layout version, or corrupt.
  static Segment attach(const std::string& job_id, int node_id);
  // Whether a segment of that name exists (no validation).
  static bool exists(const std::string& job_id, int node_id);
  // Removes the job's segment on `node_id` if its daemon is gone. Returns true if removed.
  static bool remove_if_stale(const std::string& job_id, int node_id);
  // The pid of the daemon named in the job's segment on `node_id`; 0 if none (absent, or not
  // yet written).
  static int owner_pid(const std::string& job_id, int node_id);
  // Removes the job's segment unconditionally (used when the owner is known dead).
  static void remove(const std::string& job_id, int node_id);
  // Removes this user's smddp segments (any job) whose daemons are gone, with their fabric
  // regions and control sockets; daemons sweep this way as they start, so a killed job's
  // leftovers go with the next job. A segment whose owner pid looks dead is removed only if
  // its heartbeat also stood still for `watch` (one wait for all, only when there are
  // candidates): a daemon in another pid namespace sharing /dev/shm looks dead to kill().
  static std::vector<StaleSegment> remove_all_stale(std::chrono::milliseconds watch);

  Segment(Segment&&) noexcept;
  Segment& operator=(Segment&&) noexcept;
  ~Segment();

  SegmentHeader& header() const noexcept { return *header_; }
  RankSlot& slot(int local_rank) const noexcept;
  std::span<std::byte> arena(int local_rank) const noexcept;
  // Local rank `local_rank`'s cell for fast-op number k of `lane` (k % 2); its input starts in
  // it and runs on past it (fast_input). Only while header().fast_cell_bytes > 0.
  FastCell& fast_cell(int local_rank, int lane, std::uint64_t k) const noexcept;
  static std::byte* fast_input(FastCell& c) noexcept { return c.input; }
  // A by_address cell's input address, which it holds in its input's place.
  static std::uint64_t fast_address(const FastCell& c) noexcept {
    std::uint64_t a;
    std::memcpy(&a, c.input, sizeof a);
    return a;
  }
  static void set_fast_address(FastCell& c, std::uint64_t a) noexcept { std::memcpy(c.input, &a, sizeof a); }
  // An all-reduce by single copy: its output's address, after the input's.
  static std::uint64_t fast_output_address(const FastCell& c) noexcept {
    std::uint64_t a;
    std::memcpy(&a, c.input + sizeof a, sizeof a);
    return a;
  }
  static void set_fast_output_address(FastCell& c, std::uint64_t a) noexcept {
    std::memcpy(c.input + sizeof a, &a, sizeof a);
  }
  const std::string& name() const noexcept { return name_; }
  bool owner() const noexcept { return owner_; }
  // The owner unlinks the name on destruction unless released (a forked child must not).
  void disown() noexcept { owner_ = false; }

 private:
  Segment() = default;
  std::unique_ptr<boost::interprocess::mapped_region> region_;
  SegmentHeader* header_ = nullptr;
  std::string name_;
  bool owner_ = false;
};

// In the header: the host fast path looks up cells and slots several times an operation.
inline RankSlot& Segment::slot(int local_rank) const noexcept {
  auto* base = reinterpret_cast<std::byte*>(header_);
  return *reinterpret_cast<RankSlot*>(base + header_->slots_offset +
                                      header_->slot_bytes * static_cast<std::uint64_t>(local_rank));
}

inline FastCell& Segment::fast_cell(int local_rank, int lane, std::uint64_t k) const noexcept {
  auto* base = reinterpret_cast<std::byte*>(header_);
  const std::uint64_t cell = sizeof(FastCell) + header_->fast_cell_bytes;
  const std::uint64_t index = static_cast<std::uint64_t>(lane) * 2 + k % 2;
  return *reinterpret_cast<FastCell*>(base + header_->fast_offset +
                                      fast_area_bytes(header_->fast_cell_bytes) * static_cast<std::uint64_t>(local_rank) +
                                      index * cell);
}

// True if process `pid` exists and has not ended (a zombie has).
bool process_alive(int pid) noexcept;
// True if process `pid` is stopped (a signal such as SIGSTOP, or a debugger).
bool process_stopped(int pid) noexcept;

}  // namespace smddp::ipc
