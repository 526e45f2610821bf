// Daemon: one per node and job. Owns the segment, the matcher, the executors and the
// control socket, supervises the node's ranks, and runs the progress loop.
//
// Threading: the progress loop (run()) is the only thread that touches the segment's rings,
// the matcher and the executors; the control server thread reads a status snapshot under
// status_mu_, after asking the loop for a fresh one (status_wanted_ and the daemon bell); the
// worker pool's threads run only inside HostExecutor::run.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <tuple>
#include <array>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/config.hpp"
#include "daemon/arena_sources.hpp"
#include "daemon/host_executor.hpp"
#include "daemon/internode/engine.hpp"
#include "daemon/matcher.hpp"
#include "daemon/supervisor.hpp"
#include "ipc/segment.hpp"

namespace smddp::daemon {

class ControlServer;
namespace cuda {
class GpuExecutor;
struct DoneMark;
}

struct JobLayout {
  std::string job_id;
  int node_id = 0;
  int num_nodes = 1;
  int nproc_per_node = 1;
  std::string hostname;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string transport = "none";
};

// What a job across nodes adds: the transport (not yet connected), every node's endpoint
// names, slot table and daemon (from the bootstrap).
struct InternodeSetup {
  std::unique_ptr<transport::Transport> transport;
  internode::Topology topology;
  std::vector<internode::NodeCard> cards;  // by node id
  // The GPU this node's slot table assumed for each local slot ("" when none): a rank that
  // registers with another is logged (its rail is not the nearest one).
  std::vector<std::string> gpu_of_slot;
  // Connections to the other daemons whose end shows a death at once (lifeline.hpp); may be null.
  std::unique_ptr<internode::Lifelines> lifelines;
};

class Daemon {
 public:
  Daemon(JobLayout layout, DaemonConfig config, std::optional<InternodeSetup> internode = std::nullopt);
  ~Daemon();

  // Spawns the node's ranks running `command`, serves them until they all exit, and
  // returns the job's exit status (0, a failed rank's status, or 128 + its signal).
  int run(const std::vector<std::string>& command);
  // Launch path 2: the ranks were started by mpirun or torchrun and attach by themselves.
  // Serves them until every rank registered and went away (or none came within
  // `attach_timeout`); a rank that vanishes without detaching fails the job.
  int serve_attached(std::chrono::seconds attach_timeout);

  // Asks the loop to stop (signal handlers call this through a flag).
  static void request_stop(int signo) noexcept;

 private:
  struct RankInfo {
    int pid = 0;
    bool registered = false;
    bool exited = false;
    int wait_status = 0;
    bool exit_known = true;  // false for attached ranks: we only saw them vanish
    std::uint64_t last_seq = 0;
    std::uint64_t pending = 0;
    std::uint64_t released_read = 0;  // RankSlot::released_ids read so far
    std::uint64_t invalid = 0;        // its requests refused as invalid (logged: the first kInvalidLogged)
    // The fast ledger of the communicator of its last host fast-path request (null: look it up).
    std::uint64_t fast_comm = 0;
    FastLedger* fast_ledger = nullptr;
  };
  // A rank that keeps posting invalid requests (a bug or a hostile process) would otherwise
  // flood the log with one warning each: thousands of lines that bury the job's own.
  static constexpr std::uint64_t kInvalidLogged = 10;

  bool poll_rings(Clock::time_point now);
  void handle_request(int slot, const ipc::RequestDesc& d, Clock::time_point now);
  void resolve(std::vector<Match> matches);
  void complete(const Posted& p, ipc::Status status, std::string_view error, int daemon_event = -1,
                std::uint64_t daemon_value = 0);
  void internode_finished(std::vector<internode::Finished> done);
  // `group_rank`'s operation `d` of `comm` failed here before it started: tells the other nodes
  // of the group, whose members would otherwise wait for their timeout (Engine::announce_op_failure).
  void tell_other_nodes(const Communicator& comm, int group_rank, const ipc::RequestDesc& d, ipc::Status status,
                        const std::string& error);
  bool drive_internode(Clock::time_point now);
  void housekeeping(Clock::time_point now);
  int loop();
  bool finished(Clock::time_point now);
  void watch_attached_ranks();
  void on_rank_exit(const RankExit& ex);
  void fail_job(const std::string& error, int exit_code);
  bool any_request_waiting() const;
  // A request ring at least half full: its rank posts on without ringing (the host fast path).
  bool requests_backlogged() const;
  void update_status(Clock::time_point now);
  nlohmann::json snapshot() const;
  // --- GPU path ---
  // The GPU executor, created on the first CUDA request (nullptr while off; why in gpu_off_).
  cuda::GpuExecutor* gpu();
  // Runs a device match: fills each member's daemon event, or returns an error.
  std::optional<std::string> run_device(const Match& m, std::vector<cuda::DoneMark>& done, std::uint64_t& bytes);
  nlohmann::json internode_status() const;
  nlohmann::json traffic_status() const;  // bytes by operation type: staged by the ranks, reduced, sent
  // Logs a rank whose GPU is not the one the fabric endpoint table assumed for its slot.
  void note_rank_gpu(int slot) const;
  nlohmann::json gpu_status() const;
  // Enqueues deferred GPU work whose inputs became ready; true if any ran.
  bool gpu_progress();
  // Rank-side execution (kFlagRankExec): answers every member with the IPC handles it lacks,
  // then the plan. Returns an error instead when the match cannot run that way.
  std::optional<std::string> send_plans(const Match& m);
  // A match of hierarchical requests (kFlagHierarchical): why it cannot run, or nullopt. The
  // group must span nodes and hold as many members on each node; every member must ask for it.
  std::optional<std::string> check_hierarchical(const Match& m, bool across) const;
  // Pushes a completion to `slot`'s ring (waiting briefly if that ring is full).
  bool push_completion(int slot, const ipc::CompletionDesc& c);
  // Host collectives that only move bytes: answers every member with where its output blocks
  // are (daemon/arena_sources.hpp). False when `m` runs the usual way instead.
  bool send_sources(const Match& m);
  std::uint64_t direct_read_ops_ = 0;  // chunks whose ranks read the members' arenas
  // Sources completions sent to each slot: the n-th is done once its sources_done reaches n.
  std::vector<std::uint64_t> sources_sent_;
  std::uint64_t sources_behind() const;  // Sources sent to live ranks that they have not copied yet
  // Host reductions within a node (daemon/rank_reads.cpp): answers every member with its
  // share to reduce (ipc::CompletionKind::Shares). False when `m` runs the usual way instead.
  bool send_shares(const Match& m);
  std::uint64_t split_reduce_ops_ = 0;      // chunks the ranks reduced among themselves
  std::vector<std::uint64_t> shares_sent_;  // Shares completions sent to each slot
  // A member's share of a chunk that the others wait for, until its shares_reduced reaches mark.
  struct ShareDue {
    int slot;
    std::uint64_t mark;
    std::uint64_t comm_id, seq;
    ipc::OpType op;
    Clock::time_point since;
    bool warned = false;
  };
  std::deque<ShareDue> shares_due_;
  // Drops the shares reduced; those late past the stall warning go to `new_stalls` once.
  void watch_shares(Clock::time_point now, std::vector<StallInfo>& new_stalls);
  std::vector<StallInfo> share_stalls(Clock::time_point now) const;  // late shares now, for status
  bool share_settled(const ShareDue& d) const;  // reduced, or its rank left
  StallInfo stall_of(const ShareDue& d, Clock::time_point now) const;
  static std::vector<StallInfo> merge_stalls(std::vector<StallInfo> stalls);  // one per operation
  std::uint64_t shares_behind() const;  // shares live ranks were sent and have not reduced yet
  // The job's wait-for graph (wait_for.hpp), this node's part: what its ranks have waited in for
  // a while and for whom, and which of them are stopped; sent in the beats.
  std::vector<RankWait> local_waits_;
  Clock::time_point waits_updated_{};
  void update_waits(Clock::time_point now);
  void add_share_waits(Clock::time_point now, std::vector<RankWait>& out) const;
  // The chain from `from` to the rank holding them up (over every node's waits where there are
  // other nodes).
  std::string explain_wait(const std::vector<int>& from) const;
  // The local ranks a timed-out match waited for.
  static std::vector<int> unposted_local_ranks(const Match& m);
  // Addresses `c` to the request `p` posted, as an answer of `kind`.
  static void address(ipc::CompletionDesc& c, const Posted& p, ipc::CompletionKind kind);
  // Which IPC handle each receiving slot was last sent for (owner slot, allocation id).
  std::map<std::tuple<int, int, std::uint64_t>, std::array<std::uint8_t, ipc::kCudaIpcHandleBytes>> handles_sent_;
  // Reads the allocations `slot` freed (RankSlot::released_ids): each receiver that was sent
  // one's handle is told with its next plan (release_notices_), and the daemon's own GPU
  // executor closes its mappings of it.
  void read_releases(int slot);
  std::map<int, std::vector<ipc::PlanHandle>> release_notices_;  // by receiving slot
  std::uint64_t freed_allocations_ = 0;  // ids the ranks listed as freed
  // The host fast path (ipc::kFlagHostFast): which lanes of each slot are taken (each
  // communicator's lane, the same in every local member's slot, is its ledger's: Matcher).
  std::vector<std::uint32_t> fast_lanes_taken_;  // by slot: a bit per lane
  std::uint64_t host_fast_ops_ = 0;
  std::uint64_t host_single_copy_ops_ = 0;  // of them, by single copy (ipc::kFlagSingleCopy)
  // A lane for a new communicator whose members are all on this node; -1 when it gets none.
  int take_fast_lane(const Communicator& comm);
  // A match of host fast-path requests: why they cannot have run together, or nullopt.
  std::optional<std::string> check_host_fast(const Match& m) const;
  // A host fast-path request of a communicator with a fast lane, valid, in a job that has not
  // failed and whose ranks are all there: its ledger takes it (most only count an operation the
  // ranks ran). False: the general path takes it (and refuses it, naming why).
  bool post_host_fast(int slot, const ipc::RequestDesc& d, Clock::time_point now);
  // An operation the ranks of `comm` ran on the host fast path, checked.
  void count_host_fast(const FastLedger::Ran& ran, const Communicator& comm);
  std::uint64_t rank_exec_ops_ = 0;
  std::uint64_t fast_ops_ = 0;  // of those, the ranks' fast path (kFlagRankFast)

  JobLayout layout_;
  DaemonConfig config_;
  ipc::Segment segment_;
  Matcher matcher_;
  HostExecutor host_;
  Supervisor supervisor_;
  std::unique_ptr<internode::Engine> engine_;  // jobs across nodes only
  std::vector<std::string> assumed_gpu_;  // by slot: the GPU the rail table assumed (InternodeSetup)
  std::unique_ptr<ControlServer> control_;
  std::unique_ptr<cuda::GpuExecutor> gpu_;  // the daemon's own GPU executor (SMDDP_GPU_EXEC=daemon)
  bool gpu_tried_ = false;
  std::string gpu_off_;
  std::vector<RankInfo> ranks_;
  std::vector<int> exited_slots_;

  Clock::time_point started_;
  Clock::time_point last_housekeeping_{};
  std::optional<Clock::time_point> failed_at_;
  bool sent_term_ = false, sent_kill_ = false;
  bool attach_mode_ = false;
  std::optional<Clock::time_point> attach_deadline_;
  int exit_code_ = 0;
  std::string job_error_;
  // The node's ranks and this daemon share cores (ipc::yield_between_polls): spinning yields
  // between polls, and host reductions split among the ranks only from a larger size.
  bool yield_between_polls_ = ipc::yield_between_polls(layout_.nproc_per_node + 1);
  std::optional<std::uint64_t> split_reduce_min_ = config_.split_reduce_min.resolve(yield_between_polls_);

  std::uint64_t collectives_done_ = 0;
  std::uint64_t bytes_moved_ = 0;
  std::uint64_t bw_window_bytes_ = 0;
  Clock::time_point bw_window_start_{};
  double recent_gbps_ = 0;

  mutable std::mutex status_mu_;
  nlohmann::json status_;  // rebuilt by the loop, read by the control thread
  // A control request asks the loop for a fresh status (the periodic one may be up to a
  // housekeeping period plus an idle sleep old: a job that just ran would show nothing done).
  mutable std::atomic<bool> status_wanted_{false};
  mutable std::condition_variable status_cv_;
  std::uint64_t status_generation_ = 0;  // under status_mu_
  std::vector<nlohmann::json> errors_;
  std::vector<StallInfo> stalls_;

  static std::atomic<int> stop_signal_;
};

}  // namespace smddp::daemon
