// Host collectives that only move bytes (allgather, broadcast, gather, scatter, even alltoall)
// within one node need no copies in the daemon: every member's input already sits in its
// arena, in the one segment every rank maps. So the daemon answers each member with where its
// output blocks are (CompletionKind::Sources) and each rank copies them into its own tensor.
// That saves the daemon's pass over the data (it wrote every output block into every member's
// output region, which the ranks then copied out again) and takes the daemon off the data path.
//
// The price is a release: a member's region holds its input until every member has read it,
// so each rank sends a release once it has copied, and the daemon answers the chunk's releases
// when the last member's came (SourceReleases). Only then do the ranks reuse the region.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "daemon/matcher.hpp"
#include "ipc/protocol.hpp"

namespace smddp::daemon {

// Where each member's output blocks are, result[r] for group rank r in output-block order; or
// nullopt when the match runs the usual way: a member did not offer kFlagReadSources, the op
// reduces or has split tables, the group is too large for a completion's list, or no member
// copies `min_bytes` (below it the daemon's own copy costs less than the release).
std::optional<std::vector<std::vector<ipc::ArenaSource>>> arena_sources(const Match& m, std::uint64_t min_bytes);

// The chunks answered with Sources whose members have not all released them yet.
class SourceReleases {
 public:
  struct Key {
    std::uint64_t comm_id, seq, chunk_offset;
    auto operator<=>(const Key&) const = default;
  };
  static Key key_of(const ipc::RequestDesc& d) { return {d.comm_id, d.seq, d.chunk_offset}; }

  // `m` was answered with Sources: each of its members must release it.
  void expect(const Match& m);
  // A member's release: the releases to answer now (all of the chunk's once its last member's
  // came, else none), or why this one is refused.
  std::variant<std::vector<Posted>, std::string> release(const Posted& p);
  // `slot` left: it reads nothing any more. Returns the releases answered by that.
  std::vector<Posted> drop_slot(int slot);
  // Every release still waiting, taken (the job failed: they are answered with its error).
  std::vector<Posted> take_all();
  // Chunks whose regions are still held.
  std::size_t pending() const noexcept { return chunks_.size(); }

 private:
  struct Chunk {
    std::vector<int> waiting;    // slots that have not released yet
    std::vector<Posted> posted;  // the releases that came
  };
  std::map<Key, Chunk> chunks_;
};

}  // namespace smddp::daemon
