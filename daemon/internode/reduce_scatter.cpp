// ReduceScatter across nodes: reduce the node's ranks over all blocks, send each block to the
// node that owns its rank (each daemon owns its ranks' blocks: equal shards, as every node
// has as many ranks), and reduce the received partial blocks into the owners' outputs.
#include "kernels/host/host_reduce.hpp"
#include "daemon/internode/op.hpp"

namespace smddp::daemon::internode {

bool reduce_scatter_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = op.d0();
  const std::uint64_t count = d.chunk_count;  // elements of one block (a rank's output)
  const std::size_t e = ipc::dtype_size(d.dtype);
  const int n = op.size(), P = static_cast<int>(op.nodes.size());
  const std::size_t base = static_cast<std::size_t>(P);
  // Input block r of a rank starts at r * count (the client's chunk sits inside each block).
  if (op.phase == 1) {
    std::byte* acc = c.buffer(static_cast<std::uint64_t>(n) * count * e);
    for (int r = 0; r < n; ++r) {
      std::vector<const void*> inputs;
      for (int g = 0; g < n; ++g)
        if (c.is_local(g)) inputs.push_back(c.in(g) + static_cast<std::uint64_t>(r) * count * e);
      c.reduce(d.dtype, local_reduce_op(d.reduce_op), inputs, acc + static_cast<std::uint64_t>(r) * count * e, count,
               d.scale);
      const int owner = c.node_index_of(r);
      if (owner != op.me) c.send(owner, static_cast<std::uint64_t>(r), acc + static_cast<std::uint64_t>(r) * count * e, count * e);
    }
    for (int r = 0; r < n; ++r) {
      if (!c.is_local(r)) continue;
      for (int j = 0; j < P; ++j)
        if (j != op.me) c.recv(j, static_cast<std::uint64_t>(r), c.buffer(count * e), count * e);
    }
    return false;
  }
  const std::byte* acc = op.buffers[base].get();
  std::size_t b = base + 1;
  for (int r = 0; r < n; ++r) {
    if (!c.is_local(r)) continue;
    std::vector<const void*> inputs;
    for (int j = 0; j < P; ++j)
      inputs.push_back(j == op.me ? static_cast<const void*>(acc + static_cast<std::uint64_t>(r) * count * e)
                                  : op.buffers[b++].get());
    c.reduce(d.dtype, global_reduce_op(d.reduce_op), inputs, c.out(r), count, 1.0);
    if (d.reduce_op == ipc::ReduceOp::Avg) host_kernels::host_scale(d.dtype, c.out(r), count, 1.0 / n);
  }
  return true;
}

}  // namespace smddp::daemon::internode
