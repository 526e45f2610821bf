// The plugin's side of the GPU fast path (client/gpu/peer_executor.hpp): small collectives of
// a group within one node, enqueued at once, checked by the daemon afterwards.
#include "torch_plugin/cuda_support.hpp"

#if SMDDP_PLUGIN_CUDA

#include <chrono>
#include <thread>

#include "torch_plugin/cuda_path_impl.hpp"

namespace smddp::torch_plugin::gpu {

namespace {
// The executor's view of a fast-path call (members filled in by the caller).
client::gpu::FastOp fast_op_of(const client::DeviceCall& call, const at::Tensor& in, const at::Tensor& out,
                               double scale) {
  client::gpu::FastOp f;
  f.op = call.op;
  f.dtype = call.dtype;
  f.reduce_op = call.reduce_op;
  f.scale = scale;
  f.count = call.count;
  f.in = in.data_ptr();
  f.out = out.data_ptr();
  return f;
}
}  // namespace

bool CudaPath::fast_eligible(const client::DeviceCall& call, const at::Tensor& in, const at::Tensor& out,
                             double scale, int group_size) const {
  if (!impl_->rank_exec || group_size < 2) return false;
  auto f = fast_op_of(call, in, out, scale);
  f.slots.assign(static_cast<std::size_t>(group_size), 0);
  return client::gpu::PeerExecutor::fast_eligible(f);
}

std::pair<client::WorkPtr, std::shared_ptr<CudaPath::FastMark>> CudaPath::run_fast(
    c10::Device device, const client::DeviceCall& call, const at::Tensor& in, const at::Tensor& out, double scale,
    const std::vector<int>& slots, int me, bool on_caller_stream, bool copy_engines,
    const std::function<client::WorkPtr(std::uint64_t fast_seq)>& post) {
  OnDevice g(device);
  std::shared_ptr<client::gpu::PeerExecutor> x;
  {
    std::lock_guard lk(impl_->mu);
    impl_->executor(device.index());
    x = impl_->exec;
  }
  auto f = fast_op_of(call, in, out, scale);
  f.slots = slots;
  f.me = me;
  f.copy_engines = copy_engines;
  const auto fail = [&](const std::string& why) {
    throw SmddpException(ErrorKind::Internal, "smddp " + std::string(ipc::to_string(call.op)) + ": " + why);
  };
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  std::lock_guard order(impl_->fast_mu);
  f.seq = x->reserve_fast_seq();
  client::WorkPtr op;
  try {
    // A rank whose path is off says so, and the daemon's error stops the others as well.
    op = post(x->fast_off() ? ipc::kFastSeqOff : f.seq);
  } catch (...) {
    // The peers posted theirs and their kernels wait for this rank's flags.
    try {
      x->run_fast(f, stream, on_caller_stream, /*dry_only=*/true);
    } catch (const std::exception&) {
      // It always throws; the request's own error is the one to report.
    }
    throw;
  }
  try {
    // Only before the first fast op of a member that has not started its GPU path yet.
    for (int spin = 0; !x->fast_off() && !x->fast_ready(slots); ++spin) {
      if (op->done() && op->status() != client::Status::Ok) {
        x->release_fast();  // the others got the same answer and release theirs
        fail(op->error());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(spin < 100 ? 10 : 1000));
    }
    auto mark = std::make_shared<FastMark>();
    const auto launched = x->run_fast(f, stream, on_caller_stream);
    mark->stream = launched.stream;
    mark->event = launched.done;
    mark->exec = x;
    if (!on_caller_stream) {
      // Another stream uses the tensors: their blocks must not go to new owners on the
      // caller's stream before it passed this op (as ProcessGroupNCCL records its stream).
      const auto side = c10::cuda::getStreamFromExternal(launched.stream, device.index());
      for (const at::Tensor* t : {&in, &out})
        c10::cuda::CUDACachingAllocator::recordStream(t->storage().data_ptr(), side);
    }
    return {std::move(op), std::move(mark)};
  } catch (const SmddpException&) {
    throw;
  } catch (const std::exception& e) {
    x->release_fast();  // whatever failed here, this rank stops taking the path
    fail(e.what());
  }
  return {};  // not reached: fail() throws
}

void CudaPath::block_current_stream(const std::shared_ptr<FastMark>& mark, c10::Device device) {
  if (!mark) return;
  OnDevice g(device);
  mark->order(c10::cuda::getCurrentCUDAStream(device.index()).stream());
}

void CudaPath::on_stream_of(const std::shared_ptr<FastMark>& mark, c10::Device device,
                            const std::function<void()>& body) {
  OnDevice g(device);
  c10::cuda::CUDAStreamGuard sg(c10::cuda::getStreamFromExternal(mark->stream, device.index()));
  body();
}

void CudaPath::release_fast() {
  std::shared_ptr<client::gpu::PeerExecutor> x;
  {
    std::lock_guard lk(impl_->mu);
    x = impl_->exec;
  }
  if (x) x->release_fast();
}

}  // namespace smddp::torch_plugin::gpu

#endif  // SMDDP_PLUGIN_CUDA
