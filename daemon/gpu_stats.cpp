#include "daemon/gpu_stats.hpp"

namespace smddp::daemon {

RankGpuStats rank_gpu_stats(const ipc::Segment& segment) {
  RankGpuStats s;
  for (int r = 0; r < segment.header().local_world_size; ++r) {
    const auto& slot = segment.slot(r);
    s.copies += slot.gpu_copies.load(std::memory_order_relaxed);
    for (int i = 0; i < ipc::kOpTypeCount; ++i) {
      const auto ops = slot.gpu_ops[i].load(std::memory_order_relaxed);
      if (ops == 0) continue;
      const auto kernels = slot.gpu_kernels[i].load(std::memory_order_relaxed);
      const std::string name(ipc::to_string(static_cast<ipc::OpType>(i)));
      s.ops += ops;
      s.kernels += kernels;
      s.ops_by_op[name] += ops;
      s.kernels_by_op[name] += kernels;
    }
  }
  return s;
}

}  // namespace smddp::daemon
