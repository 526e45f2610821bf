// How a rank's part of a GPU collective in a group that spans nodes decomposes: the way SMDDP
// (Herring) and NCCL move CUDA tensors across nodes. Inside the node first, over NVLink, so that
// only each GPU's shard (1/G of the node's bytes) leaves it; across nodes on that shard alone,
// as a host operation among the members with the same local index on every node (the rank's
// rail); then inside the node again.
//
//   pre   main stream     a barrier with the node's other members, then the in-node part
//                         (reductions of the members' inputs, copies) in pieces, a mark after
//                         each piece
//   rail  copy engines,   the shard goes to the arena as the marks pass (client/gpu/
//         arena, daemons  arena_copier.hpp), the rail operation runs across nodes, and its
//                         result comes back into GPU memory piece by piece
//   post  copy engines    each piece that came back is pushed into the node's other members
//   tail  copy engines    a barrier with the node's other members, on a count of its own: it
//                         runs once the rail operation ended, after plans that came later
//
// Every member of a node runs one barrier before and one after; how many pieces and marks a
// rank has is its own. Pure C++ (no CUDA): PeerExecutor moves the bytes each part names, and
// tests/client/gpu runs the same schedules on host memory for nodes x ranks, with the rail
// operations in between, checking results, pairing and races.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/gpu/schedule.hpp"
#include "ipc/types.hpp"

namespace smddp::client::gpu {

// Where a group's members live: P nodes with G members each, in node order (ascending node
// id), and on each node in group-rank order (the local index).
struct GroupLayout {
  int nodes = 0;     // P
  int per_node = 0;  // G
  std::vector<int> node_of, local_of;  // by group rank
  std::vector<int> member;             // node * G + local -> group rank

  int at(int node, int local) const { return member[static_cast<std::size_t>(node * per_node + local)]; }
  // The members of rail `local` (the local index), as group ranks in node order.
  std::vector<int> rail(int local) const;
  // From the members' global ranks when the job runs `ranks_per_node` ranks on each node (global
  // rank g on node g / ranks_per_node). Nullopt, and `why`, when the nodes hold unequal numbers
  // of members: such a group has no rails.
  static std::optional<GroupLayout> of(const std::vector<int>& global_ranks, int ranks_per_node, std::string& why);
};

// The reduce op of each level: AVG averages inside the node and again across nodes (equal counts
// everywhere make that the average of all); PREMUL_SUM scales each input inside the node only.
ipc::ReduceOp hier_pre_op(ipc::ReduceOp op);
ipc::ReduceOp hier_rail_op(ipc::ReduceOp op);

struct HierArgs {
  ipc::OpType op = ipc::OpType::AllReduce;
  ipc::DType dtype = ipc::DType::Float32;
  ipc::ReduceOp reduce_op = ipc::ReduceOp::Sum;  // the caller's (the rail's follows hier_rail_op)
  std::uint64_t count = 0;  // as in client::DeviceCall (per rank for AllGather and ReduceScatter)
  int root = 0;             // group rank (Broadcast, Reduce)
  const GroupLayout* layout = nullptr;
  int me = 0;  // group rank
  // By local index: the buffers of this node's members as this rank sees them (its own, and
  // the others' mapped here); null where a member has none or it is not known yet.
  std::vector<std::byte*> in, out;
  std::byte* scratch = nullptr;   // hier_scratch_bytes() of this rank's GPU memory
  std::uint64_t piece_bytes = 0;  // the in-node part in pieces of at most this much (0: one)
};

// A stretch of the rail operation's input or output in this rank's GPU memory.
struct RailSegment {
  std::uint64_t offset = 0;  // bytes into the rail operation's input (or output)
  std::byte* at = nullptr;   // where they are on this rank's GPU
  std::uint64_t bytes = 0;
  // Output only: where the same bytes go in the node's other members once they are back.
  std::vector<std::byte*> push;
};

// The host operation this rank posts on its rail communicator (rail rank = node index).
struct RailOp {
  ipc::OpType op = ipc::OpType::AllReduce;
  ipc::ReduceOp reduce_op = ipc::ReduceOp::Sum;
  std::uint64_t count = 0;  // as the client's Communicator takes it
  int root = 0;             // rail rank (Broadcast, Reduce)
  std::vector<RailSegment> in, out;  // empty: the rail operation has no input (output) here
  std::uint64_t in_bytes() const;
  std::uint64_t out_bytes() const;
};

// After the first `after` steps of `pre`, the first `ready` bytes of the rail input are written.
struct Mark {
  std::size_t after = 0;
  std::uint64_t ready = 0;
};

struct HierSchedule {
  std::vector<Step> pre;
  std::vector<Mark> marks;  // increasing; the last one comes after every step of `pre`
  RailOp rail;
};

// Bytes of scratch on this rank's GPU (ReduceScatter: its rail's blocks reduced in the node;
// Reduce: its shard, reduced in the node and, on the root's node, back from the rail).
std::uint64_t hier_scratch_bytes(const HierArgs& a);
// Elements of local index i's shard of `count` (AllReduce, Reduce, Broadcast), and its first.
std::uint64_t hier_shard_begin(std::uint64_t count, ipc::DType dtype, int per_node, int i);
std::uint64_t hier_shard_count(std::uint64_t count, ipc::DType dtype, int per_node, int i);

// The parts, or nullopt and `why` for an operation with no hierarchical form.
std::optional<HierSchedule> hier_schedule(const HierArgs& a, std::string& why);

}  // namespace smddp::client::gpu
