#include "client/client.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "client/client_impl.hpp"
#include "ipc/names.hpp"

namespace smddp::client {

using Clock = std::chrono::steady_clock;
using ipc::BufferKind;
using ipc::OpType;

namespace {

constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kSlice = std::chrono::milliseconds(20);
constexpr auto kHeartbeatStale = std::chrono::seconds(3);
constexpr auto kBackstop = std::chrono::seconds(15);  // beyond the daemon's own timeout
constexpr auto kDefaultTimeout = std::chrono::milliseconds(30 * 60 * 1000);

bool is_p2p(OpType op) { return op == OpType::Send || op == OpType::Recv; }

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
std::uint64_t stage_multiplier(OpType op, std::uint64_t n) {
  switch (op) {
    case OpType::AllReduce:
    case OpType::Broadcast:
    case OpType::Send:
    case OpType::Recv:
      return 1;
    case OpType::Reduce: return 2;
    case OpType::AllGather:
    case OpType::ReduceScatter:
    case OpType::Gather:
    case OpType::Scatter:
      return n + 1;
    case OpType::AllToAll: return 2 * n;
    case OpType::Barrier:
    case OpType::CommCreate:
      return 0;
  }
  return 1;
}

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
  } catch (const std::exception& e) {
    throw Error(Status::InvalidRequest, e.what());
  }
  const auto deadline = Clock::now() + opts.attach_timeout;
  std::string last_error;
  for (;;) {
    try {
      auto seg = ipc::Segment::attach(opts.job_id, opts.node_id);
      auto& h = seg.header();
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
      segment_(std::move(segment)),
      slot_(segment_.slot(std::clamp(o.local_rank, 0, ipc::kMaxLocalRanks - 1))),
      chunk_bytes_(segment_.header().chunk_bytes),
      alloc_(segment_.header().arena_bytes) {
  auto& h = segment_.header();
  auto refuse = [&](const std::string& why) { throw Error(Status::InvalidRequest, why); };
  if (o.local_rank < 0 || o.local_rank >= h.local_world_size)
    refuse("LOCAL_RANK " + std::to_string(o.local_rank) + " is outside the daemon's " +
           std::to_string(h.local_world_size) + " local ranks");
  if (o.local_world_size != h.local_world_size)
    refuse("LOCAL_WORLD_SIZE is " + std::to_string(o.local_world_size) + " but the daemon serves " +
           std::to_string(h.local_world_size) + " ranks on this node");
  if (o.world_size != h.world_size)
    refuse("WORLD_SIZE is " + std::to_string(o.world_size) + " but the job has " + std::to_string(h.world_size) + " ranks");
  if (o.rank != slot_.rank)
    refuse("RANK " + std::to_string(o.rank) + " does not match local rank " + std::to_string(o.local_rank) +
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
  slot_.pid = ::getpid();
  std::strncpy(slot_.device_bus_id, o.device_bus_id.c_str(), ipc::kBusIdBytes - 1);
  slot_.state.store(static_cast<std::uint32_t>(ipc::SlotState::Registered), std::memory_order_release);
  h.daemon_bell.ring();
  last_heartbeat_ = h.heartbeat.load(std::memory_order_relaxed);
  heartbeat_seen_ = Clock::now();
}

void ClientImpl::start() {
  progress_ = std::thread([this] { progress_thread(); });
}

namespace {
// Set when the last reference to a client is dropped on its own progress thread (a callback
// held it): the thread must then return without touching the destroyed client.
thread_local bool t_client_destroyed_here = false;
}  // namespace

void ClientImpl::detach() {
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

std::shared_ptr<OpState> ClientImpl::submit(OpPlan plan, std::chrono::milliseconds timeout) {
  auto op = std::make_shared<OpState>(shared_from_this(), std::move(plan), timeout);
  if (op->stage_bytes(0) > alloc_.capacity())
    throw Error(Status::InvalidRequest, std::string(ipc::to_string(op->plan_.base.op)) + " needs " +
                                            std::to_string(op->stage_bytes(0)) +
                                            " bytes of staging at once, more than the arena of " +
                                            std::to_string(alloc_.capacity()) +
                                            " bytes (raise daemon.arena_mib)");
  if (op->plan_.copier) op->plan_.copier->set_wake([w = waker_] { w->wake(); });
  Deferred callbacks;
  {
    std::lock_guard lk(mu_);
    if (detached_) throw Error(Status::Shutdown, "this rank has detached from smddp (Client::detach)");
    if (!dead_.empty()) throw Error(Status::PeerFailed, dead_);
    note_order_locked(op);
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
  work_cv_.notify_one();
  run(callbacks);
  return op;
}

bool ClientImpl::submit_chunk_locked(OpState& op) {
  if (inflight_.size() + outbox_.size() >= ipc::kCompletionRingCapacity) return false;
  const std::uint64_t k = op.next_;
  const auto& p = op.plan_;
  const std::uint64_t cc = op.chunk_count(k);
  const std::uint64_t e = ipc::dtype_size(p.base.dtype);
  const std::uint64_t off = k * p.chunk;
  const std::uint64_t bytes = op.stage_bytes(k);
  if (p.device) return submit_device_locked(op);
  auto at = alloc_.allocate(bytes);
  if (!at && reap_read_held_locked()) at = alloc_.allocate(bytes);
  if (!at) {
    // Regions other ranks still read may come back soon: their copies ring our bell.
    if (!read_held_.empty()) slot_.waits_for_readers.store(1, std::memory_order_seq_cst);
    return false;
  }
  slot_.waits_for_readers.store(0, std::memory_order_relaxed);

  ipc::RequestDesc d = p.base;
  d.request_id = next_request_id_++;
  d.chunk_offset = p.unchunked ? 0 : off;
  d.chunk_count = p.unchunked ? p.base.chunk_count : cc;
  if (k + 1 == op.nchunks_) d.flags |= ipc::kFlagLastChunk;
  std::uint64_t cursor = *at;
  std::byte* base = arena_.data();
  auto region = [&](std::uint64_t len) {
    ipc::BufferRef r;
    r.kind = BufferKind::Arena;
    r.offset = cursor;
    r.bytes = len;
    cursor += (len + 63) / 64 * 64;
    return r;
  };
  StagingCopier* copier = p.copier.get();
  // What this client copies out itself may come straight from the members' arenas.
  if (!copier && !p.unchunked && ipc::reads_sources(p.base.op)) d.flags |= ipc::kFlagReadSources;
  bool copied_in = false;
  // `from`: bytes into the caller's input.
  const auto copy_in = [&](std::byte* to, std::uint64_t from, std::uint64_t len) {
    if (len == 0) return;
    if (copier) {
      copier->copy_in(to, from, len);
      copied_in = true;
    } else {
      std::memcpy(to, p.in + from, len);
    }
  };
  if (p.unchunked) {
    if (p.in_bytes_total || p.base.op == OpType::AllToAll) {
      d.input = region(p.in_bytes_total);
      copy_in(base + d.input.offset, 0, p.in_bytes_total);
    }
    if (p.out_bytes_total || p.base.op == OpType::AllToAll) d.output = region(p.out_bytes_total);
  } else {
    const std::uint64_t blk = cc * e;
    if (p.in_blocks) {
      d.input = region(p.in_blocks * blk);
      for (std::uint64_t b = 0; b < p.in_blocks; ++b) copy_in(base + d.input.offset + b * blk, (b * p.user_stride + off) * e, blk);
    }
    if (p.in_place_stage) d.output = d.input;
    else if (p.out_blocks) d.output = region(p.out_blocks * blk);
  }
  if (!p.aux.empty()) {
    d.aux = region(p.aux.size());
    std::memcpy(base + d.aux.offset, p.aux.data(), p.aux.size());
  }
  const bool p2p = is_p2p(p.base.op);
  const std::uint64_t ticket = copied_in ? copier->fence(StagingCopier::Lane::In) : 0;
  if (ticket) op.last_in_ticket_ = ticket;
  post_or_stage_locked(Staged{d, Inflight{op.shared_from_this(), k, *at, p2p ? bytes : 0}, ticket});
  p2p_bytes_ += p2p ? bytes : 0;
  ++op.next_;
  ++op.inflight_;
  return true;
}

void ClientImpl::post_or_stage_locked(Staged s) {
  if (outbox_.empty() && s.ticket == 0 && slot_.requests.try_push(s.desc)) {
    inflight_.emplace(s.desc.request_id, std::move(s.inflight));
    posted_ = true;
    return;
  }
  if (s.ticket) copies_staged_.store(true, std::memory_order_relaxed);
  outbox_.push_back(std::move(s));
}

bool ClientImpl::flush_outbox_locked(Deferred& callbacks) {
  bool pushed = std::exchange(posted_, false);
  bool collectives_wait = false;           // an earlier collective chunk is still copying in
  std::vector<const OpState*> p2p_waiting;  // sends/receives with an earlier chunk copying in
  const OpState* checked = nullptr;         // the last op whose copier was asked for errors
  for (auto it = outbox_.begin(); it != outbox_.end();) {
    OpState& op = *it->inflight.op;
    if (it->ticket && &op != checked) {
      check_copier_locked(op);
      checked = &op;
    }
    if (op.status_ != Status::Ok) {  // failed or given up: the rest of it never goes
      drop_staged_locked(*it, callbacks, true);
      it = outbox_.erase(it);
      continue;
    }
    const bool p2p = is_p2p(op.plan_.base.op);
    const bool behind = p2p ? std::find(p2p_waiting.begin(), p2p_waiting.end(), &op) != p2p_waiting.end()
                            : collectives_wait;
    if (behind || (it->ticket && !op.plan_.copier->passed(StagingCopier::Lane::In, it->ticket))) {
      if (p2p) p2p_waiting.push_back(&op);
      else collectives_wait = true;
      ++it;
      continue;
    }
    if (!slot_.requests.try_push(it->desc)) break;  // the daemon answers first: its completions wake us
    inflight_.emplace(it->desc.request_id, std::move(it->inflight));
    pushed = true;
    it = outbox_.erase(it);
  }
  return pushed;
}

void ClientImpl::drop_staged_locked(Staged& s, Deferred& callbacks, bool free_region) {
  OpState& op = *s.inflight.op;
  free_after_locked(op.plan_.copier, StagingCopier::Lane::In, s.ticket, free_region ? s.inflight.offset : kNoRegion);
  p2p_bytes_ -= s.inflight.p2p_bytes;
  --op.inflight_;
  if (op.inflight_ == 0 && !op.done() && op.next_ >= op.nchunks_) finish_locked(op, callbacks);
  callbacks.released.push_back(std::move(s.inflight.op));
}

void ClientImpl::check_copier_locked(OpState& op) {
  if (op.status_ != Status::Ok || !op.plan_.copier) return;
  auto why = op.plan_.copier->error();
  if (why.empty()) return;
  op.status_ = Status::Internal;
  op.error_ = std::string(ipc::to_string(op.plan_.base.op)) + ": moving its bytes through the arena failed: " + why;
  op.next_ = op.nchunks_;  // submit no more of it
}

void ClientImpl::set_arena_release(std::function<void()> release) {
  std::lock_guard lk(mu_);
  arena_release_ = std::move(release);
}

void ClientImpl::free_after_locked(const std::shared_ptr<StagingCopier>& copier, StagingCopier::Lane lane,
                                   std::uint64_t ticket, std::uint64_t offset) {
  if (copier && ticket && !copier->passed(lane, ticket)) {
    draining_.push_back(Draining{copier, lane, ticket, offset});
  } else if (offset != kNoRegion) {
    alloc_.free(offset);
  }
}

void ClientImpl::reap_draining_locked() {
  std::erase_if(draining_, [&](const Draining& d) {
    if (!d.copier->passed(d.lane, d.ticket)) return false;
    if (d.offset != kNoRegion) alloc_.free(d.offset);
    return true;
  });
}

bool ClientImpl::copies_in_finished() {
  if (!copies_staged_.load(std::memory_order_relaxed)) return false;
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  for (auto& s : outbox_) {
    if (!s.ticket) continue;
    if (s.seen || !s.inflight.op->plan_.copier->passed(StagingCopier::Lane::In, s.ticket)) return false;
    s.seen = true;
    return true;
  }
  copies_staged_.store(false, std::memory_order_relaxed);  // none left; the next one sets it again
  return false;
}

void ClientImpl::CopyWaker::wake() {
  count.fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard lk(mu);
  if (bell) bell->ring();
}

bool ClientImpl::submit_device_locked(OpState& op) {
  const auto& p = op.plan_;
  std::uint64_t at = kNoRegion;
  if (!p.aux.empty()) {
    auto a = alloc_.allocate(p.aux.size());
    if (!a) return false;
    at = *a;
  }
  ipc::RequestDesc d = p.base;
  d.request_id = next_request_id_++;
  d.chunk_offset = 0;
  d.flags |= ipc::kFlagLastChunk;
  d.input = p.dev_in;
  d.output = p.dev_out;
  d.wait_event = p.wait_event;
  d.wait_value = p.wait_value;
  if (at != kNoRegion) {
    d.aux.kind = BufferKind::Arena;
    d.aux.offset = at;
    d.aux.bytes = p.aux.size();
    std::memcpy(arena_.data() + at, p.aux.data(), p.aux.size());
  }
  post_or_stage_locked(Staged{d, Inflight{op.shared_from_this(), 0, at, 0}, 0});
  ++op.next_;
  ++op.inflight_;
  return true;
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
  std::lock_guard lk(mu_);
  failure_handler_ = std::move(handler);
}

void ClientImpl::set_exec_handler(ExecHandler handler) {
  std::lock_guard lk(mu_);
  exec_handler_ = std::move(handler);
}

void ClientImpl::finish_locked(OpState& op, Deferred& callbacks) {
  if (op.done_.load(std::memory_order_relaxed)) return;
  op.done_.store(true, std::memory_order_release);
  --active_;
  for (auto& cb : op.callbacks_) callbacks.callbacks.push_back(std::move(cb));
  op.callbacks_.clear();
  untouch_locked(op, callbacks);
}

namespace {
bool overlap(std::uintptr_t a, std::uint64_t an, std::uintptr_t b, std::uint64_t bn) {
  return an && bn && a < b + bn && b < a + an;
}
}  // namespace

void ClientImpl::note_order_locked(const std::shared_ptr<OpState>& op) {
  // Entries whose copies are over order nothing any more.
  std::erase_if(touching_, [](const Touch& t) {
    return !t.op && (!t.copier || (t.copier->passed(StagingCopier::Lane::In, t.last_in) &&
                                   t.copier->passed(StagingCopier::Lane::Out, t.last_out)));
  });
  if (op->in_span_ == 0 && op->out_span_ == 0) return;
  Touch me;
  me.in = reinterpret_cast<std::uintptr_t>(op->plan_.in);
  me.out = reinterpret_cast<std::uintptr_t>(op->plan_.out);
  me.in_span = op->in_span_;
  me.out_span = op->out_span_;
  for (const Touch& t : touching_) {
    const bool writes = overlap(t.out, t.out_span, me.in, me.in_span) || overlap(t.out, t.out_span, me.out, me.out_span);
    if (writes || overlap(t.in, t.in_span, me.out, me.out_span)) op->deps_.push_back({t.op, t.copier, writes});
  }
  me.op = op;
  me.copier = op->plan_.copier;
  touching_.push_back(std::move(me));
}

bool ClientImpl::deps_ready_locked(OpState& op, Deferred& callbacks) {
  for (const auto& d : op.deps_) {
    // One that only reads this op's output is through once all of it was submitted: a host
    // op's copies in are made then, a copier's are enqueued then (and followed below).
    if (d.op && !d.op->done() && (d.writes || d.op->next_ < d.op->nchunks_)) return false;
  }
  if (op.plan_.copier)
    for (const auto& d : op.deps_)
      if (d.copier) op.plan_.copier->follow(*d.copier);
  for (auto& d : op.deps_)
    if (d.op) callbacks.released.push_back(std::move(d.op));
  op.deps_.clear();
  return true;
}

void ClientImpl::untouch_locked(OpState& op, Deferred& callbacks) {
  for (auto& d : op.deps_)
    if (d.op) callbacks.released.push_back(std::move(d.op));
  op.deps_.clear();
  for (Touch& t : touching_) {
    if (t.op.get() != &op) continue;
    t.last_in = op.last_in_ticket_;
    t.last_out = op.last_out_ticket_;
    // The op references the client: the client must not keep it past its end.
    callbacks.released.push_back(std::move(t.op));
    break;
  }
}

void ClientImpl::progress_locked(Deferred& callbacks) {
  // Completions and finished copies first: they free arena space for submissions.
  complete_locked(callbacks);
  reap_draining_locked();
  if (!read_held_.empty()) reap_read_held_locked();
  submit_queued_locked(callbacks);
}

void ClientImpl::complete_locked(Deferred& callbacks) {
  ipc::CompletionDesc c;
  while (slot_.completions.try_pop(c) == ipc::SpscRing<ipc::CompletionDesc, ipc::kCompletionRingCapacity>::PopResult::Item) {
    auto it = inflight_.find(c.request_id);
    if (it == inflight_.end()) {
      // Answered after we gave up on it (its region stays allocated); the other members still
      // wait for this rank's count to pass it.
      if (c.kind == ipc::CompletionKind::Sources) sources_copied_locked(c, kNoRegion);
      continue;
    }
    if (it->second.op->plan_.rank_exec) {
      // In ring order, under the lock: the plugin must run plans in the daemon's order.
      if (exec_handler_) exec_handler_(it->second.op->plan_.exec_token, c);
      if (c.kind == ipc::CompletionKind::Handles) continue;  // the plan follows
    }
    auto inf = std::move(it->second);
    inflight_.erase(it);
    std::uint64_t out_ticket = 0;  // the copier's Out-lane fence after this chunk's copies out
    OpState& op = *inf.op;
    // The last reference to an op (and through it to this client) must go after unlocking.
    callbacks.released.push_back(inf.op);
    --op.inflight_;
    ++op.finished_;
    const bool sources = c.kind == ipc::CompletionKind::Sources;
    if (sources) {
      if (op.status_ == Status::Ok) {
        if (auto why = copy_sources_locked(op, inf, c)) {
          op.status_ = Status::Internal;
          op.error_ = *why;
          op.next_ = op.nchunks_;  // submit no more of it
        }
      }
      sources_copied_locked(c, inf.offset);  // the region is freed once every reader is done
    } else if (c.status == Status::Ok && op.plan_.device) {
      op.daemon_value_.store(c.daemon_value, std::memory_order_release);
      op.daemon_event_.store(c.daemon_event, std::memory_order_release);
    } else if (c.status == Status::Ok && op.status_ == Status::Ok) {
      const auto& p = op.plan_;
      const std::uint64_t e = ipc::dtype_size(p.base.dtype);
      const std::byte* base = arena_.data();
      bool copied_out = false;
      // `to`: bytes into the caller's output.
      const auto copy_out = [&](std::uint64_t to, const std::byte* from, std::uint64_t len) {
        if (len == 0) return;
        if (p.copier) {
          p.copier->copy_out(to, from, len);
          copied_out = true;
        } else {
          std::memcpy(p.out + to, from, len);
        }
      };
      if (p.unchunked) {
        if (p.out_bytes_total) copy_out(0, base + inf.offset + (p.in_bytes_total + 63) / 64 * 64, p.out_bytes_total);
      } else if (p.out_blocks) {
        const std::uint64_t cc = op.chunk_count(inf.chunk);
        const std::uint64_t blk = cc * e;
        const std::uint64_t off = inf.chunk * p.chunk;
        const std::uint64_t out_off =
            p.in_place_stage ? inf.offset : inf.offset + (p.in_blocks * blk + 63) / 64 * 64;
        for (std::uint64_t b = 0; b < p.out_blocks; ++b) copy_out((b * p.user_stride + off) * e, base + out_off + b * blk, blk);
      }
      if (copied_out) {
        out_ticket = p.copier->fence(StagingCopier::Lane::Out);
        op.last_out_ticket_ = out_ticket;
        check_copier_locked(op);
      }
    } else if (c.status != Status::Ok && op.status_ == Status::Ok) {
      op.status_ = c.status;
      op.error_ = std::string(c.error_text());
      op.next_ = op.nchunks_;  // submit no more of it
    }
    // The copies out read the region until their fence passes.
    if (!sources) free_after_locked(op.plan_.copier, StagingCopier::Lane::Out, out_ticket, inf.offset);
    p2p_bytes_ -= inf.p2p_bytes;
    if (op.inflight_ == 0 && (op.finished_ == op.nchunks_ || op.status_ != Status::Ok)) finish_locked(op, callbacks);
  }
}

std::optional<std::string> ClientImpl::copy_sources_locked(OpState& op, const Inflight& inf,
                                                           const ipc::CompletionDesc& c) {
  const auto& p = op.plan_;
  const auto h = c.sources_header();
  const std::uint64_t e = ipc::dtype_size(p.base.dtype);
  const std::uint64_t blk = op.chunk_count(inf.chunk) * e;
  const std::uint64_t off = inf.chunk * p.chunk;
  const auto bad = [&](const std::string& why) {
    return std::string(ipc::to_string(p.base.op)) + ": the smddp daemon named arena sources that " + why;
  };
  if (h.count != p.out_blocks || h.count > ipc::kMaxSourceMembers)
    return bad("list " + std::to_string(h.count) + " blocks where this rank's output has " +
               std::to_string(p.out_blocks) + " per chunk");
  if (h.readers > ipc::kMaxSourceMembers)
    return bad("name " + std::to_string(h.readers) + " readers, more than a completion holds");
  for (std::uint32_t b = 0; b < h.count; ++b) {
    const auto s = c.source(b);
    if (s.slot < 0 || s.slot >= local_world_size_ || s.bytes != blk || s.offset > arena_.size() ||
        s.bytes > arena_.size() - s.offset)
      return bad("do not fit this chunk (block " + std::to_string(b) + ": local rank " + std::to_string(s.slot) +
                 ", " + std::to_string(s.bytes) + " bytes at " + std::to_string(s.offset) + "; a block is " +
                 std::to_string(blk) + " bytes)");
  }
  for (std::uint32_t b = 0; b < h.count; ++b) {
    const auto s = c.source(b);
    std::memcpy(p.out + (b * p.user_stride + off) * e, segment_.arena(s.slot).data() + s.offset, blk);
  }
  return std::nullopt;
}

void ClientImpl::sources_copied_locked(const ipc::CompletionDesc& c, std::uint64_t region) {
  const auto h = c.sources_header();
  const std::uint32_t count = std::min<std::uint32_t>(h.count, ipc::kMaxSourceMembers);
  const std::uint32_t readers = std::min<std::uint32_t>(h.readers, ipc::kMaxSourceMembers);
  // Our copies are done before the count says so. An owner that waits for space hears of it.
  slot_.sources_done.fetch_add(1, std::memory_order_seq_cst);
  for (std::uint32_t b = 0; b < count; ++b) {
    const int owner = c.source(b).slot;
    if (owner == local_rank_ || owner < 0 || owner >= local_world_size_) continue;
    auto& o = segment_.slot(owner);
    if (o.waits_for_readers.load(std::memory_order_seq_cst)) o.client_bell.ring();
  }
  if (region == kNoRegion) return;
  ReadHeld held{region, {}};
  for (std::uint32_t i = 0; i < readers; ++i) {
    const auto x = c.source_reader(count, i);
    if (x.slot >= 0 && x.slot < local_world_size_ && x.slot != local_rank_) held.readers.push_back(x);
  }
  if (held.readers.empty()) alloc_.free(region);
  else read_held_.push_back(std::move(held));
}

bool ClientImpl::readers_done(const ReadHeld& h) const {
  return std::all_of(h.readers.begin(), h.readers.end(), [&](const ipc::SourceReader& x) {
    const auto& peer = segment_.slot(x.slot);
    // A reader that left reads nothing any more.
    const auto st = static_cast<ipc::SlotState>(peer.state.load(std::memory_order_acquire));
    return peer.sources_done.load(std::memory_order_acquire) >= x.seq || st == ipc::SlotState::Exited ||
           st == ipc::SlotState::Failed;
  });
}

bool ClientImpl::reap_read_held_locked() {
  const auto before = read_held_.size();
  std::erase_if(read_held_, [&](const ReadHeld& h) {
    const bool done = readers_done(h);
    if (done) alloc_.free(h.offset);
    return done;
  });
  if (read_held_.empty()) slot_.waits_for_readers.store(0, std::memory_order_relaxed);  // nothing to wait for
  return read_held_.size() != before;
}

bool ClientImpl::held_regions_free() {
  if (!slot_.waits_for_readers.load(std::memory_order_acquire)) return false;
  std::unique_lock lk(mu_, std::try_to_lock);
  // Busy: say maybe, so the caller looks under the lock. A false here could sleep through the
  // reader's count (it rang nobody: it saw no waiter) until the next slice.
  if (!lk.owns_lock()) return true;
  return std::any_of(read_held_.begin(), read_held_.end(), [&](const ReadHeld& h) { return readers_done(h); });
}

void ClientImpl::submit_queued_locked(Deferred& callbacks) {
  // Submissions, strictly in issue order so every rank fills its arena alike.
  while (!queue_.empty()) {
    auto& op = *queue_.front();
    if (op.status_ != Status::Ok) op.next_ = op.nchunks_;
    if (op.next_ == 0 && !op.deps_.empty() && !deps_ready_locked(op, callbacks)) break;
    while (op.next_ < op.nchunks_ && submit_chunk_locked(op)) {}
    if (op.next_ < op.nchunks_) break;
    if (op.inflight_ == 0 && !op.done()) finish_locked(op, callbacks);
    callbacks.released.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  const std::uint64_t p2p_budget = alloc_.capacity() / 2, window = alloc_.capacity() / 8;
  for (auto it = p2p_.begin(); it != p2p_.end();) {
    auto& op = **it;
    if (op.status_ != Status::Ok) op.next_ = op.nchunks_;
    if (op.next_ == 0 && !op.deps_.empty() && !deps_ready_locked(op, callbacks)) {
      ++it;
      continue;
    }
    while (op.next_ < op.nchunks_) {
      const std::uint64_t b = op.stage_bytes(op.next_);
      // At least one chunk per op may always go, so every op makes progress.
      if (op.inflight_ > 0 && (op.inflight_ * b >= window || p2p_bytes_ + b > p2p_budget)) break;
      if (!submit_chunk_locked(op)) break;
    }
    if (op.next_ < op.nchunks_) {
      ++it;
      continue;
    }
    if (op.inflight_ == 0 && !op.done()) finish_locked(op, callbacks);
    callbacks.released.push_back(std::move(*it));
    it = p2p_.erase(it);
  }
  if (flush_outbox_locked(callbacks)) segment_.header().daemon_bell.ring();
}

void ClientImpl::fail_all_locked(Status s, const std::string& why, Deferred& callbacks) {
  std::vector<std::shared_ptr<OpState>> ops;
  for (auto& [id, inf] : inflight_) ops.push_back(inf.op);
  for (auto& st : outbox_) ops.push_back(st.inflight.op);
  for (auto& op : queue_) ops.push_back(op);
  for (auto& op : p2p_) ops.push_back(op);
  for (auto& op : ops) {
    if (op->status_ == Status::Ok) {
      op->status_ = s;
      op->error_ = why;
    }
    finish_locked(*op, callbacks);
    callbacks.released.push_back(op);
  }
  for (auto& [id, inf] : inflight_) callbacks.released.push_back(std::move(inf.op));
  for (auto& op : queue_) callbacks.released.push_back(std::move(op));
  for (auto& op : p2p_) callbacks.released.push_back(std::move(op));
  queue_.clear();
  p2p_.clear();
  // Regions stay allocated: a dead daemon will never answer for them. Copies into staged
  // ones may still run: the client waits for them before the arena goes.
  for (auto& st : outbox_) drop_staged_locked(st, callbacks, false);
  outbox_.clear();
  inflight_.clear();
  read_held_.clear();
}

bool ClientImpl::check_liveness_locked(Deferred& callbacks) {
  auto& h = segment_.header();
  if (!failure_reported_ && failure_handler_ && (!dead_.empty() || h.job_failed.load(std::memory_order_acquire))) {
    failure_reported_ = true;
    callbacks.callbacks.push_back(failure_handler_);
  }
  if (!dead_.empty()) return false;
  const auto now = Clock::now();
  const auto hb = h.heartbeat.load(std::memory_order_relaxed);
  if (hb != last_heartbeat_) {
    last_heartbeat_ = hb;
    heartbeat_seen_ = now;
  }
  std::string why;
  if (!ipc::process_alive(daemon_pid_)) why = "exited";
  else if (now - heartbeat_seen_ > kHeartbeatStale) why = "stopped responding";
  if (why.empty()) return true;
  dead_ = "smddp daemon (pid " + std::to_string(daemon_pid_) + ") on node " + std::to_string(node_id_) + " died (" +
          why + ")";
  if (h.job_failed.load(std::memory_order_acquire))
    dead_ += "; the job had failed before: " + std::string(h.job_error, ::strnlen(h.job_error, sizeof h.job_error));
  // The daemon cannot remove its segment and socket any more; do it for it.
  if (why == "exited") {
    ipc::Segment::remove_if_stale(job_id_, node_id_);
    std::error_code ec;
    std::filesystem::remove(ipc::socket_path(job_id_, node_id_), ec);
  }
  fail_all_locked(Status::PeerFailed, dead_, callbacks);
  if (!failure_reported_ && failure_handler_) {
    failure_reported_ = true;
    callbacks.callbacks.push_back(failure_handler_);
  }
  return false;
}

bool ClientImpl::wait_for(OpState& op, Clock::time_point until) {
  {
    std::lock_guard lk(mu_);
    ++waiters_;
  }
  struct Leave {
    ClientImpl& c;
    ~Leave() {
      {
        std::lock_guard lk(c.mu_);
        --c.waiters_;
      }
      c.work_cv_.notify_one();
    }
  } leave{*this};
  Deferred callbacks;
  std::uint64_t wakes = 0;  // copier fences seen passed as of the last progress step
  const auto ready = [&] {
    return op.done() || !slot_.completions.empty() || waker_->count.load(std::memory_order_acquire) != wakes ||
           copies_in_finished() || held_regions_free();
  };
  while (!op.done()) {
    wakes = waker_->count.load(std::memory_order_acquire);
    {
      std::lock_guard lk(mu_);
      progress_locked(callbacks);
      if (!op.done() && Clock::now() >= op.deadline_) {
        if (op.status_ == Status::Ok) {
          op.status_ = Status::Timeout;
          const auto blocker = std::find_if(op.deps_.begin(), op.deps_.end(), [](const OpState::Dep& d) {
            return d.op && !d.op->done();
          });
          op.error_ = blocker == op.deps_.end()
                          ? "no answer from the smddp daemon for " + std::string(ipc::to_string(op.plan_.base.op)) +
                                " well past its timeout"
                          : std::string(ipc::to_string(op.plan_.base.op)) +
                                " never started: it waits for an earlier " +
                                std::string(ipc::to_string(blocker->op->plan_.base.op)) +
                                " on the same memory, which has not finished (issued earlier, not waited for)";
        }
        // Its regions stay allocated; the daemon may still write them.
        for (auto it = inflight_.begin(); it != inflight_.end();) {
          if (it->second.op.get() != &op) {
            ++it;
            continue;
          }
          callbacks.released.push_back(std::move(it->second.op));
          it = inflight_.erase(it);
        }
        std::erase_if(queue_, [&](const auto& q) { return q.get() == &op; });
        std::erase_if(p2p_, [&](const auto& q) { return q.get() == &op; });
        finish_locked(op, callbacks);
        // Drops its staged chunks (its status is no longer Ok); others may go now.
        if (flush_outbox_locked(callbacks)) segment_.header().daemon_bell.ring();
      }
    }
    run(callbacks);
    if (op.done()) break;
    if (Clock::now() >= until) return false;
    ipc::spin_then_wait(slot_.client_bell, ready, std::min(until, op.deadline_), kSpin,
                        std::chrono::duration_cast<std::chrono::microseconds>(kSlice), [&] {
                          std::lock_guard lk(mu_);
                          const bool alive = check_liveness_locked(callbacks);
                          // Staged chunks: a copy that faulted never wakes us, so look again
                          // (progress asks the copiers for errors) once per slice.
                          return alive && outbox_.empty();
                        });
    run(callbacks);
  }
  return true;
}

void ClientImpl::progress_thread() {
  Deferred callbacks;
  std::unique_lock lk(mu_);
  for (;;) {
    // Once the GPU fast path is in use nobody waits for its ops on the CPU: this thread
    // finishes them, and stays on the completion doorbell between them, so that issuing
    // one does not have to wake it.
    work_cv_.wait(lk, [&] { return stop_ || (waiters_ == 0 && (active_ > 0 || fast_seen_)); });
    if (stop_) return;
    const auto wakes = waker_->count.load(std::memory_order_acquire);
    progress_locked(callbacks);
    const bool idle = active_ == 0 && !fast_seen_;
    // Chunks wait for their copies in: spin a little first, as a waiting user thread does, to
    // see them finish before their wake comes.
    const bool copies_due = std::any_of(outbox_.begin(), outbox_.end(), [](const Staged& s) { return s.ticket != 0; });
    lk.unlock();
    run(callbacks);
    if (t_client_destroyed_here) return;
    if (!idle) {
      const auto ready = [&] {
        return !slot_.completions.empty() || waker_->count.load(std::memory_order_acquire) != wakes ||
               (copies_due && copies_in_finished()) || held_regions_free();
      };
      ipc::spin_then_wait(slot_.client_bell, ready, Clock::now() + kSlice,
                          copies_due ? kSpin : std::chrono::microseconds(0),
                          std::chrono::duration_cast<std::chrono::microseconds>(kSlice), [] { return false; });
    }
    lk.lock();
    check_liveness_locked(callbacks);
    if (!callbacks.callbacks.empty() || !callbacks.released.empty()) {
      lk.unlock();
      run(callbacks);
      if (t_client_destroyed_here) return;
      lk.lock();
    }
  }
}

// ---------------------------------------------------------------------------------------
// OpState

OpState::OpState(std::shared_ptr<ClientImpl> client, OpPlan plan, std::chrono::milliseconds timeout)
    : client_(std::move(client)), plan_(std::move(plan)) {
  if (!plan_.unchunked && plan_.block > 0) nchunks_ = (plan_.block + plan_.chunk - 1) / plan_.chunk;
  deadline_ = Clock::now() + timeout + kBackstop;
  if (!plan_.device) {
    // Blocks of `block` elements, `user_stride` apart (plan() makes both the count).
    const std::uint64_t e = ipc::dtype_size(plan_.base.dtype);
    const auto span = [&](std::uint64_t blocks) {
      return blocks ? ((blocks - 1) * plan_.user_stride + plan_.block) * e : 0;
    };
    if (plan_.in) in_span_ = plan_.unchunked ? plan_.in_bytes_total : span(plan_.in_blocks);
    if (plan_.out) out_span_ = plan_.unchunked ? plan_.out_bytes_total : span(plan_.out_blocks);
  }
}

std::uint64_t OpState::chunk_count(std::uint64_t k) const {
  if (plan_.unchunked || plan_.block == 0) return 0;
  return std::min(plan_.chunk, plan_.block - k * plan_.chunk);
}

std::uint64_t OpState::stage_bytes(std::uint64_t k) const {
  const auto r64 = [](std::uint64_t v) { return (v + 63) / 64 * 64; };
  std::uint64_t b = r64(plan_.aux.size());
  if (plan_.unchunked) return b + r64(plan_.in_bytes_total) + r64(plan_.out_bytes_total);
  const std::uint64_t blk = chunk_count(k) * ipc::dtype_size(plan_.base.dtype);
  b += r64(plan_.in_blocks * blk);
  if (!plan_.in_place_stage) b += r64(plan_.out_blocks * blk);
  return b;
}

bool OpState::test() {
  if (done()) return true;
  Deferred callbacks;
  {
    std::lock_guard lk(client_->mutex());
    client_->progress_locked(callbacks);
  }
  ClientImpl::run(callbacks);
  return done();
}

void OpState::wait(std::chrono::milliseconds timeout) {
  const auto until = timeout.count() > 0 ? Clock::now() + timeout : Clock::time_point::max();
  if (!client_->wait_for(*this, until))
    throw Error(Status::Timeout, std::string(ipc::to_string(plan_.base.op)) + " did not finish within " +
                                     std::to_string(timeout.count()) + " ms");
  std::lock_guard lk(client_->mutex());
  if (status_ != Status::Ok) throw Error(status_, error_);
}

Status OpState::status() const {
  std::lock_guard lk(client_->mutex());
  return status_;
}

std::string OpState::error() const {
  std::lock_guard lk(client_->mutex());
  return error_;
}

void OpState::on_complete(std::function<void()> cb) {
  {
    std::lock_guard lk(client_->mutex());
    if (!done()) {
      callbacks_.push_back(std::move(cb));
      return;
    }
  }
  cb();
}

// ---------------------------------------------------------------------------------------
// Communicator

namespace {

class CommImpl final : public Communicator {
 public:
  CommImpl(std::shared_ptr<ClientImpl> client, std::uint64_t id, std::vector<int> ranks, int my_rank,
           std::shared_ptr<SeqState> seq)
      : client_(std::move(client)), id_(id), ranks_(std::move(ranks)), rank_(my_rank), seq_(std::move(seq)) {}

  std::uint64_t id() const override { return id_; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& global_ranks() const override { return ranks_; }
  std::chrono::milliseconds default_timeout() const override { return timeout_; }
  void set_default_timeout(std::chrono::milliseconds t) override { timeout_ = t.count() > 0 ? t : kDefaultTimeout; }

  WorkPtr allreduce(const void* in, void* out, std::uint64_t count, DType t, ReduceOp op,
                    const CallOptions& o) override {
    auto p = plan(OpType::AllReduce, t, count, o);
    p.base.reduce_op = op;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = p.out_blocks = 1;
    p.in_place_stage = true;
    return go(std::move(p), o);
  }
  WorkPtr broadcast(void* buf, std::uint64_t count, DType t, int root, const CallOptions& o) override {
    auto p = plan(OpType::Broadcast, t, count, o);
    check_root(root);
    p.base.root = root;
    p.in = static_cast<const std::byte*>(buf);
    p.out = static_cast<std::byte*>(buf);
    if (rank_ == root) {
      p.in_blocks = 1;
      p.in_place_stage = true;  // the daemon reads the root's region; nothing comes back
    } else {
      p.out_blocks = 1;
    }
    return go(std::move(p), o);
  }
  WorkPtr reduce(const void* in, void* out, std::uint64_t count, DType t, ReduceOp op, int root,
                 const CallOptions& o) override {
    auto p = plan(OpType::Reduce, t, count, o);
    check_root(root);
    p.base.root = root;
    p.base.reduce_op = op;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = 1;
    p.out_blocks = rank_ == root ? 1 : 0;
    return go(std::move(p), o);
  }
  WorkPtr allgather(const void* in, void* out, std::uint64_t count, DType t, const CallOptions& o) override {
    auto p = plan(OpType::AllGather, t, count, o);
    if (o.sdp) p.base.flags |= ipc::kFlagSdp;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = 1;
    p.out_blocks = static_cast<std::uint64_t>(size());
    return go(std::move(p), o);
  }
  WorkPtr reduce_scatter(const void* in, void* out, std::uint64_t count, DType t, ReduceOp op,
                         const CallOptions& o) override {
    auto p = plan(OpType::ReduceScatter, t, count, o);
    p.base.reduce_op = op;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = static_cast<std::uint64_t>(size());
    p.out_blocks = 1;
    return go(std::move(p), o);
  }
  WorkPtr alltoall(const void* in, void* out, std::uint64_t count, DType t, const CallOptions& o) override {
    auto p = plan(OpType::AllToAll, t, count, o);
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = p.out_blocks = static_cast<std::uint64_t>(size());
    return go(std::move(p), o);
  }
  WorkPtr alltoallv(const void* in, const std::vector<std::uint64_t>& send, void* out,
                    const std::vector<std::uint64_t>& recv, DType t, const CallOptions& o) override {
    const auto n = static_cast<std::size_t>(size());
    if (send.size() != n || recv.size() != n)
      throw Error(Status::InvalidRequest, "alltoall split lists must have one entry per rank (" + std::to_string(n) + ")");
    std::uint64_t total_send = 0, total_recv = 0;
    for (auto v : send) total_send += v;
    for (auto v : recv) total_recv += v;
    // count stays 0: totals differ per rank by design; the daemon cross-checks the tables.
    auto p = plan(OpType::AllToAll, t, 0, o);
    p.unchunked = true;
    p.base.flags |= ipc::kFlagSplits;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    const std::uint64_t e = ipc::dtype_size(t);
    p.in_bytes_total = total_send * e;
    p.out_bytes_total = total_recv * e;
    std::vector<std::int64_t> table;
    for (auto v : send) table.push_back(static_cast<std::int64_t>(v));
    for (auto v : recv) table.push_back(static_cast<std::int64_t>(v));
    p.aux.resize(table.size() * sizeof(std::int64_t));
    std::memcpy(p.aux.data(), table.data(), p.aux.size());
    return go(std::move(p), o);
  }
  WorkPtr barrier(const CallOptions& o) override {
    auto p = plan(OpType::Barrier, DType::UInt8, 0, o);
    return go(std::move(p), o);
  }
  WorkPtr send(const void* buf, std::uint64_t count, DType t, int peer, int tag, const CallOptions& o) override {
    auto p = plan_p2p(OpType::Send, t, count, peer, tag, o);
    p.in = static_cast<const std::byte*>(buf);
    p.in_blocks = 1;
    return go(std::move(p), o);
  }
  WorkPtr recv(void* buf, std::uint64_t count, DType t, int peer, int tag, const CallOptions& o) override {
    auto p = plan_p2p(OpType::Recv, t, count, peer, tag, o);
    p.out = static_cast<std::byte*>(buf);
    p.out_blocks = 1;
    return go(std::move(p), o);
  }
  WorkPtr gather(const void* in, void* out, std::uint64_t count, DType t, int root, const CallOptions& o) override {
    auto p = plan(OpType::Gather, t, count, o);
    check_root(root);
    p.base.root = root;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = 1;
    p.out_blocks = rank_ == root ? static_cast<std::uint64_t>(size()) : 0;
    return go(std::move(p), o);
  }
  WorkPtr scatter(const void* in, void* out, std::uint64_t count, DType t, int root, const CallOptions& o) override {
    auto p = plan(OpType::Scatter, t, count, o);
    check_root(root);
    p.base.root = root;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = rank_ == root ? static_cast<std::uint64_t>(size()) : 0;
    p.out_blocks = 1;
    return go(std::move(p), o);
  }

  WorkPtr device_op(const DeviceCall& c, const CallOptions& o) override {
    const bool p2p = is_p2p(c.op);
    const bool splits = c.op == OpType::AllToAll && !c.splits.empty();
    auto p = p2p ? plan_p2p(c.op, c.dtype, c.count, c.root, c.tag, o) : plan(c.op, c.dtype, splits ? 0 : c.count, o);
    if (c.op == OpType::Broadcast || c.op == OpType::Reduce || c.op == OpType::Gather || c.op == OpType::Scatter) {
      check_root(c.root);
      p.base.root = c.root;
    }
    p.base.reduce_op = c.reduce_op;
    if (c.op == OpType::AllGather && o.sdp) p.base.flags |= ipc::kFlagSdp;
    p.device = true;
    p.unchunked = true;
    p.base.chunk_count = p.base.count;
    const auto ref = [](const std::optional<DeviceBuffer>& b) {
      ipc::BufferRef r;
      if (!b) return r;
      r.kind = BufferKind::CudaIpc;
      r.offset = b->offset;
      r.bytes = b->bytes;
      r.alloc_id = b->alloc_id;
      r.alloc_bytes = b->alloc_bytes;
      std::memcpy(r.ipc_handle, b->ipc_handle.data(), sizeof r.ipc_handle);
      return r;
    };
    p.dev_in = ref(c.input);
    p.dev_out = ref(c.output);
    p.wait_event = c.wait_event;
    p.wait_value = c.wait_value;
    p.rank_exec = c.rank_exec;
    p.exec_token = c.exec_token;
    if (c.rank_exec) p.base.flags |= ipc::kFlagRankExec;
    if (c.fast) {
      if (c.rank_exec || c.input || c.output || c.stream_value || c.wait_event != -1 || !c.splits.empty())
        throw Error(Status::InvalidRequest, "a fast-path request carries no buffers, events or plans");
      p.base.flags |= ipc::kFlagRankFast;
    }
    if (c.stream_value) p.base.flags |= ipc::kFlagStreamValue;
    if (c.stream_value && c.device_flags) p.base.flags |= ipc::kFlagDeviceFlags;
    if (c.stream_value && !c.device_flags && c.daemon_cpu_wait) p.base.flags |= ipc::kFlagDaemonCpuWait;
    if (splits) {
      const auto n = static_cast<std::size_t>(size());
      if (c.splits.size() != 2 * n)
        throw Error(Status::InvalidRequest, "alltoall split lists must have one entry per rank (" + std::to_string(n) + ")");
      p.base.flags |= ipc::kFlagSplits;
      std::vector<std::int64_t> table(c.splits.begin(), c.splits.end());
      p.aux.resize(table.size() * sizeof(std::int64_t));
      std::memcpy(p.aux.data(), table.data(), p.aux.size());
    }
    return go(std::move(p), o);
  }

  // Used by create_communicator: the CommCreate request rides the same machinery.
  std::shared_ptr<OpState> create(std::uint64_t new_id, const std::vector<int>& members, std::chrono::milliseconds t) {
    OpPlan p;
    p.base.op = OpType::CommCreate;
    p.base.comm_id = new_id;
    p.base.seq = 0;
    p.base.count = members.size();
    p.base.dtype = DType::Int32;
    p.base.timeout_ms = static_cast<std::uint32_t>(std::min<std::int64_t>(t.count(), UINT32_MAX));
    p.unchunked = true;
    p.base.chunk_count = 0;
    p.aux.resize(members.size() * sizeof(std::int32_t));
    for (std::size_t i = 0; i < members.size(); ++i) {
      const std::int32_t v = members[i];
      std::memcpy(p.aux.data() + i * sizeof v, &v, sizeof v);
    }
    return client_->submit(std::move(p), t);
  }

 private:
  void check_root(int root) const {
    if (root < 0 || root >= size())
      throw Error(Status::InvalidRequest,
                  "root " + std::to_string(root) + " is not a rank of this group of " + std::to_string(size()));
  }

  OpPlan plan(OpType op, DType t, std::uint64_t count, const CallOptions& o) {
    if (static_cast<int>(t) >= ipc::kDTypeCount) throw Error(Status::InvalidRequest, "unknown dtype");
    OpPlan p;
    p.base.op = op;
    p.base.dtype = t;
    p.base.comm_id = id_;
    p.base.count = count;
    p.base.scale = o.scale;
    p.group_size = size();
    p.group_rank = rank_;
    p.block = count;
    p.user_stride = count;
    const std::uint64_t e = ipc::dtype_size(t);
    const std::uint64_t mult = stage_multiplier(op, static_cast<std::uint64_t>(size()));
    const std::uint64_t budget = std::max<std::uint64_t>(
        64, std::min(client_->chunk_bytes(), client_->arena_bytes() / 4));
    p.chunk = mult ? std::max<std::uint64_t>(1, budget / (mult * e)) : 1;
    p.chunk = p.chunk > 64 ? p.chunk / 64 * 64 : p.chunk;
    return p;
  }

  OpPlan plan_p2p(OpType op, DType t, std::uint64_t count, int peer, int tag, const CallOptions& o) {
    if (peer < 0 || peer >= size() || peer == rank_)
      throw Error(Status::InvalidRequest, "peer " + std::to_string(peer) + " is not another rank of this group of " +
                                              std::to_string(size()));
    auto p = plan(op, t, count, o);
    p.base.root = peer;
    p.base.tag = tag;
    return p;
  }

  WorkPtr go(OpPlan p, const CallOptions& o) {
    if (o.copier) {
      if (p.device) throw Error(Status::InvalidRequest, "a GPU-path request has no staging to copy through");
      p.copier = o.copier;
    }
    const auto timeout = o.timeout.count() > 0 ? o.timeout : timeout_;
    p.base.timeout_ms = static_cast<std::uint32_t>(std::min<std::int64_t>(timeout.count(), UINT32_MAX));
    std::lock_guard lk(seq_->mu);  // one seq order per communicator, also across threads
    if (p.base.op == OpType::Send) p.base.seq = ++seq_->sends[p.base.root];
    else if (p.base.op == OpType::Recv) p.base.seq = ++seq_->recvs[p.base.root];
    else p.base.seq = ++seq_->collectives;
    return client_->submit(std::move(p), timeout);
  }

  std::shared_ptr<ClientImpl> client_;
  std::uint64_t id_;
  std::vector<int> ranks_;
  int rank_;
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
  std::shared_ptr<SeqState> seq_;
};

}  // namespace

CommunicatorPtr ClientImpl::world() {
  std::lock_guard lk(mu_);
  if (auto w = world_.lock()) return w;
  std::vector<int> all(static_cast<std::size_t>(world_size_));
  for (int i = 0; i < world_size_; ++i) all[static_cast<std::size_t>(i)] = i;
  auto w = std::make_shared<CommImpl>(shared_from_this(), 0, std::move(all), rank_, world_seq_);
  world_ = w;
  return w;
}

CommunicatorPtr ClientImpl::create_communicator(std::uint64_t comm_id, const std::vector<int>& global_ranks,
                                                std::chrono::milliseconds timeout) {
  if (comm_id == 0) throw Error(Status::InvalidRequest, "communicator id 0 is reserved for the world");
  auto pos = std::find(global_ranks.begin(), global_ranks.end(), rank_);
  if (pos == global_ranks.end())
    throw Error(Status::InvalidRequest, "rank " + std::to_string(rank_) + " is not a member of the new communicator");
  for (int g : global_ranks)
    if (g < 0 || g >= world_size_)
      throw Error(Status::InvalidRequest, "communicator member " + std::to_string(g) + " is not a rank of the job");
  const auto t = timeout.count() > 0 ? timeout : kDefaultTimeout;
  auto comm = std::make_shared<CommImpl>(shared_from_this(), comm_id, global_ranks,
                                         static_cast<int>(pos - global_ranks.begin()), std::make_shared<SeqState>());
  comm->create(comm_id, global_ranks, t)->wait(std::chrono::milliseconds{0});
  comm->set_default_timeout(t);
  return comm;
}

}  // namespace smddp::client
