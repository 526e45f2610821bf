// AllGather by node segments (a ring or recursive doubling, as op.algorithm says): the blocks
// ordered by node, each node's ranks' blocks being its segment, gathered where every rank's
// output holds them in group-rank order: straight in the first local rank's output when the
// nodes hold consecutive group ranks (the usual case), else in staging, placed at the end.
#include "daemon/internode/segments.hpp"

namespace smddp::daemon::internode {

bool allgather_by_segments_step(Engine::Ctx& c) {
  Op& op = c.op();
  const auto& d = op.d0();
  const std::uint64_t cb = d.chunk_count * ipc::dtype_size(d.dtype);
  const int n = op.size(), first = c.first_local();
  int step = op.phase - 1;
  if (step == 0) {
    auto plan = std::make_shared<SegmentPlan>();
    plan->ag.lo = place_blocks_by_node(c, *plan);
    plan->ag.element = cb;
    plan->ag.buf = plan->places_in_rank_order ? c.out(first) : c.buffer(static_cast<std::uint64_t>(n) * cb);
    // An in-place input already sits at its place in the first rank's output (the copy is then
    // no copy); the other ranks' outputs are written only at the end, after every send.
    for (int g = 0; g < n; ++g)
      if (c.is_local(g)) c.copy(plan->ag.buf + plan->place[static_cast<std::size_t>(g)] * cb, c.in(g), cb);
    op.plan = std::move(plan);
    return false;
  }
  const SegmentPlan& plan = *op.plan;
  step -= 1;
  if (step < all_gather_steps(op.algorithm, node_count(op))) {
    all_gather_step(c, op.algorithm, plan.ag, true, step);
    return false;
  }
  std::byte* out = c.out(first);
  if (!plan.places_in_rank_order)
    for (int g = 0; g < n; ++g) c.copy(out + static_cast<std::uint64_t>(g) * cb, plan.ag.buf + plan.place[static_cast<std::size_t>(g)] * cb, cb);
  int others = 0;
  for (int r = first + 1; r < n; ++r) others += c.is_local(r);
  c.pool().parallel_for(n, static_cast<std::uint64_t>(others) * static_cast<std::uint64_t>(n) * cb, [&](int r) {
    if (r != first && c.is_local(r)) c.copy(c.out(r), out, static_cast<std::uint64_t>(n) * cb);
  });
  return true;
}

}  // namespace smddp::daemon::internode
