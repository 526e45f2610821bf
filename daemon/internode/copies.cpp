// The collectives that only move data across nodes: Broadcast (the root's node sends to every
// other node, each node copies to its ranks), AllGather (every node sends its ranks' blocks to
// every other node, received straight into one local output, then copied to the others),
// Gather and Scatter (blocks travel between the root's node and each member's node only).
#include "daemon/internode/op.hpp"

namespace smddp::daemon::internode {

using ipc::OpType;

bool broadcast_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = op.d0();
  const std::uint64_t bytes = d.chunk_count * ipc::dtype_size(d.dtype);
  const int P = static_cast<int>(op.nodes.size()), root_node = c.node_index_of(d.root);
  const int first = c.first_local();
  if (op.phase == 1) {
    if (root_node == op.me) {
      for (int j = 0; j < P; ++j)
        if (j != op.me) c.send(j, 0, c.in(d.root), bytes);
      for (int g = 0; g < op.size(); ++g)
        if (c.is_local(g)) c.copy(c.out(g), c.in(d.root), bytes);
      return false;  // the root's input must stay untouched until the sends completed
    }
    c.recv(root_node, 0, c.out(first), bytes);
    return false;
  }
  if (root_node != op.me)
    for (int g = first + 1; g < op.size(); ++g)
      if (c.is_local(g)) c.copy(c.out(g), c.out(first), bytes);
  return true;
}

bool allgather_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = op.d0();
  const std::uint64_t cb = d.chunk_count * ipc::dtype_size(d.dtype);
  const int n = op.size(), P = static_cast<int>(op.nodes.size());
  const int first = c.first_local();
  if (op.phase == 1) {
    for (int g = 0; g < n; ++g) {
      if (!c.is_local(g)) {
        c.recv(c.node_index_of(g), static_cast<std::uint64_t>(g), c.out(first) + static_cast<std::uint64_t>(g) * cb, cb);
        continue;
      }
      for (int j = 0; j < P; ++j)
        if (j != op.me) c.send(j, static_cast<std::uint64_t>(g), c.in(g), cb);
    }
    return false;
  }
  // Local blocks after the sends completed: an in-place input may sit inside an output.
  for (int g = 0; g < n; ++g)
    if (c.is_local(g)) c.copy(c.out(first) + static_cast<std::uint64_t>(g) * cb, c.in(g), cb);
  int others = 0;
  for (int r = 0; r < n; ++r) others += r != first && c.is_local(r);
  c.pool().parallel_for(n, static_cast<std::uint64_t>(others) * static_cast<std::uint64_t>(n) * cb, [&](int r) {
    if (r != first && c.is_local(r)) c.copy(c.out(r), c.out(first), static_cast<std::uint64_t>(n) * cb);
  });
  return true;
}

bool gather_scatter_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = op.d0();
  const std::uint64_t cb = d.chunk_count * ipc::dtype_size(d.dtype);
  const int n = op.size(), root_node = c.node_index_of(d.root);
  const bool gather = d.op == OpType::Gather;
  if (op.phase > 1) {
    if (gather && root_node == op.me)
      for (int g = 0; g < n; ++g)
        if (c.is_local(g)) c.copy(c.out(d.root) + static_cast<std::uint64_t>(g) * cb, c.in(g), cb);
    return true;
  }
  for (int g = 0; g < n; ++g) {
    const auto off = static_cast<std::uint64_t>(g) * cb;
    if (root_node == op.me) {
      if (c.is_local(g)) {
        if (!gather) c.copy(c.out(g), c.in(d.root) + off, cb);
      } else if (gather) {
        c.recv(c.node_index_of(g), static_cast<std::uint64_t>(g), c.out(d.root) + off, cb);
      } else {
        c.send(c.node_index_of(g), static_cast<std::uint64_t>(g), c.in(d.root) + off, cb);
      }
    } else if (c.is_local(g)) {
      if (gather) c.send(root_node, static_cast<std::uint64_t>(g), c.in(g), cb);
      else c.recv(root_node, static_cast<std::uint64_t>(g), c.out(g), cb);
    }
  }
  return false;
}

}  // namespace smddp::daemon::internode
