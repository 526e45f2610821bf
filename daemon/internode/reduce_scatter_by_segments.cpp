// ReduceScatter by node segments (a ring or recursive halving/doubling, as op.algorithm says):
// reduce the node's ranks over every block, with the blocks ordered by node so that each node's
// ranks' blocks form its segment; a reduce-scatter among the nodes leaves each node its segment
// reduced over every node; scale (AVG), round, and copy each block to its rank's output.
// Half types add their partial sums in float32 across the nodes and round once, at the owner.
#include "daemon/internode/segments.hpp"

namespace smddp::daemon::internode {

namespace {

// The local step: every block's sum over the node's ranks at the block's place, the buffers,
// the segments.
SegmentPlan plan_reduce_scatter(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = op.d0();
  const std::uint64_t count = d.chunk_count;  // elements of one block (a rank's output)
  const std::size_t e = ipc::dtype_size(d.dtype);
  const int n = op.size();
  SegmentPlan plan;
  const std::vector<std::uint64_t> blocks = place_blocks_by_node(c, plan);
  plan.result = c.buffer(static_cast<std::uint64_t>(n) * count * e);
  std::vector<const void*> inputs;
  for (int g = 0; g < n; ++g)
    if (c.is_local(g)) inputs.push_back(c.in(g));
  // Input block r of a rank starts at r * count (the client's chunk sits inside each block).
  if (plan.places_in_rank_order) {
    c.reduce(d.dtype, local_reduce_op(d.reduce_op), inputs, plan.result, static_cast<std::uint64_t>(n) * count, d.scale);
  } else {
    for (int r = 0; r < n; ++r) {
      std::vector<const void*> block;
      for (const void* in : inputs) block.push_back(static_cast<const std::byte*>(in) + static_cast<std::uint64_t>(r) * count * e);
      c.reduce(d.dtype, local_reduce_op(d.reduce_op), block, plan.result + plan.place[static_cast<std::size_t>(r)] * count * e,
               count, d.scale);
    }
  }
  auto& rs = plan.rs;
  for (const std::uint64_t b : blocks) rs.lo.push_back(b * count);
  rs.op = global_reduce_op(d.reduce_op);
  rs.dtype = partial_dtype(d.dtype);
  if (rs.dtype != d.dtype) {
    plan.widened = c.buffer(static_cast<std::uint64_t>(n) * count * sizeof(float));
    widen(c, d.dtype, plan.result, plan.widened, static_cast<std::uint64_t>(n) * count);
    rs.src = rs.out = plan.widened;
  } else {
    rs.src = rs.out = plan.result;
  }
  const std::uint64_t most = largest_receive(op.algorithm, rs.lo, op.me) * ipc::dtype_size(rs.dtype);
  for (auto& r : rs.received) r = c.buffer(most);
  return plan;
}

}  // namespace

bool reduce_scatter_by_segments_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = op.d0();
  const int P = node_count(op);
  int step = op.phase - 1;
  if (step == 0) {
    op.plan = std::make_shared<SegmentPlan>(plan_reduce_scatter(c));
    return false;
  }
  const SegmentPlan& plan = *op.plan;
  const std::size_t e = ipc::dtype_size(d.dtype);
  step -= 1;
  if (step < reduce_scatter_steps(op.algorithm, P)) {
    reduce_scatter_step(c, op.algorithm, plan.rs, step);
    return false;
  }
  step -= reduce_scatter_steps(op.algorithm, P);
  if (step == 0) {
    finish_result(c, plan, d.dtype, d.reduce_op, reduce_scatter_result(op.algorithm, plan.rs.lo, op.me));
    return false;
  }
  if (step == 1) {
    hand_over_segments(c, op.algorithm, plan.rs.lo, plan.result, e);
    return false;
  }
  const std::uint64_t cb = d.chunk_count * e;
  for (int r = 0; r < op.size(); ++r)
    if (c.is_local(r)) c.copy(c.out(r), plan.result + plan.place[static_cast<std::size_t>(r)] * cb, cb);
  return true;
}

}  // namespace smddp::daemon::internode
