// The plugin's GPU path for groups that span nodes. Hierarchically (run_hierarchical): the
// node's GPUs reduce or copy over NVLink, and only each GPU's shard crosses the fabric, staged
// through its rank's arena by a shard copier (client/gpu/hier_schedule.hpp, hier_work.hpp); or
// whole (arena_copier): every rank's tensor goes through its arena and the daemons' host path.
#include "torch_plugin/cuda_support.hpp"

#if SMDDP_PLUGIN_CUDA

#include "client/gpu/hier_work.hpp"
#include "torch_plugin/cuda_path_impl.hpp"

namespace smddp::torch_plugin::gpu {

std::shared_ptr<client::gpu::ArenaCopyLanes> CudaPath::lanes_locked(c10::Device device) {
  const auto client = impl_->locked();
  auto [arena, bytes] = client->arena_region();
  auto& l = impl_->arena_lanes;
  if (l && (l->device() != device.index() || !l->covers(arena, bytes)))
    throw SmddpException(ErrorKind::InvalidArgument, "smddp: this rank already stages CUDA tensors across nodes from cuda:" +
                                                         std::to_string(l->device()) + ", not cuda:" +
                                                         std::to_string(device.index()) + " (one GPU per rank)");
  try {
    if (!l) {
      l = std::make_shared<client::gpu::ArenaCopyLanes>(device.index(), arena, bytes);
      // The registration must go before the client unmaps the arena.
      std::weak_ptr<client::gpu::ArenaCopyLanes> weak = l;
      client->set_arena_release([weak] {
        if (auto x = weak.lock()) x->release_arena();
      });
    }
  } catch (const std::exception& e) {
    throw SmddpException(ErrorKind::Internal, std::string("smddp: cannot stage CUDA tensors across nodes: ") + e.what());
  }
  return l;
}

std::shared_ptr<client::StagingCopier> CudaPath::arena_copier(c10::Device device, const void* in, void* out) {
  std::shared_ptr<client::gpu::ArenaCopyLanes> lanes;
  {
    std::lock_guard lk(impl_->mu);
    lanes = lanes_locked(device);
  }
  OnDevice g(device);
  try {
    return lanes->copier(in, out, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  } catch (const std::exception& e) {
    throw SmddpException(ErrorKind::Internal, std::string("smddp: ") + e.what());
  }
}

CudaPath::Hierarchical CudaPath::run_hierarchical(c10::Device device, HierCall hc, client::Communicator& group,
                                                  client::Communicator& rail_comm, const client::CallOptions& options) {
  namespace cg = client::gpu;
  const client::DeviceCall& call = hc.call;
  const char* op = ipc::to_string(call.op).data();
  OnDevice g(device);
  std::shared_ptr<cg::PeerExecutor> x;
  std::shared_ptr<cg::ArenaCopyLanes> lanes;
  {
    std::lock_guard lk(impl_->mu);
    impl_->executor(device.index());
    x = impl_->exec;
    lanes = lanes_locked(device);
  }
  // This rank's parts from its own buffers: what it stages and the marks it waits for. The
  // plan, with the node's other members mapped, gives the rest (pre part, pushes) alike.
  const auto& layout = *hc.layout;
  const auto my = static_cast<std::size_t>(layout.local_of[static_cast<std::size_t>(hc.me)]);
  cg::HierArgs a;
  a.op = call.op;
  a.dtype = call.dtype;
  a.reduce_op = call.reduce_op;
  a.count = call.count;
  a.root = call.root;
  a.layout = &layout;
  a.me = hc.me;
  a.in.assign(static_cast<std::size_t>(layout.per_node), nullptr);
  a.out.assign(static_cast<std::size_t>(layout.per_node), nullptr);
  a.in[my] = static_cast<std::byte*>(hc.local_in);
  a.out[my] = static_cast<std::byte*>(hc.local_out);
  a.scratch = static_cast<std::byte*>(hc.scratch);
  a.piece_bytes = hc.piece_bytes;
  std::string why;
  auto sched = cg::hier_schedule(a, why);
  if (!sched) throw SmddpException(ErrorKind::Internal, std::string("smddp ") + op + ": " + why);
  const auto marks = x->reserve_marks(sched->marks.size());
  cg::ShardStaging st;
  st.rail = sched->rail;
  st.word = marks.word;
  for (std::size_t j = 0; j < sched->marks.size(); ++j) st.marks.push_back({sched->marks[j].ready, marks.values[j]});
  st.last = marks.values.back();
  const cudaStream_t producer = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  std::shared_ptr<client::StagingCopier> copier;
  try {
    copier = lanes->shard_copier(st, producer);
  } catch (const std::exception& e) {
    throw SmddpException(ErrorKind::Internal, std::string("smddp ") + op + ": " + e.what());
  }
  auto h = std::make_shared<cg::HierOp>();
  h->op = call.op;
  h->layout = layout;
  h->me = hc.me;
  h->piece_bytes = hc.piece_bytes;
  h->scratch = hc.scratch;
  h->copier = copier;
  h->word = marks.word;
  h->mark_values = marks.values;
  client::DeviceCall request = call;
  request.hierarchical = true;
  prepare_rank_exec(device, request, hc.local_in, hc.local_out, hc.scale, h);
  h->token = request.exec_token;
  client::WorkPtr posted;
  try {
    posted = group.device_op(request, options);
  } catch (...) {
    forget_rank_exec(request.exec_token);
    throw;
  }
  // The rail operation: a host operation of this rank's shard, whose copier reads and writes
  // GPU memory. Its pointers only mark which sides it has (the copier knows the stretches).
  const cg::RailOp& r = sched->rail;
  client::CallOptions co = options;
  co.copier = copier;
  co.rail = true;
  co.scale = 1.0;  // PREMUL_SUM scaled each input inside the node
  co.sdp = false;
  void* in = r.in.empty() ? nullptr : r.in.front().at;
  void* out = r.out.empty() ? nullptr : r.out.front().at;
  client::WorkPtr rail;
  try {
    if (r.count > 0) {
      switch (r.op) {
        case client::OpType::AllReduce: rail = rail_comm.allreduce(in, out, r.count, call.dtype, r.reduce_op, co); break;
        case client::OpType::ReduceScatter:
          rail = rail_comm.reduce_scatter(in, out, r.count, call.dtype, r.reduce_op, co);
          break;
        case client::OpType::AllGather: rail = rail_comm.allgather(in, out, r.count, call.dtype, co); break;
        case client::OpType::Broadcast: rail = rail_comm.broadcast(in ? in : out, r.count, call.dtype, r.root, co); break;
        case client::OpType::Reduce: rail = rail_comm.reduce(in, out, r.count, call.dtype, r.reduce_op, r.root, co); break;
        default: throw SmddpException(ErrorKind::Internal, std::string("smddp ") + op + ": no rail operation for it");
      }
    }
  } catch (...) {
    // The request is out and its plan will come: its tail must still run with the node's
    // other members, so the Work goes on without a rail operation, and the caller sees this.
    cg::HierWork::start(x, h, request.exec_token, posted, nullptr);
    throw;
  }
  return {cg::HierWork::start(x, h, request.exec_token, posted, rail), copier};
}

void CudaPath::after_arena_copies(client::StagingCopier& copier, c10::Device device) {
  OnDevice g(device);
  try {
    client::gpu::ArenaCopyLanes::order_after(copier, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  } catch (const std::exception& e) {
    throw SmddpException(ErrorKind::Internal, std::string("smddp: ") + e.what());
  }
}

std::shared_ptr<CudaPath::Done> CudaPath::complete_after_copies(c10::Device device, client::StagingCopier& copier,
                                                                const std::vector<at::Tensor>& used,
                                                                const std::function<void()>& body) {
  OnDevice g(device);
  const auto lane = c10::cuda::getStreamFromExternal(client::gpu::ArenaCopyLanes::out_stream(copier), device.index());
  // The copies out write the outputs there: their blocks must not go to new owners before.
  for (const auto& t : used)
    if (t.defined() && t.is_cuda() && t.has_storage())
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), lane);
  {
    c10::cuda::CUDAStreamGuard sg(lane);
    body();
  }
  auto done = std::make_shared<Done>();
  done->device = device.index();
  done->pool = impl_->done_events;
  done->event = done->pool->take(done->device);
  check(cudaEventRecord(done->event, lane.stream()), "cudaEventRecord");
  return done;
}


}  // namespace smddp::torch_plugin::gpu

#endif  // SMDDP_PLUGIN_CUDA
