// Internals of libsmddp_client (see client.hpp for the threading model).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>

#include <boost/container/small_vector.hpp>

#include "client/arena_allocator.hpp"
#include "client/client.hpp"
#include "client/copy_pool.hpp"
#include "ipc/segment.hpp"

namespace smddp::client {

using Clock = std::chrono::steady_clock;

// How long a waiting thread spins before it sleeps, and how long it sleeps at most between
// looks at the daemon's liveness.
inline constexpr auto kSpin = std::chrono::microseconds(50);
inline constexpr auto kSlice = std::chrono::milliseconds(20);
// How long a host fast-path call waits within the call for the members' cells, holding the
// client's lock, before it leaves the op to the general wait: ranks in a loop of small calls
// reach each other well within it; later ones cost an OpState, as before.
inline constexpr auto kFastNowSpin = std::chrono::microseconds(5);
// Host fast-path requests the outbox holds at most (about 2 MB) before a new call waits for the
// daemon to take some: while the daemon stalls, a rank streaming small calls would grow it by
// hundreds of MB a second until the stall is noticed (kHeartbeatStale).
inline constexpr std::size_t kOutboxFastLimit = 16 * ipc::kRequestRingCapacity;
// How often an idle progress thread looks at the job's state while this rank's GPU work may
// wait on its peers (a failure handler is set): a peer's death must release those waits even
// when nothing is in flight on the CPU side.
inline constexpr auto kIdleWatch = std::chrono::milliseconds(100);
inline constexpr auto kHeartbeatStale = std::chrono::seconds(3);
inline constexpr auto kBackstop = std::chrono::seconds(15);  // beyond the daemon's own timeout
inline constexpr auto kDefaultTimeout = std::chrono::milliseconds(30 * 60 * 1000);

inline bool is_p2p(ipc::OpType op) { return op == ipc::OpType::Send || op == ipc::OpType::Recv; }

// A Work that finished successfully: what a host fast-path op that ran within its call returns
// (shared, no allocation, no reference count).
WorkPtr finished_work();

// Set when the last reference to a client is dropped on its own progress thread (a callback
// held it): the thread must then return without touching the destroyed client.
inline thread_local bool t_client_destroyed_here = false;

class ClientImpl;
class OpState;

// What a progress step leaves to do once the client's mutex is released: completion
// callbacks to run, and op references to drop (the last one may destroy the client).
struct Deferred {
  std::vector<std::function<void()>> callbacks;
  // Inline room for the few ops a call usually releases: a small op would allocate here twice.
  boost::container::small_vector<std::shared_ptr<OpState>, 4> released;
};

// A communicator's operation numbering, under the client's mutex (ClientImpl::number_locked):
// ops then enter the client's queues in the order of their numbers, from any thread. The client
// keeps the world's, so a world() handle dropped and fetched again goes on counting where the
// last one stopped.
struct SeqState {
  std::uint64_t collectives = 0;
  std::map<int, std::uint64_t> sends, recvs;  // per peer
  // The host fast path (ipc::kFlagHostFast; host_fast_path.cpp): the communicator's lane (-1:
  // none), its members' segment slots by group rank, and its fast ops numbered so far.
  int fast_lane = -1;
  std::vector<int> fast_slots;
  std::uint64_t fast_ops = 0;
  // Set once a collective of the communicator failed on this rank: its later collectives go
  // through the daemon. Every member of a failed collective gets the error, so all of them turn
  // the path off together.
  std::atomic<bool> fast_off{false};
  // The size rule's last answer (the node's limits do not change): a loop of like calls asks it
  // once.
  struct FastRule {
    ipc::OpType op = ipc::OpType::Barrier;
    ipc::DType dtype = ipc::DType::Float32;
    std::uint64_t count = UINT64_MAX;
    std::uint64_t largest_input = 0;
    bool takes = false, single_copy = false;
  } last_rule;
};

// How one operation maps user buffers to staged chunks (see plan() in client.cpp).
struct OpPlan {
  // op, dtype, reduce_op, root, tag, count, flags, scale, comm, seq. Its input and output are
  // the GPU path's prebuilt CUDA references (nothing is staged but aux); a host op's are none
  // (each chunk names its arena regions).
  ipc::RequestDesc base;
  int group_size = 1;
  int group_rank = 0;
  const std::byte* in = nullptr;  // user input
  std::byte* out = nullptr;       // user output
  std::uint64_t block = 0;        // elements per block (chunking runs within a block)
  std::uint64_t chunk = 0;        // elements per chunk
  std::uint64_t in_blocks = 0;    // blocks staged from `in` per chunk (0: no input)
  std::uint64_t out_blocks = 0;   // blocks copied to `out` per chunk (0: no output)
  std::uint64_t user_stride = 0;  // elements between blocks in the user buffers
  // aux payload (split tables, member lists). A host fast-path op by single copy has none: there
  // it holds the input the others read where the caller's overlaps its output in a way this
  // rank's own writes would change before they read it (host_fast::input_stays_put).
  std::vector<std::byte> aux;
  std::uint64_t in_bytes_total = 0, out_bytes_total = 0;  // unchunked forms (alltoallv)
  std::uint64_t wait_value = 0;
  std::uint64_t exec_token = 0;
  int wait_event = -1;
  // The host fast path: the lane and this op's fast-op number on it (fast_k 0: not fast).
  int fast_lane = -1;
  std::uint64_t fast_k = 0;
  std::uint64_t fast_largest_input = 0;  // the most bytes a member publishes (its lines are prefetched)
  // Host path on memory the client cannot memcpy (CallOptions::copier).
  std::shared_ptr<StagingCopier> copier;
  // The communicator's numbering (collectives only): a failure turns its host fast path off.
  SeqState* comm_state = nullptr;  // the client keeps it (ClientImpl::seq_states_)
  // The flags sit together: an OpState then stays within the allocator's per-thread cache.
  bool in_place_stage = false;  // output region is the input region (allreduce, broadcast root)
  bool unchunked = false;
  bool device = false;  // GPU path
  bool rank_exec = false;
  // The host fast path by single copy: the members read each other's inputs where they are
  // (FastCell::by_address).
  bool fast_single_copy = false;
  // CallOptions::rail: the caller orders it against other operations on the same memory.
  bool ordered_by_caller = false;
};

class OpState final : public Work, public std::enable_shared_from_this<OpState> {
 public:
  // Its plan is filled in by the caller, then ClientImpl::submit takes it.
  OpState(std::shared_ptr<ClientImpl> client, std::chrono::milliseconds timeout);
  OpState(std::shared_ptr<ClientImpl> client, std::chrono::milliseconds timeout, OpPlan&& plan);
  OpPlan& plan() { return plan_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  bool test() override;
  void wait(std::chrono::milliseconds timeout) override;
  bool done() const override { return done_.load(std::memory_order_acquire); }
  Status status() const override;
  std::string error() const override;
  void on_complete(std::function<void()> cb) override;
  int daemon_event() const override { return daemon_event_.load(std::memory_order_acquire); }
  std::uint64_t daemon_value() const override { return daemon_value_.load(std::memory_order_acquire); }

 private:
  friend class ClientImpl;
  std::atomic<std::uint64_t> daemon_value_{0};
  std::atomic<int> daemon_event_{-1};
  void planned();  // derives the chunking and the memory spans from the plan (submit)
  std::uint64_t chunk_count(std::uint64_t k) const;
  std::uint64_t stage_bytes(std::uint64_t k) const;

  std::shared_ptr<ClientImpl> client_;
  OpPlan plan_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_;
  std::uint64_t nchunks_ = 1;
  std::uint64_t next_ = 0;      // next chunk to submit
  std::uint64_t finished_ = 0;  // chunks answered
  std::uint64_t inflight_ = 0;
  // Guarded by the client's mutex, and with error_ written only before done_ (then read freely).
  Status status_ = Status::Ok;
  std::atomic<bool> done_{false};
  // The host fast path: its input is in its cell (published); the members' cells disagree on
  // the call (the daemon's answer says how).
  bool fast_published_ = false;
  bool fast_mismatch_ = false;
  // Single copy: this rank has read its output; it waits for the others to be done reading its
  // input (its fast_done marks) before it returns.
  bool fast_read_ = false;
  // An all-reduce by single copy: this rank reduced its share and marked it (FastDone::reduced);
  // it reads the others' shares once their marks are there.
  bool fast_reduced_ = false;
  std::string error_;
  std::vector<std::function<void()>> callbacks_;  // this op's on_complete callbacks
  // Memory order against earlier ops (ClientImpl::touching_), under the client's mutex.
  std::uint64_t in_span_ = 0, out_span_ = 0;  // bytes of plan_.in it reads, of plan_.out it writes
  struct Dep {
    std::shared_ptr<OpState> op;            // an earlier op on overlapping memory (null: it is done)
    std::shared_ptr<StagingCopier> copier;  // its copier, whose copies this op's copier follows
    bool writes;  // it writes memory this one touches: wait for its end, not only its reads
  };
  std::vector<Dep> deps_;  // what must come first before this op's first chunk is copied in
  // Its request to the daemon (0: none yet). The daemon answers it only with an error, which
  // matters only until the op is done (ClientImpl::fast_answer_locked).
  std::uint64_t fast_request_ = 0;
  std::uint64_t last_in_ticket_ = 0, last_out_ticket_ = 0;  // its copier's latest fences
};

class ClientImpl final : public Client, public std::enable_shared_from_this<ClientImpl> {
 public:
  ClientImpl(const AttachOptions& opts, ipc::Segment segment);
  ~ClientImpl() override;
  void start();

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int local_rank() const override { return local_rank_; }
  int local_world_size() const override { return local_world_size_; }
  int node_id() const override { return node_id_; }
  int num_nodes() const override { return num_nodes_; }
  const std::string& job_id() const override { return job_id_; }
  int daemon_pid() const override { return daemon_pid_; }
  CommunicatorPtr world() override;
  CommunicatorPtr create_communicator(std::uint64_t comm_id, const std::vector<int>& global_ranks,
                                      std::chrono::milliseconds timeout) override;
  std::string job_error() const override;
  void detach() override;
  int export_event(const std::array<std::uint8_t, 64>& handle) override;
  std::optional<std::array<std::uint8_t, 64>> daemon_event_handle(int index) const override;
  std::optional<GpuSyncArea> gpu_sync_area() override;
  std::pair<std::byte*, std::size_t> arena_region() override { return {arena_.data(), arena_.size()}; }
  void set_arena_release(std::function<void()> release) override;
  void publish_flag_block(const std::array<std::uint8_t, 64>& handle) override;
  void release_allocation(std::uint64_t alloc_id) override;
  std::optional<std::array<std::uint8_t, 64>> flag_block_of(int slot) const override;
  void set_exec_handler(ExecHandler handler) override;
  void set_failure_handler(std::function<void()> handler) override;
  void count_gpu_work(OpType op, std::uint64_t kernels, std::uint64_t copies) override;
  GpuWork gpu_work() const override;

  // Numbers a communicator's call (its plan) in the communicator's order (`seq`), queues it and
  // submits what fits; throws Error if the client is unusable. A host fast-path op that finishes
  // within the call (run_fast_now_locked) returns finished_work(), without an OpState; the others
  // become one, which holds `self`.
  WorkPtr submit(const std::shared_ptr<ClientImpl>& self, OpPlan&& plan, std::chrono::milliseconds timeout,
                 SeqState& seq);
  // The same for an op that carries its number (CommCreate's 0) and goes to the daemon.
  std::shared_ptr<OpState> submit(std::shared_ptr<OpState>&& op);
  // Input bytes a fast cell holds (0: no host fast path on this node).
  std::uint64_t fast_cell_bytes() const { return segment_.header().fast_cell_bytes; }
  std::uint64_t fast_read_bytes() const { return segment_.header().fast_read_bytes; }
  std::uint64_t fast_reduce_bytes() const { return segment_.header().fast_reduce_bytes; }
  bool fast_reduce_shrinks() const { return segment_.header().fast_reduce_shrinks != 0; }
  std::uint64_t fast_single_copy_bytes() const { return segment_.header().fast_single_copy_bytes; }
  // Runs deferred callbacks, then drops the released op references (outside the lock).
  static void run(Deferred& deferred);
  // Drives submissions and completions; returns callbacks to run outside the lock.
  void progress_locked(Deferred& callbacks);  // complete_locked, then submit_queued_locked
  void complete_locked(Deferred& callbacks);  // what the daemon answered
  void submit_queued_locked(Deferred& callbacks);  // what may go to the daemon now
  // Blocks until `op` is done or `until`; returns whether it is done.
  bool wait_for(OpState& op, std::chrono::steady_clock::time_point until);
  // A published host fast-path op, not by single copy, where the ranks have cores of their own
  // (host_fast_path.cpp): spins on the members' cells without the lock for up to kSpin, then
  // finishes it in one locked pass. Returns whether it is done; `status` and `error` are then
  // its outcome (`error` only when not Ok). false: wait_for drives it.
  bool wait_fast(OpState& op, Status& status, std::string& error);
  std::mutex& mutex() { return mu_; }
  void wake_progress() { work_cv_.notify_one(); }
  std::uint64_t chunk_bytes() const { return chunk_bytes_; }
  std::uint64_t arena_bytes() const { return alloc_.capacity(); }

 private:
  // Queues a numbered op that goes through the daemon and submits what fits.
  void submit_locked(const std::shared_ptr<OpState>& op, Deferred& callbacks);
  // Throws Error when no new operation may start (detached, or the daemon is gone).
  void check_usable_locked() const;
  // submit_locked, after the checks that the op fits the arena and takes the copier's wakes.
  void submit_to_daemon_locked(const std::shared_ptr<OpState>& op, Deferred& callbacks);
  bool submit_chunk_locked(OpState& op);
  bool submit_device_locked(OpState& op);
  void finish_locked(OpState& op, Deferred& callbacks);
  void fail_all_locked(Status s, const std::string& why, Deferred& callbacks);
  // Checks the daemon: false (and every op failed) once it is gone or the job failed.
  bool check_liveness_locked(Deferred& callbacks);
  void progress_thread();
  // Gives `p` its numbers in `seq`; true when it takes the host fast path (host_fast_path.cpp;
  // host_fast::fits and single_copy), decided from the call and the communicator alone, so that
  // every member decides alike. Sets p.fast_single_copy when it takes it by single copy.
  bool number_locked(OpPlan& p, SeqState& seq);
  // The host fast path: runs a small collective of a group within this node through the
  // members' fast cells; the daemon only hears of it. Returns whether it published at once.
  bool submit_fast_locked(const std::shared_ptr<OpState>& op, Deferred& callbacks);
  // The host fast path: publishes, reads and finishes what it can of the fast ops.
  void advance_fast_locked(Deferred& callbacks);
  // The daemon's answer to a host fast-path request (an error, or a test daemon's Ok): it fails
  // the op if the op is not done yet.
  void fast_answer_locked(const ipc::CompletionDesc& c, Deferred& callbacks);
  // Fails a fast op (if it has not finished) and marks its lane given up at its number.
  void fail_fast_locked(OpState& op, Status s, const std::string& why, Deferred& callbacks);
  // What a fast op can do next, judged from the cells and marks without changing anything.
  struct FastLook {
    // Read: every member published (an all-reduce by single copy: reduce this rank's share);
    // Gather: every member's share of an all-reduce by single copy is reduced; Finish: its
    // readers are done.
    enum Kind { Wait, SelfGaveUp, PeerGaveUp, Publish, Read, Gather, Finish } kind;
    int slot = -1;          // PeerGaveUp: the member
    std::uint64_t at = 0;   // SelfGaveUp, PeerGaveUp: the number the lane was given up at
  };
  FastLook look_fast_locked(const OpState& op) const;
  // The first member (its slot) whose cell of the op's number is not published yet; -1: all are.
  int missing_cell(const OpPlan& p) const;
  // Whether the member in `slot` finished reading number k of `lane` (RankSlot::fast_done).
  bool member_done(int slot, int lane, std::uint64_t k) const;
  // Work the progress thread must drive when no caller waits (mu_).
  bool left_to_drive_locked() const { return active_ > 0 || fast_seen_ || !outbox_.empty(); }
  void publish_fast_locked(OpState& op);  // writes its cell, posts its request
  // Writes the cell of `p` (`in_span`, `out_span`: the memory it reads and writes, for single
  // copy) and posts its request; returns the request's id.
  std::uint64_t publish_cell_locked(OpPlan& p, std::uint64_t in_span, std::uint64_t out_span);
  // `op` was published with `request`: its input is read (not by single copy).
  static void published(OpState& op, std::uint64_t request);
  // A numbered fast op run within its call where nothing comes before it: no earlier fast op
  // unfinished and no earlier op that may still touch memory. Publishes, waits for the members'
  // cells for up to kFastNowSpin (where the ranks have cores of their own) and reads them.
  // NotStarted: not published (`request` untouched); Published: published as `request`, the
  // general path (an OpState) takes it from there, whatever kept it (a member not there yet,
  // a mismatch, a member that gave up); Done: its output is written.
  enum class FastNow { NotStarted, Published, Done };
  FastNow run_fast_now_locked(OpPlan& p, std::uint64_t& request);
  // Drops the memory-order entries of ops whose copies are over; true if none is left.
  bool retire_touches_locked();
  // Reads op's output from the members' cells, or by single copy from their processes (an
  // all-reduce by single copy: reduces this rank's share); false: the cells hold different calls.
  bool read_fast_locked(const OpPlan& p);
  // An all-reduce by single copy, once every member's share is reduced: reads the others' shares.
  void gather_fast_locked(const OpPlan& p);
  // Runs read(pids by group rank) over the members' processes (single copy), and names a member
  // that ended or gave up meanwhile (OwnerGaveUp in host_fast_path.cpp).
  template <class ReadFn>
  void read_peers_locked(const OpPlan& p, ReadFn&& read);
  // After a read: this rank's cell of the op's next number, asked for owned.
  void prefetch_next_cell(const OpPlan& p) const;
  // For waiting threads: whether a fast op can move now (takes the lock only if free).
  bool fast_ready();
  bool fast_ready_locked() const;
  // Rings the client bells of the op's other members (they may sleep waiting for this rank).
  void ring_members(const OpPlan& p) const;

  std::string job_id_;
  int rank_, world_size_, local_rank_, local_world_size_, node_id_, num_nodes_, daemon_pid_;
  // Give the core away between polls while spinning: the node's ranks and its daemon
  // outnumber the cores (ipc::yield_between_polls).
  bool yield_between_polls_;
  // Threads this rank copies large single-copy reads with (client::copy_threads); the helpers
  // start with the first such read.
  int copy_threads_;
  std::unique_ptr<CopyPool> copy_pool_;
  // The pool, started with the first large copy; null where this rank copies alone.
  CopyPool* copy_pool_locked() {
    if (!copy_pool_ && copy_threads_ > 1) copy_pool_ = std::make_unique<CopyPool>(copy_threads_, kSpin);
    return copy_pool_.get();
  }
  std::vector<std::byte> share_scratch_;  // an all-reduce by single copy's reads (host_fast::reduce_share)
  ipc::Segment segment_;
  ipc::RankSlot& slot_;
  std::span<std::byte> arena_;
  std::uint64_t chunk_bytes_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  ArenaAllocator alloc_;
  // Collectives not fully submitted, strictly FIFO: every rank issues them in one order, so
  // every rank's arena fills alike and no rank waits for space another rank holds.
  std::deque<std::shared_ptr<OpState>> queue_;
  // Send/recv not fully submitted. Their partners come in any order relative to other work,
  // so they are not queued behind anything, each keeps a small window in flight, and all
  // of them together use at most half the arena (collectives always have room).
  std::vector<std::shared_ptr<OpState>> p2p_;
  // Host fast-path ops not finished, or finished but not yet passed by their lane's mark
  // (RankSlot::fast_done), in issue order. fast_published_: the last number published per lane.
  std::vector<std::shared_ptr<OpState>> fast_;
  std::array<std::uint64_t, ipc::kFastLanes> fast_published_{};
  bool fast_rang_daemon_ = false;  // the request ring was at least half full after the last fast post
  std::atomic<std::size_t> fast_count_{0};  // fast_.size(), for waiting threads' looks
  std::uint64_t p2p_bytes_ = 0;
  std::size_t active_ = 0;                      // ops not finished
  // Ops that read or write user memory, in issue order, until they retired (done, and their
  // copier's copies over). An op that touches memory an earlier one writes (or writes memory
  // an earlier one reads) copies nothing in before that one is done (or has read it), and its
  // copier follows the earlier one's: ops issued back to back on one tensor, without a wait
  // between, run in issue order, as with NCCL's stream and Gloo's queue. Disjoint ops still
  // overlap.
  struct Touch {
    // Until it is done; no reference: the queues hold an op until then, and an entry for each
    // op cost two reference counts bumped on its critical path.
    OpState* op = nullptr;
    std::shared_ptr<StagingCopier> copier;  // until its copies are over
    std::uintptr_t in = 0, out = 0;
    std::uint64_t in_span = 0, out_span = 0;
    std::uint64_t last_in = 0, last_out = 0;  // its copier's latest fences, once it is done
  };
  std::vector<Touch> touching_;
  // At issue: records what `op` must wait for, and `op` itself.
  void note_order_locked(const std::shared_ptr<OpState>& op);
  // Before `op`'s first chunk: whether what it waits for came first (then its copier follows).
  bool deps_ready_locked(OpState& op, Deferred& callbacks);
  // Whether what `op` waits for came first, changing nothing.
  static bool deps_done(const OpState& op);
  // An op finished: its entry keeps only its copier, until the copies are over.
  void untouch_locked(OpState& op, Deferred& callbacks);
  struct Inflight {
    std::shared_ptr<OpState> op;
    std::uint64_t chunk;
    std::uint64_t offset;
    std::uint64_t p2p_bytes;  // arena bytes counted against the p2p budget
  };
  std::unordered_map<std::uint64_t, Inflight> inflight_;
  // Chunks staged in the arena but not yet in the request ring: their copies in (a
  // StagingCopier's) are still running, or the ring was full. Collectives leave in order;
  // a send or receive waits only for its own earlier chunks.
  struct Staged {
    ipc::RequestDesc desc;
    Inflight inflight;
    std::uint64_t ticket;  // the copier's In-lane fence to pass first (0: none)
    bool seen = false;     // a spinning thread found its fence passed (copies_in_finished)
  };
  std::deque<Staged> outbox_;
  std::size_t outbox_fast_ = 0;  // host fast-path requests in outbox_ (kOutboxFastLimit)
  // Before a new call while outbox_fast_ is at kOutboxFastLimit: drives progress (which pushes
  // what the ring takes) until it is below, the daemon is found dead (then the call fails as
  // usual), or the client detached. Runs the callbacks it collects with the lock released.
  void wait_for_outbox_room(std::unique_lock<std::mutex>& lk);
  // Host chunks the daemon answered with Sources (daemon/arena_sources.hpp): this rank copied
  // its output from the members' arenas, and its own region of the chunk stays theirs to read
  // until every reader's RankSlot::sources_done reached the number the daemon gave it.
  struct ReadHeld {
    std::uint64_t offset;
    std::vector<ipc::SourceReader> readers;
  };
  std::vector<ReadHeld> read_held_;
  // While a chunk waits for arena space and regions are held for readers, this rank's
  // RankSlot::waits_for_readers is set: readers ring its bell, and a waiting thread then looks
  // whether they are done (held_regions_free).
  // Copies a Sources completion's blocks into the op's output; an error if they do not fit it.
  std::optional<std::string> copy_sources_locked(OpState& op, const Inflight& inf, const ipc::CompletionDesc& c);
  // This rank answered Sources completion `c` (copied, or gave up on its op): counts it (in ring
  // order, reads_), and holds `region` (kNoRegion: none) for the readers once counted.
  void sources_copied_locked(const ipc::CompletionDesc& c, std::uint64_t region);
  // Reads of the members' arenas for one chunk (a Sources or Shares completion), in ring order.
  // This rank's sources_done counts them in that order, so a read that is done waits to be
  // counted until the ones before it are (a Shares completion's, while the others' shares are
  // not there yet). Once counted, the owners (slots) that wait for space are rung and `region`
  // is held for `readers`.
  struct Read {
    bool done = false;
    std::vector<int> owners;
    std::vector<ipc::SourceReader> readers;
    std::uint64_t region = kNoRegion;
  };
  std::deque<Read> reads_;
  std::uint64_t reads_counted_ = 0;  // reads counted so far: reads_.front() is number reads_counted_
  // Notes a read in ring order (done or not) and returns its number; counts what it can.
  std::uint64_t note_read_locked(Read r);
  void read_done_locked(std::uint64_t number);  // marks it done; counts what it can
  void count_reads_locked();  // counts the reads at the front that are done
  // Host reductions split among the ranks (arena_shares.cpp). A Shares completion: reduced at
  // once, then answered once the shares this rank copies are there. Until then it waits in
  // share_waits_; the completions behind it go on.
  struct ShareWait {
    ipc::CompletionDesc c;
    Inflight inf;              // inf.op null: its op was given up before the answer came
    std::uint64_t read = 0;    // its number in reads_
  };
  std::deque<ShareWait> share_waits_;
  std::atomic<bool> share_waiting_{false};  // share_waits_ is not empty, for waiting threads' looks
  struct ShareLook {
    enum Kind { Ready, Wait, Gone } kind;
    std::vector<int> late;  // Wait: the members whose shares are not there; Gone: the one that left
  };
  // Why `c` cannot be run as sent (checked against `op`'s call and chunk when given), or nullopt.
  std::optional<std::string> check_shares(const ipc::CompletionDesc& c, const OpState* op, const Inflight* inf) const;
  // Reduces this rank's share of `c` (reduce-scatter: into `out`, nothing when null).
  void reduce_share_locked(const ipc::CompletionDesc& c, std::byte* out);
  // Bumps shares_reduced and rings the members that may wait for it.
  void share_reduced_locked(const ipc::CompletionDesc& c);
  ShareLook look_shares(const ipc::CompletionDesc& c) const;  // the shares this rank copies
  void copy_shares_locked(OpState& op, const Inflight& inf, const ipc::CompletionDesc& c);
  // Takes a Shares completion: reduces this rank's share, then answers it or lets it wait.
  void start_share_locked(const ipc::CompletionDesc& c, Deferred& callbacks);
  // Answers `w` if it can (copied, failed, or its op given up); false while it waits.
  bool end_share_locked(ShareWait& w, Deferred& callbacks);
  void end_shares_locked(Deferred& callbacks);  // every share wait that can end
  bool share_can_end(const ShareWait& w) const;  // end_share_locked would end it
  // The error of an op that failed while it waited for the `late` members' shares.
  std::string waited_for_shares(const OpState& op, const std::vector<int>& late) const;
  // For waiting threads: whether there is a completion to take or a share wait that can end.
  bool completions_ready();
  // Whether every reader of `h` is done with it (or gone).
  bool readers_done(const ReadHeld& h) const;
  // Frees the held regions whose readers are all done (or gone); true if any was freed.
  bool reap_read_held_locked();
  // For a waiting thread: whether a held region could be freed now (takes the lock only if free).
  bool held_regions_free();
  // Whether the first staged chunk that waits for its copies in has them finished, found by
  // asking its copier (not yet seen so: true once per chunk). A thread that spins calls it: the
  // CUDA copier's event tells sooner than its wake. Takes the lock only if it is free, and only
  // while chunks may wait for copies: host operations' waits never touch it.
  bool copies_in_finished();
  std::atomic<bool> copies_staged_{false};  // set with such a chunk; cleared by copies_in_finished
  // Arena regions a copier still reads or writes: freed once its fence has passed.
  struct Draining {
    std::shared_ptr<StagingCopier> copier;
    StagingCopier::Lane lane;
    std::uint64_t ticket;
    std::uint64_t offset;  // kNoRegion: nothing to free, only wait (the client is going away)
  };
  std::vector<Draining> draining_;
  // What copiers call when a fence passed: wakes whoever drives progress. Shared with the
  // copiers' wake functions, which may outlive the client (the doorbell does not).
  struct CopyWaker {
    std::mutex mu;
    ipc::Doorbell* bell = nullptr;  // null once the client is gone
    std::atomic<std::uint64_t> count{0};
    void wake();
  };
  std::shared_ptr<CopyWaker> waker_ = std::make_shared<CopyWaker>();
  bool posted_ = false;  // post_or_stage_locked posted something: the daemon's bell is due
  std::function<void()> arena_release_;  // guarded by mu_
  // Posts what the outbox may post now; true if anything went.
  bool flush_outbox_locked(Deferred& callbacks);
  // At the end (detach, destruction): pushes the host fast-path requests the outbox still holds
  // (and what is queued before them), waiting for ring space while the daemon lives (up to
  // kHandOverLimit). They outlive their ops, done long ago; lost, the daemon would count the
  // rank's collectives short and fail the other members' matching requests as waiting for a
  // rank that exited.
  void hand_over_outbox();
  // Posts `s` at once when nothing waits before it and it has no copies to wait for, else
  // queues it in the outbox.
  void post_or_stage_locked(Staged s);
  // A staged chunk that will never be posted (its op failed or gave up). `free_region`:
  // its region comes back once its copies in passed (false: the daemon is gone).
  void drop_staged_locked(Staged& s, Deferred& callbacks, bool free_region);
  // Fails `op` with its copier's error, if it has one.
  void check_copier_locked(OpState& op);
  // Frees the regions whose copies finished.
  void reap_draining_locked();
  // Frees a region now, or once `copier`'s fence on `lane` has passed.
  void free_after_locked(const std::shared_ptr<StagingCopier>& copier, StagingCopier::Lane lane, std::uint64_t ticket,
                         std::uint64_t offset);
  static constexpr std::uint64_t kNoRegion = ~std::uint64_t{0};  // device request without aux
  std::mutex events_mu_;  // export_event may be called from any thread
  std::mutex release_mu_;  // release_allocation: one writer of the slot's released ids
  ExecHandler exec_handler_;  // guarded by mu_
  std::function<void()> failure_handler_;  // guarded by mu_; run once
  bool failure_reported_ = false;          // guarded by mu_
  std::uint64_t next_request_id_ = 1;
  std::string dead_;  // why the client can no longer work ("" while healthy)
  std::uint64_t last_heartbeat_ = 0;
  std::chrono::steady_clock::time_point heartbeat_seen_;
  std::weak_ptr<Communicator> world_;
  std::shared_ptr<SeqState> world_seq_ = std::make_shared<SeqState>();
  // Every communicator's numbering, kept as long as the client: its ops point at it
  // (OpPlan::comm_state) without a reference count to bump for each of them.
  std::vector<std::shared_ptr<SeqState>> seq_states_{world_seq_};
  bool stop_ = false;
  bool detached_ = false;  // detach() ran: no new operations
  // User threads inside wait_for(). While there are some, they drive progress and the
  // progress thread stays off the doorbell, so the daemon's ring() needs no futex wake.
  int waiters_ = 0;
  // The progress thread polls or sleeps on this rank's client bell (between its unlock and its
  // next lock). With no waiter either, a finished fast op rings nobody: the ring would pull the
  // bell's cache line from the peer that rings it for every op.
  bool progress_on_bell_ = false;
  bool fast_seen_ = false;  // a GPU fast-path op was submitted (mu_): the progress thread stays on the doorbell
  std::thread progress_;
};

}  // namespace smddp::client
