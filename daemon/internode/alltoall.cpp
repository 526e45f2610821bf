// AllToAll across nodes: every block whose sender and receiver live on different nodes
// travels as its own message, straight from the sender's arena into the receiver's; blocks
// within a node are copied. Uneven splits: the daemons first exchange their ranks' split
// tables, so every node checks the same global table and fails alike on a contradiction.
#include <cstring>

#include "daemon/internode/op.hpp"

namespace smddp::daemon::internode {

bool alltoall_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = op.d0();
  const std::size_t e = ipc::dtype_size(d.dtype);
  const int n = op.size(), P = static_cast<int>(op.nodes.size());
  const auto un = static_cast<std::size_t>(n);
  const bool uneven = d.flags & ipc::kFlagSplits;
  const std::size_t base = static_cast<std::size_t>(P);

  if (uneven && op.phase == 1) {
    // Tables: per member 2n int64 (send counts, then receive counts), read from its aux.
    const std::size_t table_bytes = 2 * un * sizeof(std::int64_t);
    int local = 0;
    for (int g = 0; g < n; ++g) local += c.is_local(g);
    std::byte* mine = c.buffer(static_cast<std::size_t>(local) * table_bytes);
    std::byte* at = mine;
    for (int g = 0; g < n; ++g) {
      if (!c.is_local(g)) continue;
      const Posted& p = *op.local[static_cast<std::size_t>(g)];
      std::memcpy(at, c.in(g) - p.desc.input.offset + p.desc.aux.offset, table_bytes);
      at += table_bytes;
    }
    for (int j = 0; j < P; ++j) {
      if (j == op.me) continue;
      int members = 0;
      for (int g = 0; g < n; ++g) members += c.node_index_of(g) == j;
      c.send(j, 0, mine, static_cast<std::size_t>(local) * table_bytes);
      c.recv(j, 0, c.buffer(static_cast<std::size_t>(members) * table_bytes), static_cast<std::size_t>(members) * table_bytes);
    }
    return false;
  }

  const int data_phase = uneven ? 2 : 1;
  if (op.phase == data_phase) {
    // tab[q][r]: elements q sends to r.
    std::vector<std::vector<std::int64_t>> tab(un);
    if (uneven) {
      std::vector<const std::int64_t*> next(static_cast<std::size_t>(P), nullptr);
      std::size_t b = base + 1;  // buffers[base] holds this node's tables, then one per other node
      for (int j = 0; j < P; ++j)
        next[static_cast<std::size_t>(j)] = reinterpret_cast<const std::int64_t*>(op.buffers[j == op.me ? base : b++].get());
      for (int g = 0; g < n; ++g) {
        auto& src = next[static_cast<std::size_t>(c.node_index_of(g))];
        tab[static_cast<std::size_t>(g)].assign(src, src + 2 * un);
        src += 2 * un;
      }
      for (std::size_t r = 0; r < un; ++r) {
        std::uint64_t sent = 0, recvd = 0;
        for (std::size_t q = 0; q < un; ++q) {
          if (tab[r][q] < 0 || tab[r][un + q] < 0) {
            c.fail(ipc::Status::Mismatch, "rank " + std::to_string(r) + " gave a negative split");
            return true;
          }
          if (tab[r][q] != tab[q][un + r]) {
            c.fail(ipc::Status::Mismatch, "alltoall split mismatch: rank " + std::to_string(r) + " sends " +
                                              std::to_string(tab[r][q]) + " elements to rank " + std::to_string(q) +
                                              ", which expects " + std::to_string(tab[q][un + r]));
            return true;
          }
          sent += static_cast<std::uint64_t>(tab[r][q]);
          recvd += static_cast<std::uint64_t>(tab[r][un + q]);
        }
        if (sent * e != op.descs[r].input.bytes || recvd * e != op.descs[r].output.bytes) {
          c.fail(ipc::Status::Mismatch, "alltoall splits of rank " + std::to_string(r) + " do not add up to its tensor sizes");
          return true;
        }
      }
    } else {
      for (auto& row : tab) row.assign(un, static_cast<std::int64_t>(d.chunk_count));
    }
    // Offsets: q's block for r starts at sum_{k<r} tab[q][k] in q's input; in r's output, q's
    // block starts at sum_{k<q} tab[k][r].
    const auto src_off = [&](std::size_t q, std::size_t r) {
      std::uint64_t o = 0;
      for (std::size_t k = 0; k < r; ++k) o += static_cast<std::uint64_t>(tab[q][k]);
      return o * e;
    };
    const auto dst_off = [&](std::size_t r, std::size_t q) {
      std::uint64_t o = 0;
      for (std::size_t k = 0; k < q; ++k) o += static_cast<std::uint64_t>(tab[k][r]);
      return o * e;
    };
    for (std::size_t q = 0; q < un; ++q) {
      for (std::size_t r = 0; r < un; ++r) {
        const bool ql = c.is_local(static_cast<int>(q)), rl = c.is_local(static_cast<int>(r));
        const auto len = static_cast<std::uint64_t>(tab[q][r]) * e;
        const std::uint64_t sub = q * un + r;
        if (ql && rl) continue;  // copied after the sends completed (in-place inputs)
        if (ql) c.send(c.node_index_of(static_cast<int>(r)), sub, c.in(static_cast<int>(q)) + src_off(q, r), len);
        if (rl) c.recv(c.node_index_of(static_cast<int>(q)), sub, c.out(static_cast<int>(r)) + dst_off(r, q), len);
      }
    }
    op.splits = std::move(tab);
    return false;
  }
  // Local blocks last.
  const auto& tab = op.splits;
  for (std::size_t q = 0; q < un; ++q) {
    if (!c.is_local(static_cast<int>(q))) continue;
    for (std::size_t r = 0; r < un; ++r) {
      if (!c.is_local(static_cast<int>(r))) continue;
      std::uint64_t so = 0, dof = 0;
      for (std::size_t k = 0; k < r; ++k) so += static_cast<std::uint64_t>(tab[q][k]);
      for (std::size_t k = 0; k < q; ++k) dof += static_cast<std::uint64_t>(tab[k][r]);
      c.copy(c.out(static_cast<int>(r)) + dof * e, c.in(static_cast<int>(q)) + so * e, static_cast<std::uint64_t>(tab[q][r]) * e);
    }
  }
  return true;
}

}  // namespace smddp::daemon::internode
