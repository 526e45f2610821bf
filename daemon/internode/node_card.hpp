// What a daemon tells the others at bootstrap about its fabric endpoints: every endpoint's
// name and which endpoint serves each local slot (daemon/internode/rail_map.hpp). Both
// bootstraps carry it as bytes: the MPI one gathers them, the Store one (launch path 2)
// writes them in hex into the "ADDRESS PID HOST" line that smdistributed's _launch.py passes on.
//
// Layout (little-endian): "SMDC", u16 version (1), u16 endpoint count, u16 slot count, u16 0;
// per endpoint a u16 length and the name; per slot a u16 endpoint index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace smddp::daemon::internode {

struct NodeCard {
  std::vector<std::vector<std::uint8_t>> addresses;  // endpoint i's name, as the transport gave it
  std::vector<int> rail_of_slot;                      // local slot -> endpoint index
};

inline constexpr std::size_t kMaxEndpointAddressBytes = 1024;
inline constexpr int kMaxCardEndpoints = 64;  // transport::Transport::kMaxEndpoints (engine.cpp checks)

std::vector<std::uint8_t> encode_node_card(const NodeCard& card);
// Throws std::invalid_argument saying what is wrong (not a card, a newer version, counts or
// lengths out of range, an endpoint index beyond the endpoints, bytes left over).
NodeCard decode_node_card(const std::vector<std::uint8_t>& bytes);
// Checks a decoded card against the job: one entry per local slot. Throws
// std::invalid_argument naming `node`.
void check_node_card(const NodeCard& card, int node, int nproc_per_node);

std::string to_hex(const std::vector<std::uint8_t>& bytes);
// Throws std::invalid_argument on an odd length or a character that is not a hex digit.
std::vector<std::uint8_t> from_hex(std::string_view text);

}  // namespace smddp::daemon::internode
