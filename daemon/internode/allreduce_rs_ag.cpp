// AllReduce and Reduce across nodes: reduce the node's ranks into a staging buffer, then a
// direct reduce-scatter among the daemons (node i owns shard i of the chunk), then an
// all-gather of the reduced shards (Reduce: only to the root's node), then write outputs.
// Every node sends and receives (P-1)/P of the chunk per step, like a ring, in one round.
#include "daemon/executor/host_reduce.hpp"
#include "daemon/internode/op.hpp"

namespace smddp::daemon::internode {

using ipc::OpType;

bool allreduce_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = op.d0();
  const std::uint64_t count = d.chunk_count;
  const std::size_t e = ipc::dtype_size(d.dtype);
  const int P = static_cast<int>(op.nodes.size());
  const auto shard_lo = [&](int i) { return count * static_cast<std::uint64_t>(i) / static_cast<std::uint64_t>(P); };
  const std::uint64_t my_lo = shard_lo(op.me), my_n = shard_lo(op.me + 1) - my_lo;
  // buffers[0..P-1] hold the phase-0 descriptors; the staging buffers follow.
  const std::size_t base = static_cast<std::size_t>(P);
  switch (op.phase) {
    case 1: {
      std::byte* acc = c.buffer(count * e);
      std::vector<const void*> inputs;
      for (int g = 0; g < op.size(); ++g)
        if (c.is_local(g)) inputs.push_back(c.in(g));
      c.reduce(d.dtype, local_reduce_op(d.reduce_op), inputs, acc, count, d.scale);
      for (int j = 0; j < P; ++j) {
        if (j == op.me) continue;
        c.send(j, 0, acc + shard_lo(j) * e, (shard_lo(j + 1) - shard_lo(j)) * e);
        c.recv(j, 0, c.buffer(my_n * e), my_n * e);
      }
      return false;
    }
    case 2: {
      std::byte* acc = op.buffers[base].get();
      std::vector<const void*> inputs;
      std::size_t b = base + 1;
      for (int j = 0; j < P; ++j) inputs.push_back(j == op.me ? acc + my_lo * e : op.buffers[b++].get());
      c.reduce(d.dtype, global_reduce_op(d.reduce_op), inputs, acc + my_lo * e, my_n, 1.0);
      if (d.reduce_op == ipc::ReduceOp::Avg) host_scale(d.dtype, acc + my_lo * e, my_n, 1.0 / op.size());
      const int root_node = d.op == OpType::Reduce ? c.node_index_of(d.root) : -1;
      for (int j = 0; j < P; ++j) {
        if (j == op.me) continue;
        if (root_node < 0 || root_node == j) c.send(j, 1, acc + my_lo * e, my_n * e);
        if (root_node < 0 || root_node == op.me) c.recv(j, 1, acc + shard_lo(j) * e, (shard_lo(j + 1) - shard_lo(j)) * e);
      }
      return false;
    }
    default: {
      const std::byte* acc = op.buffers[base].get();
      if (d.op == OpType::Reduce) {
        if (c.is_local(d.root)) c.copy(c.out(d.root), acc, count * e);
        return true;
      }
      for (int g = 0; g < op.size(); ++g)
        if (c.is_local(g)) c.copy(c.out(g), acc, count * e);
      return true;
    }
  }
}

}  // namespace smddp::daemon::internode
