// Cache-line prefetches for lines another process wrote or read last: asked for ahead of the
// loads or stores that need them, their transfer overlaps other work instead of stalling it.
#pragma once

#include <algorithm>
#include <cstddef>

namespace smddp::ipc {

inline constexpr std::size_t kCacheLine = 64;

// One line. Write: asked for owned (PREFETCHW; processors without it run it as a NOP), which
// GCC's builtin emits only for -mprfchw targets and otherwise turns into a plain read prefetch:
// the line then arrives shared and the store still has to take it.
template <bool Write>
[[gnu::always_inline]] inline void prefetch_line(const void* p) noexcept {
#if defined(__x86_64__)
  if constexpr (Write) {
    asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
    return;
  }
#endif
  __builtin_prefetch(p, Write ? 1 : 0, 3);
}

// The lines of [p, p + bytes), at most `max_lines` of them. Write: asks for them owned, so a
// store to a line the other process holds does not stall the next fence or locked instruction
// of this one on taking it back. Always inlined: GCC's interprocedural analysis finds a function
// that only prefetches free of side effects and drops every call to it.
template <bool Write>
[[gnu::always_inline]] inline void prefetch_lines(const void* p, std::size_t bytes,
                                                  std::size_t max_lines = 16) noexcept {
  const auto* b = static_cast<const std::byte*>(p);
  const std::size_t lines = std::min(max_lines, (bytes + kCacheLine - 1) / kCacheLine);
  for (std::size_t i = 0; i < lines; ++i) prefetch_line<Write>(b + i * kCacheLine);
}

}  // namespace smddp::ipc
