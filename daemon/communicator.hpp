// A communicator as the daemon sees it: the group's members in group-rank order, and which
// of them live on this node (their segment slots).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace smddp::daemon {

struct Communicator {
  std::uint64_t id = 0;
  std::vector<int> global_ranks;  // group rank -> global rank
  std::vector<int> slots;         // group rank -> local slot on this node, -1 if remote

  int size() const noexcept { return static_cast<int>(global_ranks.size()); }
  std::optional<int> group_rank_of_slot(int slot) const noexcept {
    for (int g = 0; g < size(); ++g)
      if (slots[static_cast<std::size_t>(g)] == slot) return g;
    return std::nullopt;
  }
  int local_member_count() const noexcept {
    int n = 0;
    for (int s : slots) n += s >= 0;
    return n;
  }
};

}  // namespace smddp::daemon
