#include "daemon/daemon.hpp"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <spdlog/spdlog.h>
#include <thread>

#include "daemon/alltoall_splits.hpp"
#include "daemon/control/control_server.hpp"
#include "daemon/cuda/gpu_executor.hpp"
#include "daemon/internode/rail_map.hpp"
#include "ipc/cross_memory.hpp"
#include "ipc/names.hpp"
#include "ipc/orphan_grace.hpp"
#include "ipc/validate.hpp"

namespace smddp::daemon {

using ipc::OpType;
using ipc::Status;

std::atomic<int> Daemon::stop_signal_{0};

void Daemon::address(ipc::CompletionDesc& c, const Posted& p, ipc::CompletionKind kind) {
  c.request_id = p.desc.request_id;
  c.comm_id = p.desc.comm_id;
  c.seq = p.desc.seq;
  c.kind = kind;
}

namespace {

constexpr auto kHousekeepingEvery = std::chrono::milliseconds(50);
constexpr auto kIdleSleep = std::chrono::microseconds(100000);
constexpr std::size_t kMaxErrorsKept = 32;
// The daemon's own GPU executor (SMDDP_GPU_EXEC=daemon) and the ranks' plans serve groups within
// one node; CUDA tensors of a group that spans nodes reach the daemon as hierarchical plans
// (kFlagHierarchical) or as host operations staged through the ranks' arenas.
constexpr const char* kDeviceAcrossNodes =
    "smddp: this GPU request cannot run in a group that spans nodes: the daemon's GPU executor "
    "(SMDDP_GPU_EXEC=daemon) and in-node plans serve groups within one node; unset SMDDP_GPU_EXEC, use CPU "
    "tensors, or a group whose ranks share a node";

std::vector<int> world_slots(const JobLayout& l) {
  std::vector<int> slots(static_cast<std::size_t>(l.num_nodes * l.nproc_per_node), -1);
  for (int r = 0; r < l.nproc_per_node; ++r) slots[static_cast<std::size_t>(l.node_id * l.nproc_per_node + r)] = r;
  return slots;
}

ipc::SegmentSpec spec_of(const JobLayout& l, const DaemonConfig& c) {
  ipc::SegmentSpec s;
  s.job_id = l.job_id;
  s.node_id = l.node_id;
  s.num_nodes = l.num_nodes;
  s.local_world_size = l.nproc_per_node;
  s.world_size = l.num_nodes * l.nproc_per_node;
  s.first_rank = l.node_id * l.nproc_per_node;
  s.arena_bytes = c.arena_bytes;
  s.chunk_bytes = c.chunk_bytes;
  s.fast_cell_bytes = c.host_fast_bytes;
  const bool helpers = ipc::copy_threads(l.nproc_per_node, ipc::usable_cores()) >= 2;
  s.fast_read_bytes = c.host_fast_read.resolve(helpers);
  const bool shared_cores = ipc::yield_between_polls(l.nproc_per_node + 1);
  s.fast_reduce_bytes = c.host_fast_reduce.resolve(shared_cores);
  s.fast_reduce_shrinks = c.host_fast_reduce.shrinks(shared_cores);
  if (c.host_fast_bytes && c.host_single_copy_min_bytes) {
    if (const auto why = ipc::peer_reads_unavailable())
      spdlog::info("host collectives by single copy are off: {}; daemon.host_single_copy_kib=off silences this", *why);
    else
      s.fast_single_copy_bytes = *c.host_single_copy_min_bytes;
    if (s.fast_single_copy_bytes) {
      const auto r = c.host_single_copy_reduce.resolve(shared_cores);
      s.fast_single_copy_reduce_bytes = r.from;
      s.fast_single_copy_reduce_upto_bytes = r.upto;
      s.fast_single_copy_reduce_wide_bytes = r.wide_from;
      if (helpers)
        s.fast_single_copy_gather_wide_bytes =
            std::max(s.fast_single_copy_bytes, DaemonConfig::kSingleCopyGatherWideFrom);
    }
  }
  return s;
}

int parallelism_of(const DaemonConfig& c) {
  if (c.worker_threads > 0) return c.worker_threads;
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

std::string iso_now() {
  char buf[32];
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

Daemon::Daemon(JobLayout layout, DaemonConfig config, std::optional<InternodeSetup> internode)
    : layout_(std::move(layout)),
      config_(std::move(config)),
      segment_(ipc::Segment::create(spec_of(layout_, config_))),
      matcher_(world_slots(layout_), std::chrono::duration_cast<std::chrono::milliseconds>(config_.collective_timeout)),
      host_(segment_, parallelism_of(config_)),
      ranks_(static_cast<std::size_t>(layout_.nproc_per_node)),
      started_(Clock::now()) {
  spdlog::info("spinning: {} rank(s) and the daemon on {} core(s), {}; host allreduce and reduce split among the ranks {}; "
               "the host fast path reduces at most {} KiB a member{}",
               layout_.nproc_per_node, ipc::usable_cores(),
               yield_between_polls_ ? "yielding between polls" : "a core each, no yield",
               split_reduce_min_ ? "from " + std::to_string(*split_reduce_min_ >> 10) + " KiB a chunk" : std::string("off"),
               segment_.header().fast_reduce_bytes >> 10,
               segment_.header().fast_reduce_shrinks ? " with 2 members, x 2 / n with n" : "");
  if (internode) {
    internode::Engine::Options o;
    o.default_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(config_.collective_timeout);
    o.algorithm = config_.fabric_algorithm;
    spdlog::info("algorithms across nodes: {}", internode::to_string(o.algorithm));
    engine_ = std::make_unique<internode::Engine>(std::move(internode->topology), std::move(internode->transport),
                                                  internode->cards, segment_, host_.pool(), o);
    if (internode->lifelines) engine_->watch_lifelines(std::move(internode->lifelines));
    assumed_gpu_ = std::move(internode->gpu_of_slot);
  }
  fast_lanes_taken_.assign(static_cast<std::size_t>(layout_.nproc_per_node), 0);
  if (config_.host_fast_bytes && layout_.num_nodes == 1) {
    // The world, when it is all on this node, takes lane 0.
    matcher_.open_fast_lane(0, 0);
    for (auto& taken : fast_lanes_taken_) taken |= 1u;
  }
  ipc::ensure_socket_dir();
  control_ = std::make_unique<ControlServer>(ipc::socket_path(layout_.job_id, layout_.node_id),
                                             [this] { return snapshot(); });
  update_status(Clock::now());
}

Daemon::~Daemon() = default;

void Daemon::request_stop(int signo) noexcept { stop_signal_.store(signo); }

int Daemon::run(const std::vector<std::string>& command) {
  const int world = layout_.num_nodes * layout_.nproc_per_node;
  for (int r = 0; r < layout_.nproc_per_node; ++r) {
    const int global = layout_.node_id * layout_.nproc_per_node + r;
    std::map<std::string, std::string> env{
        {"RANK", std::to_string(global)},
        {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_RANK", std::to_string(r)},
        {"LOCAL_WORLD_SIZE", std::to_string(layout_.nproc_per_node)},
        {"GROUP_RANK", std::to_string(layout_.node_id)},
        {"NODE_RANK", std::to_string(layout_.node_id)},
        {"SMDATAPARALLEL_LOCAL_RANK", std::to_string(r)},
        {"SMDDP_JOB_ID", layout_.job_id},
        {"SMDDP_NODE_ID", std::to_string(layout_.node_id)},
        {"SMDDP_NUM_NODES", std::to_string(layout_.num_nodes)},
        {"SMDDP_DAEMON_PID", std::to_string(::getpid())},
        {ipc::kOrphanGraceEnv, std::to_string(config_.orphan_grace.count())},
        {"MASTER_ADDR", layout_.master_addr},
        {"MASTER_PORT", std::to_string(layout_.master_port)},
    };
    // A user's own rendezvous settings win over ours.
    for (const char* keep : {"MASTER_ADDR", "MASTER_PORT"})
      if (const char* v = std::getenv(keep); v && *v) env[keep] = v;
    // Open MPI, given mpirun by its path (smddprun gives it so), puts its own bin and lib first
    // in PATH and LD_LIBRARY_PATH: `python3` would be the system's, not the user's virtualenv's,
    // and /usr/lib would come before a conda environment's libraries. smddprun passes what the
    // user had (no SMDDP_RANK_LD_LIBRARY_PATH: none).
    std::set<std::string> drop{"SMDDP_RANK_PATH", "SMDDP_RANK_LD_LIBRARY_PATH"};
    if (const char* path = std::getenv("SMDDP_RANK_PATH"); path && *path) {
      env["PATH"] = path;
      if (const char* libs = std::getenv("SMDDP_RANK_LD_LIBRARY_PATH")) env["LD_LIBRARY_PATH"] = libs;
      else drop.insert("LD_LIBRARY_PATH");
    }
    try {
      ranks_[static_cast<std::size_t>(r)].pid = supervisor_.spawn(r, command, child_environment(env, drop));
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      fail_job(std::string("cannot start rank ") + std::to_string(global) + ": " + e.what(), 127);
      break;
    }
    spdlog::info("started rank {} (local rank {}) as pid {}", global, r, ranks_[static_cast<std::size_t>(r)].pid);
  }
  segment_.header().state.store(static_cast<std::uint32_t>(ipc::DaemonState::Ready), std::memory_order_release);
  return loop();
}

int Daemon::serve_attached(std::chrono::seconds attach_timeout) {
  attach_mode_ = true;
  attach_deadline_ = Clock::now() + attach_timeout;
  segment_.header().state.store(static_cast<std::uint32_t>(ipc::DaemonState::Ready), std::memory_order_release);
  spdlog::info("attach mode: waiting for {} rank(s) to attach", layout_.nproc_per_node);
  return loop();
}

bool Daemon::finished(Clock::time_point now) {
  if (!attach_mode_) return supervisor_.all_exited();
  bool all_gone = true, any = false, registered_gone = true;
  for (const auto& r : ranks_) {
    any = any || r.registered;
    all_gone = all_gone && r.registered && r.exited;
    registered_gone = registered_gone && (!r.registered || r.exited);
  }
  if (all_gone) return true;
  // Some ranks came and went, the others never came: after the attach timeout, stop.
  if (any && registered_gone && attach_deadline_ && now >= *attach_deadline_) {
    spdlog::error("ranks that attached have left and the others never attached; exiting");
    if (exit_code_ == 0) exit_code_ = 1;
    return true;
  }
  if (!any && attach_deadline_ && now >= *attach_deadline_) {
    spdlog::error("no rank attached within the attach timeout; exiting");
    if (exit_code_ == 0) exit_code_ = 1;
    return true;
  }
  // After a failure, ranks that never came will not come.
  if (failed_at_ && now - *failed_at_ >= config_.exit_grace) {
    for (const auto& r : ranks_)
      if (r.registered && !r.exited) return false;
    return true;
  }
  return false;
}

void Daemon::watch_attached_ranks() {
  for (int s = 0; s < layout_.nproc_per_node; ++s) {
    auto& info = ranks_[static_cast<std::size_t>(s)];
    if (!info.registered || info.exited) continue;
    const auto& slot = segment_.slot(s);
    if (info.pid == 0) info.pid = slot.pid;
    const auto state = slot.state.load(std::memory_order_acquire);
    const bool detached = state == static_cast<std::uint32_t>(ipc::SlotState::Exited);
    if (detached || !ipc::process_alive(info.pid)) {
      // A rank that detached exited cleanly; one that vanished did not say how it ended.
      info.exit_known = detached;
      on_rank_exit({s, info.pid, detached ? 0 : (1 << 8)});
    }
  }
}

int Daemon::loop() {
  Clock::time_point last_activity = Clock::now();
  for (;;) {
    const auto now = Clock::now();
    if (status_wanted_.load(std::memory_order_relaxed) && status_wanted_.exchange(false)) {
      // The ranks' host fast path posts without ringing: take in what waits before counting.
      for (int pass = 0; pass < 64 && any_request_waiting(); ++pass) poll_rings(now);
      update_status(now);
    }
    if (drive_internode(now)) last_activity = now;
    // Rings after this read are rings this poll may have missed.
    const auto rung_before_poll = segment_.header().daemon_bell.ticket();
    const bool polled = poll_rings(now);
    if (gpu_progress() || polled) {
      last_activity = now;
      if (now - last_housekeeping_ >= kHousekeepingEvery) housekeeping(now);
      continue;
    }
    if (now - last_housekeeping_ >= kHousekeepingEvery) housekeeping(now);
    if (finished(now)) break;
    if (now - last_activity < config_.spin) {
      // Spin on the rings, yielding after every poll when the ranks need our core
      // (ipc::yield_between_polls).
      ipc::cpu_relax();
      if (yield_between_polls_) ::sched_yield();
      continue;
    }
    auto& bell = segment_.header().daemon_bell;
    const auto ticket = bell.ticket();
    // Requests that came without a ring are the ranks' host fast path's: they only tell the
    // daemon what ran, and their ranks ring once a ring is half full. Where the daemon has a
    // core of its own, polling for them as they come pulled each one's cache lines back and
    // forth between its rank and the daemon, the rank's biggest cost of a small op (0.2 us of
    // 1.6 with 2 ranks, 0.8 of 2.4 with 4, on a 16-core host): it waits for a ring instead (a
    // request that came with one moved the ticket past the poll's). Where it shares the ranks'
    // cores, sleeping measured slower (4 ranks on 2 vCPUs: 8.2-8.8 against 6.8-7.5 us an 8 B
    // all-reduce; the ranks' rings then wake it from its futex), and it polls on.
    const bool waits_for_ring = !yield_between_polls_ && ticket == rung_before_poll;
    if (waits_for_ring ? requests_backlogged() : any_request_waiting()) continue;
    if (gpu_ && gpu_->pending()) {
      // Deferred GPU work waits for a rank's GPU: keep polling its flags.
      if (yield_between_polls_) ::sched_yield();
      continue;
    }
    // Inter-node operations in flight need the transport driven: keep spinning.
    if (engine_ && engine_->busy()) continue;
    bell.wait(ticket, kIdleSleep);
  }
  // Last look: requests that raced with the final exits still get an answer.
  poll_rings(Clock::now());
  resolve(matcher_.fail_all(Status::Shutdown, "the job's ranks have all exited"));
  if (engine_) {
    internode_finished(engine_->fail_all(Status::Shutdown, "the job's ranks have all exited"));
    // A clean node waits for the others (its last messages must land); a failed one leaves.
    engine_->finish(job_error_.empty() ? std::chrono::milliseconds(config_.collective_timeout) : std::chrono::milliseconds(1000));
    std::string bytes;
    const auto infos = engine_->endpoint_info();
    for (std::size_t i = 0; i < infos.size(); ++i)
      bytes += (i ? "; " : "") + std::to_string(i) + ": " + std::to_string(infos[i].bytes_sent) + " sent, " +
               std::to_string(infos[i].bytes_received) + " received";
    spdlog::info("fabric endpoint bytes: {}", bytes);
  }
  // Where the bytes went, by operation type, for the job's log.
  const nlohmann::json traffic = traffic_status();
  for (const auto& [op, t] : traffic["by_op"].items())
    spdlog::info("traffic {}: {} bytes GPU to arena, {} arena to GPU, {} reduced by the daemon, {} sent on the fabric", op,
                 t.value("to_host_bytes", std::uint64_t{0}), t.value("to_device_bytes", std::uint64_t{0}),
                 t.value("daemon_reduced_bytes", std::uint64_t{0}), t.value("fabric_sent_bytes", std::uint64_t{0}));
  for (std::size_t s = 0; s < ranks_.size(); ++s)
    if (ranks_[s].invalid > kInvalidLogged)
      spdlog::warn("rank {} posted {} invalid requests in all, {} of them logged", segment_.slot(static_cast<int>(s)).rank,
                   ranks_[s].invalid, kInvalidLogged);
  segment_.header().state.store(static_cast<std::uint32_t>(ipc::DaemonState::Stopping), std::memory_order_release);
  spdlog::info("all ranks exited; job exit status {}; {} collectives ({} on the ranks' host fast path, {} of them by "
               "single copy), {} bytes",
               exit_code_, collectives_done_, host_fast_ops_, host_single_copy_ops_, bytes_moved_);
  return exit_code_;
}

bool Daemon::any_request_waiting() const {
  for (int s = 0; s < layout_.nproc_per_node; ++s)
    if (!segment_.slot(s).requests.empty()) return true;
  return false;
}

bool Daemon::requests_backlogged() const {
  for (int s = 0; s < layout_.nproc_per_node; ++s)
    if (segment_.slot(s).requests.size() >= ipc::kRequestRingCapacity / 2) return true;
  return false;
}

bool Daemon::poll_rings(Clock::time_point now) {
  bool did = false;
  ipc::RequestDesc d;
  ipc::RequestDesc fast;  // a host fast-path request: its buffer fields stay empty
  for (int s = 0; s < layout_.nproc_per_node; ++s) {
    auto& slot = segment_.slot(s);
    auto& info = ranks_[static_cast<std::size_t>(s)];
    if (!info.registered && slot.state.load(std::memory_order_acquire) == static_cast<std::uint32_t>(ipc::SlotState::Registered)) {
      info.registered = true;
      if (attach_mode_) info.pid = slot.pid;
      spdlog::info("rank {} registered (pid {}, device {})", slot.rank, slot.pid,
                   slot.device_bus_id[0] ? slot.device_bus_id : "cpu");
      note_rank_gpu(s);
    }
    read_releases(s);
    for (int budget = 0; budget < 64; ++budget) {
      bool is_fast = false;
      const auto r = slot.requests.try_pop_with([&](const ipc::RequestDesc& in) {
        // A fast request's buffer fields were not written: they hold what an earlier request left
        // there. Its call alone is 2 of the slot's 7 lines.
        is_fast = (in.flags & ipc::kFlagHostFast) != 0;
        if (is_fast) std::memcpy(static_cast<void*>(&fast), &in, offsetof(ipc::RequestDesc, input));
        else d = in;
      });
      if (r == ipc::SpscRing<ipc::RequestDesc, ipc::kRequestRingCapacity>::PopResult::Empty) break;
      if (r == ipc::SpscRing<ipc::RequestDesc, ipc::kRequestRingCapacity>::PopResult::Corrupt) {
        fail_job("rank " + std::to_string(slot.rank) + " corrupted its request ring", 1);
        break;
      }
      // The ranks' host fast path does not wait for its answer: no reason to spin for more.
      if (!is_fast) did = true;
      handle_request(s, is_fast ? fast : d, now);
    }
  }
  return did;
}

void Daemon::read_releases(int slot) {
  auto& rs = segment_.slot(slot);
  auto& read = ranks_[static_cast<std::size_t>(slot)].released_read;
  const auto count = rs.released_count.load(std::memory_order_acquire);
  if (count == read) return;
  constexpr auto kCap = static_cast<std::uint64_t>(ipc::kMaxReleased);
  if (count - read > kCap) {
    spdlog::warn("rank {} freed {} CUDA allocations before the daemon read them: the other ranks keep those mapped "
                 "(and their memory held) until the job ends",
                 rs.rank, count - read - kCap);
    read = count - kCap;
  }
  for (; read < count; ++read) {
    const auto id = rs.released_ids[read % kCap];
    ++freed_allocations_;
    for (int to = 0; to < layout_.nproc_per_node; ++to) {
      if (handles_sent_.erase({to, slot, id}) == 0) continue;
      ipc::PlanHandle ph;
      ph.slot = slot;
      ph.alloc_id = id;
      ph.flags = ipc::kPlanHandleReleased;
      release_notices_[to].push_back(ph);
    }
    if (gpu_) gpu_->release_allocation(slot, id);
  }
}

void Daemon::handle_request(int slot, const ipc::RequestDesc& d, Clock::time_point now) {
  auto& info = ranks_[static_cast<std::size_t>(slot)];
  info.last_seq = d.seq;
  ++info.pending;
  if ((d.flags & ipc::kFlagHostFast) && job_error_.empty() && exited_slots_.empty() && post_host_fast(slot, d, now))
    return;
  Posted p{slot, -1, d, now};
  if (!job_error_.empty()) return complete(p, Status::PeerFailed, job_error_);

  ipc::ValidationContext ctx;
  ctx.arena_bytes = segment_.header().arena_bytes;
  ctx.event_count = static_cast<int>(segment_.slot(slot).event_count.load(std::memory_order_acquire));
  if (d.op == OpType::CommCreate) {
    ctx.group_size = static_cast<int>(std::min<std::uint64_t>(d.count, 1u << 24));
    ctx.group_rank = 0;
  } else {
    const Communicator* comm = matcher_.find(d.comm_id);
    if (!comm) return complete(p, Status::InvalidRequest, "communicator " + std::to_string(d.comm_id) + " does not exist");
    auto g = comm->group_rank_of_slot(slot);
    if (!g) return complete(p, Status::InvalidRequest, "rank is not a member of communicator " + std::to_string(d.comm_id));
    ctx.group_size = comm->size();
    ctx.group_rank = *g;
    p.group_rank = *g;
  }
  // A refused operation fails its partners as well (the collective's other members, the
  // other side of a send/recv), now or when they post: it cannot run without this rank, and
  // they would otherwise wait for the timeout.
  const auto refuse = [&](Status status, const std::string& err) {
    complete(p, status, err);
    const std::string why = "smddp: rank " + std::to_string(segment_.slot(slot).rank) + "'s " +
                            std::string(ipc::to_string(d.op)) + " was refused: " + err;
    resolve(matcher_.fail_partners(p.group_rank, d, status, why));
    if (const Communicator* comm = matcher_.find(d.comm_id)) tell_other_nodes(*comm, p.group_rank, d, status, why);
  };
  // --- GPU path: CUDA buffers need the GPU executor, created on first use.
  if (d.flags & ipc::kFlagRankExec) {
    ctx.cuda_enabled = true;  // the ranks run it; the daemon maps nothing
  } else if (cuda::is_device_request(d)) {
    ctx.cuda_enabled = gpu() != nullptr;
    if (!ctx.cuda_enabled)
      return refuse(Status::Unsupported, "smddp: CUDA tensors need the daemon's GPU path, which is off: " + gpu_off_);
  }
  // --- end GPU path
  if (auto err = ipc::validate_request(d, ctx)) {
    if (++info.invalid <= kInvalidLogged) spdlog::warn("rank {}: {}", segment_.slot(slot).rank, *err);
    if (info.invalid == kInvalidLogged)
      spdlog::warn("rank {}: {} invalid requests; its further ones are counted, not logged (the job's end gives the count)",
                   segment_.slot(slot).rank, kInvalidLogged);
    return refuse(Status::InvalidRequest, *err);
  }
  if ((d.flags & ipc::kFlagHostFast) && !matcher_.fast_ledger(d.comm_id))
    return refuse(Status::InvalidRequest, "smddp: a host fast-path request on communicator " + std::to_string(d.comm_id) +
                                              ", which has no fast lane (its members are not all on one node, or the "
                                              "lanes ran out)");
  if (engine_ && (d.op == OpType::Send || d.op == OpType::Recv)) {
    const Communicator* comm = matcher_.find(d.comm_id);
    if (comm->slots[static_cast<std::size_t>(d.root)] < 0) {
      if (cuda::is_device_request(d)) return complete(p, Status::Unsupported, kDeviceAcrossNodes);
      return engine_->start_p2p(*comm, p, now);
    }
  }
  if (d.op == OpType::CommCreate) {
    auto members = host_.read_aux<std::int32_t>(p, d.count);
    resolve(matcher_.post_create(slot, d, std::vector<int>(members.begin(), members.end()), now));
  } else {
    resolve(matcher_.post(slot, p.group_rank, d, now));
  }
  // A collective that waits for a rank that already exited can never run.
  for (int gone : exited_slots_)
    resolve(matcher_.fail_waiting_for(gone, Status::PeerFailed,
                                      "rank " + std::to_string(segment_.slot(gone).rank) + " (pid " +
                                          std::to_string(ranks_[static_cast<std::size_t>(gone)].pid) +
                                          ") already " + describe_exit(ranks_[static_cast<std::size_t>(gone)].wait_status)));
}

void Daemon::resolve(std::vector<Match> matches) {
  for (auto& m : matches) {
    std::vector<cuda::DoneMark> events;  // GPU path: what marks each member's part done
    const OpType op = m.posted.empty() ? OpType::Barrier : m.posted.front().desc.op;
    const auto fast = [](const Posted& p) { return (p.desc.flags & ipc::kFlagRankFast) != 0; };
    if (m.status == Status::Ok && m.comm && std::any_of(m.posted.begin(), m.posted.end(), fast)) {
      // The ranks' fast path: their GPUs already run it; the match is the check.
      std::optional<std::string> err;
      if (!std::all_of(m.posted.begin(), m.posted.end(), fast))
        err = "smddp " + std::string(ipc::to_string(op)) +
              ": ranks disagree on the GPU fast path (one passed a CUDA tensor that takes it, another did not; "
              "SMDDP_FAST_MAX_BYTES must be the same on every rank)";
      else if (engine_ && engine_->spans_nodes(*m.comm))
        err = "smddp " + std::string(ipc::to_string(op)) + ": the GPU fast path is for groups within one node";
      else if (const auto off = std::find_if(m.posted.begin(), m.posted.end(),
                                             [](const Posted& p) { return p.desc.wait_value == ipc::kFastSeqOff; });
               off != m.posted.end())
        err = "smddp " + std::string(ipc::to_string(op)) + ": rank " + std::to_string(segment_.slot(off->slot).rank) +
              " turned its GPU fast path off after an earlier failure of it; the members of this collective cannot "
              "run it together";
      else if (const auto& p0 = m.posted.front();
               std::any_of(m.posted.begin(), m.posted.end(),
                           [&](const Posted& p) { return p.desc.wait_value != p0.desc.wait_value; })) {
        // Each rank numbers its fast ops over all its groups; the kernels of the k-th ones met.
        std::string who;
        for (const auto& p : m.posted)
          who += (who.empty() ? "" : ", ") + std::string("rank ") + std::to_string(segment_.slot(p.slot).rank) +
                 " #" + std::to_string(p.desc.wait_value);
        err = "smddp " + std::string(ipc::to_string(op)) +
              ": ranks issued their GPU fast-path collectives of different groups in different orders (this one "
              "is fast op " + who + "); issue collectives in the same order on every rank";
      }
      if (!err) {
        ++collectives_done_;
        ++rank_exec_ops_;
        ++fast_ops_;
        for (const auto& p : m.posted) complete(p, Status::Ok, {});
        continue;
      }
      m.status = Status::Mismatch;
      m.error = *err;
    }
    const auto host_fast = [](const Posted& p) { return (p.desc.flags & ipc::kFlagHostFast) != 0; };
    if (m.status == Status::Ok && m.comm && std::any_of(m.posted.begin(), m.posted.end(), host_fast)) {
      // The ranks' host fast path: they already exchanged the bytes; the match is the check.
      if (auto err = check_host_fast(m)) {
        m.status = Status::Mismatch;
        m.error = *err;
      } else {
        const auto& d = m.posted.front().desc;
        count_host_fast({(d.flags & ipc::kFlagSingleCopy) != 0, FastLedger::output_bytes(d, m.comm->size())}, *m.comm);
        continue;
      }
    }
    const auto hierarchical = [](const Posted& p) { return (p.desc.flags & ipc::kFlagHierarchical) != 0; };
    const bool across = m.comm && engine_ && engine_->spans_nodes(*m.comm);
    if (m.status == Status::Ok && m.comm && std::any_of(m.posted.begin(), m.posted.end(), hierarchical)) {
      // CUDA tensors across nodes: this node's members get a plan of themselves; their shards
      // cross the nodes as host operations on their rails (ipc/protocol.hpp, kFlagHierarchical).
      if (auto err = check_hierarchical(m, across)) {
        m.status = Status::Mismatch;
        m.error = *err;
      }
    } else if (m.status == Status::Ok && across && op != OpType::CommCreate && op != OpType::Send &&
               op != OpType::Recv) {
      if (std::any_of(m.posted.begin(), m.posted.end(), [](const Posted& p) {
            return cuda::is_device_request(p.desc) || (p.desc.flags & ipc::kFlagRankExec);
          })) {
        m.status = Status::Unsupported;
        m.error = kDeviceAcrossNodes;
      } else {
        engine_->start(std::move(m), Clock::now());  // completes later, in drive_internode
        continue;
      }
    }
    const auto rank_exec = [](const Posted& p) { return (p.desc.flags & ipc::kFlagRankExec) != 0; };
    if (m.status == Status::Ok && m.comm && std::any_of(m.posted.begin(), m.posted.end(), rank_exec)) {
      std::optional<std::string> err;
      if (!std::all_of(m.posted.begin(), m.posted.end(), rank_exec))
        err = "smddp " + std::string(ipc::to_string(op)) +
              ": ranks disagree on where GPU work runs (SMDDP_GPU_EXEC must be the same on every rank)";
      else if (std::any_of(m.posted.begin(), m.posted.end(), [&](const Posted& p) {
                 return p.desc.wait_value != m.posted.front().desc.wait_value;
               }))
        // Their barriers would not pair up: a GPU would wait for ever, or race.
        err = "smddp " + std::string(ipc::to_string(op)) +
              ": ranks run different GPU schedules (SMDDP_ONESHOT_MAX_BYTES, SMDDP_TWOSHOT, SMDDP_COPY_DIRECTION and "
              "SMDDP_TWOSHOT_PIECE_BYTES must be the same on every rank)";
      else
        err = send_plans(m);
      if (!err) {
        ++collectives_done_;
        ++rank_exec_ops_;
        for (const auto& p : m.posted) {
          bytes_moved_ += p.desc.output.bytes;
          bw_window_bytes_ += p.desc.output.bytes;
        }
        continue;  // every member got its plan
      }
      m.status = Status::Mismatch;
      m.error = *err;
    }
    if (m.status == Status::Ok && m.comm && (send_sources(m) || send_shares(m))) continue;
    if (m.status == Status::Ok && m.comm && m.posted.front().desc.op != OpType::CommCreate) {
      std::uint64_t bytes = 0;
      std::optional<std::string> err;
      try {
        const bool device = std::any_of(m.posted.begin(), m.posted.end(),
                                        [](const Posted& p) { return cuda::is_device_request(p.desc); });
        const bool deferred = device && std::all_of(m.posted.begin(), m.posted.end(), [](const Posted& p) {
          return (p.desc.flags & ipc::kFlagDaemonCpuWait) != 0;
        });
        if (deferred && gpu()) err = gpu_->defer(m, events);  // runs later in gpu_progress()
        else err = device ? run_device(m, events, bytes) : host_.run(m, bytes);
      } catch (const std::exception& e) {
        err = std::string("internal error: ") + e.what();
      }
      if (err) {
        m.status = Status::Mismatch;
        m.error = *err;
      } else {
        ++collectives_done_;
        bytes_moved_ += bytes;
        bw_window_bytes_ += bytes;
      }
    } else if (m.status == Status::Ok && m.comm) {
      const int lane = take_fast_lane(*m.comm);
      spdlog::info("communicator {} created with {} ranks{}", m.comm->id, m.comm->size(),
                   lane >= 0 ? ", host fast lane " + std::to_string(lane) : std::string());
      // The members learn their lane from the answer (0: none).
      for (const auto& p : m.posted) complete(p, Status::Ok, {}, -1, static_cast<std::uint64_t>(lane + 1));
      continue;
    }
    if (m.status != Status::Ok) {
      if (m.comm && !m.posted.empty() && op != OpType::CommCreate && op != OpType::Send && op != OpType::Recv)
        tell_other_nodes(*m.comm, m.posted.front().group_rank, m.posted.front().desc, m.status, m.error);
      spdlog::error("{}", m.error);
      std::lock_guard lk(status_mu_);
      errors_.push_back({{"time", iso_now()}, {"message", m.error}});
      if (errors_.size() > kMaxErrorsKept) errors_.erase(errors_.begin());
    }
    for (std::size_t i = 0; i < m.posted.size(); ++i)
      if (i < events.size() && m.status == Status::Ok) complete(m.posted[i], m.status, m.error, events[i].event, events[i].value);
      else complete(m.posted[i], m.status, m.error);
  }
}

// --- GPU path ----------------------------------------------------------------------------
std::optional<std::string> Daemon::check_hierarchical(const Match& m, bool across) const {
  const std::string op(ipc::to_string(m.posted.front().desc.op));
  if (!std::all_of(m.posted.begin(), m.posted.end(),
                   [](const Posted& p) { return (p.desc.flags & ipc::kFlagHierarchical) != 0; }))
    return "smddp " + op +
           ": ranks disagree on how CUDA tensors cross nodes (one took the hierarchical path, another staged its "
           "whole tensor; SMDDP_CUDA_ACROSS_NODES and SMDDP_HIER_MIN_BYTES must be the same on every rank, and "
           "every rank must pass CUDA tensors)";
  if (!across)
    return "smddp " + op + ": a hierarchical GPU operation in a group within one node (communicator " +
           std::to_string(m.comm->id) + ")";
  // Every node must hold as many members: a rail has one member on each node.
  std::map<int, int> per_node;
  for (int g : m.comm->global_ranks) ++per_node[g / layout_.nproc_per_node];
  const int here = per_node[layout_.node_id];
  for (const auto& [node, k] : per_node)
    if (k != here)
      return "smddp " + op + ": communicator " + std::to_string(m.comm->id) + " holds " + std::to_string(here) +
             " ranks on node " + std::to_string(layout_.node_id) + " but " + std::to_string(k) + " on node " +
             std::to_string(node) + "; the hierarchical GPU path needs as many on every node";
  if (static_cast<int>(m.posted.size()) != here)
    return "smddp " + op + ": internal error: " + std::to_string(m.posted.size()) + " of " + std::to_string(here) +
           " local members matched";
  // The matcher leaves a group across nodes to the inter-node engine, which judges every
  // member's call; but the plan answered here lets this node's members read each other's
  // buffers first, so they must agree now (a rank that skipped a call would have them read
  // past its buffer).
  return disagreement(*m.comm, m.posted.front().desc.seq, m.posted);
}

std::optional<std::string> Daemon::send_plans(const Match& m) {
  const int n = static_cast<int>(m.posted.size());
  const std::string op(ipc::to_string(m.posted.front().desc.op));
  if (n > ipc::kPlanMaxMembers)
    return "smddp " + op + ": the rank-side GPU path runs groups of up to " + std::to_string(ipc::kPlanMaxMembers) +
           " ranks; this one has " + std::to_string(n) + " (set SMDDP_GPU_EXEC=daemon)";
  // The matcher already made the members agree on op, dtype, count, reduce op and root, which
  // is what lets each rank read the others' buffers.
  ipc::PlanHeader plan;
  plan.members = static_cast<std::uint16_t>(n);
  ipc::CompletionDesc final_c;
  for (int i = 0; i < n; ++i) {
    const auto& d = m.posted[static_cast<std::size_t>(i)].desc;
    ipc::PlanMember pm;
    pm.slot = m.posted[static_cast<std::size_t>(i)].slot;
    const auto ref = [](const ipc::BufferRef& r) {
      ipc::PlanRef x;
      if (r.kind == ipc::BufferKind::CudaIpc) {
        x.alloc_id = r.alloc_id;
        x.offset = r.offset;
        x.bytes = r.bytes;
      }
      return x;
    };
    pm.in = ref(d.input);
    pm.out = ref(d.output);
    final_c.set_plan_member(i, pm);
  }
  // Uneven AllToAll: every member's blocks, from all the split tables, which must agree.
  SplitTables splits;
  if (m.posted.front().desc.op == OpType::AllToAll && (m.posted.front().desc.flags & ipc::kFlagSplits)) {
    std::vector<std::uint64_t> in_bytes, out_bytes;
    for (const Posted& p : m.posted) {
      splits.push_back(host_.read_aux<std::int64_t>(p, 2 * static_cast<std::size_t>(n)));
      in_bytes.push_back(p.desc.input.bytes);
      out_bytes.push_back(p.desc.output.bytes);
    }
    if (auto bad = check_split_tables(splits, ipc::dtype_size(m.posted.front().desc.dtype), in_bytes, out_bytes))
      return "smddp " + op + ": " + *bad;
    plan.flags |= ipc::kPlanSplits;
  }
  for (int r = 0; r < n; ++r) {
    const Posted& to = m.posted[static_cast<std::size_t>(r)];
    // The allocations freed since this receiver's last plan, then the handles of the others'
    // allocations it has not been sent (or that changed).
    std::vector<ipc::PlanHandle> fresh;
    if (auto rn = release_notices_.find(to.slot); rn != release_notices_.end()) {
      fresh = std::move(rn->second);
      release_notices_.erase(rn);
    }
    for (int i = 0; i < n; ++i) {
      if (i == r) continue;
      const Posted& from = m.posted[static_cast<std::size_t>(i)];
      for (const ipc::BufferRef* b : {&from.desc.input, &from.desc.output}) {
        if (b->kind != ipc::BufferKind::CudaIpc) continue;
        std::array<std::uint8_t, ipc::kCudaIpcHandleBytes> h{};
        std::memcpy(h.data(), b->ipc_handle, h.size());
        auto [it, added] = handles_sent_.try_emplace({to.slot, from.slot, b->alloc_id}, h);
        if (!added && it->second == h) continue;
        it->second = h;
        ipc::PlanHandle ph;
        ph.slot = from.slot;
        ph.alloc_id = b->alloc_id;
        std::memcpy(ph.handle, h.data(), h.size());
        if (std::none_of(fresh.begin(), fresh.end(),
                         [&](const ipc::PlanHandle& x) { return x.slot == ph.slot && x.alloc_id == ph.alloc_id; }))
          fresh.push_back(ph);
      }
    }
    for (std::size_t at = 0; at < fresh.size(); at += ipc::kPlanHandlesPerCompletion) {
      ipc::CompletionDesc c;
      address(c, to, ipc::CompletionKind::Handles);
      ipc::PlanHeader h;
      h.handles = static_cast<std::uint16_t>(std::min(ipc::kPlanHandlesPerCompletion, fresh.size() - at));
      c.set_plan_header(h);
      for (int k = 0; k < h.handles; ++k) c.set_plan_handle(k, fresh[at + static_cast<std::size_t>(k)]);
      if (!push_completion(to.slot, c)) return std::nullopt;  // the job failed
    }
    ipc::CompletionDesc c = final_c;
    address(c, to, ipc::CompletionKind::Plan);
    plan.me = static_cast<std::uint16_t>(r);
    c.set_plan_header(plan);
    if (!splits.empty()) {
      const auto ur = static_cast<std::size_t>(r);
      for (std::size_t q = 0; q < splits.size(); ++q) {
        ipc::PlanSplit x;
        x.send = static_cast<std::uint64_t>(splits[ur][q]);
        x.send_dst = recv_offset(splits, q, ur);
        x.recv = static_cast<std::uint64_t>(splits[q][ur]);
        x.recv_src = send_offset(splits, q, ur);
        c.set_plan_split(static_cast<int>(q), x);
      }
    }
    auto& info = ranks_[static_cast<std::size_t>(to.slot)];
    if (info.pending) --info.pending;
    if (!push_completion(to.slot, c)) return std::nullopt;
  }
  return std::nullopt;
}

bool Daemon::push_completion(int slot_index, const ipc::CompletionDesc& c) {
  auto& slot = segment_.slot(slot_index);
  // Handles completions come on top of one completion per request; a rank with a full ring
  // is draining it (its progress thread runs while it has work in flight).
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  while (!slot.completions.try_push(c)) {
    // A rank that is gone reads no answer: its exit (on_rank_exit) says whether the job failed.
    const auto& info = ranks_[static_cast<std::size_t>(slot_index)];
    const auto st = static_cast<ipc::SlotState>(slot.state.load(std::memory_order_acquire));
    if (info.exited || st == ipc::SlotState::Exited || st == ipc::SlotState::Failed || !ipc::process_alive(info.pid))
      return false;
    if (Clock::now() > give_up) {
      spdlog::error("rank {} does not drain its completion ring", slot.rank);
      fail_job("rank " + std::to_string(slot.rank) + " does not drain its completion ring", 1);
      return false;
    }
    slot.client_bell.ring();
    segment_.header().heartbeat.fetch_add(1, std::memory_order_relaxed);  // waiting, not dead
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  slot.client_bell.ring();
  return true;
}

cuda::GpuExecutor* Daemon::gpu() {
  if (!gpu_tried_) {
    gpu_tried_ = true;
    gpu_ = cuda::GpuExecutor::create(segment_, gpu_off_);
    if (gpu_) spdlog::info("GPU path on: {}", gpu_->describe());
    else spdlog::warn("GPU path off: {}", gpu_off_);
  }
  return gpu_.get();
}

bool Daemon::gpu_progress() {
  if (!gpu_ || !gpu_->pending()) return false;
  std::string err;
  std::uint64_t bytes = 0;
  const bool did = gpu_->progress(err, bytes);
  bytes_moved_ += bytes;
  bw_window_bytes_ += bytes;
  if (!err.empty()) fail_job("the smddp GPU path failed: " + err, 1);
  return did;
}

std::optional<std::string> Daemon::run_device(const Match& m, std::vector<cuda::DoneMark>& events, std::uint64_t& bytes) {
  if (!gpu()) return "smddp: CUDA tensors need the daemon's GPU path, which is off: " + gpu_off_;
  return gpu_->run(m, events, bytes);
}
// --- end GPU path

bool Daemon::drive_internode(Clock::time_point now) {
  if (!engine_) return false;
  auto done = engine_->progress(now);
  if (auto f = engine_->take_peer_failure()) fail_job(f->error, f->exit_code);
  // Operations another node failed before starting them: the chunks this node's ranks post
  // later fail as they come (a send/recv across nodes never waits in the matcher).
  for (const auto& f : engine_->take_op_failures())
    if (f.src < 0) resolve(matcher_.fail_sequence(f.comm, f.seq, f.status, f.error));
  if (done.empty()) return false;
  internode_finished(std::move(done));
  return true;
}

void Daemon::internode_finished(std::vector<internode::Finished> done) {
  for (auto& f : done) {
    if (f.match.status == Status::Ok) {
      ++collectives_done_;
      bytes_moved_ += f.bytes;
      bw_window_bytes_ += f.bytes;
    } else {
      spdlog::error("{}", f.match.error);
      std::lock_guard lk(status_mu_);
      errors_.push_back({{"time", iso_now()}, {"message", f.match.error}});
      if (errors_.size() > kMaxErrorsKept) errors_.erase(errors_.begin());
    }
    for (const auto& p : f.match.posted) complete(p, f.match.status, f.match.error);
    // The other chunks of a mismatched operation fail at once, here as on the other nodes.
    if (f.mismatch && f.match.comm)
      resolve(matcher_.fail_sequence(f.match.comm->id, f.match.posted.front().desc.seq, Status::Mismatch, f.match.error));
  }
}

void Daemon::tell_other_nodes(const Communicator& comm, int group_rank, const ipc::RequestDesc& d, Status status,
                              const std::string& error) {
  // A job failure reaches the other nodes through the heartbeats, with its own text.
  if (!engine_ || !engine_->spans_nodes(comm) || !job_error_.empty() || status == Status::PeerFailed ||
      status == Status::Shutdown || d.op == OpType::CommCreate)
    return;
  internode::Engine::OpFailure f{d.comm_id, d.seq, -1, -1, status, error};
  if (d.op == OpType::Send || d.op == OpType::Recv) {
    if (d.root < 0 || d.root >= comm.size() || comm.slots[static_cast<std::size_t>(d.root)] >= 0) return;  // no partner elsewhere
    f.src = d.op == OpType::Send ? group_rank : d.root;
    f.dst = d.op == OpType::Send ? d.root : group_rank;
  }
  if (engine_->announce_op_failure(comm, f))
    spdlog::info("told the other nodes that operation #{} of communicator {} failed here", d.seq, d.comm_id);
}

void Daemon::complete(const Posted& p, Status status, std::string_view error, int daemon_event,
                      std::uint64_t daemon_value) {
  auto& info = ranks_[static_cast<std::size_t>(p.slot)];
  if (info.pending) --info.pending;
  ipc::CompletionDesc c;
  address(c, p, ipc::CompletionKind::Final);
  c.status = status;
  c.daemon_event = daemon_event;
  c.daemon_value = daemon_value;
  if (status != Status::Ok) c.set_error(error);
  // Clients keep at most kCompletionRingCapacity requests in flight, but rank-side GPU plans
  // add Handles completions: a full ring waits (briefly) for the rank to drain it.
  push_completion(p.slot, c);
}

void Daemon::housekeeping(Clock::time_point now) {
  last_housekeeping_ = now;
  auto& h = segment_.header();
  h.heartbeat.fetch_add(1, std::memory_order_relaxed);

  if (const auto exits = supervisor_.reap(); !exits.empty()) {
    // A rank's last requests may still be in its ring (host fast-path requests do not wake the
    // daemon): matched first, they are not collectives that wait for a rank that exited. Bounded:
    // the other ranks may go on posting.
    for (int round = 0; round < 8 && any_request_waiting(); ++round) poll_rings(now);
    for (const auto& ex : exits) on_rank_exit(ex);
  }
  if (attach_mode_) watch_attached_ranks();
  if (engine_)
    if (auto f = engine_->take_peer_failure()) fail_job(f->error, f->exit_code);
  if (const int sig = stop_signal_.exchange(0)) {
    spdlog::warn("received signal {}; stopping the job", sig);
    // mpirun signals at once when another daemon of the job died: on the same host its pid says
    // so already, and the job fails naming it rather than "asked to stop".
    if (engine_) {
      engine_->check_peers_now();
      if (auto f = engine_->take_peer_failure()) fail_job(f->error, f->exit_code);
    }
    // mpirun stops the other daemons once one died: ranks that already know why the job failed
    // get the usual grace period to report it.
    if (job_error_.empty()) supervisor_.signal_all(SIGTERM);
    fail_job("the smddp daemon on node " + std::to_string(layout_.node_id) + " was asked to stop (signal " +
                 std::to_string(sig) + ")",
             128 + sig);
  }
  std::vector<StallInfo> new_stalls;
  update_waits(now);
  auto expired = matcher_.expire(now, config_.stall_warning, new_stalls);
  // A rank that never posted may itself wait for another, or be stopped: name the one behind.
  for (auto& m : expired)
    if (m.status == ipc::Status::Timeout)
      if (auto why = explain_wait(unposted_local_ranks(m)); !why.empty()) m.error += "; " + why;
  resolve(std::move(expired));
  watch_shares(now, new_stalls);
  if (engine_)
    for (auto& s : engine_->stalls(now, config_.stall_warning, true)) new_stalls.push_back(std::move(s));
  if (engine_) {
    // This node's late ranks, for the other nodes' timeouts to name (Engine::set_stall_note).
    std::string note;
    double longest = 0;
    auto late_here = matcher_.stalls(now, config_.stall_warning);
    for (auto& s : share_stalls(now)) late_here.push_back(std::move(s));
    for (const auto& st : late_here) {
      std::string late;
      for (int g : st.missing_global_ranks)
        if (g / layout_.nproc_per_node == layout_.node_id) late += (late.empty() ? "" : " ") + std::to_string(g);
      if (late.empty() || st.waiting_s < longest) continue;
      longest = st.waiting_s;
      note = "rank(s) " + late + " late: " + std::string(ipc::to_string(st.op)) + " on communicator " + std::to_string(st.comm_id) +
             " (operation #" + std::to_string(st.seq) + ") has waited " + std::to_string(static_cast<int>(st.waiting_s)) +
             " s for them";
    }
    engine_->set_stall_note(std::move(note));
  }
  for (const auto& s : new_stalls) {
    std::string missing;
    for (int g : s.missing_global_ranks) missing += (missing.empty() ? "" : ", ") + std::to_string(g);
    spdlog::warn("stall: {} (communicator {}, operation #{}) has waited {:.0f} s for rank(s) {}",
                 ipc::to_string(s.op), s.comm_id, s.seq, s.waiting_s, missing);
  }
  if (failed_at_) {
    const auto since = now - *failed_at_;
    if (!sent_term_ && since >= config_.exit_grace) {
      sent_term_ = true;
      spdlog::warn("terminating the {} rank(s) still running after the job failed", supervisor_.running());
      supervisor_.signal_all(SIGTERM);
    } else if (sent_term_ && !sent_kill_ && since >= config_.exit_grace + std::chrono::seconds(5)) {
      sent_kill_ = true;
      supervisor_.signal_all(SIGKILL);
    }
  }
  update_status(now);
}

void Daemon::on_rank_exit(const RankExit& ex) {
  auto& info = ranks_[static_cast<std::size_t>(ex.local_rank)];
  info.exited = true;
  info.wait_status = ex.wait_status;
  auto& slot = segment_.slot(ex.local_rank);
  const int global = layout_.node_id * layout_.nproc_per_node + ex.local_rank;
  // An attached rank is not our child: we see only whether it detached first.
  const std::string how = !attach_mode_ ? describe_exit(ex.wait_status)
                          : info.exit_known ? std::string("detached from smddp (its exit status is unknown to the daemon)")
                                            : std::string("exited without detaching from smddp (crashed or killed)");
  const std::string what = "rank " + std::to_string(global) + " (pid " + std::to_string(ex.pid) + ") on node " +
                           std::to_string(layout_.node_id) + " " + how;
  const bool clean = exit_code_of(ex.wait_status) == 0;
  std::erase_if(handles_sent_, [&](const auto& e) {
    return std::get<0>(e.first) == ex.local_rank || std::get<1>(e.first) == ex.local_rank;
  });
  release_notices_.erase(ex.local_rank);
  if (clean) {
    slot.state.store(static_cast<std::uint32_t>(ipc::SlotState::Exited), std::memory_order_release);
    spdlog::info("{}", what);
    exited_slots_.push_back(ex.local_rank);
    resolve(matcher_.fail_waiting_for(ex.local_rank, Status::PeerFailed, what + " while others wait for it"));
  } else {
    spdlog::error("{}", what);
    fail_job(what, exit_code_of(ex.wait_status));
    // Only after the job's error is published: a peer that sees this slot Failed must find the
    // reason (pid, signal) in the header, not just that the rank is gone.
    slot.state.store(static_cast<std::uint32_t>(ipc::SlotState::Failed), std::memory_order_release);
  }
}

void Daemon::fail_job(const std::string& error, int exit_code) {
  if (!job_error_.empty()) return;  // the first failure is the job's failure
  job_error_ = error;
  exit_code_ = exit_code ? exit_code : 1;
  failed_at_ = Clock::now();
  auto& h = segment_.header();
  std::strncpy(h.job_error, error.c_str(), sizeof h.job_error - 1);
  h.job_failed.store(1, std::memory_order_release);
  h.state.store(static_cast<std::uint32_t>(ipc::DaemonState::Failed), std::memory_order_release);
  {
    std::lock_guard lk(status_mu_);
    errors_.push_back({{"time", iso_now()}, {"message", error}});
  }
  resolve(matcher_.fail_all(Status::PeerFailed, error));
  if (gpu_) gpu_->abort_pending();  // GPU path: release rank streams waiting for promised work
  if (engine_) {
    engine_->announce_failure(error, exit_code_);
    internode_finished(engine_->fail_all(Status::PeerFailed, error));
  }
  // Wake every rank so sleepers see the failure now.
  for (int s = 0; s < layout_.nproc_per_node; ++s) segment_.slot(s).client_bell.ring();
}

void Daemon::note_rank_gpu(int s) const {
  if (!engine_ || static_cast<std::size_t>(s) >= assumed_gpu_.size()) return;
  const auto& slot = segment_.slot(s);
  const auto& assumed = assumed_gpu_[static_cast<std::size_t>(s)];
  const std::string actual = internode::normalize_bus_id(std::string(slot.device_bus_id, ::strnlen(slot.device_bus_id, ipc::kBusIdBytes)));
  if (assumed.empty() || actual.empty() || actual == assumed) return;
  // The table was published at bootstrap and both sides of every message rely on it: it stays.
  spdlog::info("rank {} (local slot {}) uses GPU {}, but the fabric endpoint table assumed GPU {}: its operations "
               "with one member per node take endpoint {}, which may not be the nearest",
               slot.rank, s, actual, assumed, engine_->rails().rail_of_slot.at(static_cast<std::size_t>(s)));
}

}  // namespace smddp::daemon
