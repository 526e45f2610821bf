// PeerExecutor: the rank side of the GPU path's default mode (ipc::kFlagRankExec).
//
// Why it exists: without MPS a GPU time-slices between processes' contexts. When the daemon
// ran the kernels, every collective put two contexts (the rank's and the daemon's) on each
// GPU, and any stream of one that waited on the other paid a ~2 ms timeslice. Here each GPU
// runs only its own rank's context: the daemon matches, validates and sends each member a
// plan (the members' buffers); the rank runs its part on its own stream against the other
// ranks' buffers, mapped into its context from their CUDA IPC handles (peer access over
// NVLink). Ranks order their steps with barriers: stream memory operations that write a
// counter into each peer's GPU flag block and wait for the peers' counters in their own.
//
// The algorithms (which rank reads and writes what, between which barriers) are in
// client/gpu/schedule.hpp, plain C++ tested on host memory for 1-8 ranks; this file maps the
// buffers, runs the steps on the GPU and implements the barriers.
//
// The fast path (small AllReduce, AllGather and ReduceScatter of a group of all the job's
// ranks, on one node) skips the plan: the caller enqueues one kernel at once
// (kernels/device_kernels.hpp, FastArgs), on its own stream when it waits at once, else
// on the fast stream, against staging buffers and flags that live in every rank's flag
// allocation, mapped by all the others once. The daemon still matches and checks
// the request (kFlagRankFast) and reports a disagreement as an error; a failed fast op
// releases every flag this rank waits on, so no kernel spins for ever, and turns the fast
// path off on this rank.
//
// Threading: expect() from the calling thread, on_completion() from the client's exec
// handler (client lock held: it only queues), drain() from any thread (it enqueues GPU work
// in the order the daemon sent the plans, which every rank shares; that order keeps the
// pairwise barrier counters of two ranks in step). reserve_fast_seq() and run_fast() from
// the calling thread, in the order the ranks issue their fast-path collectives. No call here
// may wait, under mu_, for GPU work that waits for a peer: the peer's matching work may be
// enqueued only after this thread, or one it blocks, goes on (see to_close_). CUDA calls run
// in thread-local capture mode (DeviceScope), so a graph the model captures on another thread
// is left alone.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "client/client.hpp"
#include "client/gpu/hier_schedule.hpp"
#include "client/gpu/schedule.hpp"
#include "kernels/device_kernels.hpp"
#include "ipc/protocol.hpp"
#include "ipc/segment.hpp"

namespace smddp::client::gpu {

// A hierarchical operation across nodes (client/gpu/hier_schedule.hpp), shared by its Work
// (hier_work.hpp), the executor, which runs its pre part from the plan and its tail once the
// rail operation ended, and its copier.
struct HierOp {
  ipc::OpType op = ipc::OpType::AllReduce;
  std::uint64_t token = 0;  // the request's exec token (for traces)
  GroupLayout layout;
  int me = 0;  // group rank
  std::uint64_t piece_bytes = 0;
  void* scratch = nullptr;  // hier_scratch_bytes() on this rank's GPU, kept alive by the caller
  std::shared_ptr<StagingCopier> copier;  // ArenaCopyLanes::shard_copier
  std::uint64_t* word = nullptr;           // its progress word (reserve_marks)
  std::vector<std::uint64_t> mark_values;  // by mark of the schedule
  std::weak_ptr<Work> rail;  // its rail operation (null if it has none): driven by waiters
  // Under the executor's lock:
  bool planned = false;     // the pre part is enqueued; the tail comes in plan order
  bool abandoned = false;   // no plan will come (its request failed); its marks were released
  bool rail_done = false;   // the rail operation ended (or there is none)
  bool tail_done = false;   // the tail is enqueued: the operation's GPU work is all enqueued
  std::vector<int> slots;   // the node's members' local slots, by local index (from the plan)
  std::string error;        // why its GPU work could not run as planned
  std::vector<std::function<void()>> on_tail;  // run (outside the lock) once tail_done
};

// This rank's side of one operation, registered before it is submitted.
struct LocalOp {
  ipc::OpType op = ipc::OpType::AllReduce;
  ipc::DType dtype = ipc::DType::Float32;
  ipc::ReduceOp reduce_op = ipc::ReduceOp::Sum;
  double scale = 1.0;
  int root = 0;             // group rank of the root (p2p: the peer)
  std::uint64_t count = 0;  // as in DeviceCall
  void* in = nullptr;       // this rank's buffers (device pointers of its GPU), may be null
  void* out = nullptr;
  cudaEvent_t ready = nullptr;  // from record_ready(): the inputs are written
  std::shared_ptr<HierOp> hier;  // a hierarchical operation across nodes (kFlagHierarchical)
};

// One fast-path operation (see above), as the caller issues it.
struct FastOp {
  ipc::OpType op = ipc::OpType::AllReduce;
  ipc::DType dtype = ipc::DType::Float32;
  ipc::ReduceOp reduce_op = ipc::ReduceOp::Sum;
  double scale = 1.0;
  std::uint64_t count = 0;  // as kernels::FastArgs::count
  const void* in = nullptr;
  void* out = nullptr;
  std::vector<int> slots;  // the members' local ranks, in group order
  int me = 0;              // this rank's index in slots
  // AllGather with copy engines and stream memory operations only, no kernel
  // (SMDATAPARALLEL_OPTIMIZE_SDP): the same staging and flags as the kernel.
  bool copy_engines = false;
  std::uint64_t seq = 0;  // from reserve_fast_seq()
};

// What this executor launched (the per-operation sums go to the daemon's status through
// Client::count_gpu_work).
struct PeerStats {
  std::uint64_t ops = 0;
  std::uint64_t kernel_launches = 0;
  std::uint64_t copies = 0;
  std::uint64_t barriers = 0;
  std::uint64_t mappings = 0;  // peer allocations opened
  std::uint64_t mappings_closed = 0;  // of those, closed since their owner freed them
};

class PeerExecutor {
 public:
  // Allocates and publishes this rank's flag block on `device`. `stream` runs the work.
  PeerExecutor(const std::shared_ptr<Client>& client, int device, cudaStream_t stream);
  ~PeerExecutor();
  PeerExecutor(const PeerExecutor&) = delete;
  PeerExecutor& operator=(const PeerExecutor&) = delete;

  // An event recorded on `user_stream` now (the inputs are ready there); pass it in LocalOp.
  cudaEvent_t record_ready(cudaStream_t user_stream);
  void expect(std::uint64_t token, LocalOp op);
  void forget(std::uint64_t token);  // the op was never submitted
  void on_completion(std::uint64_t token, const ipc::CompletionDesc& c);
  // Enqueues every plan received so far on the stream, in order, up to one held behind a
  // hierarchical operation whose tail is not enqueued yet (see pump_locked).
  void drain();
  // Whether `token`'s plan was enqueued (or never came); a plan-path operation's end must not
  // be marked on the stream before it is.
  bool planned(std::uint64_t token) const;
  // Blocks until `token`'s plan is enqueued, driving the rail operations it is held behind.
  void wait_planned(std::uint64_t token);
  // Why the op's GPU work could not run (it still took part in every barrier, so the other
  // ranks go on); nullopt when it ran.
  std::optional<std::string> take_error(std::uint64_t token);
  int device() const noexcept { return device_; }

  // Fast path. Whether `op` may take it (the same answer on every member: it depends only
  // on the op and SMDDP_FAST_MAX_BYTES, which must be the same everywhere).
  static bool fast_eligible(const FastOp& op);
  // Whether every member published its flag allocation (each does when it starts its
  // executor); maps the ones not mapped yet. False for good once the fast path failed here.
  bool fast_ready(const std::vector<int>& slots);
  // Enqueues `op` after the work on `user_stream`: on that stream itself when `on_user_stream`
  // (the caller waits for it at once: fewest API calls), else on the fast stream. Fast ops
  // run in issue order whatever streams they take. Returns the stream it ran on and an event
  // recorded after it, to be handed back with release_event().
  struct FastLaunch {
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
  };
  // `dry_only`: its request could not be posted; only raise this rank's flags for the peers
  // and turn the path off (throws, as every failure here does).
  FastLaunch run_fast(const FastOp& op, cudaStream_t user_stream, bool on_user_stream, bool dry_only = false);
  // The next fast op's number: every member numbers its fast ops alike (over all groups,
  // which therefore all have the same members), and the daemon checks that they agree.
  std::uint64_t reserve_fast_seq();
  // Makes `waiter` wait for an op that ran on `s` (`done`: the event after it, or null).
  void order_after(cudaStream_t waiter, cudaStream_t s, cudaEvent_t done);
  void release_event(cudaEvent_t ev);
  // A fast op failed (the daemon found the members disagree, a peer died, a timeout): lets
  // every kernel of this rank that waits for a peer's flag go on, and turns the path off.
  void release_fast();
  // The job failed or the daemon died: every wait of this rank's GPU work on a peer or on a
  // hierarchical operation's marks goes on (fast flags, barriers, tails, marks), so the streams
  // drain; nothing is issued any more.
  void release_all();

  // Hierarchical operations across nodes. Reserves a progress word and `marks` increasing
  // values of it (the last one marks the whole pre part).
  struct Marks {
    std::uint64_t* word = nullptr;
    std::vector<std::uint64_t> values;
  };
  Marks reserve_marks(std::size_t marks);
  // The operation's request failed: no plan will come. Its marks pass (its rail operation then
  // moves whatever is there; its Work reports the failure) and no tail is enqueued for it.
  void hier_abandon(const std::shared_ptr<HierOp>& h);
  // Its rail operation ended: enqueues the tails that may go now, in plan order.
  void hier_rail_done(const std::shared_ptr<HierOp>& h);
  // Runs `cb` once `h`'s tail is enqueued or it was abandoned (at once if it already was).
  void hier_on_tail(const std::shared_ptr<HierOp>& h, std::function<void()> cb);
  // Blocks until `h`'s tail is enqueued or it was abandoned, driving the rail operations of
  // the operations planned before it (their tails come first); false at `until`.
  bool hier_wait_tail(const std::shared_ptr<HierOp>& h, std::chrono::steady_clock::time_point until);
  bool fast_off() const;
  cudaStream_t stream() const noexcept { return stream_; }

  // AllReduce up to this many bytes runs one-shot (SMDDP_ONESHOT_MAX_BYTES overrides).
  static std::uint64_t oneshot_max_bytes(int group_size);
  // A digest of the settings above and below (never 0). The members of a collective must
  // share them, or their barriers do not pair up; the daemon compares the keys.
  static std::uint64_t schedule_key();
  // Two-shot AllReduce: each rank's kernel reduces its chunk, then its copy engines write it
  // into the others' outputs ("push", the default), the others' copy engines read it ("pull"),
  // or its kernel writes it into every output itself ("kernel").
  // SMDDP_TWOSHOT=push|pull|kernel; any other value is an error.
  using TwoShot = gpu::TwoShot;
  static TwoShot twoshot_form();
  // AllGather and AllToAll: copy engines write into the peers' outputs (push, the default) or
  // read from the peers' inputs (pull). SMDDP_COPY_DIRECTION=push|pull.
  static bool copy_push();

 private:
  struct Plan {
    std::uint64_t token = 0;
    LocalOp local;
    ipc::PlanHeader header;
    std::vector<ipc::PlanMember> members;
    std::vector<ipc::PlanSplit> splits;  // an uneven AllToAll: by member
  };
  struct Mapping {
    std::array<std::uint8_t, ipc::kCudaIpcHandleBytes> handle{};
    void* ptr = nullptr;  // opened lazily
  };
  cudaEvent_t take_event();  // from the pool, or a new one (mu_ held)
  void order_after_locked(cudaStream_t waiter, cudaStream_t s, cudaEvent_t done);
  void run_fast_copies(const kernels::FastArgs& a, cudaStream_t s);  // mu_ held
  // The SDP fast AllGather's steps as a CUDA graph: its three or four copies and its flag
  // operations, the flags' values set before each launch.
  struct SdpGraph {
    SdpGraph() = default;
    SdpGraph(SdpGraph&& o) noexcept;
    SdpGraph& operator=(SdpGraph&&) = delete;
    ~SdpGraph();  // an executable graph still running is freed once it is done
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaGraphNode_t flag_node = nullptr;
    CUcontext ctx = nullptr;
    std::vector<CUstreamBatchMemOpParams> flags;
  };
  // (input, output, bytes, members and index, then every member's staging and flag words):
  // what the graph's nodes name.
  using SdpKey = std::array<std::uintptr_t, 4 + 3 * kernels::kFastMaxRanks>;
  static constexpr std::size_t kSdpGraphs = 64;
  SdpGraph* sdp_graph(const kernels::FastArgs& a);  // found or built (null: none; mu_ held)
  void release_flags();  // on the rescue stream
  // The last fast op ran on `s`, `done` after it (null: none recorded); `held`: a mark owns it.
  void set_last_fast_locked(cudaStream_t s, cudaEvent_t done, bool held);
  void run(const Plan& p);
  void run_hier(const Plan& p);  // a hierarchical operation's pre part
  void pump_locked();            // enqueues the tails and the plans that may go now
  // Enqueues the tails of the front of hier_tails_ whose rail operations ended (mu_ held);
  // their callbacks go to `after`.
  void flush_tails_locked(std::vector<std::function<void()>>& after);
  void* resolve(const Plan& p, int member, bool input);
  void* map(int slot, std::uint64_t alloc_id);
  std::uint64_t* peer_flags(int slot);
  // A barrier count: the words of the peers' flag blocks it writes, and its counters by peer.
  struct Channel {
    std::size_t base = 0;  // ipc::kBarrierFlagBase or ipc::kTailFlagBase
    std::vector<std::uint64_t> sent, waited;
  };
  void barrier(const Plan& p);
  void signal(const Plan& p);                   // on the main stream
  void wait_peers(const Plan& p, cudaStream_t s);  // every peer's next signal
  // `slots`: the members' local slots (this rank's included, skipped).
  void signal(const std::vector<int>& slots, Channel& ch, cudaStream_t s);
  void wait_peers(const std::vector<int>& slots, Channel& ch, cudaStream_t s);
  void write_word(std::uint64_t* word, std::uint64_t value, cudaStream_t s);
  void fork();                                  // the side stream after the main one
  void side_copy(void* dst, const void* src, std::uint64_t bytes);
  // Two-shot pull AllReduce pipelined in pieces of this many bytes (SMDDP_TWOSHOT_PIECE_BYTES;
  // 0, the default: one piece).
  static std::uint64_t twoshot_piece_bytes();
  // out = reduction of inputs; with `outs`, the result goes to each of them instead.
  void reduce(const std::vector<const void*>& inputs, void* out, std::uint64_t count, const LocalOp& l, int n,
              const std::vector<void*>& outs = {});
  // On `on`, or the rank's stream when null.
  void copy(void* dst, const void* src, std::uint64_t bytes, cudaStream_t on = nullptr);
  // A copy of this rank's own bytes on the side stream, beside the peer copies (another
  // copy engine); join() makes the main stream wait for it.
  void copy_beside(void* dst, const void* src, std::uint64_t bytes);
  void join();

  std::weak_ptr<Client> client_;  // the process group owns the client
  int device_ = 0;
  int my_slot_ = 0;
  int sms_ = 132;
  cudaStream_t stream_ = nullptr;
  cudaStream_t side_ = nullptr;  // ours
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  bool forked_ = false;
  void* flag_block_ = nullptr;  // and, after the first kFlagBlockBytes, the fast path's flags and staging
  cudaStream_t fast_stream_ = nullptr;    // asynchronous fast ops
  // The last fast op's stream and done event: a fast op on another stream waits for it. The
  // event goes back to the pool only once it is no longer the last (see release_event).
  cudaStream_t last_fast_stream_ = nullptr;
  cudaEvent_t last_fast_done_ = nullptr;
  bool last_fast_done_released_ = false;
  cudaStream_t rescue_stream_ = nullptr;  // release_fast()
  std::uint64_t fast_seq_ = 0;
  bool fast_off_ = false;
  bool fast_mapped_ = false;  // every peer's flag allocation is mapped
  void* scratch_ = nullptr;
  std::uint64_t scratch_bytes_ = 0;
  std::vector<std::uint64_t*> peer_flags_;      // by slot, opened lazily (the whole flag allocation)
  // By peer slot: the signals this rank sent it and the ones it waited for (a barrier is one
  // of each; every member of an op sends and waits as often, in the same order). Plans' barriers
  // count on one channel, hierarchical operations' tails on another.
  Channel main_{ipc::kBarrierFlagBase, {}, {}};
  Channel tail_{ipc::kTailFlagBase, {}, {}};
  // Hierarchical operations: progress words (kMarkWords, reused round-robin with increasing
  // values), and the planned ones whose tails are not enqueued yet, in plan order.
  static constexpr std::size_t kMarkWords = 1024;
  std::uint64_t* marks_ = nullptr;
  std::uint64_t mark_ops_ = 0;
  std::deque<std::shared_ptr<HierOp>> hier_tails_;
  std::condition_variable hier_cv_;
  std::vector<std::function<void()>> deferred_;  // to run once drain() releases mu_
  std::map<std::pair<int, std::uint64_t>, Mapping> maps_;  // (slot, alloc id)
  // Mappings of allocations their owners freed (or whose id now names other bytes). Closing
  // one may synchronize the whole device, so it waits until every GPU op this rank enqueued
  // is done: else the device could wait for a peer whose matching op waits, in its own close,
  // for this rank to enqueue the next one (through mu_, which a close holds), and neither
  // would go on. close_released() runs before new work is enqueued (drain, run_fast).
  std::vector<void*> to_close_;
  bool no_work_pending_locked();
  void close_released();  // mu_ held
  std::vector<void*> retired_scratch_;
  std::map<SdpKey, SdpGraph> sdp_graphs_;
  std::deque<SdpKey> sdp_order_;  // oldest first
  bool sdp_graphs_off_ = false;   // one could not be built or launched, or they seldom repeat
  std::uint64_t sdp_graph_builds_ = 0, sdp_graph_hits_ = 0;

  mutable std::mutex mu_;  // everything below, and the members above after construction
  std::map<std::uint64_t, LocalOp> expected_;
  std::deque<Plan> ready_;
  std::map<std::uint64_t, std::string> errors_;
  std::vector<cudaEvent_t> free_events_;
  std::vector<cudaEvent_t> all_events_;
  std::string dry_error_;  // set while running an op whose buffers could not be mapped
  PeerStats stats_;
};

}  // namespace smddp::client::gpu
