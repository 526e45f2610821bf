// libsmddp_client: a rank's handle on its node's smddp daemon.
//
//   auto client = smddp::client::Client::attach(smddp::client::AttachOptions::from_env());
//   auto work = client->world().allreduce(in, out, n, DType::Float32, ReduceOp::Sum);
//   work->wait();   // throws smddp::client::Error naming what failed
//
// Threading: every method may be called from any thread. Operations are progressed by the
// calling thread (submit/test/wait) and by one background progress thread per Client that
// runs only while operations are pending, so completion callbacks fire without anybody
// calling wait() (what c10d futures need). Host buffers must stay valid until the Work is
// done. Collectives on one Communicator must be issued in the same order on every member.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ipc/protocol.hpp"
#include "ipc/types.hpp"

namespace smddp::client {

using ipc::DType;
using ipc::OpType;
using ipc::ReduceOp;
using ipc::Status;

// Raised for every failure; status() tells which kind (mismatch, peer failed, timeout...).
class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& what) : std::runtime_error(what), status_(status) {}
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

// Raised by attach when the rank's RANK, WORLD_SIZE, LOCAL_RANK or LOCAL_WORLD_SIZE disagree
// with the job the daemon serves (status InvalidRequest): its own type, so that a caller that
// knows how the rank was launched can say where the wrong values came from.
class LayoutMismatch : public Error {
 public:
  explicit LayoutMismatch(const std::string& what) : Error(Status::InvalidRequest, what) {}
};

struct AttachOptions {
  std::string job_id;
  int node_id = 0;
  int rank = -1;
  int local_rank = -1;
  int world_size = -1;
  int local_world_size = -1;
  std::string device_bus_id;  // PCI bus id of the rank's GPU, "" for CPU-only ranks
  std::chrono::milliseconds attach_timeout{30000};
  // Whether a spinning thread yields its core between polls; unset: when the node's ranks and
  // daemon outnumber the cores (ipc::yield_between_polls). Tests set it to run either wait.
  std::optional<bool> yield_between_polls;
  // Reads SMDDP_JOB_ID, SMDDP_NODE_ID, RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE.
  // Throws Error(InvalidRequest) naming the first one missing or malformed.
  static AttachOptions from_env();
};

// A CUDA buffer as the daemon maps it (the GPU path). The client never touches CUDA: the
// framework plugin fills these from cudaIpcGetMemHandle and the allocation's buffer id.
struct DeviceBuffer {
  std::array<std::uint8_t, 64> ipc_handle{};  // of the allocation that holds the buffer
  std::uint64_t alloc_id = 0;                 // the allocation's buffer id: the daemon's cache key
  std::uint64_t alloc_bytes = 0;              // size of that allocation
  std::uint64_t offset = 0;                   // first byte of the buffer in the allocation
  std::uint64_t bytes = 0;                    // bytes the operation reads or writes
};

// One collective or send/recv on CUDA buffers. Counts mean what they mean for the host
// methods of Communicator (per-rank counts for allgather/reduce_scatter/gather/scatter,
// per-peer for an even alltoall). `splits` (alltoallv only): send counts then receive counts.
struct DeviceCall {
  OpType op = OpType::AllReduce;
  DType dtype = DType::Float32;
  ReduceOp reduce_op = ReduceOp::Sum;
  int root = 0;  // root, or the peer of send/recv
  int tag = 0;
  std::uint64_t count = 0;
  std::optional<DeviceBuffer> input, output;
  int wait_event = -1;  // index from Client::export_event, recorded after the inputs were written
  // Stream-flag synchronization instead of events: wait_event indexes the stream flags
  // (GpuSyncArea) and the daemon waits until that flag reaches wait_value.
  bool stream_value = false;
  bool device_flags = false;  // the flags are in the published GPU flag block
  bool daemon_cpu_wait = false;  // host flags; the daemon waits on its CPU (kFlagDaemonCpuWait)
  std::uint64_t wait_value = 0;
  std::vector<std::uint64_t> splits;
  // Rank-side execution (ipc::kFlagRankExec): the daemon answers with a plan, handed to the
  // client's exec handler with this token; the caller runs the GPU work itself.
  bool rank_exec = false;
  std::uint64_t exec_token = 0;
  // The ranks' fast path (ipc::kFlagRankFast): the caller already enqueued the GPU work; the
  // request carries no buffers and its completion only says whether the members agreed.
  bool fast = false;
  // With rank_exec, in a group that spans nodes (ipc::kFlagHierarchical): the plan names this
  // node's members only; the caller moves its shard across nodes itself, on its rail.
  bool hierarchical = false;
};

// Moves a host operation's bytes between the caller's buffers and the rank's arena when they
// are not host memory the client can memcpy: CUDA tensors in a group that spans nodes, whose
// bytes cross the fabric through the arena. The client then passes byte offsets into the
// caller's buffers instead of reading them, posts a chunk to the daemon only once its copies
// in have finished, and frees a chunk's arena region only once its copies out have. Copies of
// some chunks so overlap the daemons' work on others.
//
// Threading: the client calls copy_in, copy_out, fence, passed and error with its lock held,
// from the submitting thread or its progress thread, so they must not block; the wake
// function runs on any thread, once per fence, after passed() says that fence has.
//
// An operation is done once every chunk's copies out are enqueued, not finished: the caller
// orders its own use of the output after the copier's Out lane (the CUDA copier: a stream).
class StagingCopier {
 public:
  enum class Lane { In, Out };
  virtual ~StagingCopier() = default;
  // Set by the client before the first copy.
  virtual void set_wake(std::function<void()> wake) = 0;
  // Enqueues a copy of `bytes` from the caller's input, `offset` bytes in, to the arena at `to`.
  virtual void copy_in(std::byte* to, std::uint64_t offset, std::uint64_t bytes) noexcept = 0;
  // Enqueues a copy of `bytes` from the arena at `from` into the caller's output, `offset` bytes in.
  virtual void copy_out(std::uint64_t offset, const std::byte* from, std::uint64_t bytes) noexcept = 0;
  // Ends the copies enqueued so far on `lane`; returns their ticket (increasing per lane).
  virtual std::uint64_t fence(Lane lane) noexcept = 0;
  // Whether every copy up to `ticket` on `lane` has finished. It may look at the copies
  // themselves (without waiting), before their wake comes: threads that spin poll it.
  virtual bool passed(Lane lane, std::uint64_t ticket) const noexcept = 0;
  // Why a copy failed ("" while none has), whether it failed when enqueued or while it ran:
  // the client then fails the operation and posts none of its chunks that are still to go.
  // Copy and fence failures are reported here, never thrown.
  virtual std::string error() const = 0;
  // Blocks until every copy enqueued has finished (the arena is about to go away).
  virtual void drain() noexcept = 0;
  // Makes this operation's copies, both lanes, wait for every copy `earlier` (an earlier
  // operation's copier of the same kind) has enqueued so far: the two touch the same memory.
  // Called before this operation's first copy. Failures are reported by error().
  virtual void follow(StagingCopier& earlier) noexcept = 0;
};

struct CallOptions {
  std::chrono::milliseconds timeout{0};  // 0: the communicator's default
  double scale = 1.0;                    // PREMUL_SUM factor
  bool sdp = false;                      // SMDATAPARALLEL_OPTIMIZE_SDP AllGather path
  // Host operations only: the buffers are not host memory; `copier` moves their bytes (the
  // buffer pointers passed are only checked for null).
  std::shared_ptr<StagingCopier> copier;
  // Host operations only (ipc::kFlagRail): one GPU's shard of a hierarchical operation across
  // nodes. The caller orders it against other operations on the same memory (the client does
  // not: the buffer pointers then only name where the copier's stretches start).
  bool rail = false;
};

class Work {
 public:
  virtual ~Work() = default;
  // Progresses the operation; true once it finished (successfully or not). Never blocks.
  virtual bool test() = 0;
  // Blocks until finished, then throws Error if it failed. A timeout of 0 waits up to the
  // operation's own timeout; on expiry throws Error(Timeout).
  virtual void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds{0}) = 0;
  virtual bool done() const = 0;
  virtual Status status() const = 0;  // meaningful once done()
  virtual std::string error() const = 0;
  // Runs `cb` exactly once when the operation finishes (at once if it already has), on the
  // thread that completes it. `cb` must not block on other smddp operations.
  virtual void on_complete(std::function<void()> cb) = 0;
  // GPU path: once done() and successful, the index of the daemon event (Client::
  // daemon_event_handle) that marks the device work finished; -1 for host operations.
  virtual int daemon_event() const { return -1; }
  // GPU path with stream flags: the done flag value that marks the device work finished.
  virtual std::uint64_t daemon_value() const { return 0; }
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::uint64_t id() const = 0;
  virtual int rank() const = 0;  // rank in this communicator
  virtual int size() const = 0;
  virtual const std::vector<int>& global_ranks() const = 0;
  virtual std::chrono::milliseconds default_timeout() const = 0;
  virtual void set_default_timeout(std::chrono::milliseconds t) = 0;

  // Host (CPU) buffers. `in` and `out` may be the same pointer where the op allows it.
  virtual WorkPtr allreduce(const void* in, void* out, std::uint64_t count, DType, ReduceOp,
                            const CallOptions& = {}) = 0;
  virtual WorkPtr broadcast(void* buf, std::uint64_t count, DType, int root, const CallOptions& = {}) = 0;
  // `out` is used only on the root (may be null elsewhere).
  virtual WorkPtr reduce(const void* in, void* out, std::uint64_t count, DType, ReduceOp, int root,
                         const CallOptions& = {}) = 0;
  // out holds size() * count elements, rank r's input at r * count.
  virtual WorkPtr allgather(const void* in, void* out, std::uint64_t count, DType, const CallOptions& = {}) = 0;
  // in holds size() * count elements; out receives the reduction of block rank().
  virtual WorkPtr reduce_scatter(const void* in, void* out, std::uint64_t count, DType, ReduceOp,
                                 const CallOptions& = {}) = 0;
  // Even split: count elements per peer block in both buffers.
  virtual WorkPtr alltoall(const void* in, void* out, std::uint64_t count_per_peer, DType,
                           const CallOptions& = {}) = 0;
  // Uneven split: send_counts[p] elements to peer p, recv_counts[p] from peer p.
  virtual WorkPtr alltoallv(const void* in, const std::vector<std::uint64_t>& send_counts, void* out,
                            const std::vector<std::uint64_t>& recv_counts, DType, const CallOptions& = {}) = 0;
  virtual WorkPtr barrier(const CallOptions& = {}) = 0;
  virtual WorkPtr send(const void* buf, std::uint64_t count, DType, int peer, int tag, const CallOptions& = {}) = 0;
  virtual WorkPtr recv(void* buf, std::uint64_t count, DType, int peer, int tag, const CallOptions& = {}) = 0;
  // out: size() * count elements on the root (may be null elsewhere).
  virtual WorkPtr gather(const void* in, void* out, std::uint64_t count, DType, int root,
                         const CallOptions& = {}) = 0;
  // in: size() * count elements on the root (may be null elsewhere).
  virtual WorkPtr scatter(const void* in, void* out, std::uint64_t count, DType, int root,
                          const CallOptions& = {}) = 0;

  // CUDA buffers (the GPU path): the daemon waits for `call.wait_event`, runs the operation on
  // its GPU streams and records the daemon event the Work names. Completes (on the CPU) as
  // soon as the work is enqueued; the caller orders its stream after daemon_event().
  virtual WorkPtr device_op(const DeviceCall& call, const CallOptions& = {}) {
    (void)call;
    throw Error(Status::Unsupported, "this communicator has no GPU path");
  }
};
using CommunicatorPtr = std::shared_ptr<Communicator>;

class Client {
 public:
  virtual ~Client() = default;
  // Attaches to the node's daemon segment (waiting up to attach_timeout for it to appear) and
  // registers this rank. Throws Error with a message that says how to start a daemon.
  static std::shared_ptr<Client> attach(const AttachOptions& opts);

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int local_rank() const = 0;
  virtual int local_world_size() const = 0;
  virtual int node_id() const = 0;
  virtual int num_nodes() const = 0;
  virtual const std::string& job_id() const = 0;
  virtual int daemon_pid() const = 0;

  // The communicator of all ranks (id 0).
  virtual CommunicatorPtr world() = 0;
  // Collective over `global_ranks` (every member calls it with the same id and list, in the
  // same order relative to its other collectives on the world). Blocks until the daemon
  // has the communicator. `comm_id` must not be 0 and must be unique in the job.
  virtual CommunicatorPtr create_communicator(std::uint64_t comm_id, const std::vector<int>& global_ranks,
                                              std::chrono::milliseconds timeout = std::chrono::milliseconds{0}) = 0;

  // Empty while the job is healthy; otherwise why it failed (dead rank or daemon).
  virtual std::string job_error() const = 0;

  // Leaves the job now, as the destructor does when the last reference goes: operations
  // still pending fail with Status::Shutdown, later calls throw it, and the daemon sees this
  // rank as exited cleanly. For hosts that keep clients alive until the process ends (torch
  // 2.x never destroys a registered process group). Idempotent.
  virtual void detach() = 0;

  // GPU path. Publishes an interprocess event handle (cudaIpcEventHandle_t bytes) to the
  // daemon; returns its index for DeviceCall::wait_event. Throws Error when the table is full.
  virtual int export_event(const std::array<std::uint8_t, 64>& handle) {
    (void)handle;
    throw Error(Status::Unsupported, "this client has no GPU path");
  }
  // The daemon's event handle `index` (from Work::daemon_event), if the daemon published it.
  virtual std::optional<std::array<std::uint8_t, 64>> daemon_event_handle(int index) const {
    (void)index;
    return std::nullopt;
  }
  // GPU path with stream flags: this rank's slot of the segment (to register with CUDA),
  // its stream flags (written by the rank's GPU) and the done flag (written by the daemon's).
  struct GpuSyncArea {
    void* region = nullptr;
    std::size_t bytes = 0;
    std::uint64_t* stream_flags = nullptr;
    int stream_flag_count = 0;
    std::uint64_t* done_flag = nullptr;
  };
  virtual std::optional<GpuSyncArea> gpu_sync_area() { return std::nullopt; }
  // This rank's arena (to register with CUDA for StagingCopier's copies); empty if none.
  virtual std::pair<std::byte*, std::size_t> arena_region() { return {nullptr, 0}; }
  // Runs once, before the arena is unmapped (the client's end) and after every copy the
  // client still knew of finished: where the arena's CUDA registration is undone.
  virtual void set_arena_release(std::function<void()> release) { (void)release; }
  // Publishes the IPC handle of this rank's GPU flag block (ipc::kFlagBlockBytes of device
  // memory: stream flags, then the done flag) for DeviceCall::device_flags requests.
  virtual void publish_flag_block(const std::array<std::uint8_t, 64>& handle) { (void)handle; }
  // This rank freed the CUDA allocation `alloc_id` (DeviceBuffer::alloc_id) it had exported:
  // the daemon tells every rank it sent the handle to, which then closes its mapping.
  // Lock-free and never blocks (torch's allocator calls it with its lock held).
  virtual void release_allocation(std::uint64_t alloc_id) { (void)alloc_id; }
  // The flag block handle local rank `slot` published, if it did.
  virtual std::optional<std::array<std::uint8_t, 64>> flag_block_of(int slot) const {
    (void)slot;
    return std::nullopt;
  }
  // Rank-side GPU execution: every completion of a DeviceCall with rank_exec (the Handles
  // ones, the Plan, or a failure) is handed to `handler` with the call's exec_token, in the
  // order the daemon sent them, before the Work is marked done. The handler runs with the
  // client's lock held: it must be quick and must not call back into the client.
  using ExecHandler = std::function<void(std::uint64_t token, const ipc::CompletionDesc&)>;
  virtual void set_exec_handler(ExecHandler handler) { (void)handler; }
  // Runs once, on a client thread without the client's lock, when this client sees the job
  // fail (the daemon's job_failed flag) or its daemon die: GPU work that waits for a peer's
  // flag must then be released (the GPU fast path's kernels).
  virtual void set_failure_handler(std::function<void()> handler) { (void)handler; }
  // Rank-side GPU execution: counts one operation of type `op` this rank's GPU ran, with the
  // kernels and copies it launched, where the daemon's status shows them.
  virtual void count_gpu_work(OpType op, std::uint64_t kernels, std::uint64_t copies) {
    (void)op;
    (void)kernels;
    (void)copies;
  }
  // What count_gpu_work() counted so far in this rank's slot (what smddp-ctl status sums over
  // the ranks): by operation type (index: OpType), and the copies of every type.
  struct GpuWork {
    std::array<std::uint64_t, ipc::kOpTypeCount> ops{}, kernels{};
    std::uint64_t copies = 0;
  };
  virtual GpuWork gpu_work() const { return {}; }
};
using ClientPtr = std::shared_ptr<Client>;

}  // namespace smddp::client
