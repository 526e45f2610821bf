// Which algorithm moves a collective's chunk among the daemons, as NCCL's tuner picks one: from
// the operation, the chunk's size and the number of nodes P. Every node must choose alike, so
// the choice reads only what all nodes share once the descriptors agree (operation, dtype,
// counts, group, P) and the daemons' common setting, never a local timing; the engine also
// sends the choice with the descriptors and fails the chunk, naming both choices, if they differ.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "ipc/protocol.hpp"

namespace smddp::daemon::internode {

enum class Algorithm : std::uint8_t {
  Auto = 0,     // a setting only: the tuner chooses
  Eager = 1,    // the data travels with the descriptors: one exchange (eager.cpp)
  Direct = 2,   // every node with every other at once: 1 round per phase, P-1 messages per node
  Ring = 3,     // around a ring: P-1 rounds per phase, 1 message of 1/P each (ring.cpp)
  Halving = 4,  // recursive halving then doubling: log2 P rounds per phase, +1 each where P is not
                // a power of two (halving_doubling.cpp)
};

std::string_view to_string(Algorithm a) noexcept;
// "auto", "direct", "ring" or "halving" (what fabric.algorithm takes); nullopt otherwise.
std::optional<Algorithm> parse_algorithm(std::string_view name) noexcept;

// The collectives that have ring and halving/doubling forms: AllReduce, Reduce, ReduceScatter,
// AllGather. The others always run directly (or eagerly).
bool runs_by_segments(ipc::OpType op) noexcept;

// Thresholds of the automatic choice (tuner.cpp says how they were chosen): the direct exchange
// up to kDirectMaxNodes nodes; beyond, a ring where each of its steps moves at least
// kRingMinSegmentBytes (the chunk's bytes / P), recursive halving/doubling below.
inline constexpr int kDirectMaxNodes = 8;
inline constexpr std::uint64_t kRingMinSegmentBytes = 128ull << 10;

// The algorithm for a chunk described by `d` (any member's descriptor), in a group of `ranks`
// ranks on `nodes` nodes. `eager_fits`: the chunk is small enough for the eager path
// (sends_eagerly). `setting`: fabric.algorithm. A forced setting applies to the collectives that
// have that form, small ones included (to test and measure it); Auto sends small data eagerly.
Algorithm choose_algorithm(Algorithm setting, const ipc::RequestDesc& d, int ranks, int nodes, bool eager_fits) noexcept;

}  // namespace smddp::daemon::internode
