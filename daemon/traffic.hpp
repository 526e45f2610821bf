// Byte counts by operation type, for the operator (smddp-ctl status and metrics): what the
// daemon reduced on its CPU and what it sent on the fabric. Owned and updated by the daemon's
// thread; read by the same thread when it builds its status.
#pragma once

#include <array>
#include <cstdint>

#include "ipc/types.hpp"

namespace smddp::daemon {

class BytesByOp {
 public:
  void add(ipc::OpType op, std::uint64_t bytes) noexcept {
    const auto i = static_cast<std::size_t>(op);
    if (i < counts_.size()) counts_[i] += bytes;
  }
  std::uint64_t operator[](ipc::OpType op) const noexcept {
    const auto i = static_cast<std::size_t>(op);
    return i < counts_.size() ? counts_[i] : 0;
  }

 private:
  std::array<std::uint64_t, ipc::kOpTypeCount> counts_{};
};

}  // namespace smddp::daemon
