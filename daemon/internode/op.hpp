// One inter-node operation in flight, and the context the algorithms post messages through.
// Internal to daemon/internode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/internode/engine.hpp"
#include "daemon/internode/tuner.hpp"

namespace smddp::daemon::internode {

struct SegmentPlan;  // segments.hpp

struct Op : std::enable_shared_from_this<Op> {
  Match match;  // this node's requests (collectives: in group-rank order)
  const Communicator* comm = nullptr;
  bool p2p = false;
  std::vector<const Posted*> local;      // group rank -> this node's request, or null
  std::vector<ipc::RequestDesc> descs;   // group rank -> every member's request (after phase 0)
  std::vector<int> nodes;                // nodes holding members, ascending
  int me = 0;                            // this node's index in `nodes`
  std::vector<transport::Rail> rails;    // node index -> the endpoints its messages take
  int phase = 0;                         // 0: descriptor exchange; then the algorithm's steps
  int outstanding = 0;                   // messages whose callback has not run
  ipc::Status status = ipc::Status::Ok;
  std::string error;
  // When a fabric message of it failed (not a peer check or a notice): set once, with the error.
  Clock::time_point fabric_failed_at{};
  void fail_by_fabric(std::string why) {
    status = ipc::Status::PeerFailed;
    error = std::move(why);
    fabric_failed_at = Clock::now();
  }
  bool failed_by_fabric() const { return fabric_failed_at != Clock::time_point{}; }
  bool mismatch = false;
  // Another node announced this operation failed before it started there: ended in phase 0,
  // while its descriptor messages (into op-owned buffers) may still be posted.
  bool abandoned = false;
  OpKey of{};  // the operation this is a part of
  Clock::time_point started;
  Clock::time_point deadline;
  std::vector<char> heard;               // node index -> its descriptors arrived (phase 0)
  bool judged = false;                   // every node's descriptors arrived and agree (a recv: the sender's arrived)
  // A recv's data receive into the rank's output is posted (its descriptor agreed: the data
  // surely comes); such an op runs to its end, whatever failure notice arrives.
  bool into_ranks = false;
  // Small AllReduce and AllGather: the data went out with the descriptors (eager.cpp). A small
  // recv: its data is received into staging (buffers[1]) beside the descriptor.
  bool eager = false;
  bool stall_reported = false;
  std::uint64_t key = 0;                 // hash of (comm, seq, chunk): the base of every tag
  std::uint64_t bytes = 0;
  std::vector<StagingPool::Buffer> buffers;  // staging, back to the pool with the op
  std::vector<std::vector<std::int64_t>> splits;      // alltoall split tables by group rank
  // How this chunk moves among the nodes (tuner.hpp): chosen alike on every node, and sent with
  // the descriptors in their `reserved0` byte (the ranks leave it 0) so that the nodes check it.
  Algorithm algorithm = Algorithm::Direct;
  std::shared_ptr<SegmentPlan> plan;  // Ring and Halving: their data between steps

  const ipc::RequestDesc& d0() const { return descs.front(); }
  int size() const { return comm->size(); }
  int node_index_of_member(int g, const Topology& t) const;
};

// What an algorithm step sees. Messages are addressed by node index (position in op.nodes)
// and a `sub` number both sides derive alike (a block or a pair of group ranks).
class Engine::Ctx {
 public:
  Ctx(Engine& e, Op& op) : e_(e), op_(op) {}
  Op& op() { return op_; }
  const Topology& topo() const { return e_.topo_; }
  WorkerPool& pool() { return e_.pool_; }

  void send(int node_index, std::uint64_t sub, const void* buf, std::size_t bytes);
  void recv(int node_index, std::uint64_t sub, void* buf, std::size_t bytes);
  // The registration covering `buf`: one of this op's staging buffers, a rank's arena, or none.
  const transport::MemoryRegion* region_for(const void* buf, std::size_t bytes) const;
  std::byte* in(int g) const;   // member g's input in its arena (g must be local)
  std::byte* out(int g) const;  // member g's output in its arena (g must be local)
  bool is_local(int g) const { return op_.local[static_cast<std::size_t>(g)] != nullptr; }
  // The lowest group rank on this node (-1 if none): where a node's single local copy lives.
  int first_local() const {
    for (int g = 0; g < op_.size(); ++g)
      if (is_local(g)) return g;
    return -1;
  }
  int node_index_of(int g) const { return op_.node_index_of_member(g, e_.topo_); }
  std::byte* buffer(std::size_t bytes);
  void fail(ipc::Status status, std::string error);
  // Element-wise reduction split across the worker pool for large counts.
  void reduce(ipc::DType dtype, ipc::ReduceOp op, const std::vector<const void*>& inputs, void* out,
              std::uint64_t count, double premul_scale);
  void copy(std::byte* dst, const std::byte* src, std::uint64_t bytes);
  std::uint64_t tag(int src_node, int dst_node, std::uint64_t sub) const;

 private:
  Engine& e_;
  Op& op_;
};

// A data message's `sub` when the receiver cannot know the size before the sender's descriptor
// arrives (the eager collectives, send/recv): the tag names the size, so a message of another
// size never meets the receive. A longer message would be truncated, and tcp;ofi_rxm (libfabric
// 1.17) loses the pair's later messages after a truncation. The unmatched message stays with the
// provider; the descriptors report the mismatch. (Descriptors use sub 0.)
inline std::uint64_t data_sub(std::uint64_t bytes) { return bytes << 1 | 1; }

// Hierarchical reductions reduce inside the node first, then across nodes. AVG is a sum
// scaled once at the end by 1/size; PREMUL_SUM scales each rank's input in the local step.
inline ipc::ReduceOp local_reduce_op(ipc::ReduceOp op) { return op == ipc::ReduceOp::Avg ? ipc::ReduceOp::Sum : op; }
inline ipc::ReduceOp global_reduce_op(ipc::ReduceOp op) {
  return op == ipc::ReduceOp::Avg || op == ipc::ReduceOp::PremulSum ? ipc::ReduceOp::Sum : op;
}

// The algorithms: called with op.phase = 1, 2, ... each time the previous step's messages
// have all completed. Post the step's messages and return false, or return true when done.
bool allreduce_step(Engine::Ctx& c);       // AllReduce and Reduce: reduce-scatter + all-gather
// The same collectives by node segments, moved by a ring or recursive halving/doubling
// (op.algorithm; segments.hpp).
bool allreduce_by_segments_step(Engine::Ctx& c);  // AllReduce and Reduce
bool reduce_scatter_by_segments_step(Engine::Ctx& c);
bool allgather_by_segments_step(Engine::Ctx& c);
bool reduce_scatter_step(Engine::Ctx& c);
bool broadcast_step(Engine::Ctx& c);
bool allgather_step(Engine::Ctx& c);
bool gather_scatter_step(Engine::Ctx& c);  // Gather and Scatter
bool alltoall_step(Engine::Ctx& c);

// Small single-chunk collectives (all but uneven AllToAll and Barrier) send their data with
// their descriptors (phase 0) and finish in phase 1: one exchange (eager.cpp). Each node
// decides from its own descriptor; nodes that decide differently called different operations,
// which the descriptor check reports.
// Larger single messages leave the providers' eager protocols (tcp;ofi_rxm sends up to 16 KiB
// eagerly, then a rendezvous: a 32 KiB AllReduce over tcp was 1.2x slower sent this way), and
// one node sending much more than the two-step algorithms would costs more than a round trip.
constexpr std::uint64_t kEagerMessageBytes = 16 << 10;
constexpr std::uint64_t kEagerBytes = 64 << 10;  // what one node sends, in all
bool sends_eagerly(Engine::Ctx& c);
bool eager_step(Engine::Ctx& c);  // phase 0 posts the exchange; phase 1 finishes

}  // namespace smddp::daemon::internode
