// Inter-node engine: runs collectives whose communicator spans several nodes.
//
// Layering: the Matcher lines up a collective among this node's ranks; the Engine then
// (1) exchanges the local members' descriptors with every other node of the communicator,
//     so a signature mismatch is judged on the same global data everywhere (one message
//     naming each rank's call, on every node);
// (2) runs the hierarchical algorithm of the operation (daemon/internode/*.cpp): a step on
//     the host arenas inside the node, an exchange among the daemons over the Transport,
//     a step that writes the ranks' outputs. Each chunk of a pipelined operation is its own
//     Engine operation, so chunk k's network transfer overlaps chunk k+1's local reduction.
//     Small AllReduce and AllGather send their data beside the descriptors (eager.cpp): one
//     exchange in all.
// It also carries the daemons' heartbeats: a daemon that dies, or whose job fails, makes every
// other daemon fail its job with a message naming the cause; and failure notices: an operation
// that failed on one node before that node started any part of it (a refused request, a local
// timeout) fails on the other nodes at once, with the same text, instead of at their timeout.
//
// Messages between two nodes take a pair of their fabric endpoints chosen alike on both sides
// (rail_choice.hpp): an operation with one member on each node over those members' endpoints,
// others striped over the endpoints by operation chunk; heartbeats and notices over endpoint 0.
//
// Threading: single-threaded, driven by the daemon's progress loop (like the Transport).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "daemon/internode/lifeline.hpp"
#include "daemon/internode/node_card.hpp"
#include "daemon/internode/rail_choice.hpp"
#include "daemon/internode/staging_pool.hpp"
#include "daemon/internode/tuner.hpp"
#include "daemon/matcher.hpp"
#include "daemon/traffic.hpp"
#include "daemon/transport/transport.hpp"
#include "daemon/wait_for.hpp"
#include "daemon/worker_pool.hpp"
#include "ipc/segment.hpp"

namespace smddp::daemon::internode {

struct PeerInfo {
  int pid = 0;
  std::string hostname;
  std::string address;  // its first endpoint's printable name, for errors ("" where unknown)
};

struct Topology {
  int node_id = 0;
  int num_nodes = 1;
  int nproc_per_node = 1;
  std::vector<PeerInfo> nodes;  // indexed by node id (this node included)
  // Global rank g lives on node g / nproc_per_node: every node runs the same number of ranks.
  int node_of(int global) const noexcept { return global / nproc_per_node; }
  int slot_of(int global) const noexcept { return global % nproc_per_node; }
};

// An operation that ended: its local requests and how it ended.
struct Finished {
  Match match;
  std::uint64_t bytes = 0;  // bytes written to local outputs or sent
  bool mismatch = false;    // the signature check failed: the daemon fails the whole sequence
};

struct Op;  // one collective chunk or one remote send/recv in flight (engine.cpp)
// An operation, whichever of its chunks: (comm, seq, src, dst), src = dst = -1 for a collective,
// a send/recv's group ranks otherwise.
using OpKey = std::tuple<std::uint64_t, std::uint64_t, int, int>;

class Engine {
 public:
  struct Options {
    std::chrono::milliseconds heartbeat_every{200};
    // A peer silent this long is declared gone (on the same host a dead pid is seen at once).
    std::chrono::milliseconds heartbeat_timeout{2000};
    std::chrono::milliseconds default_timeout{1800000};
    // fabric.algorithm: Auto lets the tuner choose per chunk (tuner.hpp); every node must run
    // with the same setting (the nodes check each chunk's choice).
    Algorithm algorithm = Algorithm::Auto;
  };

  // `transport` has not met its peers yet; `cards` are every node's endpoint names and slot
  // tables (indexed by node id, this node's too), agreed through the bootstrap. Throws
  // std::invalid_argument when they do not fit the topology or this node's transport.
  Engine(Topology topo, std::unique_ptr<transport::Transport> transport, const std::vector<NodeCard>& cards,
         const ipc::Segment& segment, WorkerPool& pool, Options options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  bool spans_nodes(const Communicator& c) const noexcept { return c.local_member_count() < c.size(); }
  // Starts a collective whose local members all posted (m.status == Ok, posted in group-rank order).
  void start(Match m, Clock::time_point now);
  // Starts a send or recv whose peer lives on another node.
  void start_p2p(const Communicator& comm, const Posted& p, Clock::time_point now);

  // Drives the transport, advances operations, sends heartbeats, checks peers. Returns the
  // operations that ended. `now` is the loop's clock.
  std::vector<Finished> progress(Clock::time_point now);
  bool busy() const noexcept { return !ops_.empty(); }
  // For the operator (smddp-ctl status): operations in flight, and the staging pool's buffers.
  std::size_t in_flight() const noexcept { return ops_.size(); }
  std::size_t staging_allocations() const { return staging_.allocations(); }
  std::size_t staging_cached_bytes() const { return staging_.cached_bytes(); }
  std::size_t staging_registration_failures() const { return staging_.registration_failures(); }
  // Operations whose descriptors some node has not sent for `stall_after`, naming the ranks of
  // those nodes; `new_only`: each reported once (for the log).
  std::vector<StallInfo> stalls(Clock::time_point now, std::chrono::seconds stall_after, bool new_only);

  // A peer's failure (it died, or its job failed): the text to fail the job with, and the exit
  // code. Reported once.
  struct PeerFailure {
    std::string error;
    int exit_code = 1;
  };
  std::optional<PeerFailure> take_peer_failure();
  // Checks the peers now rather than at the loop's next turn (a daemon told to stop looks for
  // the cause first).
  void check_peers_now() { check_peers(Clock::now()); }
  // What this node's beats say while its job lives: its own ranks that others wait for (the
  // daemon's stall warning), so that a timeout on another node can name the rank behind it.
  void set_stall_note(std::string note) { my_stall_note_ = std::move(note); }
  // This node's ranks' waits (wait_for.hpp), for the beats; and what the engine adds to them:
  // the local ranks of each operation in flight wait for the ranks whose node has not posted it.
  void set_waits(std::vector<RankWait> waits) {
    my_waits_wire_ = to_wire(waits);  // once per update, not per beat and peer
    my_waits_ = std::move(waits);
  }
  void add_waits(Clock::time_point now, std::vector<RankWait>& out) const;
  // From `from` (ranks something waited for) to the rank holding them up, over every node's
  // waits; empty when `from` is.
  std::string explain_wait(const std::vector<int>& from) const;
  // Watches the other daemons' lifelines from now on (a death on another host shows at once).
  void watch_lifelines(std::unique_ptr<Lifelines> lifelines) { lifelines_ = std::move(lifelines); }
  // Tells every peer that this node's job failed (they fail theirs with the same text).
  void announce_failure(const std::string& error, int exit_code);
  // Fails every operation in flight (job failure) and returns them.
  std::vector<Finished> fail_all(ipc::Status status, const std::string& error);
  // An operation that failed on one node before it started there. src/dst: a send/recv's
  // group ranks; -1, -1: a collective (every chunk of it).
  struct OpFailure {
    std::uint64_t comm = 0, seq = 0;
    int src = -1, dst = -1;
    ipc::Status status = ipc::Status::Ok;
    std::string error;
  };
  // Tells the other nodes of `comm` (for a send/recv: the other side's node) that `f` failed
  // here. Nothing is sent when this node already started a part of it (the others wait for that
  // part, which runs; the rest falls back to their timeout) or already knows of the failure.
  // Returns whether a notice went out.
  bool announce_op_failure(const Communicator& comm, const OpFailure& f);
  // Failures other nodes announced since the last call. Their operations in flight here already
  // ended (progress() returns them); the caller fails the parts its ranks post later.
  std::vector<OpFailure> take_op_failures();

  // Clean end: tells the peers, then keeps serving the transport until every peer has ended
  // too (or failed), so a peer's last messages are not cut off.
  void finish(std::chrono::milliseconds max_wait);

  std::string describe() const { return transport_->describe(); }
  // Each endpoint's device and byte counts, for the operator.
  std::vector<transport::EndpointInfo> endpoint_info() const { return transport_->endpoint_info(); }
  // This node's endpoints and which serves each local slot.
  const RailTable& rails() const noexcept { return my_rails_; }
  // Bytes this node sent on the fabric (descriptors and data) and reduced on its CPU for
  // operations across nodes, by operation type.
  const BytesByOp& fabric_sent() const noexcept { return fabric_sent_; }
  const BytesByOp& host_reduced() const noexcept { return host_reduced_; }

  // For algorithms (daemon/internode/*.cpp).
  struct Ctx;

 private:
  enum class PeerState : std::uint32_t { Alive = 0, Done = 1, Failed = 2, Dead = 3 };
  struct Peer {
    int transport_index = -1;
    RailTable rails;  // the node's endpoints, from its card
    PeerState state = PeerState::Alive;
    Clock::time_point last_heard;
    bool heard_from = false;  // any beat arrived: silence from the start means unreachable
    // When a beat to it failed (its connection broke) and why; judged by check_peers once a
    // goodbye or failure notice it sent before has had time to arrive.
    std::optional<Clock::time_point> beat_failed_at;
    std::string beat_error;
    std::optional<Clock::time_point> lifeline_closed_at;  // its lifeline ended (lifeline.hpp)
    std::string stall_note;  // its latest set_stall_note, from its beats
    std::vector<RankWait> waits;  // its latest set_waits, from its beats
    Clock::time_point last_sent{};
    int beats_in_flight = 0;
    bool goodbye_sent = false;  // our Done/Failed beat went out
  };
  void post_beat_recv(int node);
  void post_notice_recv(int node);
  // False when the node runs on this host and its process is gone: some providers (shm) crash
  // sending to a vanished process.
  bool process_there(int node) const;
  // Records that this node starts a part of `key`; or, when another node announced `key`
  // failed, ends `op` at once instead (false).
  bool admit(Op& op, const OpKey& key);
  // Records a failure (false: already known) and ends this node's operations waiting for it.
  bool note_failure(const OpKey& key, ipc::Status status, const std::string& error);
  void send_beat(int node, Clock::time_point now);
  void check_peers(Clock::time_point now);
  void peer_lost(int node, const std::string& why, int exit_code);
  bool advance(Op& op, Clock::time_point now);  // true when the op has ended
  // Fills op.rails, the rail to each node of the op (rail_choice.hpp), from its members'
  // global ranks (a collective's communicator; a send/recv's pair). Needs op.nodes, me, key.
  void choose_rails(Op& op, const std::vector<int>& members) const;
  // Receives node index j's descriptors into `buf`; the op has heard j once they are in.
  void post_descriptor_recv(const std::shared_ptr<Op>& op, int j, std::byte* buf, std::size_t bytes);
  // Compares every member's descriptor once all arrived; false (and the op failed with the
  // mismatch naming every call) when they disagree.
  bool judge(Op& op);
  // A recv's sender descriptor arrived: when they agree, posts the data's receive into the
  // output (unless small data is already coming into staging); else fails the pair here and on
  // the sender's node, naming both calls, drains the sent data and returns false.
  bool judge_recv(Op& op);
  // Sends `f` to `node` as a failure notice; false when that node is gone or is this one.
  bool send_notice(int node, const OpFailure& f);
  const transport::MemoryRegion* region_for(const void* buf, std::size_t bytes) const;
  Finished finish_op(Op& op);
  std::vector<int> unheard_ranks(const Op& op) const;

  Topology topo_;
  std::unique_ptr<transport::Transport> transport_;
  // The ranks' arenas, registered once: sends and receives from and into them need no
  // per-message registration on providers that want registered buffers (efa). Declared after
  // transport_ so they are closed first.
  std::vector<transport::MemoryRegion> arena_regions_;
  const ipc::Segment& segment_;
  WorkerPool& pool_;
  // What operations receive before they reduce or scatter it, reused (staging_pool.hpp); it
  // keeps at most as many bytes as the node's arenas hold, and registers each buffer once where
  // the provider wants registered buffers. Declared after transport_, which it registers with.
  StagingPool staging_;
  Options options_;
  RailTable my_rails_;
  BytesByOp fabric_sent_;
  BytesByOp host_reduced_;
  std::vector<Peer> peers_;  // indexed by node id
  std::deque<std::shared_ptr<Op>> ops_;
  std::optional<PeerFailure> peer_failure_;
  bool peer_failure_taken_ = false;
  Clock::time_point last_check_{};
  // check_peers: when it last ran, and since when it has been watching without a gap.
  Clock::time_point last_peer_check_{};
  Clock::time_point watching_since_{};
  std::unique_ptr<Lifelines> lifelines_;  // null where the bootstrap made none (tests, launch path 2)
  Clock::time_point last_lifeline_poll_{};
  PeerState my_state_ = PeerState::Alive;
  std::string my_error_;
  std::string my_stall_note_;
  std::vector<RankWait> my_waits_;
  WireWaits my_waits_wire_;
  int my_exit_code_ = 0;
  // Operations recently started and recently failed (announced or told), oldest dropped first:
  // a failure notice concerns an operation of the last few thousand.
  static constexpr std::size_t kRemembered = 4096;
  std::set<OpKey> started_;
  std::deque<OpKey> started_order_;
  std::map<OpKey, std::pair<ipc::Status, std::string>> failed_;
  std::deque<OpKey> failed_order_;
  std::vector<OpFailure> told_;  // for take_op_failures
};

}  // namespace smddp::daemon::internode
