// ArenaAllocator: first-fit allocation of a rank's staging arena. Regions come back in any
// order (collectives on different communicators, or a receive waiting for its sender, finish
// out of order), and a long-pending region must not block the free space around it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace smddp::client {

class ArenaAllocator {
 public:
  explicit ArenaAllocator(std::uint64_t capacity);

  // A region of `bytes` (rounded up to 64), or nullopt until enough is freed.
  std::optional<std::uint64_t> allocate(std::uint64_t bytes);
  void free(std::uint64_t offset);

  std::uint64_t capacity() const noexcept { return capacity_; }
  std::uint64_t in_use() const noexcept { return used_; }
  bool empty() const noexcept { return live_.empty(); }

 private:
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::map<std::uint64_t, std::uint64_t> free_;  // offset -> bytes, coalesced
  std::map<std::uint64_t, std::uint64_t> live_;  // offset -> bytes
};

}  // namespace smddp::client
