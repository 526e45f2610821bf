// Which pair of endpoints ("rail") a message between two nodes takes, decided by each side
// alone from what the bootstrap told it, so that both name the same pair with no message
// between them (engine.cpp):
// - an operation with exactly one member on each of the two nodes (a send/recv; a collective
//   of a communicator with one member per node, as the GPU path's per-GPU communicators):
//   each member's slot's endpoint on its own node (the endpoint nearest its GPU, rail_map.hpp);
// - otherwise striped: the same index on both sides, hash(operation chunk) mod the smaller
//   endpoint count, so an operation's chunks spread over the endpoints.
// Heartbeats and failure notices take endpoint 0 on both sides.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "daemon/transport/transport.hpp"

namespace smddp::daemon::internode {

// A node's endpoints as the bootstrap described them.
struct RailTable {
  int endpoints = 1;
  std::vector<int> rail_of_slot;  // local slot -> endpoint index
};

inline transport::Rail pinned_rail(const RailTable& mine, int my_slot, const RailTable& theirs, int their_slot) {
  return {mine.rail_of_slot.at(static_cast<std::size_t>(my_slot)), theirs.rail_of_slot.at(static_cast<std::size_t>(their_slot))};
}

inline transport::Rail striped_rail(std::uint64_t op_key, int my_endpoints, int their_endpoints) {
  const auto n = static_cast<std::uint64_t>(std::max(1, std::min(my_endpoints, their_endpoints)));
  const int index = static_cast<int>(op_key % n);
  return {index, index};
}

inline constexpr transport::Rail kControlRail{0, 0};

}  // namespace smddp::daemon::internode
