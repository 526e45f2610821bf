// libsmddp_client: attaching to the node's daemon, the client's lifecycle, and what the GPU
// path publishes through the rank's segment slot. The rest of ClientImpl lives beside it:
// staging.cpp (operations into chunks and the arena), completions.cpp (answers, failures and
// waiting), op_order.cpp (issue order on shared memory), arena_reads.cpp (outputs copied from
// the members' arenas), communicator.cpp (the Communicator).
#include "client/client.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "client/client_impl.hpp"
#include "client/host_fast.hpp"
#include "client/orphan_watch.hpp"
#include "ipc/cross_memory.hpp"
#include "ipc/names.hpp"

namespace smddp::client {

namespace {

int env_int(const char* name, bool required, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (required)
      throw Error(Status::InvalidRequest, std::string("environment variable ") + name +
                                              " is not set; start ranks with smddprun, mpirun or torchrun");
    return fallback;
  }
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 24))
    throw Error(Status::InvalidRequest, std::string("environment variable ") + name + "='" + v + "' is not a valid number");
  return static_cast<int>(x);
}

// Elements of staging per element of a chunk, for the most demanding role of the op; the
// same on every rank, so every rank cuts the same chunks.

}  // namespace

// ---------------------------------------------------------------------------------------
// AttachOptions / attach

AttachOptions AttachOptions::from_env() {
  AttachOptions o;
  const char* job = std::getenv("SMDDP_JOB_ID");
  if (!job || !*job)
    throw Error(Status::InvalidRequest,
                "SMDDP_JOB_ID is not set: no smddp daemon was started for this job. Launch with "
                "'smddprun [--nproc-per-node N] -- python train.py', or with mpirun/torchrun and the smddp "
                "PyTorch backend, which starts one");
  o.job_id = job;
  o.node_id = env_int("SMDDP_NODE_ID", false, 0);
  o.rank = env_int("RANK", true, 0);
  o.world_size = env_int("WORLD_SIZE", true, 0);
  o.local_rank = env_int("LOCAL_RANK", true, 0);
  o.local_world_size = env_int("LOCAL_WORLD_SIZE", true, 0);
  return o;
}

std::shared_ptr<Client> Client::attach(const AttachOptions& opts) {
  try {
    ipc::check_job_id(opts.job_id);
    copy_threads_from(std::getenv(kCopyThreadsEnv), opts.local_world_size, 1);  // a bad value fails now, not on retry
  } catch (const std::exception& e) {
    throw Error(Status::InvalidRequest, e.what());
  }
  const auto deadline = Clock::now() + opts.attach_timeout;
  std::string last_error;
  for (;;) {
    try {
      auto seg = ipc::Segment::attach(opts.job_id, opts.node_id);
      auto& h = seg.header();
      // A segment whose daemon has exited is a killed job's leftover (or this job's daemon
      // died): never attach to it; the next daemon of this job id replaces it.
      if (const int owner = h.daemon_pid; !ipc::process_alive(owner))
        throw std::runtime_error("segment /dev/shm/" + ipc::segment_name(opts.job_id, opts.node_id) +
                                 " was left by daemon pid " + std::to_string(owner) + ", which has exited");
      // Wait for the daemon to finish starting.
      while (h.state.load(std::memory_order_acquire) == static_cast<std::uint32_t>(ipc::DaemonState::Starting) &&
             Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const auto state = static_cast<ipc::DaemonState>(h.state.load(std::memory_order_acquire));
      if (state == ipc::DaemonState::Failed || state == ipc::DaemonState::Stopping)
        throw Error(Status::PeerFailed, "the smddp daemon of job " + opts.job_id + " is no longer serving (" +
                                            std::string(h.job_error, ::strnlen(h.job_error, sizeof h.job_error)) + ")");
      if (state != ipc::DaemonState::Ready) throw std::runtime_error("the daemon is still starting");
      auto client = std::make_shared<ClientImpl>(opts, std::move(seg));
      client->start();
      return client;
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      last_error = e.what();
      if (std::string_view(last_error).find("version mismatch") != std::string_view::npos)
        throw Error(Status::InvalidRequest, last_error);
    }
    if (Clock::now() >= deadline)
      throw Error(Status::PeerFailed,
                  "cannot reach the smddp daemon of job " + opts.job_id + " on node " + std::to_string(opts.node_id) +
                      " after " + std::to_string(opts.attach_timeout.count() / 1000) + " s (" + last_error +
                      "). Start the job with 'smddprun [--nproc-per-node N] -- python train.py', or with "
                      "mpirun/torchrun and backend='smddp', which starts a daemon itself");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// ---------------------------------------------------------------------------------------
// ClientImpl

ClientImpl::ClientImpl(const AttachOptions& o, ipc::Segment segment)
    : job_id_(o.job_id),
      rank_(o.rank),
      world_size_(o.world_size),
      local_rank_(o.local_rank),
      local_world_size_(o.local_world_size),
      node_id_(o.node_id),
      num_nodes_(segment.header().num_nodes),
      daemon_pid_(segment.header().daemon_pid),
      yield_between_polls_(o.yield_between_polls.value_or(ipc::yield_between_polls(o.local_world_size + 1))),
      copy_threads_(copy_threads_from(std::getenv(kCopyThreadsEnv), o.local_world_size, ipc::usable_cores())),
      segment_(std::move(segment)),
      slot_(segment_.slot(std::clamp(o.local_rank, 0, ipc::kMaxLocalRanks - 1))),
      chunk_bytes_(segment_.header().chunk_bytes),
      alloc_(segment_.header().arena_bytes) {
  auto& h = segment_.header();
  auto refuse = [&](const std::string& why) { throw Error(Status::InvalidRequest, why); };
  auto mismatch = [&](const std::string& why) { throw LayoutMismatch(why); };
  if (o.local_rank < 0 || o.local_rank >= h.local_world_size)
    mismatch("LOCAL_RANK " + std::to_string(o.local_rank) + " is outside the daemon's " +
             std::to_string(h.local_world_size) + " local ranks");
  if (o.local_world_size != h.local_world_size)
    mismatch("LOCAL_WORLD_SIZE is " + std::to_string(o.local_world_size) + " but the daemon serves " +
             std::to_string(h.local_world_size) + " ranks on this node");
  if (o.world_size != h.world_size)
    mismatch("WORLD_SIZE is " + std::to_string(o.world_size) + " but the job has " + std::to_string(h.world_size) + " ranks");
  if (o.rank != slot_.rank)
    mismatch("RANK " + std::to_string(o.rank) + " does not match local rank " + std::to_string(o.local_rank) +
             " of node " + std::to_string(o.node_id) + " (the daemon expects rank " + std::to_string(slot_.rank) + ")");
  arena_ = segment_.arena(o.local_rank);
  std::uint32_t expected = static_cast<std::uint32_t>(ipc::SlotState::Empty);
  if (!slot_.state.compare_exchange_strong(expected, static_cast<std::uint32_t>(ipc::SlotState::Claiming))) {
    if (expected == static_cast<std::uint32_t>(ipc::SlotState::Exited) && slot_.pid == ::getpid())
      refuse("this process already attached to job " + o.job_id + " as local rank " + std::to_string(o.local_rank) +
             " and detached; attaching a second time in one job is not supported (keep the process group, or "
             "start a new job)");
    refuse("local rank " + std::to_string(o.local_rank) + " of job " + o.job_id + " is already taken (pid " +
           std::to_string(slot_.pid) + ", state " + std::to_string(expected) + ")");
  }
  waker_->bell = &slot_.client_bell;
  // Single copy: the other ranks read this one's inputs (Yama's scope 1 lets only ancestors).
  if (h.fast_single_copy_bytes) ipc::allow_peer_reads();
  slot_.pid = ::getpid();
  std::strncpy(slot_.device_bus_id, o.device_bus_id.c_str(), ipc::kBusIdBytes - 1);
  slot_.state.store(static_cast<std::uint32_t>(ipc::SlotState::Registered), std::memory_order_release);
  h.daemon_bell.ring();
  last_heartbeat_ = h.heartbeat.load(std::memory_order_relaxed);
  heartbeat_seen_ = Clock::now();
  // The daemon gives the world host fast lane 0 when the job has a single node.
  if (h.fast_cell_bytes && num_nodes_ == 1) {
    world_seq_->fast_lane = 0;
    for (int s = 0; s < local_world_size_; ++s) world_seq_->fast_slots.push_back(s);
  }
}

void ClientImpl::start() {
  progress_ = std::thread([this] { progress_thread(); });
  watch_for_orphaning(daemon_pid_, orphan_grace_from_env());
}


void ClientImpl::detach() {
  hand_over_outbox();
  Deferred callbacks;
  {
    std::lock_guard lk(mu_);
    if (detached_) return;
    detached_ = true;
    stop_ = true;
    fail_all_locked(Status::Shutdown, "this rank detached from smddp before the operation finished", callbacks);
  }
  work_cv_.notify_all();
  slot_.client_bell.ring();
  if (progress_.joinable() && progress_.get_id() != std::this_thread::get_id()) progress_.join();
  run(callbacks);
  std::uint32_t reg = static_cast<std::uint32_t>(ipc::SlotState::Registered);
  slot_.state.compare_exchange_strong(reg, static_cast<std::uint32_t>(ipc::SlotState::Exited));
}

ClientImpl::~ClientImpl() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  slot_.client_bell.ring();
  if (progress_.joinable()) {
    if (progress_.get_id() == std::this_thread::get_id()) {
      t_client_destroyed_here = true;
      progress_.detach();
    } else {
      progress_.join();
    }
  }
  hand_over_outbox();
  {
    std::lock_guard lk(waker_->mu);
    waker_->bell = nullptr;
  }
  // Copies into or out of the arena must end before it is unmapped, and so must its CUDA
  // registration. (Staged chunks hold their ops, which hold the client: none are left.)
  for (auto& d : draining_) d.copier->drain();
  if (arena_release_) arena_release_();
  std::uint32_t reg = static_cast<std::uint32_t>(ipc::SlotState::Registered);
  slot_.state.compare_exchange_strong(reg, static_cast<std::uint32_t>(ipc::SlotState::Exited));
}

void ClientImpl::wait_for_outbox_room(std::unique_lock<std::mutex>& lk) {
  Deferred callbacks;
  while (outbox_fast_ >= kOutboxFastLimit && dead_.empty() && !detached_) {
    progress_locked(callbacks);  // pushes what the ring takes, and rings the daemon
    const bool full = outbox_fast_ >= kOutboxFastLimit;
    if (full) check_liveness_locked(callbacks);  // a stalled daemon fails the client here
    lk.unlock();
    run(callbacks);
    if (full) std::this_thread::sleep_for(std::chrono::microseconds(20));
    lk.lock();
  }
}

void ClientImpl::hand_over_outbox() {
  // The daemon drains a ring within microseconds of its bell: seconds is a daemon that stopped.
  constexpr auto kHandOverLimit = std::chrono::seconds(5);
  auto& h = segment_.header();
  const auto until = Clock::now() + kHandOverLimit;
  Deferred callbacks;
  // Only fast requests are waited for: a detach fails the staged chunks of ops still running.
  const auto fast_left = [&] { return outbox_fast_ > 0; };
  std::unique_lock lk(mu_);
  while (fast_left()) {
    flush_outbox_locked(callbacks);
    h.daemon_bell.ring();  // it takes what went, which makes room for the rest
    if (!fast_left() || !dead_.empty() || h.job_failed.load(std::memory_order_acquire) ||
        !ipc::process_alive(daemon_pid_) || Clock::now() >= until)
      break;
    lk.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    lk.lock();
  }
  lk.unlock();
  run(callbacks);
}

std::string ClientImpl::job_error() const {
  std::lock_guard lk(mu_);
  if (!dead_.empty()) return dead_;
  auto& h = segment_.header();
  if (h.job_failed.load(std::memory_order_acquire)) return std::string(h.job_error, ::strnlen(h.job_error, sizeof h.job_error));
  return {};
}

void ClientImpl::run(Deferred& deferred) {
  for (auto& cb : deferred.callbacks) cb();
  deferred.callbacks.clear();
  // Last: dropping the final op reference may destroy the client.
  deferred.released.clear();
}

void ClientImpl::check_usable_locked() const {
  if (detached_) throw Error(Status::Shutdown, "this rank has detached from smddp (Client::detach)");
  if (!dead_.empty()) throw Error(Status::PeerFailed, dead_);
}

void ClientImpl::submit_to_daemon_locked(const std::shared_ptr<OpState>& op, Deferred& callbacks) {
  if (op->stage_bytes(0) > alloc_.capacity())
    throw Error(Status::InvalidRequest, std::string(ipc::to_string(op->plan_.base.op)) + " needs " +
                                            std::to_string(op->stage_bytes(0)) +
                                            " bytes of staging at once, more than the arena of " +
                                            std::to_string(alloc_.capacity()) + " bytes (raise daemon.arena_mib)");
  if (op->plan_.copier) op->plan_.copier->set_wake([w = waker_] { w->wake(); });
  submit_locked(op, callbacks);
}

std::shared_ptr<OpState> ClientImpl::submit(std::shared_ptr<OpState>&& op) {
  op->planned();
  Deferred callbacks;
  {
    std::lock_guard lk(mu_);
    check_usable_locked();
    submit_to_daemon_locked(op, callbacks);
  }
  work_cv_.notify_one();
  run(callbacks);
  return std::move(op);
}

WorkPtr ClientImpl::submit(const std::shared_ptr<ClientImpl>& self, OpPlan&& plan, std::chrono::milliseconds timeout,
                           SeqState& seq) {
  Deferred callbacks;
  bool wake = true;
  std::shared_ptr<OpState> op;
  {
    std::unique_lock lk(mu_);
    if (outbox_fast_ >= kOutboxFastLimit) wait_for_outbox_room(lk);
    check_usable_locked();
    const bool fast = number_locked(plan, seq);
    std::uint64_t request = 0;
    const FastNow now = fast ? run_fast_now_locked(plan, request) : FastNow::NotStarted;
    // No OpState, no memory-order entry, no queue: each cost more than the exchange itself.
    if (now == FastNow::Done) return finished_work();
    op = std::make_shared<OpState>(self, timeout, std::move(plan));
    op->planned();
    if (now == FastNow::Published) published(*op, request);
    // The progress thread is woken only for a fast op that could not publish at once (its
    // lane's cells are still read, or it waits for an earlier op on its memory): the others'
    // wait needs its cell even if nobody here waits. Otherwise a caller that waits drives it,
    // and one that registers a callback wakes the thread then (OpState::on_complete): waking
    // it for every op cost a system call on the critical path.
    if (fast) wake = !submit_fast_locked(op, callbacks);
    else submit_to_daemon_locked(op, callbacks);
  }
  if (wake) work_cv_.notify_one();
  run(callbacks);
  return op;
}

bool ClientImpl::number_locked(OpPlan& p, SeqState& seq) {
  const ipc::OpType op = p.base.op;
  if (op == ipc::OpType::Send) p.base.seq = ++seq.sends[p.base.root];
  else if (op == ipc::OpType::Recv) p.base.seq = ++seq.recvs[p.base.root];
  else p.base.seq = ++seq.collectives;
  if (is_p2p(op) || op == ipc::OpType::CommCreate) return false;
  // The communicator's numbering: a failure turns its host fast path off.
  p.comm_state = &seq;
  if (seq.fast_lane < 0 || seq.fast_off.load(std::memory_order_relaxed)) return false;
  if (p.device || p.copier || p.ordered_by_caller || p.unchunked || (p.base.flags & ipc::kFlagSplits)) return false;
  if (ipc::reduces(op) && !ipc::reduce_op_supported(p.base.reduce_op, p.base.dtype)) return false;  // the daemon says why
  auto& rule = seq.last_rule;
  if (rule.op != op || rule.dtype != p.base.dtype || rule.count != p.base.count) {
    const auto& h = segment_.header();
    rule.op = op;
    rule.dtype = p.base.dtype;
    rule.count = p.base.count;
    rule.largest_input = host_fast::largest_input(op, p.base.count, p.base.dtype, p.group_size).value_or(0);
    rule.single_copy = host_fast::single_copy(op, p.base.count, p.base.dtype, p.group_size, h.fast_single_copy_bytes,
                                              h.fast_single_copy_gather_wide_bytes);
    rule.takes = rule.single_copy || host_fast::fits(op, p.base.count, p.base.dtype, p.group_size, h.fast_cell_bytes,
                                                     h.fast_read_bytes, h.fast_reduce_bytes, h.fast_reduce_shrinks != 0);
    if (!rule.takes && host_fast::single_copy_reduce(op, p.base.count, p.base.dtype, p.group_size,
                                                     h.fast_single_copy_reduce_bytes,
                                                     h.fast_single_copy_reduce_upto_bytes,
                                                     h.fast_single_copy_reduce_wide_bytes))
      rule.takes = rule.single_copy = true;
  }
  p.fast_single_copy = rule.single_copy;
  if (!rule.takes) return false;
  p.fast_lane = seq.fast_lane;
  p.fast_k = ++seq.fast_ops;
  p.fast_largest_input = rule.single_copy ? 0 : rule.largest_input;
  return true;
}

void ClientImpl::submit_locked(const std::shared_ptr<OpState>& op, Deferred& callbacks) {
  if (!op->plan_.ordered_by_caller) note_order_locked(op);
  if (is_p2p(op->plan_.base.op)) p2p_.push_back(op);
  else queue_.push_back(op);
  ++active_;
  // A GPU fast-path op is already running: its caller must not pay for finishing earlier
  // ops (their completions wait for a waiter or the progress thread).
  if (op->plan_.base.flags & ipc::kFlagRankFast) {
    fast_seen_ = true;
    submit_queued_locked(callbacks);
  } else {
    progress_locked(callbacks);
  }
}

int ClientImpl::export_event(const std::array<std::uint8_t, 64>& handle) {
  std::lock_guard lk(events_mu_);
  const auto n = slot_.event_count.load(std::memory_order_relaxed);
  if (n >= static_cast<std::uint32_t>(ipc::kMaxEvents))
    throw Error(Status::Unsupported, "this rank exported " + std::to_string(n) +
                                         " CUDA events, the most the daemon's table holds");
  std::memcpy(slot_.event_handles[n], handle.data(), handle.size());
  slot_.event_count.store(n + 1, std::memory_order_release);  // publishes the handle
  return static_cast<int>(n);
}

std::optional<std::array<std::uint8_t, 64>> ClientImpl::daemon_event_handle(int index) const {
  const auto n = slot_.daemon_event_count.load(std::memory_order_acquire);
  if (index < 0 || static_cast<std::uint32_t>(index) >= n || index >= ipc::kMaxDaemonEvents) return std::nullopt;
  std::array<std::uint8_t, 64> h{};
  std::memcpy(h.data(), slot_.daemon_event_handles[index], h.size());
  return h;
}

std::optional<Client::GpuSyncArea> ClientImpl::gpu_sync_area() {
  GpuSyncArea a;
  a.region = &slot_;
  a.bytes = segment_.header().slot_bytes;
  a.stream_flags = slot_.stream_flags;
  a.stream_flag_count = ipc::kMaxEvents;
  a.done_flag = &slot_.done_flag;
  return a;
}

void ClientImpl::publish_flag_block(const std::array<std::uint8_t, 64>& handle) {
  std::memcpy(slot_.flag_block_handle, handle.data(), handle.size());
  slot_.flag_block_published.store(1, std::memory_order_release);
}

void ClientImpl::release_allocation(std::uint64_t alloc_id) {
  // One writer at a time (the allocator may free on several threads); the daemon only reads.
  std::lock_guard lk(release_mu_);
  const auto i = slot_.released_count.load(std::memory_order_relaxed);
  slot_.released_ids[i % ipc::kMaxReleased] = alloc_id;
  slot_.released_count.store(i + 1, std::memory_order_release);
}

std::optional<std::array<std::uint8_t, 64>> ClientImpl::flag_block_of(int slot) const {
  if (slot < 0 || slot >= local_world_size_) return std::nullopt;
  const auto& s = segment_.slot(slot);
  if (!s.flag_block_published.load(std::memory_order_acquire)) return std::nullopt;
  std::array<std::uint8_t, 64> h{};
  std::memcpy(h.data(), s.flag_block_handle, h.size());
  return h;
}

void ClientImpl::count_gpu_work(OpType op, std::uint64_t kernels, std::uint64_t copies) {
  const auto i = static_cast<std::size_t>(op);
  if (i >= static_cast<std::size_t>(ipc::kOpTypeCount)) return;
  slot_.gpu_ops[i].fetch_add(1, std::memory_order_relaxed);
  slot_.gpu_kernels[i].fetch_add(kernels, std::memory_order_relaxed);
  slot_.gpu_copies.fetch_add(copies, std::memory_order_relaxed);
}

Client::GpuWork ClientImpl::gpu_work() const {
  GpuWork w;
  for (std::size_t i = 0; i < w.ops.size(); ++i) {
    w.ops[i] = slot_.gpu_ops[i].load(std::memory_order_relaxed);
    w.kernels[i] = slot_.gpu_kernels[i].load(std::memory_order_relaxed);
  }
  w.copies = slot_.gpu_copies.load(std::memory_order_relaxed);
  return w;
}

void ClientImpl::set_failure_handler(std::function<void()> handler) {
  {
    std::lock_guard lk(mu_);
    failure_handler_ = std::move(handler);
  }
  // The progress thread may sleep without a time limit: with a handler it must watch the job.
  work_cv_.notify_all();
}

void ClientImpl::set_exec_handler(ExecHandler handler) {
  std::lock_guard lk(mu_);
  exec_handler_ = std::move(handler);
}
}  // namespace smddp::client
