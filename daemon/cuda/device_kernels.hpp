// The daemon's CUDA kernels, behind a plain C++ interface (gpu_executor.cpp is compiled by
// g++; only device_kernels.cu goes through nvcc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ipc/types.hpp"

namespace smddp::daemon::cuda {

inline constexpr int kMaxKernelInputs = 64;  // ipc::kMaxLocalRanks

// out[i] = reduce_op over inputs[0..n)[i], i < count. Half types accumulate in float32.
// Pointers must be valid in the context of the device that runs `stream`.
struct ReduceArgs {
  const void* inputs[kMaxKernelInputs];
  int n = 0;
  void* out = nullptr;
  // One-shot form: when nout > 0 the result goes to every outs[i] instead of `out` (each
  // element is read and written by one thread, so outputs may alias inputs).
  void* outs[kMaxKernelInputs] = {};
  int nout = 0;
  std::uint64_t count = 0;
  ipc::DType dtype = ipc::DType::Float32;
  ipc::ReduceOp op = ipc::ReduceOp::Sum;
  double scale = 1.0;  // PREMUL_SUM factor
};

// Enqueues the reduction on `stream` with at most `max_blocks` blocks of 512 threads.
// Returns cudaErrorInvalidValue for a dtype/op pair that has no kernel.
cudaError_t launch_reduce(const ReduceArgs& args, cudaStream_t stream, int max_blocks);

// Up to kMaxKernelInputs byte copies in one launch (the general AllGather path pulls every
// rank's input into one output with it).
struct CopyArgs {
  const void* src[kMaxKernelInputs];
  void* dst[kMaxKernelInputs];
  std::uint64_t bytes = 0;  // the same for every pair
  int n = 0;
};
cudaError_t launch_copy(const CopyArgs& args, cudaStream_t stream, int max_blocks);

}  // namespace smddp::daemon::cuda
