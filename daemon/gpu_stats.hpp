// What the ranks' GPUs ran under rank-side execution (ipc::kFlagRankExec), summed from the
// counters each rank keeps in its segment slot: the daemon launches nothing itself then, and
// operators still want kernel launches per operation (SDP AllGather: none).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "ipc/segment.hpp"

namespace smddp::daemon {

struct RankGpuStats {
  std::uint64_t ops = 0;  // operations, counted once per rank that ran its part
  std::uint64_t kernels = 0;
  std::uint64_t copies = 0;
  std::map<std::string, std::uint64_t> ops_by_op;      // "allgather" -> operations
  std::map<std::string, std::uint64_t> kernels_by_op;  // "allgather" -> kernel launches
};

RankGpuStats rank_gpu_stats(const ipc::Segment& segment);

}  // namespace smddp::daemon
