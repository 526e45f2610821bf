// Small AllReduce and AllGather across nodes in one exchange. Their data goes out with the
// descriptors (phase 0) instead of after them: every node sends what it holds (its ranks' sum,
// or its ranks' blocks) to every other node, and each node finishes alone once the descriptors
// agree and the data is in. One network round trip instead of three (AllReduce: descriptors,
// reduce-scatter, all-gather) or two (AllGather).
//
// Phase 0 copies the ranks' inputs into staging buffers and receives only into staging buffers:
// an operation that ends in phase 0 (a mismatch, another node's failure notice) may leave
// messages posted, and those must never touch a rank's memory.
#include <algorithm>

#include "daemon/executor/host_reduce.hpp"
#include "daemon/internode/op.hpp"

namespace smddp::daemon::internode {

using ipc::OpType;

namespace {
// buffers[0, P) hold the descriptors; this node's data follows, then each other node's, in
// node order.
std::size_t mine(const Op& op) { return op.nodes.size(); }
// Phase 0 runs before the other nodes' descriptors arrived (d0() may not be known yet); once
// they agree, this node's first request describes the operation as well as any.
const ipc::RequestDesc& local_desc(const Op& op) { return op.match.posted.front().desc; }
}  // namespace

bool sends_eagerly(Engine::Ctx& c) {
  const Op& op = c.op();
  const auto& d = local_desc(op);
  if (d.chunk_offset != 0 || d.chunk_count != d.count) return false;  // pipelined: large
  const std::uint64_t e = ipc::dtype_size(d.dtype), P = op.nodes.size();
  std::uint64_t message = 0;  // the largest data message any node sends
  if (d.op == OpType::AllReduce) {
    message = d.count * e;  // a node's sum
  } else if (d.op == OpType::AllGather) {
    std::vector<std::uint64_t> members(P, 0);
    for (int g = 0; g < op.size(); ++g) ++members[static_cast<std::size_t>(c.node_index_of(g))];
    message = *std::max_element(members.begin(), members.end()) * d.count * e;  // a node's blocks
  } else {
    return false;
  }
  return message <= kEagerMessageBytes && message * (P - 1) <= kEagerBytes;
}

bool allreduce_eager_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = local_desc(op);
  const std::uint64_t count = d.chunk_count;
  const std::size_t bytes = count * ipc::dtype_size(d.dtype);
  const int P = static_cast<int>(op.nodes.size());
  if (op.phase == 0) {
    std::byte* sum = c.buffer(bytes);
    std::vector<const void*> inputs;
    for (int g = 0; g < op.size(); ++g)
      if (c.is_local(g)) inputs.push_back(c.in(g));
    c.reduce(d.dtype, local_reduce_op(d.reduce_op), inputs, sum, count, d.scale);
    for (int j = 0; j < P; ++j) {
      if (j == op.me) continue;
      c.send(j, data_sub(bytes), sum, bytes);
      c.recv(j, data_sub(bytes), c.buffer(bytes), bytes);
    }
    return false;
  }
  // Every node adds the same sums in node order: the same result everywhere, and the same as the
  // reduce-scatter's (allreduce_rs_ag.cpp adds its shards in that order too).
  std::vector<const void*> sums;
  std::size_t b = mine(op) + 1;
  for (int j = 0; j < P; ++j) sums.push_back(op.buffers[j == op.me ? mine(op) : b++].get());
  const int first = c.first_local();
  std::byte* out = c.out(first);
  c.reduce(d.dtype, global_reduce_op(d.reduce_op), sums, out, count, 1.0);
  if (d.reduce_op == ipc::ReduceOp::Avg) host_scale(d.dtype, out, count, 1.0 / op.size());
  for (int g = first + 1; g < op.size(); ++g)
    if (c.is_local(g)) c.copy(c.out(g), out, bytes);
  return true;
}

bool allgather_eager_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = local_desc(op);
  const std::uint64_t cb = d.chunk_count * ipc::dtype_size(d.dtype);
  const int n = op.size(), P = static_cast<int>(op.nodes.size());
  std::vector<std::uint64_t> members(static_cast<std::size_t>(P), 0);
  for (int g = 0; g < n; ++g) ++members[static_cast<std::size_t>(c.node_index_of(g))];
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
  std::vector<const std::byte*> next(static_cast<std::size_t>(P));
  std::size_t b = mine(op) + 1;
  for (int j = 0; j < P; ++j) next[static_cast<std::size_t>(j)] = op.buffers[j == op.me ? mine(op) : b++].get();
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

}  // namespace smddp::daemon::internode
