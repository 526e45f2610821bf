// The GPU path's entry points in a build whose torch has no CUDA: CUDA tensors are refused
// with a clear error, and nothing else is reached.
#include "torch_plugin/cuda_support.hpp"

#if !SMDDP_PLUGIN_CUDA

#include "torch_plugin/errors.hpp"

namespace smddp::torch_plugin::gpu {

bool compiled() noexcept { return false; }
std::optional<std::string> capture_refusal(c10::Device) { return std::nullopt; }
std::optional<std::string> current_capture_refusal() { return std::nullopt; }
std::string local_bus_id() { return {}; }
struct CudaPath::Impl {};
struct CudaPath::Done {};
CudaPath::CudaPath(std::shared_ptr<client::Client>) {}
CudaPath::~CudaPath() = default;
bool CudaPath::exportable(const at::Tensor&) { return false; }
client::DeviceBuffer CudaPath::buffer(const at::Tensor&, const char* op) {
  throw_unsupported(op, "this smddp build has no GPU path (torch without CUDA)");
}
void CudaPath::mark_inputs(c10::Device, client::DeviceCall&) {}
bool CudaPath::rank_exec() const noexcept { return false; }
void CudaPath::prepare_rank_exec(c10::Device, client::DeviceCall&, void*, void*, double,
                                 std::shared_ptr<client::gpu::HierOp>) {}
CudaPath::Hierarchical CudaPath::run_hierarchical(c10::Device, HierCall, client::Communicator&, client::Communicator&,
                                                  const client::CallOptions&) {
  throw SmddpException(ErrorKind::Unsupported, "smddp: this smddp build has no GPU path (torch without CUDA)");
}
void CudaPath::forget_rank_exec(std::uint64_t) {}
std::optional<std::string> CudaPath::run_rank_exec(std::uint64_t) { return std::nullopt; }
void* CudaPath::staging_ptr(const std::shared_ptr<Staging>&) { return nullptr; }
void CudaPath::release_event(int) {}
std::shared_ptr<CudaPath::Done> CudaPath::complete(c10::Device, const std::vector<DoneMark>&, const std::vector<at::Tensor>&,
                                                   const std::function<void()>& body, const std::shared_ptr<FastMark>&) {
  body();
  return nullptr;
}
struct CudaPath::FastMark {};
bool CudaPath::fast_eligible(const client::DeviceCall&, const at::Tensor&, const at::Tensor&, double, int) const {
  return false;
}
std::pair<client::WorkPtr, std::shared_ptr<CudaPath::FastMark>> CudaPath::run_fast(
    c10::Device, const client::DeviceCall&, const at::Tensor&, const at::Tensor&, double, const std::vector<int>&, int,
    bool, bool, const std::function<client::WorkPtr(std::uint64_t)>&) {
  return {};
}
void CudaPath::block_current_stream(const std::shared_ptr<FastMark>&, c10::Device) {}
void CudaPath::on_stream_of(const std::shared_ptr<FastMark>&, c10::Device, const std::function<void()>& body) { body(); }
void CudaPath::release_fast() {}
void CudaPath::block_current_stream(const std::shared_ptr<Done>&, c10::Device) {}
struct CudaPath::Staging {};
std::shared_ptr<CudaPath::Staging> CudaPath::stage_in(c10::Device, std::size_t, const at::Tensor*) { return nullptr; }
client::DeviceBuffer CudaPath::staging_buffer(const std::shared_ptr<Staging>&, std::size_t) { return {}; }
void CudaPath::copy_out(const std::shared_ptr<Staging>&, const at::Tensor&) {}
void CudaPath::release_staging(std::shared_ptr<Staging>, std::shared_ptr<Done>) {}
std::shared_ptr<client::StagingCopier> CudaPath::arena_copier(c10::Device, const void*, void*) {
  throw SmddpException(ErrorKind::Unsupported, "smddp: this smddp build has no GPU path (torch without CUDA)");
}
void CudaPath::after_arena_copies(client::StagingCopier&, c10::Device) {}
std::shared_ptr<CudaPath::Done> CudaPath::complete_after_copies(c10::Device, client::StagingCopier&,
                                                                const std::vector<at::Tensor>&,
                                                                const std::function<void()>& body) {
  body();
  return nullptr;
}


}  // namespace smddp::torch_plugin::gpu

#endif  // !SMDDP_PLUGIN_CUDA
