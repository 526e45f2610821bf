#include "daemon/arena_sources.hpp"

#include <algorithm>

namespace smddp::daemon {

using ipc::OpType;

std::optional<std::vector<std::vector<ipc::ArenaSource>>> arena_sources(const Match& m, std::uint64_t min_bytes) {
  if (m.posted.empty()) return std::nullopt;
  const auto& d0 = m.posted.front().desc;
  if (!ipc::reads_sources(d0.op) || (d0.flags & ipc::kFlagSplits)) return std::nullopt;
  const std::size_t n = m.posted.size();
  if (n > ipc::kMaxArenaSources) return std::nullopt;
  if (!std::all_of(m.posted.begin(), m.posted.end(),
                   [](const Posted& p) { return (p.desc.flags & ipc::kFlagReadSources) != 0; }))
    return std::nullopt;
  const std::uint64_t cb = d0.chunk_count * ipc::dtype_size(d0.dtype);
  if (cb == 0) return std::nullopt;
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
  std::size_t most = 0;
  for (const auto& v : out) most = std::max(most, v.size());
  if (most * cb < min_bytes) return std::nullopt;
  return out;
}

void SourceReleases::expect(const Match& m) {
  Chunk c;
  for (const auto& p : m.posted) c.waiting.push_back(p.slot);
  chunks_[key_of(m.posted.front().desc)] = std::move(c);
}

std::variant<std::vector<Posted>, std::string> SourceReleases::release(const Posted& p) {
  const Key k = key_of(p.desc);
  auto it = chunks_.find(k);
  auto w = it == chunks_.end() ? std::vector<int>::iterator{} : std::find(it->second.waiting.begin(), it->second.waiting.end(), p.slot);
  if (it == chunks_.end() || w == it->second.waiting.end())
    return "smddp: a release of " + std::string(ipc::to_string(p.desc.op)) + " (communicator " +
           std::to_string(k.comm_id) + ", operation #" + std::to_string(k.seq) + ", chunk at element " +
           std::to_string(k.chunk_offset) + ") that this rank has no sources to release for";
  it->second.waiting.erase(w);
  it->second.posted.push_back(p);
  if (!it->second.waiting.empty()) return std::vector<Posted>{};
  auto done = std::move(it->second.posted);
  chunks_.erase(it);
  return done;
}

std::vector<Posted> SourceReleases::drop_slot(int slot) {
  std::vector<Posted> done;
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    std::erase(it->second.waiting, slot);
    std::erase_if(it->second.posted, [&](const Posted& p) { return p.slot == slot; });
    if (!it->second.waiting.empty()) {
      ++it;
      continue;
    }
    for (auto& p : it->second.posted) done.push_back(std::move(p));
    it = chunks_.erase(it);
  }
  return done;
}

std::vector<Posted> SourceReleases::take_all() {
  std::vector<Posted> all;
  for (auto& [k, c] : chunks_)
    for (auto& p : c.posted) all.push_back(std::move(p));
  chunks_.clear();
  return all;
}

}  // namespace smddp::daemon
