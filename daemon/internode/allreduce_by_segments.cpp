// AllReduce and Reduce by node segments (a ring or recursive halving/doubling, as op.algorithm
// says): reduce the node's ranks, a reduce-scatter among the nodes leaves each node its segment
// (1/P of the chunk) reduced over every node, which it scales (AVG) and rounds; an all-gather then
// gives every node every segment (Reduce: each node sends its segment to the root's node alone).
// Each element is reduced at one node only and copied from there: every node gets the same bits.
// Half types add their partial sums in float32 across the nodes and round once, at the owner.
#include "daemon/internode/segments.hpp"

namespace smddp::daemon::internode {

using ipc::OpType;

namespace {

// The local step: the node's contribution, the buffers, the segments.
SegmentPlan plan_allreduce(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = op.d0();
  const std::uint64_t count = d.chunk_count;
  const std::size_t e = ipc::dtype_size(d.dtype);
  const int P = node_count(op), first = c.first_local();
  int locals = 0;
  for (int g = 0; g < op.size(); ++g) locals += c.is_local(g);
  SegmentPlan plan;
  // AllReduce gathers the result in the first local rank's output; Reduce in staging (only the
  // root has an output).
  plan.result = d.op == OpType::AllReduce ? c.out(first) : c.buffer(count * e);
  // One local rank and no per-input scaling: its input is the node's contribution as it is.
  const std::byte* contribution = c.in(first);
  if (locals > 1 || d.reduce_op == ipc::ReduceOp::PremulSum) {
    std::vector<const void*> inputs;
    for (int g = 0; g < op.size(); ++g)
      if (c.is_local(g)) inputs.push_back(c.in(g));
    c.reduce(d.dtype, local_reduce_op(d.reduce_op), inputs, plan.result, count, d.scale);
    contribution = plan.result;
  }
  auto& rs = plan.rs;
  for (int j = 0; j <= P; ++j) rs.lo.push_back(count * static_cast<std::uint64_t>(j) / static_cast<std::uint64_t>(P));
  rs.op = global_reduce_op(d.reduce_op);
  rs.dtype = partial_dtype(d.dtype);
  if (rs.dtype != d.dtype) {
    plan.widened = c.buffer(count * sizeof(float));
    widen(c, d.dtype, contribution, plan.widened, count);
    rs.src = rs.out = plan.widened;
  } else {
    rs.src = contribution;
    rs.out = plan.result;
  }
  const std::uint64_t most = largest_receive(op.algorithm, rs.lo, op.me) * ipc::dtype_size(rs.dtype);
  for (auto& r : rs.received) r = c.buffer(most);
  plan.ag = {rs.lo, e, plan.result};
  return plan;
}

// Reduce: every node that holds reduced segments sends them to the root's node.
void send_to_root(Engine::Ctx& c, const SegmentPlan& plan) {
  const Op& op = c.op();
  const int root_node = c.node_index_of(op.d0().root);
  const std::uint64_t e = plan.ag.element;
  if (op.me != root_node) return send_range(c, root_node, plan.result, reduce_scatter_result(op.algorithm, plan.ag.lo, op.me), e);
  for (int j = 0; j < node_count(op); ++j)
    if (j != op.me) recv_range(c, j, plan.result, reduce_scatter_result(op.algorithm, plan.ag.lo, j), e);
}

}  // namespace

bool allreduce_by_segments_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = op.d0();
  const int P = node_count(op);
  int step = op.phase - 1;
  if (step == 0) {
    op.plan = std::make_shared<SegmentPlan>(plan_allreduce(c));
    return false;
  }
  const SegmentPlan& plan = *op.plan;
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
  step -= 1;
  const std::uint64_t bytes = d.chunk_count * plan.ag.element;
  if (d.op == OpType::Reduce) {
    if (step == 0) {
      send_to_root(c, plan);
      return false;
    }
    if (c.is_local(d.root)) c.copy(c.out(d.root), plan.result, bytes);
    return true;
  }
  if (step < all_gather_steps(op.algorithm, P)) {
    all_gather_step(c, op.algorithm, plan.ag, false, step);
    return false;
  }
  for (int g = c.first_local() + 1; g < op.size(); ++g)
    if (c.is_local(g)) c.copy(c.out(g), plan.result, bytes);
  return true;
}

}  // namespace smddp::daemon::internode
