// Uneven AllToAll (ipc::kFlagSplits): each member's aux holds n send counts then n receive
// counts, in elements, by group rank. One check and one offset rule for every executor that
// runs it (the host path, the daemon's GPU executor, the plans of the rank-side GPU path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace smddp::daemon {

using SplitTables = std::vector<std::vector<std::int64_t>>;  // by group rank, 2n entries each

// Why the members' tables cannot run (a negative count, a rank sending what its peer does not
// expect, counts that do not add up to a rank's buffers), or nullopt. `in_bytes`/`out_bytes`:
// each member's buffer sizes, by group rank.
inline std::optional<std::string> check_split_tables(const SplitTables& tab, std::uint64_t elem_bytes,
                                                     const std::vector<std::uint64_t>& in_bytes,
                                                     const std::vector<std::uint64_t>& out_bytes) {
  const std::size_t n = tab.size();
  for (std::size_t r = 0; r < n; ++r) {
    std::uint64_t sent = 0, recvd = 0;
    for (std::size_t q = 0; q < n; ++q) {
      if (tab[r][q] < 0 || tab[r][n + q] < 0) return "rank " + std::to_string(r) + " gave a negative split";
      if (tab[r][q] != tab[q][n + r])
        return "alltoall split mismatch: rank " + std::to_string(r) + " sends " + std::to_string(tab[r][q]) +
               " elements to rank " + std::to_string(q) + ", which expects " + std::to_string(tab[q][n + r]);
      sent += static_cast<std::uint64_t>(tab[r][q]);
      recvd += static_cast<std::uint64_t>(tab[r][n + q]);
    }
    if (sent * elem_bytes != in_bytes[r] || recvd * elem_bytes != out_bytes[r])
      return "alltoall splits of rank " + std::to_string(r) + " do not add up to its tensor sizes";
  }
  return std::nullopt;
}

// Elements before rank r's block for rank q in r's input (blocks go in rank order).
inline std::uint64_t send_offset(const SplitTables& tab, std::size_t r, std::size_t q) {
  std::uint64_t off = 0;
  for (std::size_t k = 0; k < q; ++k) off += static_cast<std::uint64_t>(tab[r][k]);
  return off;
}

// Elements before the block from rank q in rank r's output.
inline std::uint64_t recv_offset(const SplitTables& tab, std::size_t r, std::size_t q) {
  std::uint64_t off = 0;
  for (std::size_t k = 0; k < q; ++k) off += static_cast<std::uint64_t>(tab[r][tab.size() + k]);
  return off;
}

}  // namespace smddp::daemon
