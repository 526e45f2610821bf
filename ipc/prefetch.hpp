// Cache-line prefetches for lines another process wrote or read last: asked for ahead of the
// loads or stores that need them, their transfer overlaps other work instead of stalling it.
#pragma once

#include <algorithm>
#include <cstddef>

namespace smddp::ipc {

inline constexpr std::size_t kCacheLine = 64;

// The lines of [p, p + bytes), at most `max_lines` of them. Write: asks for them owned, so a
// store to a line the other process holds does not stall the next fence or locked instruction
// of this one on taking it back.
template <bool Write>
inline void prefetch_lines(const void* p, std::size_t bytes, std::size_t max_lines = 16) noexcept {
  const auto* b = static_cast<const std::byte*>(p);
  const std::size_t lines = std::min(max_lines, (bytes + kCacheLine - 1) / kCacheLine);
  for (std::size_t i = 0; i < lines; ++i) __builtin_prefetch(b + i * kCacheLine, Write ? 1 : 0, 3);
}

}  // namespace smddp::ipc
