#include "daemon/internode/engine.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <spdlog/spdlog.h>
#include <sstream>
#include <thread>
#include <type_traits>

#include "kernels/host/host_reduce.hpp"
#include "daemon/internode/op.hpp"
#include "daemon/posted.hpp"
#include "ipc/types.hpp"

namespace smddp::daemon::internode {

using ipc::OpType;
using ipc::Status;

static_assert(kMaxCardEndpoints == transport::Transport::kMaxEndpoints);

namespace {

// Tags below this are the engine's own (heartbeats); operation tags are hashes above it.
constexpr std::uint64_t kBeatTag = 1;
constexpr std::uint64_t kFirstOpTag = 16;
constexpr std::uint32_t kBeatMagic = 0x534d4442;  // "SMDB"

// An operation that failed on the sender before it started there (Engine::OpFailure).
constexpr std::uint64_t kFailureTag = 2;
constexpr std::uint32_t kFailureMagic = 0x534d4446;  // "SMDF"
// How long a message that failed on its connection waits for its peer's death to show (the
// kernel closes a dying process's sockets before its pid reads as gone).
constexpr auto kFabricErrorSettle = std::chrono::milliseconds(200);
// How often the lifelines are polled (a syscall each time; check_peers runs every loop turn).
constexpr auto kLifelinePoll = std::chrono::milliseconds(20);

struct FailureNotice {
  std::uint32_t magic = kFailureMagic;
  std::uint32_t status = 0;
  std::int32_t src = -1, dst = -1;
  std::uint64_t comm = 0, seq = 0;
  char error[960] = {};
};

// A heartbeat: the sender's state and, once its job failed, why; while it lives, its stall note.
struct Beat {
  std::uint32_t magic = kBeatMagic;
  std::uint32_t state = 0;
  std::int32_t exit_code = 0;
  std::int32_t pid = 0;
  char error[960] = {};
  WireWaits waits;  // while it lives: its ranks' waits
};

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  // splitmix64 finalizer over h ^ v: a well-spread 64-bit hash of the tuple.
  std::uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

int Op::node_index_of_member(int g, const Topology& t) const {
  const int node = t.node_of(comm->global_ranks[static_cast<std::size_t>(g)]);
  return static_cast<int>(std::lower_bound(nodes.begin(), nodes.end(), node) - nodes.begin());
}

// ---- Ctx

namespace {
std::size_t arena_bytes(const ipc::Segment& segment, int ranks) {
  std::size_t n = 0;
  for (int s = 0; s < ranks; ++s) n += segment.arena(s).size();
  return n;
}

// Where the provider wants local buffers registered, the pool registers each staging buffer
// once. The transport outlives the pool (Engine's member order) and every buffer's registration
// goes before its domain (staging_pool.hpp).
StagingPool::Registrar staging_registrar(transport::Transport* t) {
  if (!t->needs_registration()) return {};
  return [t](void* base, std::size_t bytes) { return t->register_memory(base, bytes); };
}

// log_level = trace: one line per step of each operation across nodes, with microseconds since
// the first such line and since the operation started (where an operation's time goes).
void trace_step(const Op& op, const char* what, Clock::time_point now) {
  if (!spdlog::should_log(spdlog::level::trace)) return;
  static const Clock::time_point t0 = now;
  const auto us = [](Clock::duration d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); };
  const auto& d = op.match.posted.front().desc;
  spdlog::trace("internode: {} #{} chunk at {} phase {} {}: t={} us, +{} us", ipc::to_string(d.op), d.seq,
                d.chunk_offset, op.phase, what, us(now - t0), us(now - op.started));
}
}  // namespace

std::uint64_t Engine::Ctx::tag(int src_node, int dst_node, std::uint64_t sub) const {
  // Tags are hashes of (operation, phase, direction, sub): two messages in flight between the
  // same peers collide only with probability ~2^-48 per pair, and the transport matches
  // same-tag messages in order anyway.
  std::uint64_t h = mix(op_.key, static_cast<std::uint64_t>(op_.phase));
  h = mix(h, static_cast<std::uint64_t>(src_node) << 32 | static_cast<std::uint32_t>(dst_node));
  h = mix(h, sub) & transport::Transport::kMaxTag;
  return h < kFirstOpTag ? h + kFirstOpTag : h;
}

void Engine::Ctx::send(int node_index, std::uint64_t sub, const void* buf, std::size_t bytes) {
  const int node = op_.nodes[static_cast<std::size_t>(node_index)];
  auto& peer = e_.peers_[static_cast<std::size_t>(node)];
  ++op_.outstanding;
  op_.bytes += bytes;
  e_.fabric_sent_.add(op_.match.posted.front().desc.op, bytes);
  auto keep = op_.shared_from_this();
  e_.transport_->send(peer.transport_index, op_.rails[static_cast<std::size_t>(node_index)],
                      tag(e_.topo_.node_id, node, sub), buf, bytes, region_for(buf, bytes),
                      [keep](transport::Status st) {
                        --keep->outstanding;
                        if (!st.ok && keep->error.empty()) {
                          keep->fail_by_fabric(st.error);
                        }
                      });
}

void Engine::Ctx::recv(int node_index, std::uint64_t sub, void* buf, std::size_t bytes) {
  const int node = op_.nodes[static_cast<std::size_t>(node_index)];
  auto& peer = e_.peers_[static_cast<std::size_t>(node)];
  ++op_.outstanding;
  auto keep = op_.shared_from_this();
  e_.transport_->recv(peer.transport_index, op_.rails[static_cast<std::size_t>(node_index)],
                      tag(node, e_.topo_.node_id, sub), buf, bytes, region_for(buf, bytes),
                      [keep](transport::Status st) {
                        --keep->outstanding;
                        if (!st.ok && keep->error.empty()) {
                          keep->fail_by_fabric(st.error);
                        }
                      });
}

std::byte* Engine::Ctx::in(int g) const {
  const Posted& p = *op_.local[static_cast<std::size_t>(g)];
  return e_.segment_.arena(p.slot).data() + p.desc.input.offset;
}

std::byte* Engine::Ctx::out(int g) const {
  const Posted& p = *op_.local[static_cast<std::size_t>(g)];
  return e_.segment_.arena(p.slot).data() + p.desc.output.offset;
}

const transport::MemoryRegion* Engine::Ctx::region_for(const void* buf, std::size_t bytes) const {
  for (const auto& b : op_.buffers)
    if (const auto* r = b.region(); r && r->contains(buf, bytes)) return r;
  return e_.region_for(buf, bytes);
}

std::byte* Engine::Ctx::buffer(std::size_t bytes) {
  op_.buffers.push_back(e_.staging_.take(bytes));
  return op_.buffers.back().get();
}

void Engine::Ctx::fail(Status status, std::string error) {
  if (!op_.error.empty()) return;
  op_.status = status;
  op_.error = std::move(error);
}

void Engine::Ctx::reduce(ipc::DType dtype, ipc::ReduceOp op, const std::vector<const void*>& inputs, void* out,
                         std::uint64_t count, double premul_scale) {
  host_kernels::ReduceParams params;
  params.premul_scale = premul_scale;
  const std::size_t e = ipc::dtype_size(dtype);
  e_.host_reduced_.add(op_.match.posted.front().desc.op, count * e);
  // Below 128 KiB per task splitting costs more than it saves (as in HostExecutor).
  const auto tasks = static_cast<int>(std::clamp<std::uint64_t>(count * e / (128 << 10), 1,
                                                                static_cast<std::uint64_t>(pool().parallelism())));
  const std::uint64_t per = ((count + static_cast<std::uint64_t>(tasks) - 1) / static_cast<std::uint64_t>(tasks) + 63) / 64 * 64;
  pool().parallel_for(tasks, [&](int t) {
    const std::uint64_t lo = std::min(count, per * static_cast<std::uint64_t>(t));
    const std::uint64_t hi = std::min(count, lo + per);
    if (lo >= hi) return;
    std::vector<const void*> part(inputs.size());
    for (std::size_t k = 0; k < inputs.size(); ++k) part[k] = static_cast<const std::byte*>(inputs[k]) + lo * e;
    host_kernels::host_reduce(dtype, op, part, static_cast<std::byte*>(out) + lo * e, hi - lo, params);
  });
}

void Engine::Ctx::copy(std::byte* dst, const std::byte* src, std::uint64_t bytes) {
  if (bytes && dst != src) std::memmove(dst, src, bytes);
}

// ---- Engine

Engine::Engine(Topology topo, std::unique_ptr<transport::Transport> transport, const std::vector<NodeCard>& cards,
               const ipc::Segment& segment, WorkerPool& pool, Options options)
    : topo_(std::move(topo)),
      transport_(std::move(transport)),
      segment_(segment),
      pool_(pool),
      staging_(arena_bytes(segment, topo_.nproc_per_node), staging_registrar(transport_.get())),
      options_(options),
      peers_(static_cast<std::size_t>(topo_.num_nodes)) {
  if (cards.size() != static_cast<std::size_t>(topo_.num_nodes))
    throw std::invalid_argument("the bootstrap gave " + std::to_string(cards.size()) + " node cards for " +
                                std::to_string(topo_.num_nodes) + " nodes");
  for (int n = 0; n < topo_.num_nodes; ++n) check_node_card(cards[static_cast<std::size_t>(n)], n, topo_.nproc_per_node);
  const auto& mine = cards[static_cast<std::size_t>(topo_.node_id)];
  if (mine.addresses.size() != static_cast<std::size_t>(transport_->endpoints()))
    throw std::invalid_argument("this node's card names " + std::to_string(mine.addresses.size()) +
                                " endpoints, its transport has " + std::to_string(transport_->endpoints()));
  my_rails_ = {transport_->endpoints(), mine.rail_of_slot};
  const auto now = Clock::now();
  for (int n = 0; n < topo_.num_nodes; ++n) {
    auto& p = peers_[static_cast<std::size_t>(n)];
    p.last_heard = now;
    if (n == topo_.node_id) continue;
    const auto& card = cards[static_cast<std::size_t>(n)];
    p.rails = {static_cast<int>(card.addresses.size()), card.rail_of_slot};
    p.transport_index = transport_->add_peer(card.addresses);
  }
  for (int n = 0; n < topo_.num_nodes; ++n)
    if (n != topo_.node_id) {
      post_beat_recv(n);
      post_notice_recv(n);
    }
  try {
    for (int s = 0; s < topo_.nproc_per_node; ++s) {
      auto arena = segment_.arena(s);
      arena_regions_.push_back(transport_->register_memory(arena.data(), arena.size()));
    }
  } catch (const std::exception& e) {
    // Still correct: the transport then registers per message where the provider needs it.
    spdlog::warn("registering the staging arenas with the fabric failed ({}); registering per message", e.what());
    arena_regions_.clear();
  }
}

const transport::MemoryRegion* Engine::region_for(const void* buf, std::size_t bytes) const {
  for (const auto& r : arena_regions_)
    if (r.contains(buf, bytes)) return &r;
  return nullptr;
}

Engine::~Engine() = default;

namespace {
// A heartbeat or failure notice in a staging buffer: registered once where the provider wants
// local buffers registered (efa), where a buffer of its own would be registered and deregistered
// around every message (heartbeats: five a second each way per peer). The callback that holds
// it keeps it, and the Buffer goes back to the pool with it.
template <class T>
class ControlMessage {
 public:
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
  explicit ControlMessage(StagingPool& pool) : buffer_(pool.take(sizeof(T))) { std::construct_at(get()); }
  T* get() const { return reinterpret_cast<T*>(buffer_.get()); }
  const transport::MemoryRegion* region() const { return buffer_.region(); }

 private:
  StagingPool::Buffer buffer_;
};
}  // namespace

void Engine::post_beat_recv(int node) {
  auto beat = std::make_shared<ControlMessage<Beat>>(staging_);
  auto& peer = peers_[static_cast<std::size_t>(node)];
  transport_->recv(peer.transport_index, kControlRail, kBeatTag, beat->get(), sizeof(Beat), beat->region(),
                   [this, beat, node](transport::Status st) {
                     Beat& m = *beat->get();
                     auto& p = peers_[static_cast<std::size_t>(node)];
                     if (!st.ok) {
                       // Failed by fail_peer (the peer is gone) or by the transport's timeout;
                       // the latter only means silence, which check_peers judges.
                       if (p.state == PeerState::Alive) post_beat_recv(node);
                       return;
                     }
                     p.last_heard = Clock::now();
                     p.heard_from = true;
                     if (m.magic == kBeatMagic) {
                       const auto s = static_cast<PeerState>(m.state);
                       m.error[sizeof m.error - 1] = '\0';
                       if (s == PeerState::Alive) {
                         p.stall_note = m.error;
                         p.waits = from_wire(m.waits, topo_.num_nodes * topo_.nproc_per_node);
                       }
                       if (s == PeerState::Failed && p.state == PeerState::Alive) {
                         m.error[sizeof m.error - 1] = '\0';
                         p.state = PeerState::Failed;
                         if (!peer_failure_) peer_failure_ = PeerFailure{m.error, m.exit_code ? m.exit_code : 1};
                       } else if (s == PeerState::Done && p.state == PeerState::Alive) {
                         p.state = PeerState::Done;
                       }
                     }
                     if (p.state == PeerState::Alive) post_beat_recv(node);
                   });
}

void Engine::post_notice_recv(int node) {
  auto notice = std::make_shared<ControlMessage<FailureNotice>>(staging_);
  auto& peer = peers_[static_cast<std::size_t>(node)];
  transport_->recv(peer.transport_index, kControlRail, kFailureTag, notice->get(), sizeof(FailureNotice), notice->region(),
                   [this, notice, node](transport::Status st) {
                     FailureNotice& m = *notice->get();
                     const auto& p = peers_[static_cast<std::size_t>(node)];
                     if (st.ok && m.magic == kFailureMagic &&
                         m.status > static_cast<std::uint32_t>(Status::Ok) &&
                         m.status <= static_cast<std::uint32_t>(Status::Shutdown)) {
                       m.error[sizeof m.error - 1] = '\0';
                       const auto status = static_cast<Status>(m.status);
                       const OpKey key{m.comm, m.seq, m.src, m.dst};
                       if (note_failure(key, status, m.error))
                         told_.push_back({m.comm, m.seq, m.src, m.dst, status, m.error});
                     }
                     if (p.state == PeerState::Alive) post_notice_recv(node);
                   });
}

bool Engine::admit(Op& op, const OpKey& key) {
  op.of = key;
  if (auto f = failed_.find(key); f != failed_.end()) {
    op.status = f->second.first;  // progress() returns it
    op.error = f->second.second;
    return false;
  }
  if (started_.insert(key).second) {
    started_order_.push_back(key);
    if (started_order_.size() > kRemembered) {
      started_.erase(started_order_.front());
      started_order_.pop_front();
    }
  }
  return true;
}

bool Engine::note_failure(const OpKey& key, Status status, const std::string& error) {
  if (!failed_.try_emplace(key, status, error).second) return false;
  failed_order_.push_back(key);
  if (failed_order_.size() > kRemembered) {
    failed_.erase(failed_order_.front());
    failed_order_.pop_front();
  }
  // Its parts waiting here wait for descriptors that never come. Until an op receives into a
  // rank's memory (a collective's later phases, a recv whose sender's descriptor matched), its
  // receives land in its own buffers only: ending it leaves nothing that could write a rank's
  // memory later.
  for (auto& op : ops_) {
    if (op->phase != 0 || op->into_ranks || !op->error.empty() || op->of != key) continue;
    op->status = status;
    op->error = error;
    op->abandoned = true;
  }
  return true;
}

bool Engine::announce_op_failure(const Communicator& comm, const OpFailure& f) {
  const OpKey key{f.comm, f.seq, f.src, f.dst};
  if (started_.contains(key)) {
    spdlog::debug("operation #{} of communicator {} failed after this node started part of it; the other nodes "
                  "are not told (their part runs or times out)", f.seq, f.comm);
    return false;
  }
  if (!note_failure(key, f.status, f.error)) return false;
  std::vector<int> nodes;
  if (f.src < 0) {
    for (int g : comm.global_ranks) nodes.push_back(topo_.node_of(g));
  } else {
    for (int r : {f.src, f.dst})
      if (r >= 0 && r < comm.size()) nodes.push_back(topo_.node_of(comm.global_ranks[static_cast<std::size_t>(r)]));
  }
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  bool told = false;
  for (int n : nodes) told = send_notice(n, f) || told;
  return told;
}

bool Engine::send_notice(int node, const OpFailure& f) {
  auto& peer = peers_[static_cast<std::size_t>(node)];
  if (node == topo_.node_id || peer.state != PeerState::Alive || !process_there(node)) return false;
  auto notice = std::make_shared<ControlMessage<FailureNotice>>(staging_);
  FailureNotice& m = *notice->get();
  m.status = static_cast<std::uint32_t>(f.status);
  m.src = f.src;
  m.dst = f.dst;
  m.comm = f.comm;
  m.seq = f.seq;
  std::strncpy(m.error, f.error.c_str(), sizeof m.error - 1);
  transport_->send(peer.transport_index, kControlRail, kFailureTag, notice->get(), sizeof(FailureNotice), notice->region(),
                   [notice](transport::Status) {});
  return true;
}

std::vector<Engine::OpFailure> Engine::take_op_failures() { return std::exchange(told_, {}); }

bool Engine::process_there(int node) const {
  const auto& info = topo_.nodes[static_cast<std::size_t>(node)];
  return info.hostname != topo_.nodes[static_cast<std::size_t>(topo_.node_id)].hostname || ipc::process_alive(info.pid);
}

void Engine::send_beat(int node, Clock::time_point now) {
  auto& peer = peers_[static_cast<std::size_t>(node)];
  // Never send to a peer that ended: some providers (shm) crash sending to a vanished process.
  // A peer that said goodbye still waits for ours (it leaves once every peer has ended), so it
  // gets exactly that one.
  if (peer.state == PeerState::Dead || peer.state == PeerState::Failed) return;
  if (peer.state == PeerState::Done && (my_state_ == PeerState::Alive || peer.goodbye_sent)) return;
  if (!process_there(node)) return;
  if (peer.beats_in_flight >= 4) return;  // it does not take them: silence is judged by its side
  auto beat = std::make_shared<ControlMessage<Beat>>(staging_);
  Beat& m = *beat->get();
  m.state = static_cast<std::uint32_t>(my_state_);
  m.exit_code = my_exit_code_;
  m.pid = topo_.nodes[static_cast<std::size_t>(topo_.node_id)].pid;
  std::strncpy(m.error, (my_state_ == PeerState::Alive ? my_stall_note_ : my_error_).c_str(), sizeof m.error - 1);
  if (my_state_ == PeerState::Alive) m.waits = my_waits_wire_;
  ++peer.beats_in_flight;
  peer.last_sent = now;
  if (my_state_ != PeerState::Alive) peer.goodbye_sent = true;
  transport_->send(peer.transport_index, kControlRail, kBeatTag, beat->get(), sizeof(Beat), beat->region(),
                   [this, beat, node](transport::Status st) {
                     auto& p = peers_[static_cast<std::size_t>(node)];
                     --p.beats_in_flight;
                     if (!st.ok && p.state == PeerState::Alive && !p.beat_failed_at) {
                       p.beat_failed_at = Clock::now();
                       p.beat_error = st.error;
                     }
                   });
}

void Engine::peer_lost(int node, const std::string& why, int exit_code) {
  auto& p = peers_[static_cast<std::size_t>(node)];
  p.state = PeerState::Dead;
  if (!peer_failure_) peer_failure_ = PeerFailure{why, exit_code};
  transport_->fail_peer(p.transport_index, why);
}

void Engine::check_peers(Clock::time_point now) {
  // Time this loop was not looking (the daemon descheduled on a loaded machine, a test driving
  // several engines from one thread) is not the peers' silence: their beats wait unread.
  if (now - last_peer_check_ > options_.heartbeat_timeout / 2) watching_since_ = now;
  last_peer_check_ = now;
  const auto silent_for = [&](const Peer& p) { return now - std::max(p.last_heard, watching_since_); };
  if (lifelines_ && now - last_lifeline_poll_ >= kLifelinePoll) {
    last_lifeline_poll_ = now;
    for (int n : lifelines_->closed())
      if (n >= 0 && n < topo_.num_nodes) peers_[static_cast<std::size_t>(n)].lifeline_closed_at = now;
  }
  const auto& my_host = topo_.nodes[static_cast<std::size_t>(topo_.node_id)].hostname;
  bool drained = false;
  for (int n = 0; n < topo_.num_nodes; ++n) {
    if (n == topo_.node_id) continue;
    auto& p = peers_[static_cast<std::size_t>(n)];
    const auto& info = topo_.nodes[static_cast<std::size_t>(n)];
    if (p.state == PeerState::Dead) continue;
    const std::string who = "smddp daemon (pid " + std::to_string(info.pid) + ") on node " + std::to_string(n);
    // On the same host the pid tells a death at once; silence is judged everywhere (a daemon
    // stopped or hung, a network that no longer carries its messages).
    if (info.hostname == my_host && !ipc::process_alive(info.pid)) {
      if (p.state == PeerState::Alive) peer_lost(n, who + " died", 1);
      else p.state = PeerState::Dead;  // it ended or failed and said so first
      continue;
    }
    // Its lifeline ended: its process is gone. A goodbye or failure notice it sent before it
    // went travels on the fabric, which may deliver it a moment later: that is let to come first.
    if (p.state == PeerState::Alive && p.lifeline_closed_at && now - *p.lifeline_closed_at >= kFabricErrorSettle) {
      peer_lost(n, who + " died: its process on " + info.hostname + " is gone (its lifeline connection closed)", 1);
      continue;
    }
    // A beat that could not be sent: the connection to it broke, which on another host is how
    // a killed daemon shows long before its silence would. Its last words, if any, come first.
    if (p.state == PeerState::Alive && p.beat_failed_at && now - *p.beat_failed_at >= kFabricErrorSettle) {
      if (p.last_heard > *p.beat_failed_at) {
        p.beat_failed_at.reset();  // heard from since: it lives, the failure was the message's own
      } else {
        peer_lost(n, who + " is gone: the fabric connection to " + info.hostname + " broke (" + p.beat_error +
                         "; the daemon died, or its host went down)",
                  1);
        continue;
      }
    }
    if (p.state != PeerState::Alive || silent_for(p) <= options_.heartbeat_timeout) continue;
    if (!drained) {
      // Its beat may be among completions not read yet: read them all before the verdict.
      drained = true;
      for (int batches = 0; batches < 1024 && transport_->progress() > 0; ++batches) {
      }
      if (p.state != PeerState::Alive || silent_for(p) <= options_.heartbeat_timeout) continue;
    }
    const std::string timeout = std::to_string(options_.heartbeat_timeout.count()) + " ms";
    if (!p.heard_from)
      peer_lost(n, "cannot reach the " + who + " (host " + info.hostname +
                       (info.address.empty() ? "" : ", address " + info.address) + "): nothing arrived from it in " +
                       timeout + " since the job started (no route between the hosts, a firewall, or an interface " +
                       "the other host cannot reach: see fabric.interface)",
                1);
    else
      peer_lost(n, who + " stopped answering: no heartbeat from " + info.hostname + " for " + timeout +
                       " (the daemon died or hangs, or the network between the nodes is down)",
                1);
  }
}

std::optional<Engine::PeerFailure> Engine::take_peer_failure() {
  if (!peer_failure_ || peer_failure_taken_) return std::nullopt;
  peer_failure_taken_ = true;
  return peer_failure_;
}

void Engine::announce_failure(const std::string& error, int exit_code) {
  if (my_state_ == PeerState::Failed) return;
  my_state_ = PeerState::Failed;
  my_error_ = error;
  my_exit_code_ = exit_code;
  const auto now = Clock::now();
  for (int n = 0; n < topo_.num_nodes; ++n)
    if (n != topo_.node_id) send_beat(n, now);
}

void Engine::start(Match m, Clock::time_point now) {
  auto op = std::make_shared<Op>();
  op->comm = m.comm;
  op->match = std::move(m);
  const int n = op->comm->size();
  op->local.assign(static_cast<std::size_t>(n), nullptr);
  for (const auto& p : op->match.posted) op->local[static_cast<std::size_t>(p.group_rank)] = &p;
  op->descs.resize(static_cast<std::size_t>(n));
  for (const auto& p : op->match.posted) op->descs[static_cast<std::size_t>(p.group_rank)] = p.desc;
  for (int g : op->comm->global_ranks) op->nodes.push_back(topo_.node_of(g));
  std::sort(op->nodes.begin(), op->nodes.end());
  op->nodes.erase(std::unique(op->nodes.begin(), op->nodes.end()), op->nodes.end());
  op->me = static_cast<int>(std::lower_bound(op->nodes.begin(), op->nodes.end(), topo_.node_id) - op->nodes.begin());
  const auto& d = op->match.posted.front().desc;
  op->key = mix(mix(mix(0x736d646470ull, d.comm_id), d.seq), d.chunk_offset);
  choose_rails(*op, op->comm->global_ranks);
  op->started = now;
  op->deadline = now + (d.timeout_ms ? std::chrono::milliseconds(d.timeout_ms) : options_.default_timeout);
  op->heard.assign(op->nodes.size(), 0);
  op->heard[static_cast<std::size_t>(op->me)] = 1;
  ops_.push_back(op);
  trace_step(*op, "started", now);
  if (!admit(*op, {d.comm_id, d.seq, -1, -1})) return;

  // Phase 0: every node sends its members' descriptors to every other node of the group, with
  // how this chunk moves (tuner.hpp) in their reserved byte: judge() checks that all chose alike.
  Ctx c(*this, *op);
  op->algorithm = choose_algorithm(options_.algorithm, d, n, static_cast<int>(op->nodes.size()), sends_eagerly(c));
  std::vector<ipc::RequestDesc> mine;
  for (const auto& p : op->match.posted) {
    mine.push_back(p.desc);
    mine.back().reserved0 = op->descs[static_cast<std::size_t>(p.group_rank)].reserved0 =
        static_cast<std::uint8_t>(op->algorithm);
  }
  std::byte* out = c.buffer(mine.size() * sizeof(ipc::RequestDesc));
  std::memcpy(out, mine.data(), mine.size() * sizeof(ipc::RequestDesc));
  for (int j = 0; j < static_cast<int>(op->nodes.size()); ++j) {
    if (j == op->me) continue;
    c.send(j, 0, out, mine.size() * sizeof(ipc::RequestDesc));
  }
  // Receive straight into descs[]: a node's members are consecutive global ranks but not
  // necessarily consecutive group ranks, so receive into a staging block and scatter later.
  for (int j = 0; j < static_cast<int>(op->nodes.size()); ++j) {
    if (j == op->me) continue;
    int members = 0;
    for (int g = 0; g < n; ++g) members += op->node_index_of_member(g, topo_) == j;
    const std::size_t bytes = static_cast<std::size_t>(members) * sizeof(ipc::RequestDesc);
    post_descriptor_recv(op, j, c.buffer(bytes), bytes);
  }
  // Small operations send their data now too (eager.cpp): one exchange instead of two or three.
  if (op->algorithm == Algorithm::Eager) {
    op->eager = true;
    try {
      eager_step(c);
    } catch (const std::exception& e) {
      c.fail(Status::Internal, std::string("internal error: ") + e.what());
    }
  }
}

void Engine::start_p2p(const Communicator& comm, const Posted& p, Clock::time_point now) {
  auto op = std::make_shared<Op>();
  op->comm = &comm;
  op->p2p = true;
  op->match = Match{&comm, {p}, Status::Ok, {}};
  const auto& d = p.desc;
  const bool is_send = d.op == OpType::Send;
  const int src = is_send ? p.group_rank : d.root, dst = is_send ? d.root : p.group_rank;
  const int peer_node = topo_.node_of(comm.global_ranks[static_cast<std::size_t>(d.root)]);
  op->nodes = {std::min(topo_.node_id, peer_node), std::max(topo_.node_id, peer_node)};
  op->me = topo_.node_id < peer_node ? 0 : 1;
  op->local.assign(static_cast<std::size_t>(comm.size()), nullptr);
  op->local[static_cast<std::size_t>(p.group_rank)] = &op->match.posted.front();
  op->descs.assign(static_cast<std::size_t>(comm.size()), ipc::RequestDesc{});
  op->descs[static_cast<std::size_t>(p.group_rank)] = d;
  op->key = mix(mix(mix(mix(mix(0x703270ull, d.comm_id), static_cast<std::uint64_t>(src)),
                        static_cast<std::uint64_t>(dst)), d.seq), d.chunk_offset);
  choose_rails(*op, {comm.global_ranks[static_cast<std::size_t>(src)], comm.global_ranks[static_cast<std::size_t>(dst)]});
  op->started = now;
  op->deadline = now + (d.timeout_ms ? std::chrono::milliseconds(d.timeout_ms) : options_.default_timeout);
  ops_.push_back(op);
  if (!admit(*op, {d.comm_id, d.seq, src, dst})) return;
  Ctx c(*this, *op);
  const int other = 1 - op->me;
  const std::size_t bytes = d.chunk_count * ipc::dtype_size(d.dtype);
  if (is_send) {
    // The descriptor first (the receiver checks it), then the data straight from the arena.
    std::byte* hdr = c.buffer(sizeof d);
    std::memcpy(hdr, &d, sizeof d);
    c.send(other, 0, hdr, sizeof d);
    c.send(other, data_sub(bytes), c.in(p.group_rank), bytes);
    return;
  }
  // The descriptor, judged as it arrives (advance). The data's receive goes straight into the
  // output only once the descriptor agrees (judge_recv): the data then surely comes, where an
  // op ended by a mismatch or a failure notice must leave no receive that could write a rank's
  // memory later. Small data is received at once into staging and copied (no wait for the
  // descriptor's round through the loop). The data's tag names its size.
  op->heard.assign(2, 0);
  op->heard[static_cast<std::size_t>(op->me)] = 1;
  post_descriptor_recv(op, other, c.buffer(sizeof d), sizeof d);
  if (bytes <= kEagerMessageBytes) {
    op->eager = true;
    c.recv(other, data_sub(bytes), c.buffer(bytes), bytes);
  }
}

void Engine::choose_rails(Op& op, const std::vector<int>& members) const {
  // Each node's member count in the operation, and its member when it has one.
  std::vector<int> count(op.nodes.size(), 0), single(op.nodes.size(), -1);
  for (int g : members) {
    const auto j = static_cast<std::size_t>(std::lower_bound(op.nodes.begin(), op.nodes.end(), topo_.node_of(g)) - op.nodes.begin());
    ++count[j];
    single[j] = g;
  }
  const auto me = static_cast<std::size_t>(op.me);
  op.rails.assign(op.nodes.size(), kControlRail);
  for (std::size_t j = 0; j < op.nodes.size(); ++j) {
    if (j == me) continue;
    const RailTable& theirs = peers_[static_cast<std::size_t>(op.nodes[j])].rails;
    op.rails[j] = count[me] == 1 && count[j] == 1
                      ? pinned_rail(my_rails_, topo_.slot_of(single[me]), theirs, topo_.slot_of(single[j]))
                      : striped_rail(op.key, my_rails_.endpoints, theirs.endpoints);
  }
}

void Engine::post_descriptor_recv(const std::shared_ptr<Op>& op, int j, std::byte* buf, std::size_t bytes) {
  Ctx c(*this, *op);
  ++op->outstanding;
  const int node = op->nodes[static_cast<std::size_t>(j)];
  transport_->recv(peers_[static_cast<std::size_t>(node)].transport_index, op->rails[static_cast<std::size_t>(j)],
                   c.tag(node, topo_.node_id, 0), buf, bytes,
                   c.region_for(buf, bytes), [keep = op, j](transport::Status st) {
                     --keep->outstanding;
                     if (st.ok) {
                       keep->heard[static_cast<std::size_t>(j)] = 1;
                     } else if (keep->error.empty()) {
                       keep->fail_by_fabric(st.error);
                     }
                   });
}

bool Engine::judge(Op& op) {
  // Scatter the received descriptors into group-rank order, then compare the signatures.
  std::size_t buf = 1;  // buffers[0] is what we sent
  const int n = op.size();
  for (int j = 0; j < static_cast<int>(op.nodes.size()); ++j) {
    if (j == op.me) continue;
    const auto* recvd = reinterpret_cast<const ipc::RequestDesc*>(op.buffers[buf++].get());
    for (int g = 0; g < n; ++g)
      if (op.node_index_of_member(g, topo_) == j) std::memcpy(&op.descs[static_cast<std::size_t>(g)], recvd++, sizeof(ipc::RequestDesc));
  }
  bool agree = true;
  for (int g = 1; g < n; ++g) agree = agree && same_signature(op.descs[0], op.descs[static_cast<std::size_t>(g)]);
  std::ostringstream s;
  if (agree) {
    // The same call everywhere, so the same choice of algorithm, unless the daemons' settings differ.
    const auto algorithm_of = [&](int g) { return static_cast<Algorithm>(op.descs[static_cast<std::size_t>(g)].reserved0); };
    int other = 1;
    while (other < n && algorithm_of(other) == algorithm_of(0)) ++other;
    if (other == n) {
      op.judged = true;
      return true;
    }
    const auto node_of = [&](int g) { return op.nodes[static_cast<std::size_t>(op.node_index_of_member(g, topo_))]; };
    s << "nodes chose different algorithms for " << describe_call(op.descs[0]) << " on communicator " << op.comm->id
      << " (operation #" << op.descs[0].seq << "): node " << node_of(0) << " " << to_string(algorithm_of(0))
      << ", node " << node_of(other) << " " << to_string(algorithm_of(other))
      << "; every daemon needs the same fabric.algorithm";
  } else {
    s << "collective mismatch on communicator " << op.comm->id << " (operation #" << op.descs[0].seq << "):";
    for (int g = 0; g < n; ++g)
      s << (g ? ", " : " ") << "rank " << op.comm->global_ranks[static_cast<std::size_t>(g)] << " called "
        << describe_call(op.descs[static_cast<std::size_t>(g)]);
  }
  // Replaces what a data message reported: an eager op's data of another size fails to match.
  op.status = Status::Mismatch;
  op.error = s.str();
  op.mismatch = true;
  return false;
}

bool Engine::advance(Op& op, Clock::time_point now) {
  if (op.abandoned) return true;  // its callbacks keep the op (and its buffers) alive until they run
  // The descriptors are judged as soon as they are in, before the op's other messages: an eager
  // op's data travels beside them, and a node that called something else sends data of another
  // size (the receive fails) or none at all (it never completes). The mismatch is the error.
  if (!op.judged && !op.heard.empty() && std::all_of(op.heard.begin(), op.heard.end(), [](char h) { return h != 0; }) &&
      !(op.p2p ? judge_recv(op) : judge(op)))
    return true;  // its callbacks keep the op (and its buffers) alive until they run
  if (op.outstanding > 0) {
    if (now >= op.deadline && op.error.empty()) {
      std::ostringstream s;
      s << describe_call(op.match.posted.front().desc) << " on communicator " << op.comm->id << " (operation #"
        << op.match.posted.front().desc.seq << ") timed out after "
        << std::chrono::duration<double>(op.deadline - op.started).count() << " s: ";
      // What the nodes of `ranks` said of their late ranks: the rank those wait for.
      std::set<int> told;
      const auto notes_of = [&](const std::vector<int>& ranks) {
        for (int g : ranks) {
          const int n = topo_.node_of(g);
          if (n == topo_.node_id) continue;
          const auto& note = peers_[static_cast<std::size_t>(n)].stall_note;
          if (!note.empty() && told.insert(n).second) s << "; node " << n << " says: " << note;
        }
      };
      const auto missing = unheard_ranks(op);
      if (!missing.empty()) {
        s << "rank(s)";
        for (int g : missing) s << " " << g;
        s << " on other node(s) never posted it (or not all of their node's ranks did)";
        notes_of(missing);
        if (auto why = explain_wait(missing); !why.empty()) s << "; " << why;
      } else if (op.p2p) {
        const auto& mine = op.match.posted.front().desc;
        const int peer = op.comm->global_ranks[static_cast<std::size_t>(mine.root)];
        s << "rank " << peer << " on node " << topo_.node_of(peer) << " did not finish its "
          << (mine.op == OpType::Recv ? "send" : "receive");
        notes_of({peer});
        if (auto why = explain_wait({peer}); !why.empty()) s << "; " << why;
      } else {
        s << "the other node(s) of the group did not finish their part";
        notes_of(op.comm->global_ranks);
      }
      op.status = Status::Timeout;
      op.error = s.str();
      return true;  // its callbacks keep the op (and its buffers) alive until they run
    }
    return false;
  }
  if (!op.error.empty()) return true;
  Ctx c(*this, op);
  if (op.p2p) {
    const auto& mine = op.match.posted.front().desc;
    if (mine.op == OpType::Recv && op.eager)
      c.copy(c.out(op.match.posted.front().group_rank), op.buffers[1].get(), mine.chunk_count * ipc::dtype_size(mine.dtype));
    return true;
  }
  // Run algorithm steps until one posts messages or the op is done.
  const bool by_segments = op.algorithm == Algorithm::Ring || op.algorithm == Algorithm::Halving;
  for (;;) {
    ++op.phase;
    bool done = false;
    try {
      if (op.eager) {
        done = eager_step(c);
      } else {
        switch (op.d0().op) {
          case OpType::AllReduce:
          case OpType::Reduce: done = by_segments ? allreduce_by_segments_step(c) : allreduce_step(c); break;
          case OpType::ReduceScatter: done = by_segments ? reduce_scatter_by_segments_step(c) : reduce_scatter_step(c); break;
          case OpType::Broadcast: done = broadcast_step(c); break;
          case OpType::AllGather: done = by_segments ? allgather_by_segments_step(c) : allgather_step(c); break;
          case OpType::Gather:
          case OpType::Scatter: done = gather_scatter_step(c); break;
          case OpType::AllToAll: done = alltoall_step(c); break;
          case OpType::Barrier: done = true; break;
          default: c.fail(Status::Unsupported, std::string(ipc::to_string(op.d0().op)) + " is not a collective"); done = true;
        }
      }
    } catch (const std::exception& e) {
      c.fail(Status::Internal, std::string("internal error: ") + e.what());
      done = true;
    }
    if (done || !op.error.empty()) {
      trace_step(op, "done", now);
      return true;
    }
    if (op.outstanding > 0) {
      trace_step(op, "posted", now);
      return false;
    }
  }
}

bool Engine::judge_recv(Op& op) {
  const auto& mine = op.match.posted.front().desc;
  ipc::RequestDesc s;
  std::memcpy(&s, op.buffers.front().get(), sizeof s);
  op.judged = true;
  const int g = op.match.posted.front().group_rank;
  const std::size_t wanted = mine.chunk_count * ipc::dtype_size(mine.dtype);
  Ctx c(*this, op);
  if (s.dtype == mine.dtype && s.count == mine.count && s.chunk_offset == mine.chunk_offset &&
      s.chunk_count == mine.chunk_count && s.tag == mine.tag) {
    if (!op.eager) {
      op.into_ranks = true;
      c.recv(1 - op.me, data_sub(wanted), c.out(g), wanted);
    }
    return true;
  }
  op.status = Status::Mismatch;
  op.error = "send/recv mismatch on communicator " + std::to_string(mine.comm_id) + ": rank " +
             std::to_string(op.comm->global_ranks[static_cast<std::size_t>(mine.root)]) + " called " + describe_call(s) +
             ", rank " + std::to_string(op.comm->global_ranks[static_cast<std::size_t>(g)]) + " called " +
             describe_call(mine);
  // Every chunk of the pair fails, here (those still waiting for their sender's descriptor end at
  // once) and on the sender's node.
  const auto& [comm, seq, src, dst] = op.of;
  const OpFailure f{comm, seq, src, dst, Status::Mismatch, op.error};
  if (note_failure(op.of, f.status, f.error)) send_notice(op.nodes[static_cast<std::size_t>(1 - op.me)], f);
  // The sender's data is taken into staging (our small receive takes it when the sizes agree),
  // so that its message completes and meets no shorter receive. The op ends now; its callbacks
  // keep it (and its buffers) alive until they run.
  const std::size_t sent = s.chunk_count * ipc::dtype_size(s.dtype);
  if (!(op.eager && sent == wanted)) c.recv(1 - op.me, data_sub(sent), c.buffer(sent), sent);
  return false;
}

std::vector<int> Engine::unheard_ranks(const Op& op) const {
  std::vector<int> out;
  if (op.p2p) return out;
  for (int g = 0; g < op.size(); ++g)
    if (!op.heard[static_cast<std::size_t>(op.node_index_of_member(g, topo_))])
      out.push_back(op.comm->global_ranks[static_cast<std::size_t>(g)]);
  return out;
}

void Engine::add_waits(Clock::time_point now, std::vector<RankWait>& out) const {
  for (const auto& op : ops_) {
    if (op->abandoned || !op->error.empty()) continue;
    const auto& first = op->match.posted.front().desc;
    std::vector<int> waits_for;
    if (op->p2p) {
      if (first.op != OpType::Recv) continue;  // a send waits for no one in particular
      waits_for.push_back(op->comm->global_ranks[static_cast<std::size_t>(first.root)]);
    } else {
      waits_for = unheard_ranks(*op);
    }
    for (const auto& p : op->match.posted)
      out.push_back({op->comm->global_ranks[static_cast<std::size_t>(p.group_rank)], false, 0, first.op, first.comm_id,
                     first.seq, std::chrono::duration<double>(now - op->started).count(), waits_for});
  }
}

std::string Engine::explain_wait(const std::vector<int>& from) const {
  return daemon::explain_wait(from, [this](int g) -> const RankWait* {
    const int n = topo_.node_of(g);
    if (n < 0 || static_cast<std::size_t>(n) >= peers_.size()) return nullptr;
    return find_wait(n == topo_.node_id ? my_waits_ : peers_[static_cast<std::size_t>(n)].waits, g);
  });
}

std::vector<StallInfo> Engine::stalls(Clock::time_point now, std::chrono::seconds stall_after, bool new_only) {
  std::vector<StallInfo> out;
  for (auto& op : ops_) {
    if (op->p2p || now - op->started < stall_after || (new_only && op->stall_reported)) continue;
    auto missing = unheard_ranks(*op);
    if (missing.empty()) continue;
    if (new_only) op->stall_reported = true;
    const auto& d = op->match.posted.front().desc;
    out.push_back({d.comm_id, d.seq, d.op, std::chrono::duration<double>(now - op->started).count(), std::move(missing)});
  }
  return out;
}

Finished Engine::finish_op(Op& op) {
  Finished f{op.match, op.bytes, op.mismatch};
  f.match.status = op.status;
  f.match.error = op.error;
  return f;
}

std::vector<Finished> Engine::progress(Clock::time_point now) {
  std::vector<Finished> out;
  // One batch of completions, then the operations: a chunk whose step's messages landed takes
  // its next step while the other chunks' messages still arrive (draining them all first ran
  // each step of every chunk of an operation together; AllGather over shm 10-15% slower).
  transport_->progress();
  for (auto it = ops_.begin(); it != ops_.end();) {
    if (advance(**it, now)) {
      // A dying daemon's connections break a moment before its pid shows it gone: give the cause
      // that moment to show, then name the daemon, as the rest of the job hears it, rather than
      // the broken socket.
      if ((*it)->failed_by_fabric() && !peer_failure_) {
        check_peers(now);
        if (!peer_failure_ && now - (*it)->fabric_failed_at < kFabricErrorSettle) {
          ++it;
          continue;
        }
      }
      if ((*it)->failed_by_fabric() && peer_failure_) (*it)->error = peer_failure_->error;
      out.push_back(finish_op(**it));
      it = ops_.erase(it);
    } else {
      ++it;
    }
  }
  // Heartbeats and peer checks cost syscalls: at most every 20 ms of a spinning loop.
  if (now - last_check_ >= std::chrono::milliseconds(20)) {
    last_check_ = now;
    for (int n = 0; n < topo_.num_nodes; ++n) {
      if (n == topo_.node_id) continue;
      if (now - peers_[static_cast<std::size_t>(n)].last_sent >= options_.heartbeat_every) send_beat(n, now);
    }
    check_peers(now);
  }
  return out;
}

std::vector<Finished> Engine::fail_all(Status status, const std::string& error) {
  std::vector<Finished> out;
  for (auto& op : ops_) {
    // A broken socket is the symptom; the job's failure names the cause (the dead daemon).
    if (op->error.empty() || op->failed_by_fabric()) {
      op->status = status;
      op->error = error;
    }
    out.push_back(finish_op(*op));
  }
  ops_.clear();  // pending callbacks still hold the ops (and their buffers)
  return out;
}

void Engine::finish(std::chrono::milliseconds max_wait) {
  if (my_state_ == PeerState::Alive) my_state_ = PeerState::Done;
  auto now = Clock::now();
  for (int n = 0; n < topo_.num_nodes; ++n)
    if (n != topo_.node_id) send_beat(n, now);
  const auto until = now + max_wait;
  // A failed node leaves at once; a clean one waits for its peers so its last sends land.
  const bool wait_for_peers = my_state_ == PeerState::Done;
  for (;;) {
    transport_->progress();
    now = Clock::now();
    check_peers(now);
    bool all_ended = true, sends_pending = false;
    for (int n = 0; n < topo_.num_nodes; ++n) {
      if (n == topo_.node_id) continue;
      const auto& p = peers_[static_cast<std::size_t>(n)];
      all_ended = all_ended && p.state != PeerState::Alive;
      // Beats to a peer that still listens must land (our goodbye is what it waits for).
      sends_pending = sends_pending || ((p.state == PeerState::Alive || p.state == PeerState::Done) && p.beats_in_flight > 0);
    }
    if ((!wait_for_peers || all_ended) && !sends_pending) break;
    if (now >= until) {
      spdlog::warn("leaving while peer daemons still run (waited {} ms)", max_wait.count());
      break;
    }
    for (int n = 0; n < topo_.num_nodes; ++n)
      if (n != topo_.node_id && now - peers_[static_cast<std::size_t>(n)].last_sent >= options_.heartbeat_every)
        send_beat(n, now);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace smddp::daemon::internode
