// The GPU path's CUDA kernels (reductions, copies, the fast path) behind a plain C++
// interface, shared by the ranks' executor (client/gpu) and the daemon's (daemon/cuda): the
// callers are compiled by g++, only device_kernels.cu goes through nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ipc/types.hpp"

namespace smddp::kernels {

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

// The rank side's latency path for small AllReduce, AllGather and ReduceScatter (see
// client/gpu/peer_executor.hpp, "fast path"): one kernel per operation, enqueued when the
// caller issues it, with no answer from the daemon awaited. Every member copies its input
// into its own staging buffer (peer-mapped by the others), signals each peer with a flag
// per thread block, waits for theirs, then reads the others' staging buffers over NVLink.
// Staging alternates between two buffers by sequence parity, so op k+2 may overwrite a
// buffer only after every peer signalled op k+1, which they do after finishing op k.
inline constexpr int kFastMaxRanks = 8;
inline constexpr int kFastMaxBlocks = 128;
struct FastArgs {
  ipc::OpType op = ipc::OpType::AllReduce;  // AllReduce, AllGather or ReduceScatter
  ipc::DType dtype = ipc::DType::Float32;
  ipc::ReduceOp reduce_op = ipc::ReduceOp::Sum;
  double scale = 1.0;
  int n = 0;   // members
  int me = 0;  // this rank's index among them
  // Elements: AllReduce the tensor's, AllGather each member's input, ReduceScatter each
  // member's output.
  std::uint64_t count = 0;
  const void* in = nullptr;
  void* out = nullptr;
  void* stage[kFastMaxRanks] = {};                // every member's staging (this op's parity)
  std::uint64_t* signal[kFastMaxRanks] = {};      // in member r's flags: the row this rank writes
  const std::uint64_t* wait[kFastMaxRanks] = {};  // in this rank's flags: the row member r writes
  std::uint64_t seq = 0;                          // this op's number, > every earlier one
};
// The staging bytes one member needs, and the grid (the same on every member).
std::uint64_t fast_stage_bytes(const FastArgs& args);
int fast_blocks(const FastArgs& args);
// cudaErrorInvalidValue for an op, dtype or reduce op the fast path does not take.
cudaError_t launch_fast(const FastArgs& args, cudaStream_t stream);
bool fast_supported(ipc::OpType op, ipc::DType dtype, ipc::ReduceOp reduce_op);

// Waits on the GPU until each of `flags` reached its value (a 64-bit counter another process
// writes over NVLink), spinning in one thread. Unlike a stream memory operation's wait, a kernel
// that waits does not hold back the work of other streams of this process that the hardware
// queues behind it (CUDA_DEVICE_MAX_CONNECTIONS queues serve all of them): work the writers may
// need to get to their writes.
struct WaitArgs {
  const std::uint64_t* flags[kMaxKernelInputs] = {};
  std::uint64_t values[kMaxKernelInputs] = {};
  int n = 0;
};
cudaError_t launch_wait_flags(const WaitArgs& args, cudaStream_t stream);

// Loads every kernel of this file into the current context now. With CUDA's lazy loading a
// kernel's first launch may wait for the whole context to go idle, which must not happen
// while a stream of this process waits for a flag that another process sets.
cudaError_t preload_kernels();

}  // namespace smddp::kernels
