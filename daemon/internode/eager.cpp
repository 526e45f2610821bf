// Small collectives across nodes in one exchange. Their data goes out with the descriptors
// (phase 0) instead of after them: every node sends what the others need of its ranks (their
// sum, their blocks, the root's data), one message per pair of nodes, and each node finishes
// alone once the descriptors agree and the data is in. One network round trip instead of three
// (AllReduce, Reduce: descriptors, reduce-scatter, all-gather) or two (the others). Not for
// uneven AllToAll (its split tables come first) nor Barrier (the descriptors are all it is).
//
// Phase 0 receives only into staging buffers and writes no rank's output: an operation that
// ends in phase 0 (a mismatch, another node's failure notice) may leave messages posted, and
// those must never touch a rank's memory. (A send may read a rank's input: reading harms
// nothing.) Results add the same terms in the same order as the two-step algorithms.
#include <algorithm>

#include "kernels/host/host_reduce.hpp"
#include "daemon/internode/op.hpp"

namespace smddp::daemon::internode {

using ipc::OpType;

namespace {
// buffers[0, P) hold the descriptors; the eager step's staging buffers follow.
std::size_t first_staging(const Op& op) { return op.nodes.size(); }
// Phase 0 runs before the other nodes' descriptors arrived (d0() may not be known yet); once
// they agree, this node's first request describes the operation as well as any.
const ipc::RequestDesc& local_desc(const Op& op) { return op.match.posted.front().desc; }

// Node index -> how many members of the group it holds.
std::vector<std::uint64_t> members_per_node(Engine::Ctx& c) {
  std::vector<std::uint64_t> members(c.op().nodes.size(), 0);
  for (int g = 0; g < c.op().size(); ++g) ++members[static_cast<std::size_t>(c.node_index_of(g))];
  return members;
}

// The other nodes' sums (or partial blocks) with this node's own, in node order: the order in
// which the two-step algorithms add them.
std::vector<const void*> in_node_order(const Op& op, const void* own, std::size_t first_received,
                                       std::uint64_t offset) {
  std::vector<const void*> terms;
  std::size_t b = first_received;
  for (int j = 0; j < static_cast<int>(op.nodes.size()); ++j)
    terms.push_back(j == op.me ? own : op.buffers[b++].get() + offset);
  return terms;
}

// AllReduce and Reduce. Every node (Reduce: every node but the root's) sends its ranks' sum to
// every node that needs the result; those add the sums.
bool allreduce_eager_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = local_desc(op);
  const std::uint64_t count = d.chunk_count;
  const std::size_t bytes = count * ipc::dtype_size(d.dtype);
  const int P = static_cast<int>(op.nodes.size());
  const int root_node = d.op == OpType::Reduce ? c.node_index_of(d.root) : -1;
  const bool needs_result = root_node < 0 || root_node == op.me;
  if (op.phase == 0) {
    std::byte* sum = c.buffer(bytes);
    std::vector<const void*> inputs;
    for (int g = 0; g < op.size(); ++g)
      if (c.is_local(g)) inputs.push_back(c.in(g));
    c.reduce(d.dtype, local_reduce_op(d.reduce_op), inputs, sum, count, d.scale);
    for (int j = 0; j < P; ++j) {
      if (j == op.me) continue;
      if (root_node < 0 || root_node == j) c.send(j, data_sub(bytes), sum, bytes);
      if (needs_result) c.recv(j, data_sub(bytes), c.buffer(bytes), bytes);
    }
    return false;
  }
  if (!needs_result) return true;
  const int first = c.first_local();
  std::byte* out = c.out(root_node < 0 ? first : d.root);
  const std::size_t mine = first_staging(op);
  c.reduce(d.dtype, global_reduce_op(d.reduce_op), in_node_order(op, op.buffers[mine].get(), mine + 1, 0), out, count,
           1.0);
  if (d.reduce_op == ipc::ReduceOp::Avg) host_kernels::host_scale(d.dtype, out, count, 1.0 / op.size());
  if (root_node < 0)
    for (int g = first + 1; g < op.size(); ++g)
      if (c.is_local(g)) c.copy(c.out(g), out, bytes);
  return true;
}

// ReduceScatter. Each node sums its ranks' whole inputs, sends every other node the blocks of
// that node's ranks (in group-rank order, one message), and adds what it receives for its own.
bool reduce_scatter_eager_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = local_desc(op);
  const std::uint64_t count = d.chunk_count;  // elements of one block (a rank's output)
  const std::size_t cb = count * ipc::dtype_size(d.dtype);
  const int n = op.size(), P = static_cast<int>(op.nodes.size());
  const auto members = members_per_node(c);
  const std::size_t acc_at = first_staging(op), received_at = acc_at + 1;
  if (op.phase == 0) {
    // One chunk: block r of every input starts at r * count, so the blocks sum as one run.
    std::byte* acc = c.buffer(static_cast<std::uint64_t>(n) * cb);
    std::vector<const void*> inputs;
    for (int g = 0; g < n; ++g)
      if (c.is_local(g)) inputs.push_back(c.in(g));
    c.reduce(d.dtype, local_reduce_op(d.reduce_op), inputs, acc, static_cast<std::uint64_t>(n) * count, d.scale);
    const std::size_t to_me = members[static_cast<std::size_t>(op.me)] * cb;
    for (int j = 0; j < P; ++j)
      if (j != op.me) c.recv(j, data_sub(to_me), c.buffer(to_me), to_me);
    for (int j = 0; j < P; ++j) {
      if (j == op.me) continue;
      const std::size_t to_j = members[static_cast<std::size_t>(j)] * cb;
      std::byte* blocks = c.buffer(to_j);
      std::byte* at = blocks;
      for (int r = 0; r < n; ++r)
        if (c.node_index_of(r) == j) {
          c.copy(at, acc + static_cast<std::uint64_t>(r) * cb, cb);
          at += cb;
        }
      c.send(j, data_sub(to_j), blocks, to_j);
    }
    return false;
  }
  const std::byte* acc = op.buffers[acc_at].get();
  std::uint64_t nth = 0;  // this rank's place among the node's ranks: its block in each message
  for (int r = 0; r < n; ++r) {
    if (!c.is_local(r)) continue;
    c.reduce(d.dtype, global_reduce_op(d.reduce_op), in_node_order(op, acc + static_cast<std::uint64_t>(r) * cb, received_at, nth * cb),
             c.out(r), count, 1.0);
    if (d.reduce_op == ipc::ReduceOp::Avg) host_kernels::host_scale(d.dtype, c.out(r), count, 1.0 / n);
    ++nth;
  }
  return true;
}

// Broadcast. The root's node sends the root's data to every other node; every node copies it
// to its ranks' outputs once the descriptors agree.
bool broadcast_eager_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = local_desc(op);
  const std::size_t bytes = d.chunk_count * ipc::dtype_size(d.dtype);
  const int P = static_cast<int>(op.nodes.size()), root_node = c.node_index_of(d.root);
  if (op.phase == 0) {
    if (root_node == op.me) {
      for (int j = 0; j < P; ++j)
        if (j != op.me) c.send(j, data_sub(bytes), c.in(d.root), bytes);
    } else {
      c.recv(root_node, data_sub(bytes), c.buffer(bytes), bytes);
    }
    return false;
  }
  // The root's input is read only now that its sends are done (it may be its own output).
  const std::byte* data = root_node == op.me ? c.in(d.root) : op.buffers[first_staging(op)].get();
  for (int g = 0; g < op.size(); ++g)
    if (c.is_local(g)) c.copy(c.out(g), data, bytes);
  return true;
}

// AllGather. Each node sends its ranks' blocks (in group-rank order, one message) to every
// other node and places every node's blocks.
bool allgather_eager_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = local_desc(op);
  const std::uint64_t cb = d.chunk_count * ipc::dtype_size(d.dtype);
  const int n = op.size(), P = static_cast<int>(op.nodes.size());
  const auto members = members_per_node(c);
  const std::size_t mine = first_staging(op);
  if (op.phase == 0) {
    // This node's blocks in group-rank order, as the receivers place them.
    std::byte* blocks = c.buffer(members[static_cast<std::size_t>(op.me)] * cb);
    std::byte* at = blocks;
    for (int g = 0; g < n; ++g)
      if (c.is_local(g)) {
        c.copy(at, c.in(g), cb);
        at += cb;
      }
    for (int j = 0; j < P; ++j) {
      if (j == op.me) continue;
      const std::size_t to_j = members[static_cast<std::size_t>(op.me)] * cb;
      const std::size_t from_j = members[static_cast<std::size_t>(j)] * cb;
      c.send(j, data_sub(to_j), blocks, to_j);
      c.recv(j, data_sub(from_j), c.buffer(from_j), from_j);
    }
    return false;
  }
  // Node j's blocks, in group-rank order: where each lands in the output.
  std::vector<const std::byte*> next;
  for (const void* blocks : in_node_order(op, op.buffers[mine].get(), mine + 1, 0))
    next.push_back(static_cast<const std::byte*>(blocks));
  const int first = c.first_local();
  std::byte* out = c.out(first);
  for (int g = 0; g < n; ++g) {
    auto& from = next[static_cast<std::size_t>(c.node_index_of(g))];
    c.copy(out + static_cast<std::uint64_t>(g) * cb, from, cb);
    from += cb;
  }
  for (int g = first + 1; g < n; ++g)
    if (c.is_local(g)) c.copy(c.out(g), out, static_cast<std::uint64_t>(n) * cb);
  return true;
}

// Gather and Scatter. Gather: every other node sends its ranks' blocks (in group-rank order, one
// message) to the root's node, which places them. Scatter: the root's node sends every other
// node the blocks of its ranks, which copy theirs.
bool gather_scatter_eager_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = local_desc(op);
  const std::uint64_t cb = d.chunk_count * ipc::dtype_size(d.dtype);
  const int n = op.size(), P = static_cast<int>(op.nodes.size()), root_node = c.node_index_of(d.root);
  const bool gather = d.op == OpType::Gather, at_root = root_node == op.me;
  const auto members = members_per_node(c);
  const std::size_t first = first_staging(op);
  if (op.phase == 0) {
    if (gather && !at_root) {
      const std::size_t to_root = members[static_cast<std::size_t>(op.me)] * cb;
      std::byte* blocks = c.buffer(to_root);
      std::byte* at = blocks;
      for (int g = 0; g < n; ++g)
        if (c.is_local(g)) {
          c.copy(at, c.in(g), cb);
          at += cb;
        }
      c.send(root_node, data_sub(to_root), blocks, to_root);
    } else if (gather) {
      for (int j = 0; j < P; ++j) {
        if (j == op.me) continue;
        const std::size_t from_j = members[static_cast<std::size_t>(j)] * cb;
        c.recv(j, data_sub(from_j), c.buffer(from_j), from_j);
      }
    } else if (at_root) {
      for (int j = 0; j < P; ++j) {
        if (j == op.me) continue;
        const std::size_t to_j = members[static_cast<std::size_t>(j)] * cb;
        std::byte* blocks = c.buffer(to_j);
        std::byte* at = blocks;
        for (int g = 0; g < n; ++g)
          if (c.node_index_of(g) == j) {
            c.copy(at, c.in(d.root) + static_cast<std::uint64_t>(g) * cb, cb);
            at += cb;
          }
        c.send(j, data_sub(to_j), blocks, to_j);
      }
    } else {
      const std::size_t to_me = members[static_cast<std::size_t>(op.me)] * cb;
      c.recv(root_node, data_sub(to_me), c.buffer(to_me), to_me);
    }
    return false;
  }
  if (gather) {
    if (!at_root) return true;
    std::vector<const std::byte*> next(static_cast<std::size_t>(P), nullptr);
    std::size_t b = first;
    for (int j = 0; j < P; ++j)
      if (j != op.me) next[static_cast<std::size_t>(j)] = op.buffers[b++].get();
    std::byte* out = c.out(d.root);
    for (int g = 0; g < n; ++g) {
      const int j = c.node_index_of(g);
      if (j == op.me) {
        c.copy(out + static_cast<std::uint64_t>(g) * cb, c.in(g), cb);
      } else {
        c.copy(out + static_cast<std::uint64_t>(g) * cb, next[static_cast<std::size_t>(j)], cb);
        next[static_cast<std::size_t>(j)] += cb;
      }
    }
    return true;
  }
  const std::byte* mine = at_root ? nullptr : op.buffers[first].get();
  for (int g = 0; g < n; ++g) {
    if (!c.is_local(g)) continue;
    if (at_root) {
      c.copy(c.out(g), c.in(d.root) + static_cast<std::uint64_t>(g) * cb, cb);
    } else {
      c.copy(c.out(g), mine, cb);
      mine += cb;
    }
  }
  return true;
}

// AllToAll with even splits. Each node sends every other node one message: for each of its
// ranks q (group-rank order), q's blocks for that node's ranks r (group-rank order).
bool alltoall_eager_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = local_desc(op);
  const std::uint64_t cb = d.chunk_count * ipc::dtype_size(d.dtype);
  const int n = op.size(), P = static_cast<int>(op.nodes.size());
  const auto members = members_per_node(c);
  const std::uint64_t here = members[static_cast<std::size_t>(op.me)];
  const std::size_t first = first_staging(op);
  if (op.phase == 0) {
    for (int j = 0; j < P; ++j)
      if (j != op.me) {
        const std::size_t from_j = members[static_cast<std::size_t>(j)] * here * cb;
        c.recv(j, data_sub(from_j), c.buffer(from_j), from_j);
      }
    for (int j = 0; j < P; ++j) {
      if (j == op.me) continue;
      const std::size_t to_j = here * members[static_cast<std::size_t>(j)] * cb;
      std::byte* blocks = c.buffer(to_j);
      std::byte* at = blocks;
      for (int q = 0; q < n; ++q) {
        if (!c.is_local(q)) continue;
        for (int r = 0; r < n; ++r)
          if (c.node_index_of(r) == j) {
            c.copy(at, c.in(q) + static_cast<std::uint64_t>(r) * cb, cb);
            at += cb;
          }
      }
      c.send(j, data_sub(to_j), blocks, to_j);
    }
    return false;
  }
  // From node j: for each of j's ranks q, a block for each of ours r.
  std::size_t b = first;
  for (int j = 0; j < P; ++j) {
    if (j == op.me) continue;
    const std::byte* from = op.buffers[b++].get();
    for (int q = 0; q < n; ++q) {
      if (c.node_index_of(q) != j) continue;
      for (int r = 0; r < n; ++r)
        if (c.is_local(r)) {
          c.copy(c.out(r) + static_cast<std::uint64_t>(q) * cb, from, cb);
          from += cb;
        }
    }
  }
  // Blocks within the node last, as the two-step form (an in-place input may sit in an output).
  for (int q = 0; q < n; ++q)
    for (int r = 0; r < n; ++r)
      if (c.is_local(q) && c.is_local(r))
        c.copy(c.out(r) + static_cast<std::uint64_t>(q) * cb, c.in(q) + static_cast<std::uint64_t>(r) * cb, cb);
  return true;
}

}  // namespace

bool sends_eagerly(Engine::Ctx& c) {
  const Op& op = c.op();
  const auto& d = local_desc(op);
  if (d.chunk_offset != 0 || d.chunk_count != d.count) return false;  // pipelined: large
  const std::uint64_t cb = d.count * ipc::dtype_size(d.dtype), P = op.nodes.size();
  const auto members = members_per_node(c);
  const std::uint64_t most = *std::max_element(members.begin(), members.end());
  // The largest data message, and the most data any one node sends in all (every node decides
  // alike from the same descriptors).
  std::uint64_t message = 0, sent = 0;
  switch (d.op) {
    case OpType::AllReduce: message = cb, sent = (P - 1) * message; break;
    case OpType::Reduce: message = cb, sent = message; break;            // to the root's node only
    case OpType::Broadcast: message = cb, sent = (P - 1) * message; break;  // from the root's node
    case OpType::AllGather:
    case OpType::ReduceScatter: message = most * cb, sent = (P - 1) * message; break;  // a node's blocks
    case OpType::Gather: message = most * cb, sent = message; break;                   // to the root's node
    case OpType::Scatter: message = most * cb, sent = (P - 1) * message; break;        // from the root's node
    case OpType::AllToAll:  // even splits only: uneven ones exchange their tables first
      if (d.flags & ipc::kFlagSplits) return false;
      message = most * most * cb, sent = (P - 1) * message;
      break;
    default: return false;
  }
  return message <= kEagerMessageBytes && sent <= kEagerBytes;
}

bool eager_step(Engine::Ctx& c) {
  switch (local_desc(c.op()).op) {
    case OpType::AllReduce:
    case OpType::Reduce: return allreduce_eager_step(c);
    case OpType::ReduceScatter: return reduce_scatter_eager_step(c);
    case OpType::Broadcast: return broadcast_eager_step(c);
    case OpType::AllGather: return allgather_eager_step(c);
    case OpType::Gather:
    case OpType::Scatter: return gather_scatter_eager_step(c);
    case OpType::AllToAll: return alltoall_eager_step(c);
    default: throw std::logic_error(std::string(ipc::to_string(local_desc(c.op()).op)) + " has no eager form");
  }
}

}  // namespace smddp::daemon::internode
