// A request as the daemon holds it while its collective waits for the other members: who
// posted it, as which group rank, and when.
#pragma once

#include <chrono>

#include "ipc/protocol.hpp"
#include "ipc/types.hpp"

namespace smddp::daemon {

using Clock = std::chrono::steady_clock;

struct Posted {
  int slot = -1;
  int group_rank = -1;
  ipc::RequestDesc desc;
  Clock::time_point at;
};

// Whether two members' calls of one collective agree on the fields every member must share.
inline bool same_signature(const ipc::RequestDesc& a, const ipc::RequestDesc& b) {
  constexpr std::uint32_t kMustMatch = ipc::kFlagSdp | ipc::kFlagSplits;
  if (a.op != b.op || a.dtype != b.dtype || a.count != b.count || a.chunk_offset != b.chunk_offset ||
      a.chunk_count != b.chunk_count || (a.flags & kMustMatch) != (b.flags & kMustMatch))
    return false;
  if (reduces(a.op) && a.reduce_op != b.reduce_op) return false;
  if (rooted(a.op) && a.root != b.root) return false;
  return true;
}

}  // namespace smddp::daemon
