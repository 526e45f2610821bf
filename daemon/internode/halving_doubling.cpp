// Recursive halving then recursive doubling among the nodes (Rabenseifner's AllReduce; Gloo's
// halving-doubling, MPICH's reduce-scatter and all-gather): log2 P exchanges each, in exchange k
// a node trading with the node whose index differs in one bit. Halving sends half of what the
// node holds and adds what arrives for the other half; doubling sends all it holds and receives
// as much. As many bytes as the ring, in log2 P rounds instead of P - 1.
//
// Where P is not a power of two (P2 the largest power of two below it, r = P - P2), the first 2r
// nodes fold in pairs, as MPICH does: node 2t hands its data to node 2t + 1 first (one more
// round, and the whole chunk once more over that pair), sits the exchanges out and receives the
// result at the end. The P2 others exchange under indices v: node 2v + 1 for v < r, node v + r
// after. Block v is the segments of the nodes v stands for, in node order, so every node still
// ends its reduce-scatter next to its own segment (hand_over_segments gives it over).
#include "daemon/internode/segments.hpp"

namespace smddp::daemon::internode {

Fold::Fold(int nodes) {
  while (exchanging_ * 2 <= nodes) {
    exchanging_ *= 2;
    ++log2_;
  }
  extra_ = nodes - exchanging_;
}

namespace {
// Elements of `count` blocks from block `first`.
Range blocks(const Fold& fold, const std::vector<std::uint64_t>& lo, int first, int count) {
  return {lo[static_cast<std::size_t>(fold.first_segment(first))], lo[static_cast<std::size_t>(fold.first_segment(first + count))]};
}
Range whole(const std::vector<std::uint64_t>& lo) { return {lo.front(), lo.back()}; }

// Halving exchange k (1..log2 P2) of exchanging node v: the partner v ^ dist, and the halves of
// the blocks v held before it; v keeps the half its own bit `dist` points to.
struct Halving {
  int partner;
  Range kept, given;
};
Halving halving(const Fold& fold, const std::vector<std::uint64_t>& lo, int v, int k) {
  const int dist = fold.exchanging() >> k, first = v & ~(2 * dist - 1);
  const Range lower = blocks(fold, lo, first, dist), upper = blocks(fold, lo, first + dist, dist);
  return (v & dist) ? Halving{v ^ dist, upper, lower} : Halving{v ^ dist, lower, upper};
}
}  // namespace

// Step 0: the fold. Steps 1..log2 P2: exchange k, after adding what exchange k - 1 (or the fold)
// brought. The last step only adds: node v then holds block v reduced over every node.
void halving_reduce_scatter(Engine::Ctx& c, const ReduceScatterData& d, int step) {
  const Fold fold(node_count(c.op()));
  const int me = c.op().me, v = fold.index_of(me);
  const std::uint64_t e = ipc::dtype_size(d.dtype);
  if (step == 0) {
    if (v < 0) send_range(c, me + 1, d.src, whole(d.lo), e);
    else if (fold.took_fold(me)) recv_range_into(c, me - 1, d.received[0], whole(d.lo), e);
    return;
  }
  if (v < 0) return;  // folded: its partner reduces for it
  const bool took = fold.took_fold(me);
  const auto received = [&](int k) { return d.received[static_cast<std::size_t>(k % 2)]; };
  if (step <= fold.exchanges()) {
    const Halving x = halving(fold, d.lo, v, step);
    recv_range_into(c, fold.node_of(x.partner), received(step), x.kept, e);
  }
  // This node's partial sums are in `out` from its first addition on (the fold's, or exchange 1's).
  if (step == 1 && took) add_received(c, d, whole(d.lo), d.src, received(0));
  if (step >= 2) add_received(c, d, halving(fold, d.lo, v, step - 1).kept, took || step > 2 ? d.out : d.src, received(step - 1));
  if (step <= fold.exchanges()) {
    const Halving x = halving(fold, d.lo, v, step);
    send_range(c, fold.node_of(x.partner), took || step > 1 ? d.out : d.src, x.given, e);
  }
}

// Step 0: a folded node hands its segment to its partner (AllGather; after a halving
// reduce-scatter the partner holds it already). Steps 1..log2 P2: exchange k, with the partner
// v ^ 2^(k-1), of the 2^(k-1) blocks each holds. Last step: the folded nodes receive it all.
void doubling_all_gather(Engine::Ctx& c, const AllGatherData& d, bool from_segments, int step) {
  const Fold fold(node_count(c.op()));
  const int me = c.op().me, v = fold.index_of(me);
  if (step == 0) {
    if (!from_segments) return;
    if (v < 0) send_range(c, me + 1, d.buf, segment(d.lo, me), d.element);
    else if (fold.took_fold(me)) recv_range(c, me - 1, d.buf, segment(d.lo, me - 1), d.element);
    return;
  }
  if (step > fold.exchanges()) {
    if (fold.took_fold(me)) send_range(c, me - 1, d.buf, whole(d.lo), d.element);
    else if (v < 0) recv_range(c, me + 1, d.buf, whole(d.lo), d.element);
    return;
  }
  if (v < 0) return;
  const int dist = 1 << (step - 1), partner = v ^ dist;
  recv_range(c, fold.node_of(partner), d.buf, blocks(fold, d.lo, partner & ~(dist - 1), dist), d.element);
  send_range(c, fold.node_of(partner), d.buf, blocks(fold, d.lo, v & ~(dist - 1), dist), d.element);
}

Range halving_result(const std::vector<std::uint64_t>& lo, int node) {
  const Fold fold(static_cast<int>(lo.size()) - 1);
  const int v = fold.index_of(node);
  return v < 0 ? Range{} : blocks(fold, lo, v, 1);
}

std::uint64_t halving_largest_receive(const std::vector<std::uint64_t>& lo, int node) {
  const Fold fold(static_cast<int>(lo.size()) - 1);
  const int v = fold.index_of(node);
  if (v < 0) return 0;
  if (fold.took_fold(node)) return whole(lo).size();
  return halving(fold, lo, v, 1).kept.size();  // the first exchange's: each later one keeps half as much
}

}  // namespace smddp::daemon::internode
