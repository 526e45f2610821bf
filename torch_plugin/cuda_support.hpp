// The rank side of the GPU path: CUDA tensors travel to the daemon as IPC memory handles
// (cached by the allocation's buffer id) plus an interprocess event recorded on the caller's
// current stream; the daemon answers with the index of its own event, which the Work's
// completion stream (and Work::wait()'s caller stream) waits on. The CPU never waits for
// the GPU here.
//
// Built only where torch has CUDA (SMDDP_PLUGIN_CUDA); elsewhere available() is false and
// CUDA tensors are refused with a clear error.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <functional>
#include <string>
#include <vector>

#include "client/client.hpp"
#include "client/gpu/hier_schedule.hpp"

namespace smddp::client::gpu {
struct HierOp;
class ArenaCopyLanes;
}

namespace smddp::torch_plugin::gpu {

// Whether this build of the plugin has the GPU path.
bool compiled() noexcept;

// PCI bus id of this rank's GPU (device LOCAL_RANK, else the current one) for registration;
// "" where there is no GPU.
std::string local_bus_id();

// Why a collective on CUDA tensors of `device` cannot be issued now, or nullopt: the current
// stream is capturing a CUDA graph (torch.cuda.graph, torch.compile with CUDA graphs). The
// daemon matches and numbers each call when it is issued, and our kernels wait for flag values
// numbered then; a replay of the graph would repeat neither, so a captured call cannot work.
std::optional<std::string> capture_refusal(c10::Device device);
// The same for a call without tensors (barrier): the current device's current stream, where
// this process already holds that GPU's context (a job on host tensors must not create one).
std::optional<std::string> current_capture_refusal();

// Per-process state of the GPU path for one client.
class CudaPath {
 public:
  explicit CudaPath(std::shared_ptr<client::Client> client);
  ~CudaPath();
  CudaPath(const CudaPath&) = delete;
  CudaPath& operator=(const CudaPath&) = delete;

  // The daemon's view of `t`'s bytes. Throws SmddpException(Unsupported) for memory that
  // cannot be exported through CUDA IPC (expandable segments, cudaMallocAsync pools).
  client::DeviceBuffer buffer(const at::Tensor& t, const char* op);
  // Whether `t`'s memory can be exported (false: the caller stages it).
  bool exportable(const at::Tensor& t);
  // Marks the inputs ready on the current stream of `device` and fills call.wait_event (and
  // wait_value): by default a stream flag written by the GPU (stream memory operations); with
  // SMDDP_GPU_SYNC=events one of our interprocess events, held until release_event.
  void mark_inputs(c10::Device device, client::DeviceCall& call);
  void release_event(int index);
  // What marks an operation done on the daemon's side (from its client Work).
  struct DoneMark {
    int event = -1;
    std::uint64_t value = 0;
  };
  // Makes the pool stream `completion_stream(device)` wait on each daemon event, then runs
  // `body` with that stream current (epilogue copies, Future completion), then records the
  // Work's done event there. Returns that event (opaque), waited on by block_on_done().
  struct Done;
  struct FastMark;  // see the fast path below
  // `after`: a fast op's mark, waited for as well.
  std::shared_ptr<Done> complete(c10::Device device, const std::vector<DoneMark>& daemon_done,
                                 const std::vector<at::Tensor>& used, const std::function<void()>& body,
                                 const std::shared_ptr<FastMark>& after = nullptr);
  // Makes the caller's current stream on `device` wait for `done`.
  static void block_current_stream(const std::shared_ptr<Done>& done, c10::Device device);

  // Rank-side execution (SMDDP_GPU_EXEC unset or "rank", the default): this rank runs its
  // part of each collective on its own GPU from the daemon's plan (client/gpu/peer_executor.hpp).
  bool rank_exec() const noexcept;
  // Marks the inputs ready on the current stream of `device`, registers this rank's buffers
  // (device pointers: the tensors' or staging buffers') and sets call.rank_exec/exec_token.
  // `hier`: a hierarchical operation across nodes (run_hierarchical).
  void prepare_rank_exec(c10::Device device, client::DeviceCall& call, void* local_in, void* local_out, double scale,
                         std::shared_ptr<client::gpu::HierOp> hier = nullptr);
  void forget_rank_exec(std::uint64_t token);
  // Enqueues every plan received so far (in the daemon's order) on the completion stream;
  // returns why `token`'s GPU work could not run, if it could not.
  std::optional<std::string> run_rank_exec(std::uint64_t token);

  // The fast path (client/gpu/peer_executor.hpp): small AllReduce, AllGather and
  // ReduceScatter of a group within one node run as one kernel, enqueued at once, with no
  // plan awaited. Whether `call` on these tensors takes it: the same answer on every member.
  bool fast_eligible(const client::DeviceCall& call, const at::Tensor& in, const at::Tensor& out, double scale,
                     int group_size) const;
  // FastMark: what marks a fast op done on the GPU: its stream, and an event after its
  // kernel where it ran on a stream of its own (none on the caller's stream).
  // Numbers the fast op, has `post` submit its request with that number, then enqueues it
  // after the current stream's work (all of it under one lock: the numbers follow the
  // order of the kernels). Until every member published its flag allocation (each does
  // before posting its first GPU request) this waits, and fails if the request does.
  // `on_caller_stream`: run it on the current stream itself (the caller waits at once).
  // `copy_engines`: an AllGather moved by copy engines only (SMDATAPARALLEL_OPTIMIZE_SDP).
  std::pair<client::WorkPtr, std::shared_ptr<FastMark>> run_fast(
      c10::Device device, const client::DeviceCall& call, const at::Tensor& in, const at::Tensor& out, double scale,
      const std::vector<int>& slots, int me, bool on_caller_stream, bool copy_engines,
      const std::function<client::WorkPtr(std::uint64_t fast_seq)>& post);
  // Makes the current stream wait for the op (nothing if the op ran on it).
  static void block_current_stream(const std::shared_ptr<FastMark>& mark, c10::Device device);
  // Runs `body` (a Future's completion) with the op's stream current: what it records
  // follows the op.
  static void on_stream_of(const std::shared_ptr<FastMark>& mark, c10::Device device, const std::function<void()>& body);
  // A fast op failed: every kernel of this rank waiting for a peer goes on, and the fast
  // path is off on this rank from now on (the others see the same failure).
  void release_fast();
  // Staging for memory that cannot be exported (PYTORCH_CUDA_ALLOC_CONF=expandable_segments):
  // a cudaMalloc'ed buffer the daemon can map, reused once the operation that last used it
  // is done on the GPU (the caller's stream waits for that before copying in).
  struct Staging;
  static void* staging_ptr(const std::shared_ptr<Staging>& s);
  // A buffer of at least `bytes` on `device`; if `copy_from` is given, its bytes are copied in
  // on the current stream.
  std::shared_ptr<Staging> stage_in(c10::Device device, std::size_t bytes, const at::Tensor* copy_from);
  client::DeviceBuffer staging_buffer(const std::shared_ptr<Staging>& s, std::size_t bytes);
  // Copies the staging buffer into `to` on the current stream (run inside complete()'s body).
  static void copy_out(const std::shared_ptr<Staging>& s, const at::Tensor& to);
  // Back to the pool; the next user waits for `done` (null: the daemon never ran it).
  void release_staging(std::shared_ptr<Staging> s, std::shared_ptr<Done> done);

  // Across nodes: what moves a CUDA operation's bytes through this rank's arena (pipelined
  // device-to-host, fabric, host-to-device; client/gpu/arena_copier.hpp), ordered after the
  // current stream of `device`. `in`/`out`: the tensors' device pointers (either may be null).
  std::shared_ptr<client::StagingCopier> arena_copier(c10::Device device, const void* in, void* out);
  // Makes the current stream of `device` wait for the copier's copies out (run inside
  // complete()'s body). A failed copy fails the client's operation.
  static void after_arena_copies(client::StagingCopier& copier, c10::Device device);
  // The end of an operation that succeeded and whose only GPU work was `copier`'s: runs `body`
  // (epilogue, Future) with the copier's Out lane current, records `used` on it and returns the
  // Work's done event recorded there. One driver call, where complete() with
  // after_arena_copies() makes five: the copies in all finished before the op's chunks went.
  std::shared_ptr<Done> complete_after_copies(c10::Device device, client::StagingCopier& copier,
                                              const std::vector<at::Tensor>& used, const std::function<void()>& body);

  // Across nodes, hierarchically (client/gpu/hier_schedule.hpp): reduce or copy inside the node
  // over NVLink, move only this rank's shard across nodes on its rail, push what comes back to
  // the node's other members. `call` names the operation and this rank's buffers (as for the
  // plan path); `local_in`/`local_out` are their device pointers on this rank's GPU, `scratch`
  // hier_scratch_bytes() of device memory. Posts the rank-side request on `group` and the rail
  // operation on `rail`, and returns the operation's Work and the copier whose Out lane it ends
  // on (complete_after_copies).
  struct HierCall {
    client::DeviceCall call;
    void* local_in = nullptr;
    void* local_out = nullptr;
    void* scratch = nullptr;
    double scale = 1.0;
    const client::gpu::GroupLayout* layout = nullptr;
    int me = 0;  // group rank
    std::uint64_t piece_bytes = 0;
  };
  struct Hierarchical {
    client::WorkPtr work;
    std::shared_ptr<client::StagingCopier> copier;
  };
  Hierarchical run_hierarchical(c10::Device device, HierCall hc, client::Communicator& group,
                                client::Communicator& rail, const client::CallOptions& options);

 private:
  int record_input_event(c10::Device device, void* stream);  // interprocess-event mode
  // The arena's copy lanes of this rank, made at first use (impl_->mu held).
  std::shared_ptr<client::gpu::ArenaCopyLanes> lanes_locked(c10::Device device);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One CudaPath per client (created on first use).
std::shared_ptr<CudaPath> path_for(const std::shared_ptr<client::Client>& client);

}  // namespace smddp::torch_plugin::gpu
