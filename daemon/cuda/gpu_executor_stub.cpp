// Built where no CUDA compiler was found: the GPU path is off and says so.
#include "daemon/cuda/gpu_executor.hpp"

namespace smddp::daemon::cuda {

bool is_device_request(const ipc::RequestDesc& d) noexcept {
  return d.input.kind == ipc::BufferKind::CudaIpc || d.output.kind == ipc::BufferKind::CudaIpc;
}

std::unique_ptr<GpuExecutor> GpuExecutor::create(const ipc::Segment&, std::string& why_not) {
  why_not = "this smddp-daemon was built without CUDA (no nvcc at configure time)";
  return nullptr;
}

}  // namespace smddp::daemon::cuda
