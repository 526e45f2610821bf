// Internals of PeerExecutor shared by its files: peer_executor.cpp (plans, barriers, maps),
// peer_executor_hier.cpp (hierarchical operations) and fast_path.cpp (the fast path).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "client/gpu/cuda_util.hpp"
#include "ipc/protocol.hpp"
#include "ipc/segment.hpp"
#include "kernels/device_kernels.hpp"

namespace smddp::client::gpu::detail {

// The members' node slots, in member order.
inline std::vector<int> slots_of(const std::vector<ipc::PlanMember>& members) {
  std::vector<int> v;
  for (const auto& m : members) v.push_back(m.slot);
  return v;
}

// Stream memory operations through the runtime's driver entry points (no libcuda link).
using StreamValue = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
using StreamBatch = CUresult (*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);
struct StreamOps {
  StreamValue wait = nullptr, write = nullptr;
  StreamBatch batch = nullptr;  // several waits and writes in one call (null: one call each)
};
inline const StreamOps& stream_ops() {
  static const StreamOps ops{driver_entry<StreamValue>("cuStreamWaitValue64"),
                             driver_entry<StreamValue>("cuStreamWriteValue64"),
                             driver_entry<StreamBatch>("cuStreamBatchMemOp")};
  return ops;
}


// The flag allocation every rank publishes: the flag block (stream flags, plan barriers),
// then the fast path's flags (row w written by local rank w, one word per thread block),
// then its two staging buffers (by sequence parity).
inline constexpr std::size_t kFastFlagsOffset = ipc::kFlagBlockBytes;
inline constexpr std::size_t kFastFlagsBytes = std::size_t{ipc::kMaxLocalRanks} * kernels::kFastMaxBlocks * 8;
inline constexpr std::size_t kFastStageOffset = kFastFlagsOffset + kFastFlagsBytes;
inline constexpr std::uint64_t kFastStageBytes = 16ull << 20;
inline constexpr std::size_t kFlagAllocBytes = kFastStageOffset + 2 * kFastStageBytes;
static_assert(kFastStageOffset % 256 == 0);


// Null stays null, so a missing buffer is caught before any GPU work uses it.
inline std::byte* at(void* p, std::uint64_t off) { return p ? static_cast<std::byte*>(p) + off : nullptr; }

}  // namespace smddp::client::gpu::detail
