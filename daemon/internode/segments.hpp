// Collectives run by node segments: a chunk is cut into one segment per node (node j's:
// elements [lo[j], lo[j + 1])); a reduce-scatter among the nodes leaves each node its segment
// reduced over every node, an all-gather gives every node every segment. Two schedules move the
// segments, chosen by the tuner (tuner.hpp): a ring (ring.cpp) and recursive halving/doubling
// (halving_doubling.cpp). The collectives built on them: allreduce_by_segments.cpp (AllReduce,
// Reduce), reduce_scatter_by_segments.cpp, allgather_by_segments.cpp.
//
// A schedule's steps are engine phases: step s posts its messages, and the engine calls step
// s + 1 once they all completed (a step that posts nothing is followed at once). Every node runs
// the same steps in the same phases, so a message's tag (Ctx::tag: operation, phase, direction,
// sub) is the same on both sides. Messages of no bytes are not sent: both sides know the sizes.
// Internal to daemon/internode.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "daemon/internode/op.hpp"

namespace smddp::daemon::internode {

// Elements [lo, hi) of a chunk.
struct Range {
  std::uint64_t lo = 0, hi = 0;
  std::uint64_t size() const { return hi - lo; }
};
inline Range segment(const std::vector<std::uint64_t>& lo, int j) {
  return {lo[static_cast<std::size_t>(j)], lo[static_cast<std::size_t>(j) + 1]};
}

// A reduce-scatter's data. Every node starts with its contribution to the whole chunk in `src`
// and ends with reduce_scatter_result() reduced over every node in `out` (same offsets).
struct ReduceScatterData {
  std::vector<std::uint64_t> lo;  // P + 1 segment bounds, in elements
  ipc::DType dtype = ipc::DType::Float32;  // of src, out and the messages
  ipc::ReduceOp op = ipc::ReduceOp::Sum;   // AVG and PREMUL_SUM are sums here (scaled elsewhere)
  const std::byte* src = nullptr;          // read only
  std::byte* out = nullptr;                // partial sums; may be src
  // What a step receives, alternating between steps (one is received into while the other's
  // contents are added): each holds largest_receive() elements.
  std::array<std::byte*, 2> received{};
};

// An all-gather's data: node j's segment (or what reduce_scatter_result gave it) at its place in
// `buf`; every node ends with every segment there.
struct AllGatherData {
  std::vector<std::uint64_t> lo;  // P + 1 segment bounds, in elements of `element` bytes
  std::uint64_t element = 1;
  std::byte* buf = nullptr;
};

// What a collective by segments keeps between its steps (Op::plan).
struct SegmentPlan {
  ReduceScatterData rs;
  AllGatherData ag;
  std::byte* result = nullptr;    // the reduced chunk in the operation's dtype
  std::byte* widened = nullptr;   // half types: the float32 partial sums (rs.out), else null
  std::vector<std::uint64_t> place;  // group rank -> its block's place in node order (ReduceScatter, AllGather)
  bool places_in_rank_order = true;  // place[g] == g for every g
};

// The schedules (Algorithm::Ring or Algorithm::Halving).
int reduce_scatter_steps(Algorithm a, int nodes);
void reduce_scatter_step(Engine::Ctx& c, Algorithm a, const ReduceScatterData& d, int step);
// What node `node` holds reduced after the reduce-scatter: its segment; under halving a node
// that folded holds nothing and its partner holds both their segments.
Range reduce_scatter_result(Algorithm a, const std::vector<std::uint64_t>& lo, int node);
// Elements the largest message this node receives in the reduce-scatter holds.
std::uint64_t largest_receive(Algorithm a, const std::vector<std::uint64_t>& lo, int node);
int all_gather_steps(Algorithm a, int nodes);
// `from_segments`: every node starts with its own segment (AllGather); otherwise with its
// reduce_scatter_result (AllReduce).
void all_gather_step(Engine::Ctx& c, Algorithm a, const AllGatherData& d, bool from_segments, int step);
// After a reduce-scatter: a node that holds another's segment (halving's folded pairs) sends it
// there, into `buf` at the segment's place (elements of `element` bytes). One step.
void hand_over_segments(Engine::Ctx& c, Algorithm a, const std::vector<std::uint64_t>& lo, std::byte* buf,
                        std::uint64_t element);

void ring_reduce_scatter(Engine::Ctx& c, const ReduceScatterData& d, int step);  // P steps
void ring_all_gather(Engine::Ctx& c, const AllGatherData& d, int step);          // P - 1 steps
std::uint64_t ring_largest_receive(const std::vector<std::uint64_t>& lo);

// Recursive halving/doubling, with the nodes above the largest power of two folded in pairs.
class Fold {
 public:
  explicit Fold(int nodes);
  int exchanges() const { return log2_; }       // log2 of the nodes that exchange
  int exchanging() const { return exchanging_; }  // the largest power of two <= P
  // Index among the exchanging nodes, or -1 for a node that folded into the next one.
  int index_of(int node) const { return node < 2 * extra_ ? (node % 2 ? node / 2 : -1) : node - extra_; }
  int node_of(int index) const { return index < extra_ ? 2 * index + 1 : index + extra_; }
  // Took a folded node's data in (odd nodes below 2 * extra).
  bool took_fold(int node) const { return node < 2 * extra_ && node % 2 == 1; }
  // Exchanging node `index` stands for segments [first_segment(index), first_segment(index + 1)).
  int first_segment(int index) const { return index < extra_ ? 2 * index : index + extra_; }

 private:
  int exchanging_ = 1, extra_ = 0, log2_ = 0;
};
void halving_reduce_scatter(Engine::Ctx& c, const ReduceScatterData& d, int step);  // log2 P2 + 2 steps
void doubling_all_gather(Engine::Ctx& c, const AllGatherData& d, bool from_segments, int step);  // log2 P2 + 2
Range halving_result(const std::vector<std::uint64_t>& lo, int node);
std::uint64_t halving_largest_receive(const std::vector<std::uint64_t>& lo, int node);

// Helpers for the schedules and collectives (segments.cpp).
int node_count(const Op& op);
// Sends or receives elements `r` of `base` (elements of `element` bytes) to or from node index
// `node`, unless `r` is empty.
void send_range(Engine::Ctx& c, int node, const std::byte* base, Range r, std::uint64_t element);
void recv_range(Engine::Ctx& c, int node, std::byte* base, Range r, std::uint64_t element);
// Receives `r`'s elements into the start of `buf` (a staging buffer), unless `r` is empty.
void recv_range_into(Engine::Ctx& c, int node, std::byte* buf, Range r, std::uint64_t element);
// out[r] = base[r] op received[0, r.size()): this node's contribution added to what arrived.
void add_received(Engine::Ctx& c, const ReduceScatterData& d, Range r, const std::byte* base, const std::byte* received);
// Partial sums of half types travel and accumulate as float32 and are rounded once, at their
// owner, as host_reduce accumulates them.
ipc::DType partial_dtype(ipc::DType t);
void widen(Engine::Ctx& c, ipc::DType from, const std::byte* in, std::byte* out, std::uint64_t count);
void narrow(Engine::Ctx& c, ipc::DType to, const std::byte* in, std::byte* out, std::uint64_t count);
// The node's reduced elements `r` made final in plan.result: scaled by 1/ranks for AVG, rounded
// to the dtype from float32 for half types.
void finish_result(Engine::Ctx& c, const SegmentPlan& plan, ipc::DType dtype, ipc::ReduceOp op, Range r);
// Blocks of the group's ranks ordered by node, then group rank: each node's blocks are then one
// run (its segment). Fills plan.place and plan.places_in_rank_order; returns the P + 1 bounds
// of the nodes' runs, in blocks.
std::vector<std::uint64_t> place_blocks_by_node(Engine::Ctx& c, SegmentPlan& plan);

}  // namespace smddp::daemon::internode
