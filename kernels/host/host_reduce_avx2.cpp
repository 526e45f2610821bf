// AVX2 + F16C kernel set; the build compiles this file with -mavx2 -mf16c on x86-64 only and
// host_reduce.cpp selects it at run time when the CPU has both.
#if defined(__x86_64__) && defined(__AVX2__) && defined(__F16C__)
#define SMDDP_KERNEL_SET avx2
#include "kernels/host/host_reduce_kernels.inc"
#else
#include "kernels/host/host_reduce_impl.hpp"

namespace smddp::host_kernels::detail::avx2 {
ReduceKernel reduce_kernel(ipc::DType, ipc::ReduceOp) noexcept { return nullptr; }
ScaleKernel scale_kernel(ipc::DType) noexcept { return nullptr; }
}  // namespace smddp::host_kernels::detail::avx2
#endif
