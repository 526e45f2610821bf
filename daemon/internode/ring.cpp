// Ring reduce-scatter and all-gather among the nodes (NCCL's and Gloo's rings): node i sends
// only to its successor i + 1 and receives only from its predecessor i - 1, one segment (about
// 1/P of the chunk) per step. P - 1 steps each: more rounds than the direct exchange, but one
// message per node per round, each between neighbours.
#include <algorithm>

#include "daemon/internode/segments.hpp"

namespace smddp::daemon::internode {

namespace {
int wrap(int k, int P) { return (k % P + P) % P; }
}  // namespace

// Step s < P - 1: node i receives segment i - s - 2 from its predecessor, adds its own
// contribution to segment i - s - 1 (received in step s - 1) and passes that sum on (at step 0:
// its contribution alone). Step P - 1 only adds: segment i, the last to arrive, is then reduced
// over every node, at node i alone.
void ring_reduce_scatter(Engine::Ctx& c, const ReduceScatterData& d, int step) {
  const int P = node_count(c.op()), me = c.op().me;
  const int next = wrap(me + 1, P), prev = wrap(me - 1, P);
  const std::uint64_t e = ipc::dtype_size(d.dtype);
  // Posted before the addition, into the other buffer: the predecessor's data may land meanwhile.
  if (step < P - 1) recv_range_into(c, prev, d.received[static_cast<std::size_t>(step % 2)], segment(d.lo, wrap(me - step - 2, P)), e);
  const Range passed = segment(d.lo, wrap(me - step - 1, P));
  if (step > 0) add_received(c, d, passed, d.src, d.received[static_cast<std::size_t>((step - 1) % 2)]);
  if (step < P - 1) send_range(c, next, step == 0 ? d.src : d.out, passed, e);
}

// Step s: node i passes segment i - s on (its own at step 0, then the one it received in step
// s - 1) and receives segment i - s - 1 straight into its place.
void ring_all_gather(Engine::Ctx& c, const AllGatherData& d, int step) {
  const int P = node_count(c.op()), me = c.op().me;
  recv_range(c, wrap(me - 1, P), d.buf, segment(d.lo, wrap(me - step - 1, P)), d.element);
  send_range(c, wrap(me + 1, P), d.buf, segment(d.lo, wrap(me - step, P)), d.element);
}

std::uint64_t ring_largest_receive(const std::vector<std::uint64_t>& lo) {
  std::uint64_t most = 0;
  for (std::size_t j = 0; j + 1 < lo.size(); ++j) most = std::max(most, lo[j + 1] - lo[j]);
  return most;
}

}  // namespace smddp::daemon::internode
