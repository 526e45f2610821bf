// What the schedule checkers (schedule_test.cpp, hier_schedule_test.cpp) share: byte ranges for
// the race check and an exact element-wise sum for the reference results.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "ipc/types.hpp"

namespace smddp::client::gpu::schedule_check {

struct Range {
  const std::byte* lo;
  const std::byte* hi;
  bool overlaps(const Range& o) const { return lo < o.hi && o.lo < hi; }
};

// Element-wise sum in the dtype, integer types only (wrap-around: exact in every order).
inline void add_into(std::byte* acc, const std::byte* x, std::uint64_t count, ipc::DType t) {
  const auto go = [&](auto zero) {
    using T = decltype(zero);
    for (std::uint64_t i = 0; i < count; ++i) {
      T a, b;
      std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
      std::memcpy(&b, x + i * sizeof(T), sizeof(T));
      const T c = static_cast<T>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
      std::memcpy(acc + i * sizeof(T), &c, sizeof(T));
    }
  };
  switch (t) {
    case ipc::DType::Int8: go(std::uint8_t{}); break;
    case ipc::DType::Int32: go(std::uint32_t{}); break;
    case ipc::DType::Int64: go(std::uint64_t{}); break;
    default: throw std::invalid_argument("the schedule checkers sum Int8, Int32 and Int64 only");
  }
}

}  // namespace smddp::client::gpu::schedule_check
