// ProcessGroupSMDDP: which path a collective's tensors take (host; CUDA within a node through
// the plan or the fast path; CUDA across nodes hierarchically, or staged whole through the
// arena), and issuing it there.
#include "torch_plugin/process_group_smddp.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "torch_plugin/client_registry.hpp"
#include "torch_plugin/cuda_support.hpp"
#include "torch_plugin/errors.hpp"
#include "torch_plugin/pending_works.hpp"

namespace smddp::torch_plugin {

DevicePath ProcessGroupSMDDP::supported_path(const char* op, const std::vector<at::Tensor>& tensors) const {
  const auto path = common_device_path(op, tensors);
  if (path == DevicePath::Cuda && !gpu::compiled()) {
    throw_unsupported(op, "CUDA tensors are not supported yet by this smddp build (host tensors only); "
                          "move the tensors to the CPU or use another backend for GPU tensors");
  }
  // Before anything is posted or enqueued: the group stays as it was.
  if (path == DevicePath::Cuda) {
    if (auto why = gpu::capture_refusal(tensors.front().device())) throw_unsupported(op, *why);
  }
  const bool outside = touches_outside_client(op);
  auto spans = spans_of(tensors);
  wait_for(pending_works().before(spans, outside));
  t_issue = Issue{op, std::move(spans), outside};
  return path;
}

client::WorkPtr ProcessGroupSMDDP::device_call(WorkSMDDP& w, client::DeviceCall call, const at::Tensor* in,
                                               const at::Tensor* out, const client::CallOptions& co,
                                               bool caller_waits) {
  if (!cuda_path_) {
    cuda_path_ = gpu::path_for(client_);
  }
  const at::Tensor& any = in ? *in : *out;
  if (!w.cuda()) {
    w.set_cuda(cuda_path_, any.device());
  }
  if (spans_nodes(call)) {
    if (hierarchical_path(call)) {
      t_issue.path = GpuPath::Hier;
      wait_for(pending_works().other_path(t_issue.spans, GpuPath::Hier));  // before its inputs are marked ready
      return hierarchical_call(w, std::move(call), in, out, co);
    }
    t_issue.path = GpuPath::Staged;
    wait_for(pending_works().other_path(t_issue.spans, GpuPath::Staged));
    return host_staged_call(w, call, in, out, co);
  }
  if (fast_group_ && in && out && in->numel() > 0 && out->numel() > 0 && call.splits.empty() &&
      client_->num_nodes() == 1 && cuda_path_->fast_eligible(call, *in, *out, co.scale, comm_->size())) {
    t_issue.path = GpuPath::Fast;
    wait_for(pending_works().other_path(t_issue.spans, GpuPath::Fast));
    return fast_call(w, std::move(call), *in, *out, co, caller_waits);
  }
  t_issue.path = GpuPath::Plan;
  wait_for(pending_works().other_path(t_issue.spans, GpuPath::Plan));  // before its inputs are marked ready
  void* local_in = nullptr;  // the device pointers this rank's own GPU work uses
  void* local_out = nullptr;
  device_buffers(w, call, in, out, local_in, local_out);
  // Recorded after every producer of the inputs (flatten copies included) on this stream.
  // Empty tensors leave no GPU work (the daemon runs them as host requests), except in an
  // uneven AllToAll, where the others' tables decide: a member that sends and receives nothing
  // still runs the plan's barriers with the others.
  const bool uneven_alltoall = call.op == client::OpType::AllToAll && !call.splits.empty();
  if ((call.input || call.output || uneven_alltoall) && cuda_path_->rank_exec()) {
    cuda_path_->prepare_rank_exec(any.device(), call, local_in, local_out, co.scale);
    try {
      auto op = comm_->device_op(call, co);
      w.add_exec_token(call.exec_token);
      return op;
    } catch (...) {
      cuda_path_->forget_rank_exec(call.exec_token);
      throw;
    }
  }
  if (call.input || call.output) {
    cuda_path_->mark_inputs(any.device(), call);
    if (!call.stream_value) {
      w.add_input_event(call.wait_event);
    }
  }
  return comm_->device_op(call, co);
}

void ProcessGroupSMDDP::device_buffers(WorkSMDDP& w, client::DeviceCall& call, const at::Tensor* in,
                                       const at::Tensor* out, void*& local_in, void*& local_out) {
  const auto bytes_of = [](const at::Tensor& t) { return static_cast<std::size_t>(t.numel()) * t.element_size(); };
  // In place (allreduce, a broadcast root): one buffer for both roles.
  const bool same = in && out && in->numel() > 0 && in->data_ptr() == out->data_ptr() && in->numel() == out->numel();
  if (in && in->numel() > 0) {
    if (cuda_path_->exportable(*in)) {
      call.input = cuda_path_->buffer(*in, w.op_name());
      local_in = in->data_ptr();
    } else {
      // Expandable segments: the collective works on a staging copy.
      auto s = cuda_path_->stage_in(in->device(), bytes_of(*in), in);
      call.input = cuda_path_->staging_buffer(s, bytes_of(*in));
      local_in = gpu::CudaPath::staging_ptr(s);
      w.add_staging(s, same ? *out : at::Tensor());
    }
  }
  if (out && out->numel() > 0) {
    if (same) {
      call.output = call.input;
      local_out = local_in;
    } else if (cuda_path_->exportable(*out)) {
      call.output = cuda_path_->buffer(*out, w.op_name());
      local_out = out->data_ptr();
    } else {
      auto s = cuda_path_->stage_in(out->device(), bytes_of(*out), nullptr);
      call.output = cuda_path_->staging_buffer(s, bytes_of(*out));
      local_out = gpu::CudaPath::staging_ptr(s);
      w.add_staging(s, *out);
    }
  }
}

namespace {
std::uint64_t env_bytes(const char* name, std::uint64_t fallback) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  char* end = nullptr;
  const auto v = std::strtoull(e, &end, 10);
  if (*end != '\0')
    throw SmddpException(ErrorKind::InvalidArgument, std::string("smddp: ") + name + "='" + e + "' is not a byte count");
  return v;
}
}  // namespace

bool ProcessGroupSMDDP::hierarchical_path(const client::DeviceCall& call) {
  using client::OpType;
  if (!hierarchical_ || !cuda_path_->rank_exec() || call.count == 0) return false;
  if (call.op != OpType::AllReduce && call.op != OpType::ReduceScatter && call.op != OpType::AllGather &&
      call.op != OpType::Reduce && call.op != OpType::Broadcast)
    return false;
  // An integer average would round twice (inside the node, then across nodes): the staged path
  // sums, then divides once.
  const bool floating = call.dtype == client::DType::Float32 || call.dtype == client::DType::Float64 ||
                        call.dtype == client::DType::Float16 || call.dtype == client::DType::BFloat16;
  if (call.reduce_op == client::ReduceOp::Avg && !floating) return false;
  // Below this many bytes of the collective (its whole tensor; for AllGather and ReduceScatter
  // every rank's part together) the staged path's single exchange is sooner than a plan round
  // trip and an in-node pass. Every rank decides alike: it depends on what they all share.
  static const std::uint64_t min_bytes = env_bytes("SMDDP_HIER_MIN_BYTES", 1ull << 20);
  std::uint64_t bytes = call.count * ipc::dtype_size(call.dtype);
  if (call.op == OpType::AllGather || call.op == OpType::ReduceScatter)
    bytes *= static_cast<std::uint64_t>(comm_->size());
  if (bytes < min_bytes) return false;
  std::lock_guard lk(hier_mu_);
  if (!layout_checked_) {
    layout_checked_ = true;
    std::string why;
    if (auto l = client::gpu::GroupLayout::of(comm_->global_ranks(), client_->local_world_size(), why); l && l->per_node > 1)
      layout_ = std::move(*l);
  }
  return layout_.has_value();
}

client::Communicator& ProcessGroupSMDDP::rail(int local) {
  std::lock_guard lk(hier_mu_);
  auto& c = rails_[local];
  if (!c) {
    // The members with this local index, one per node: created on every node by its member
    // alone (no other node is waited for), under an id every member derives alike.
    std::vector<int> members;
    for (int g : layout_->rail(local)) members.push_back(comm_->global_ranks()[static_cast<std::size_t>(g)]);
    c = client_->create_communicator(torch_plugin::communicator_id(group_id_ + "/rail/" + std::to_string(local)),
                                     members, timeout_);
  }
  return *c;
}

client::WorkPtr ProcessGroupSMDDP::hierarchical_call(WorkSMDDP& w, client::DeviceCall call, const at::Tensor* in,
                                                     const at::Tensor* out, const client::CallOptions& co) {
  const at::Tensor& any = in ? *in : *out;
  gpu::CudaPath::HierCall hc;
  device_buffers(w, call, in, out, hc.local_in, hc.local_out);
  hc.layout = &*layout_;
  hc.me = comm_->rank();
  hc.scale = co.scale;
  static const std::uint64_t piece_bytes = env_bytes("SMDDP_HIER_PIECE_BYTES", 2ull << 20);
  hc.piece_bytes = piece_bytes;
  client::gpu::HierArgs a;
  a.op = call.op;
  a.dtype = call.dtype;
  a.count = call.count;
  a.root = call.root;
  a.layout = hc.layout;
  a.me = hc.me;
  if (const std::uint64_t bytes = client::gpu::hier_scratch_bytes(a)) {
    // Read and written by this rank's streams only; kept (and recorded on the stream the Work
    // ends on) until the Work is done.
    at::Tensor scratch = at::empty({static_cast<int64_t>(bytes)}, any.options().dtype(at::kByte));
    hc.scratch = scratch.data_ptr();
    w.keep_alive(std::move(scratch));
  }
  if (in) w.keep_alive(*in);
  client::Communicator& r = rail(layout_->local_of[static_cast<std::size_t>(hc.me)]);
  hc.call = std::move(call);
  auto h = cuda_path_->run_hierarchical(any.device(), std::move(hc), *comm_, r, co);
  w.add_arena_copier(h.copier);
  return h.work;
}

client::WorkPtr ProcessGroupSMDDP::fast_call(WorkSMDDP& w, client::DeviceCall call, const at::Tensor& in,
                                             const at::Tensor& out, const client::CallOptions& co, bool caller_waits) {
  call.fast = true;
  // One node: local ranks are the global ones.
  const std::vector<int>& slots = comm_->global_ranks();
  // SMDATAPARALLEL_OPTIMIZE_SDP: AllGather launches no kernel, here too.
  const bool copy_engines = call.op == client::OpType::AllGather && co.sdp;
  auto [op, mark] = cuda_path_->run_fast(in.device(), call, in, out, co.scale, slots, comm_->rank(), caller_waits,
                                         copy_engines, [&](std::uint64_t fast_seq) {
                                           call.wait_value = fast_seq;
                                           return comm_->device_op(call, co);
                                         });
  w.keep_alive(in);
  w.set_fast(std::move(mark));
  return op;
}

bool ProcessGroupSMDDP::spans_nodes(const client::DeviceCall& call) const {
  if (client_->num_nodes() <= 1) {
    return false;
  }
  // Ranks of a node are consecutive (smddprun, mpirun by slot, SMDDP_SIMULATE_NODES).
  const int first = client_->rank() - client_->local_rank();
  const int end = first + client_->local_world_size();
  const auto& global = comm_->global_ranks();
  const auto elsewhere = [&](int g) { return g < first || g >= end; };
  if (call.op == client::OpType::Send || call.op == client::OpType::Recv) {
    return call.root >= 0 && static_cast<std::size_t>(call.root) < global.size() &&
           elsewhere(global[static_cast<std::size_t>(call.root)]);
  }
  return std::any_of(global.begin(), global.end(), elsewhere);
}

client::WorkPtr ProcessGroupSMDDP::host_staged_call(WorkSMDDP& w, const client::DeviceCall& call,
                                                    const at::Tensor* in, const at::Tensor* out,
                                                    const client::CallOptions& options) {
  // The daemons' host path runs it; the bytes go through this rank's arena chunk by chunk
  // (device to host, fabric, host to device), the copies of some chunks overlapping the
  // fabric's work on others. Nothing here waits for the GPU.
  void* ip = in && in->numel() > 0 ? in->data_ptr() : nullptr;
  void* op = out && out->numel() > 0 ? out->data_ptr() : nullptr;
  client::CallOptions co = options;
  if (ip || op) {
    co.copier = cuda_path_->arena_copier((ip ? *in : *out).device(), ip, op);
    w.add_arena_copier(co.copier);
    if (ip) {
      w.keep_alive(*in);  // read by the copies in, which run on streams of ours
    }
  }
  using client::OpType;
  switch (call.op) {
    case OpType::AllReduce:
      return comm_->allreduce(ip, op, call.count, call.dtype, call.reduce_op, co);
    case OpType::Broadcast:
      return comm_->broadcast(ip ? ip : op, call.count, call.dtype, call.root, co);
    case OpType::Reduce:
      return comm_->reduce(ip, op, call.count, call.dtype, call.reduce_op, call.root, co);
    case OpType::AllGather:
      return comm_->allgather(ip, op, call.count, call.dtype, co);
    case OpType::ReduceScatter:
      return comm_->reduce_scatter(ip, op, call.count, call.dtype, call.reduce_op, co);
    case OpType::AllToAll:
      if (!call.splits.empty()) {
        const auto n = call.splits.size() / 2;
        std::vector<std::uint64_t> send(call.splits.begin(), call.splits.begin() + static_cast<std::ptrdiff_t>(n));
        std::vector<std::uint64_t> recv(call.splits.begin() + static_cast<std::ptrdiff_t>(n), call.splits.end());
        return comm_->alltoallv(ip, send, op, recv, call.dtype, co);
      }
      return comm_->alltoall(ip, op, call.count, call.dtype, co);
    case OpType::Gather:
      return comm_->gather(ip, op, call.count, call.dtype, call.root, co);
    case OpType::Scatter:
      return comm_->scatter(ip, op, call.count, call.dtype, call.root, co);
    case OpType::Send:
      return comm_->send(ip, call.count, call.dtype, call.root, call.tag, co);
    case OpType::Recv:
      return comm_->recv(op, call.count, call.dtype, call.root, call.tag, co);
    default:
      throw_unsupported(w.op_name(), "this operation has no host-staged form across nodes");
  }
}

}  // namespace smddp::torch_plugin
