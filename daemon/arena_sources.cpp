#include "daemon/arena_sources.hpp"

#include <algorithm>

namespace smddp::daemon {

using ipc::OpType;

std::optional<std::vector<std::vector<ipc::ArenaSource>>> arena_sources(const Match& m, std::uint64_t min_bytes) {
  if (m.posted.empty()) return std::nullopt;
  const auto& d0 = m.posted.front().desc;
  if (!ipc::reads_sources(d0.op) || (d0.flags & ipc::kFlagSplits)) return std::nullopt;
  const std::size_t n = m.posted.size();
  if (n > ipc::kMaxSourceMembers) return std::nullopt;
  if (!std::all_of(m.posted.begin(), m.posted.end(),
                   [](const Posted& p) { return (p.desc.flags & ipc::kFlagReadSources) != 0; }))
    return std::nullopt;
  const std::uint64_t cb = d0.chunk_count * ipc::dtype_size(d0.dtype);
  // The most blocks one member copies: checked before anything is built, since most small
  // operations stop here.
  const bool one_block = d0.op == OpType::Broadcast || d0.op == OpType::Scatter;
  if (cb == 0 || (one_block ? 1 : n) * cb < min_bytes) return std::nullopt;
  const auto root = static_cast<std::size_t>(d0.root);
  // Member q's input, `at` bytes in: validated as an arena region of the expected size.
  const auto from = [&](std::size_t q, std::uint64_t at) {
    ipc::ArenaSource s;
    s.slot = m.posted[q].slot;
    s.offset = m.posted[q].desc.input.offset + at;
    s.bytes = cb;
    return s;
  };
  std::vector<std::vector<ipc::ArenaSource>> out(n);
  for (std::size_t r = 0; r < n; ++r) {
    auto& to = out[r];
    switch (d0.op) {
      case OpType::AllGather:
        for (std::size_t q = 0; q < n; ++q) to.push_back(from(q, 0));
        break;
      case OpType::AllToAll:
        for (std::size_t q = 0; q < n; ++q) to.push_back(from(q, r * cb));
        break;
      case OpType::Broadcast:
        if (r != root) to.push_back(from(root, 0));
        break;
      case OpType::Gather:
        if (r == root)
          for (std::size_t q = 0; q < n; ++q) to.push_back(from(q, 0));
        break;
      case OpType::Scatter: to.push_back(from(root, r * cb)); break;
      default: return std::nullopt;
    }
  }
  return out;
}

}  // namespace smddp::daemon
