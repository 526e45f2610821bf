// AllReduce and Reduce across nodes: reduce the node's ranks into a staging buffer, then a
// direct reduce-scatter among the daemons (node i owns shard i of the chunk), then an
// all-gather of the reduced shards (Reduce: only to the root's node), then write outputs.
// Every node sends and receives (P-1)/P of the chunk per step, like a ring, in one round.
#include "kernels/host/host_reduce.hpp"
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
  int locals = 0;
  for (int g = 0; g < op.size(); ++g) locals += c.is_local(g);
  const int first = c.first_local();
  // AllReduce accumulates in the first local rank's output (no staging, no final copy for
  // it); Reduce in a staging buffer (only the root has an output). With one local rank and no
  // per-input scaling there is nothing to reduce locally: its input is sent as it is.
  const bool allreduce = d.op == OpType::AllReduce;
  const bool direct = allreduce && locals == 1 && d.reduce_op != ipc::ReduceOp::PremulSum;
  // buffers[0..P-1] hold the phase-0 descriptors; the staging buffers follow.
  const std::size_t base = static_cast<std::size_t>(P);
  const std::size_t tmp_base = allreduce ? base : base + 1;
  std::byte* acc = allreduce ? c.out(first) : (op.phase > 1 ? op.buffers[base].get() : nullptr);
  const std::byte* src = direct ? c.in(first) : acc;  // what the reduce-scatter sends
  switch (op.phase) {
    case 1: {
      if (!allreduce) acc = c.buffer(count * e);
      if (!direct) {
        std::vector<const void*> inputs;
        for (int g = 0; g < op.size(); ++g)
          if (c.is_local(g)) inputs.push_back(c.in(g));
        c.reduce(d.dtype, local_reduce_op(d.reduce_op), inputs, acc, count, d.scale);
        src = acc;
      }
      for (int j = 0; j < P; ++j) {
        if (j == op.me) continue;
        c.send(j, 0, src + shard_lo(j) * e, (shard_lo(j + 1) - shard_lo(j)) * e);
        c.recv(j, 0, c.buffer(my_n * e), my_n * e);
      }
      return false;
    }
    case 2: {
      std::vector<const void*> inputs;
      std::size_t b = tmp_base;
      for (int j = 0; j < P; ++j) inputs.push_back(j == op.me ? src + my_lo * e : op.buffers[b++].get());
      c.reduce(d.dtype, global_reduce_op(d.reduce_op), inputs, acc + my_lo * e, my_n, 1.0);
      if (d.reduce_op == ipc::ReduceOp::Avg) host_kernels::host_scale(d.dtype, acc + my_lo * e, my_n, 1.0 / op.size());
      const int root_node = d.op == OpType::Reduce ? c.node_index_of(d.root) : -1;
      for (int j = 0; j < P; ++j) {
        if (j == op.me) continue;
        if (root_node < 0 || root_node == j) c.send(j, 1, acc + my_lo * e, my_n * e);
        if (root_node < 0 || root_node == op.me) c.recv(j, 1, acc + shard_lo(j) * e, (shard_lo(j + 1) - shard_lo(j)) * e);
      }
      return false;
    }
    default: {
      if (!allreduce) {
        if (c.is_local(d.root)) c.copy(c.out(d.root), acc, count * e);
        return true;
      }
      for (int g = first + 1; g < op.size(); ++g)
        if (c.is_local(g)) c.copy(c.out(g), acc, count * e);
      return true;
    }
  }
}

}  // namespace smddp::daemon::internode
