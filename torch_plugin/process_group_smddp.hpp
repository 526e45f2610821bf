// ProcessGroupSMDDP: the c10d backend "smddp". Each call validates its arguments (so bad
// input raises at once and the group stays usable), picks the data path from the tensors'
// device, submits client operations on this group's communicator, and returns a WorkSMDDP.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "client/client.hpp"
#include "client/gpu/hier_schedule.hpp"
#include "torch_plugin/tensor_checks.hpp"
#include "torch_plugin/torch_compat.hpp"
#include "torch_plugin/work_smddp.hpp"

namespace smddp::torch_plugin {

class ProcessGroupSMDDP : public BackendBase {
 public:
  struct Config {
    int rank = 0;  // in the group
    int size = 1;
    std::chrono::milliseconds timeout = kDefaultPgTimeout;
    std::string group_id;               // torch's group name (same on every member)
    std::vector<int64_t> global_ranks;  // members; empty for the default (world) group
  };

  // Attaches (once per process) and creates the group's communicator; blocks until every
  // member has done the same.
  static c10::intrusive_ptr<ProcessGroupSMDDP> create(const Config& config);

  ProcessGroupSMDDP(const Config& config, std::shared_ptr<client::Client> client, client::CommunicatorPtr comm);
  ~ProcessGroupSMDDP() override;

  const std::string getBackendName() const override { return "smddp"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // A counter of the collectives issued on this group, the same on every member while they
  // agree (TORCH_DISTRIBUTED_DEBUG=DETAIL compares it before each collective).
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

#if SMDDP_TORCH_2
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts = {}) override;
  // Collects every Work issued until endCoalescing() into one (what _coalescing_manager and
  // DeepSpeed rely on; see reference/pytorch-c10d.md §3.5).
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
#endif

  std::uint64_t communicator_id() const { return comm_->id(); }
  const std::vector<int>& global_ranks() const { return comm_->global_ranks(); }

 private:
  c10::intrusive_ptr<WorkSMDDP> make_work(c10d::OpType type, const char* op, std::vector<at::Tensor> outputs);
  // Submits what `body` adds to `work`, converting client errors; then arms the work, counts
  // it and (2.x) records it for coalescing.
  template <typename Body>
  c10::intrusive_ptr<c10d::Work> run(const c10::intrusive_ptr<WorkSMDDP>& work, Body&& body);
  // The device path all of `tensors` share (common_device_path), refusing CUDA tensors where
  // this build has no GPU path or where the current stream is capturing a CUDA graph.
  DevicePath supported_path(const char* op, const std::vector<at::Tensor>& tensors) const;
  // GPU path: submits `call` with CUDA tensors `in`/`out` (null where the role has none),
  // after recording an input event on the current stream.
  // CUDA tensors in a group that spans nodes: the daemons' host path across the fabric, the
  // bytes staged chunk by chunk through this rank's arena by copy streams of ours
  // (client/gpu/arena_copier.hpp); the Work's completion stream waits for the copies back.
  bool spans_nodes(const client::DeviceCall& call) const;
  client::WorkPtr host_staged_call(WorkSMDDP& w, const client::DeviceCall& call, const at::Tensor* in,
                                   const at::Tensor* out, const client::CallOptions& co);
  // `caller_waits`: the caller waits for the op at once (torch 2.11's asyncOp=false), so a
  // fast-path kernel may run on its stream instead of a stream of its own.
  client::WorkPtr device_call(WorkSMDDP& w, client::DeviceCall call, const at::Tensor* in, const at::Tensor* out,
                              const client::CallOptions& co, bool caller_waits = false);
  // The GPU fast path (gpu::CudaPath::fast_eligible): posts the request, then enqueues the
  // kernel at once.
  client::WorkPtr fast_call(WorkSMDDP& w, client::DeviceCall call, const at::Tensor& in, const at::Tensor& out,
                            const client::CallOptions& co, bool caller_waits);
  client::CallOptions call_options(std::chrono::milliseconds timeout, double scale = 1.0) const;
  // Fills call.input/output with `in`/`out`'s memory (or staging buffers where it cannot be
  // exported) and the device pointers this rank's own GPU work uses.
  void device_buffers(WorkSMDDP& w, client::DeviceCall& call, const at::Tensor* in, const at::Tensor* out,
                      void*& local_in, void*& local_out);
  // CUDA tensors across nodes, hierarchically (gpu::CudaPath::run_hierarchical): whether `call`
  // goes that way (every member decides alike), and issuing it.
  bool hierarchical_path(const client::DeviceCall& call);
  client::WorkPtr hierarchical_call(WorkSMDDP& w, client::DeviceCall call, const at::Tensor* in,
                                    const at::Tensor* out, const client::CallOptions& co);
  // The communicator of this group's members with local index `local`, one per node (made on
  // first use).
  client::Communicator& rail(int local);

  // Shared helpers of the single-tensor and coalesced forms.
  void add_allgather_base(WorkSMDDP& work, const char* op, at::Tensor& output, at::Tensor& input,
                          const c10d::AllgatherOptions& opts);
  void add_reduce_scatter_base(WorkSMDDP& work, const char* op, at::Tensor& output, at::Tensor& input,
                               const c10d::ReduceScatterOptions& opts);

  std::shared_ptr<client::Client> client_;
  client::CommunicatorPtr comm_;
  std::chrono::milliseconds timeout_;
  std::string group_id_;
  bool sdp_allgather_ = false;  // SMDATAPARALLEL_OPTIMIZE_SDP
  bool hierarchical_ = true;    // SMDDP_CUDA_ACROSS_NODES (hierarchical, or staged whole)
  // A group of every rank of the job (the world, or another group with its members): the
  // only ones that take the GPU fast path. Each rank numbers its fast ops over all of them
  // alike only if every such group has the same members (client/gpu/peer_executor.hpp).
  bool fast_group_ = false;
  std::shared_ptr<AsyncErrors> async_errors_ = std::make_shared<AsyncErrors>();
  std::shared_ptr<gpu::CudaPath> cuda_path_;  // created on the first CUDA call
  // Hierarchical operations across nodes: the group's layout (none where its nodes hold
  // unequal numbers of members, or one each) and its rails.
  std::mutex hier_mu_;
  bool layout_checked_ = false;
  std::optional<client::gpu::GroupLayout> layout_;
  std::map<int, client::CommunicatorPtr> rails_;
  std::atomic<std::uint64_t> sequence_{0};

  std::mutex coalescing_mutex_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<WorkSMDDP>> coalesced_;
};

}  // namespace smddp::torch_plugin
