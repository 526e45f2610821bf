// Host collectives that only move bytes (allgather, broadcast, gather, scatter, even alltoall)
// within one node need no copies in the daemon: every member's input already sits in its
// arena, in the one segment every rank maps. So the daemon answers each member with where its
// output blocks are (CompletionKind::Sources) and each rank copies them into its own tensor.
// That saves the daemon's pass over the data (it wrote every output block into every member's
// output region, which the ranks then copied out again) and takes the daemon off the data path.
//
// A member's region holds its input until every member has read it. No message says so: each
// rank counts the Sources completions it has copied (RankSlot::sources_done, in ring order),
// the daemon numbers each member's copy of the chunk in that count (SourceReader), and a member
// reuses its region once every reader's count reached its number (client.cpp). A release sent
// to the daemon and answered (an earlier form) cost 10-15 us an op on 2 cores.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "daemon/matcher.hpp"
#include "ipc/protocol.hpp"

namespace smddp::daemon {

// Where each member's output blocks are, result[r] for group rank r in output-block order; or
// nullopt when the match runs the usual way: a member did not offer kFlagReadSources, the op
// reduces or has split tables, the group is too large for a completion's list, or no member
// copies `min_bytes` (below it, measured, the daemon's copy costs no more and varies less).
std::optional<std::vector<std::vector<ipc::ArenaSource>>> arena_sources(const Match& m, std::uint64_t min_bytes);

}  // namespace smddp::daemon
