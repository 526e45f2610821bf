#include "client/arena_allocator.hpp"

#include <stdexcept>

namespace smddp::client {

ArenaAllocator::ArenaAllocator(std::uint64_t capacity) : capacity_(capacity / 64 * 64) {
  if (capacity_) free_.emplace(0, capacity_);
}

std::optional<std::uint64_t> ArenaAllocator::allocate(std::uint64_t bytes) {
  bytes = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const std::uint64_t at = it->first;
    const std::uint64_t left = it->second - bytes;
    free_.erase(it);
    if (left) free_.emplace(at + bytes, left);
    live_.emplace(at, bytes);
    used_ += bytes;
    return at;
  }
  return std::nullopt;
}

void ArenaAllocator::free(std::uint64_t offset) {
  auto live = live_.find(offset);
  if (live == live_.end()) throw std::logic_error("arena region freed twice or never allocated");
  std::uint64_t at = offset, bytes = live->second;
  used_ -= bytes;
  live_.erase(live);
  auto next = free_.lower_bound(at);
  if (next != free_.end() && next->first == at + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      at = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(at, bytes);
}

}  // namespace smddp::client
