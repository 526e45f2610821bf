// The plugin's GPU path for groups that span nodes: CUDA tensors' bytes cross the fabric
// through this rank's arena (client/gpu/arena_copier.hpp).
#include "torch_plugin/cuda_support.hpp"

#if SMDDP_PLUGIN_CUDA

#include "torch_plugin/cuda_path_impl.hpp"

namespace smddp::torch_plugin::gpu {

std::shared_ptr<client::StagingCopier> CudaPath::arena_copier(c10::Device device, const void* in, void* out) {
  std::shared_ptr<client::gpu::ArenaCopyLanes> lanes;
  {
    std::lock_guard lk(impl_->mu);
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
    lanes = l;
  }
  OnDevice g(device);
  try {
    return lanes->copier(in, out, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  } catch (const std::exception& e) {
    throw SmddpException(ErrorKind::Internal, std::string("smddp: ") + e.what());
  }
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
