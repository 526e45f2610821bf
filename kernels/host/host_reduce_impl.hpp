// Internals of host_reduce shared by its translation units and its tests: the kernel sets
// compiled for each instruction set, and a way to run a chosen set (tests compare them).
#pragma once

#include <cstddef>

#include "kernels/host/host_reduce.hpp"

namespace smddp::host_kernels::detail {

// inputs/n/out/count/params as host_reduce; inputs already validated.
using ReduceKernel = void (*)(const void* const* inputs, std::size_t n, void* out, std::size_t count,
                              const ReduceParams& params);
using ScaleKernel = void (*)(void* buf, std::size_t count, double factor);

enum class HostIsa { Generic, Avx2 };

// Each kernel set: nullptr where (dtype, op) is not supported.
namespace generic {
ReduceKernel reduce_kernel(ipc::DType dtype, ipc::ReduceOp op) noexcept;
ScaleKernel scale_kernel(ipc::DType dtype) noexcept;
}  // namespace generic
namespace avx2 {
ReduceKernel reduce_kernel(ipc::DType dtype, ipc::ReduceOp op) noexcept;
ScaleKernel scale_kernel(ipc::DType dtype) noexcept;
}  // namespace avx2

bool host_isa_available(HostIsa isa) noexcept;  // compiled in and supported by this CPU
HostIsa host_isa_selected() noexcept;           // the set host_reduce uses

// host_reduce / host_scale on a given kernel set (must be available).
void host_reduce_on(HostIsa isa, ipc::DType dtype, ipc::ReduceOp op, std::span<const void* const> inputs,
                    void* out, std::size_t count, const ReduceParams& params = {});
void host_scale_on(HostIsa isa, ipc::DType dtype, void* buf, std::size_t count, double factor);

}  // namespace smddp::host_kernels::detail
