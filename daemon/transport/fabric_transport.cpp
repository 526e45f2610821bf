#include "daemon/transport/fabric_transport.hpp"

#include <netinet/in.h>
#include <rdma/fi_cm.h>
#include <sys/socket.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace smddp::daemon::transport {
namespace {

using fabric_info::check;
using fabric_info::error_text;

constexpr int kChunkShift = Transport::kTagBits;
constexpr std::uint64_t kChunkMask = 0xFFFF;  // chunk index bits above the user tag

// A registration in every domain (or, with FI_MR_ENDPOINT, on every endpoint) it covers.
class FabricMemoryHandle final : public MemoryRegion::Handle {
 public:
  FabricMemoryHandle(std::vector<FidPtr<fid_mr>> mrs, std::vector<int> mr_of_endpoint)
      : mrs_(std::move(mrs)), mr_of_endpoint_(std::move(mr_of_endpoint)) {}
  void* descriptor(int endpoint) const override {
    const fid_mr* mr = of(endpoint);
    return mr ? fi_mr_desc(const_cast<fid_mr*>(mr)) : nullptr;
  }
  std::uint64_t key(int endpoint) const override {
    const fid_mr* mr = of(endpoint);
    return mr ? fi_mr_key(const_cast<fid_mr*>(mr)) : 0;
  }

 private:
  const fid_mr* of(int endpoint) const {
    if (endpoint < 0 || static_cast<std::size_t>(endpoint) >= mr_of_endpoint_.size()) return nullptr;
    const int i = mr_of_endpoint_[static_cast<std::size_t>(endpoint)];
    return i < 0 ? nullptr : mrs_[static_cast<std::size_t>(i)].get();
  }
  std::vector<FidPtr<fid_mr>> mrs_;
  std::vector<int> mr_of_endpoint_;  // -1: not registered for that endpoint
};

std::string straddr(fid_av* av, const std::vector<std::uint8_t>& address) {
  std::array<char, 256> name{};
  std::size_t len = name.size();
  fi_av_straddr(av, address.data(), name.data(), &len);
  return name.data();
}

}  // namespace

std::unique_ptr<Transport> make_fabric_transport(const TransportConfig& config) {
  return std::make_unique<FabricTransport>(config);
}

FabricTransport::FabricTransport(const TransportConfig& config) {
  if (config.endpoints < 1 || config.endpoints > kMaxEndpoints)
    throw std::invalid_argument("transport: " + std::to_string(config.endpoints) + " endpoints requested (1.." +
                                std::to_string(kMaxEndpoints) + ")");
  select_devices(config);
  op_timeout_ = config.op_timeout;
  std::size_t provider_max = SIZE_MAX;
  for (const auto& d : devices_) provider_max = std::min(provider_max, d.info->ep_attr->max_msg_size);
  max_message_ = config.max_message == 0 ? provider_max : std::min(config.max_message, provider_max);
  if (max_message_ == 0) throw std::runtime_error("libfabric provider reports a max_msg_size of 0");
  for (auto& e : endpoints_) open_endpoint(*e);

  // Never ask for more than the provider's queues hold: beyond them it would answer
  // -FI_EAGAIN, which works but wastes calls.
  // (A provider reporting queue size 0 leaves the bound to us; -FI_EAGAIN still protects.)
  auto bound = [](std::size_t wanted, std::size_t queue, std::size_t fallback) {
    if (wanted == 0) wanted = queue == 0 ? fallback : queue;
    return std::max<std::size_t>(queue == 0 ? wanted : std::min(wanted, queue), 1);
  };
  for (auto& e : endpoints_) {
    const fi_info* i = info_of(*e);
    const std::size_t send_slots = bound(config.max_inflight, i->tx_attr->size, 64);
    const std::size_t recv_slots = bound(config.max_posted_receives, i->rx_attr->size, 1024);
    for (auto* dir : {&e->sends, &e->recvs}) {
      dir->slots.resize(dir == &e->sends ? send_slots : recv_slots);
      for (auto& slot : dir->slots) dir->free_slots.push_back(&slot);
    }
  }
  spdlog::debug("transport: {}", describe());
}

void FabricTransport::select_devices(const TransportConfig& config) {
  // Strongest request first: ordered matching (FI_ORDER_SAS) and RMA are wanted, not needed.
  for (bool ordered : {true, false}) {
    for (bool rma : {true, false}) {
      FiInfoPtr hints = fabric_info::make_hints(config.provider, fabric_info::kRequiredCaps | (rma ? FI_RMA : 0), ordered);
      FiInfoPtr found = fabric_info::get_info(hints.get());
      if (!found) continue;
      auto chosen = fabric_info::choose_devices(found.get(), config.interface, config.endpoints, interface_note_);
      // Endpoints on the same domain share its fabric and domain objects.
      for (auto& info : chosen) {
        int device = -1;
        for (std::size_t d = 0; d < devices_.size(); ++d)
          if (std::strcmp(devices_[d].info->domain_attr->name, info->domain_attr->name) == 0) device = static_cast<int>(d);
        if (device < 0) {
          device = static_cast<int>(devices_.size());
          Device& dev = devices_.emplace_back();
          dev.info = std::move(info);
          check(fi_fabric(dev.info->fabric_attr, dev.fabric.out(), nullptr), "fi_fabric");
          check(fi_domain(dev.fabric.get(), dev.info.get(), dev.domain.out(), nullptr), "fi_domain");
        }
        endpoints_.push_back(std::make_unique<Endpoint>());
        endpoints_.back()->device = device;
      }
      rma_offered_ = (info()->caps & FI_RMA) != 0;
      ordered_ = ordered;
      // FI_HMEM is only reported (on every device): the daemon stages device data through host
      // memory for now.
      hints->caps |= FI_HMEM;
      FiInfoPtr hmem = fabric_info::get_info(hints.get());
      hmem_offered_ = true;
      for (const auto& dev : devices_) {
        bool here = false;
        for (const fi_info* i = hmem.get(); i != nullptr; i = i->next) {
          const char* a = i->domain_attr->name;
          here = here || (a != nullptr && std::strcmp(a, dev.info->domain_attr->name) == 0);
        }
        hmem_offered_ = hmem_offered_ && here;
      }
      return;
    }
  }
  fabric_info::explain_no_info(config.provider);
}

void FabricTransport::open_endpoint(Endpoint& e) {
  const Device& dev = devices_[static_cast<std::size_t>(e.device)];
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.wait_obj = FI_WAIT_NONE;  // the progress loop polls
  cq_attr.size = dev.info->tx_attr->size + dev.info->rx_attr->size;
  check(fi_cq_open(dev.domain.get(), &cq_attr, e.cq.out(), nullptr), "fi_cq_open");

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  check(fi_av_open(dev.domain.get(), &av_attr, e.av.out(), nullptr), "fi_av_open");

  check(fi_endpoint(dev.domain.get(), dev.info.get(), e.ep.out(), nullptr), "fi_endpoint");
  check(fi_ep_bind(e.ep.get(), &e.cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  check(fi_ep_bind(e.ep.get(), &e.av->fid, 0), "fi_ep_bind(av)");
  check(fi_enable(e.ep.get()), "fi_enable");

  std::size_t len = 0;
  int ret = fi_getname(&e.ep->fid, nullptr, &len);
  if (ret != -FI_ETOOSMALL && ret != 0) check(ret, "fi_getname");
  e.address.resize(len);
  check(fi_getname(&e.ep->fid, e.address.data(), &len), "fi_getname");
  e.address.resize(len);
}

FabricTransport::~FabricTransport() {
  shutting_down_ = true;
  // Cancel posted receives and collect their completions so that no provider keeps a
  // pointer into a caller's buffer. Sends cannot be cancelled portably; closing the endpoint
  // drops them. Bounded: a provider that never reports a cancellation is not waited for.
  auto posted_recvs = [this] {
    std::size_t n = 0;
    for (const auto& e : endpoints_) n += e->recvs.slots.size() - e->recvs.free_slots.size();
    return n;
  };
  for (auto& e : endpoints_) {
    if (!e->ep) continue;
    for (auto& slot : e->recvs.slots)
      if (slot.message != nullptr) fi_cancel(&e->ep->fid, &slot);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (posted_recvs() > 0 && std::chrono::steady_clock::now() < deadline) progress();
  endpoints_.clear();
  // Per-message registrations go before the domains close.
  messages_.clear();
  abandoned_.clear();
}

std::vector<std::vector<std::uint8_t>> FabricTransport::local_addresses() const {
  std::vector<std::vector<std::uint8_t>> out;
  for (const auto& e : endpoints_) out.push_back(e->address);
  return out;
}

int FabricTransport::add_peer(const std::vector<std::vector<std::uint8_t>>& addresses) {
  if (addresses.empty()) throw std::invalid_argument("transport: a peer with no endpoint addresses");
  if (addresses.size() > static_cast<std::size_t>(kMaxEndpoints))
    throw std::invalid_argument("transport: a peer with " + std::to_string(addresses.size()) + " endpoints (at most " +
                                std::to_string(kMaxEndpoints) + ")");
  // fi_av_insert reads as many bytes as the address format says, whatever we pass: check it.
  for (std::size_t r = 0; r < addresses.size(); ++r) {
    const std::string why = address_fault(addresses[r]);
    if (!why.empty())
      throw std::invalid_argument("transport: the peer's endpoint " + std::to_string(r) + " address (" +
                                  std::to_string(addresses[r].size()) + " bytes) is malformed for provider '" +
                                  info()->fabric_attr->prov_name + "': " + why);
  }
  Peer p;
  p.addresses = addresses;
  for (const auto& a : addresses) p.names.push_back(straddr(endpoints_.front()->av.get(), a));
  p.addr.assign(endpoints_.size() * addresses.size(), FI_ADDR_NOTAVAIL);
  peers_.push_back(std::move(p));
  const int index = static_cast<int>(peers_.size() - 1);
  // Every address once, where striping (same index both sides) will use it.
  try {
    for (std::size_t r = 0; r < addresses.size(); ++r)
      resolve(index, Rail{static_cast<int>(r % endpoints_.size()), static_cast<int>(r)});
  } catch (...) {
    peers_.pop_back();
    throw;
  }
  return index;
}

std::string FabricTransport::address_fault(const std::vector<std::uint8_t>& a) const {
  if (a.empty()) return "empty";
  switch (info()->addr_format) {
    case FI_ADDR_STR:  // shm: a NUL-terminated name
      return std::find(a.begin(), a.end(), std::uint8_t{0}) == a.end() ? "no terminating NUL" : "";
    case FI_SOCKADDR:
    case FI_SOCKADDR_IN:
    case FI_SOCKADDR_IN6: {
      if (a.size() < sizeof(sockaddr)) return "shorter than a sockaddr";
      sockaddr sa{};
      std::memcpy(&sa, a.data(), sizeof sa);
      const std::size_t want = sa.sa_family == AF_INET ? sizeof(sockaddr_in) : sa.sa_family == AF_INET6 ? sizeof(sockaddr_in6) : 0;
      if (want == 0) return "address family " + std::to_string(sa.sa_family) + " is neither IPv4 nor IPv6";
      return a.size() == want ? "" : "a sockaddr of its family is " + std::to_string(want) + " bytes";
    }
    default: {  // fixed-size formats (efa): as long as ours
      const std::size_t mine = endpoints_.front()->address.size();
      return a.size() == mine ? "" : "this provider's addresses are " + std::to_string(mine) + " bytes";
    }
  }
}

int FabricTransport::peer_endpoints(int peer) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= peers_.size()) return 0;
  return static_cast<int>(peers_[static_cast<std::size_t>(peer)].addresses.size());
}

fi_addr_t FabricTransport::resolve(int peer, Rail rail) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  const std::size_t remotes = p.addresses.size();
  fi_addr_t& a = p.addr[static_cast<std::size_t>(rail.local) * remotes + static_cast<std::size_t>(rail.remote)];
  if (a != FI_ADDR_NOTAVAIL) return a;
  const auto& bytes = p.addresses[static_cast<std::size_t>(rail.remote)];
  fi_addr_t out = FI_ADDR_UNSPEC;
  const int inserted = fi_av_insert(endpoints_[static_cast<std::size_t>(rail.local)]->av.get(), bytes.data(), 1, &out, 0, nullptr);
  if (inserted != 1) {
    throw std::invalid_argument("transport: endpoint " + std::to_string(rail.local) + " rejected peer " +
                                std::to_string(peer) + "'s endpoint " + std::to_string(rail.remote) + " address (" +
                                std::to_string(bytes.size()) + " bytes)" +
                                (inserted < 0 ? ": " + error_text(inserted) : std::string()));
  }
  a = out;
  return a;
}

std::string FabricTransport::peer_name(int peer, int endpoint) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= peers_.size()) return "?";
  const auto& names = peers_[static_cast<std::size_t>(peer)].names;
  if (endpoint < 0 || static_cast<std::size_t>(endpoint) >= names.size()) return "?";
  return names[static_cast<std::size_t>(endpoint)];
}

bool FabricTransport::needs_registration() const { return (info()->domain_attr->mr_mode & FI_MR_LOCAL) != 0; }

MemoryRegion FabricTransport::register_memory(void* base, std::size_t bytes) { return register_on(base, bytes, -1); }

MemoryRegion FabricTransport::register_on(void* base, std::size_t bytes, int only_endpoint) {
  // Registration is real when the provider needs it for local buffers (FI_MR_LOCAL) or
  // offers RMA (the key will address the region remotely); otherwise the region is a label.
  if (!needs_registration() && !rma_offered_) return MemoryRegion(base, bytes, nullptr);
  if (bytes == 0) return MemoryRegion(base, bytes, nullptr);
  std::uint64_t access = FI_SEND | FI_RECV;
  if (rma_offered_) access |= FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  const int mode = info()->domain_attr->mr_mode;
  // One registration per domain; with FI_MR_ENDPOINT one per endpoint, bound to it.
  const bool per_endpoint = (mode & FI_MR_ENDPOINT) != 0;
  std::vector<FidPtr<fid_mr>> mrs;
  std::vector<int> mr_of_endpoint(endpoints_.size(), -1);
  std::vector<int> mr_of_device(devices_.size(), -1);
  for (std::size_t i = 0; i < endpoints_.size(); ++i) {
    if (only_endpoint >= 0 && static_cast<std::size_t>(only_endpoint) != i) continue;
    const Endpoint& e = *endpoints_[i];
    const auto device = static_cast<std::size_t>(e.device);
    if (!per_endpoint && mr_of_device[device] >= 0) {
      mr_of_endpoint[i] = mr_of_device[device];
      continue;
    }
    const std::uint64_t requested_key = (mode & FI_MR_PROV_KEY) ? 0 : next_mr_key_++;
    FidPtr<fid_mr> mr;
    const int ret = fi_mr_reg(devices_[device].domain.get(), base, bytes, access, 0, requested_key, 0, mr.out(), nullptr);
    if (ret != 0) {
      throw std::runtime_error("transport: fi_mr_reg of " + std::to_string(bytes) + " bytes on device '" +
                               devices_[device].info->domain_attr->name + "' failed: " + error_text(ret));
    }
    if (per_endpoint) {
      check(fi_mr_bind(mr.get(), &e.ep->fid, 0), "fi_mr_bind");
      check(fi_mr_enable(mr.get()), "fi_mr_enable");
    }
    mr_of_endpoint[i] = static_cast<int>(mrs.size());
    if (!per_endpoint) mr_of_device[device] = mr_of_endpoint[i];
    mrs.push_back(std::move(mr));
  }
  return MemoryRegion(base, bytes, std::make_unique<FabricMemoryHandle>(std::move(mrs), std::move(mr_of_endpoint)));
}

void FabricTransport::send(int peer, Rail rail, std::uint64_t tag, const void* buf, std::size_t bytes,
                           const MemoryRegion* region, Completion done) {
  // The provider never writes through a send buffer; the cast only shares the Message type.
  submit(true, peer, rail, tag, static_cast<std::uint8_t*>(const_cast<void*>(buf)), bytes, region, std::move(done));
}

void FabricTransport::recv(int peer, Rail rail, std::uint64_t tag, void* buf, std::size_t bytes,
                           const MemoryRegion* region, Completion done) {
  submit(false, peer, rail, tag, static_cast<std::uint8_t*>(buf), bytes, region, std::move(done));
}

void FabricTransport::submit(bool is_send, int peer, Rail rail, std::uint64_t tag, std::uint8_t* buf,
                             std::size_t bytes, const MemoryRegion* region, Completion done) {
  const std::string op = is_send ? "send" : "recv";
  if (peer < 0 || static_cast<std::size_t>(peer) >= peers_.size())
    throw std::invalid_argument("transport: " + op + " to unknown peer " + std::to_string(peer));
  if (rail.local < 0 || rail.local >= endpoints() || rail.remote < 0 || rail.remote >= peer_endpoints(peer))
    throw std::invalid_argument("transport: " + op + " over endpoints " + std::to_string(rail.local) + " -> " +
                                std::to_string(rail.remote) + ", but this side has " + std::to_string(endpoints()) +
                                " and peer " + std::to_string(peer) + " has " + std::to_string(peer_endpoints(peer)));
  if (tag > kMaxTag)
    throw std::invalid_argument("transport: " + op + " tag " + std::to_string(tag) + " exceeds " +
                                std::to_string(kTagBits) + " bits");
  if (buf == nullptr && bytes != 0) throw std::invalid_argument("transport: " + op + " of a null buffer");
  if (region != nullptr && !region->contains(buf, bytes))
    throw std::invalid_argument("transport: " + op + " buffer lies outside its memory region");
  const fi_addr_t address = resolve(peer, rail);

  Message& m = messages_.emplace_back();
  m.self = std::prev(messages_.end());
  m.is_send = is_send;
  m.peer = peer;
  m.rail = rail;
  m.address = address;
  m.tag = tag;
  m.buf = buf;
  m.bytes = bytes;
  m.done = std::move(done);
  if (op_timeout_.count() > 0) m.deadline = std::chrono::steady_clock::now() + op_timeout_;
  m.chunks = bytes == 0 ? 1 : 1 + (bytes - 1) / max_message_;  // no overflow at max_message_ = SIZE_MAX
  if (region != nullptr) {
    m.descriptor = region->descriptor(rail.local);
  } else if (needs_registration() && bytes != 0) {
    try {
      m.own_region = register_on(buf, bytes, rail.local);
    } catch (...) {
      messages_.pop_back();
      throw;
    }
    m.descriptor = m.own_region.descriptor(rail.local);
  }
  Endpoint& e = *endpoints_[static_cast<std::size_t>(rail.local)];
  Direction& dir = is_send ? e.sends : e.recvs;
  m.queued = true;
  dir.queue.push_back(&m);
  post_queued(e, dir);  // post at once when slots are free: saves a progress() round for latency
}

std::size_t FabricTransport::chunk_bytes(const Message& m, std::size_t chunk) const {
  std::size_t offset = chunk * max_message_;
  return std::min(max_message_, m.bytes - std::min(offset, m.bytes));
}

void FabricTransport::post_queued(Endpoint& e, Direction& dir) {
  while (!dir.queue.empty() && !dir.free_slots.empty()) {
    Message& m = *dir.queue.front();
    Slot* slot = dir.free_slots.back();
    const std::size_t chunk = m.next_chunk;
    std::uint8_t* data = m.buf == nullptr ? nullptr : m.buf + chunk * max_message_;
    const std::size_t len = chunk_bytes(m, chunk);
    const std::uint64_t wire_tag = m.tag | ((chunk & kChunkMask) << kChunkShift);
    slot->message = &m;
    slot->chunk = chunk;
    ssize_t ret = m.is_send ? fi_tsend(e.ep.get(), data, len, m.descriptor, m.address, wire_tag, slot)
                            : fi_trecv(e.ep.get(), data, len, m.descriptor, m.address, wire_tag, 0, slot);
    if (ret == -FI_EAGAIN) {
      slot->message = nullptr;
      return;  // the provider's queue is full: progress() retries after draining the CQ
    }
    if (ret != 0) {
      slot->message = nullptr;
      fail(m, Status::failure(describe_op(m, chunk) + ": posting failed: " + error_text(static_cast<int>(ret))));
      maybe_finish(m);
      continue;
    }
    dir.free_slots.pop_back();
    ++m.posted;
    if (++m.next_chunk == m.chunks) {
      dir.queue.pop_front();
      m.queued = false;
    }
  }
}

std::string FabricTransport::describe_op(const Message& m, std::size_t chunk) const {
  std::ostringstream out;
  out << (m.is_send ? "send to" : "recv from") << " peer " << m.peer << " (" << peer_name(m.peer, m.rail.remote) << ")";
  // Named only where there is a choice: with one endpoint each the text stays as it was.
  if (endpoints() > 1 || peer_endpoints(m.peer) > 1)
    out << " over endpoint " << m.rail.local << (m.is_send ? " -> its endpoint " : " <- its endpoint ") << m.rail.remote;
  out << " tag " << m.tag << " (" << m.bytes << " bytes";
  if (m.chunks > 1 && chunk < m.chunks) out << ", chunk " << chunk + 1 << "/" << m.chunks;
  out << ")";
  return out.str();
}

void FabricTransport::fail(Message& m, const Status& status) {
  if (m.status.ok) m.status = status;  // the first error explains best
  if (m.queued) {
    // Chunks not yet posted are dropped: the message has already failed.
    Direction& dir = direction_of(m);
    dir.queue.erase(std::find(dir.queue.begin(), dir.queue.end(), &m));
    m.queued = false;
  }
}

void FabricTransport::maybe_finish(Message& m) {
  if (m.queued || m.completed != m.posted) return;
  if (m.abandoned) {  // its callback already ran
    abandoned_.erase(m.self);
    return;
  }
  Completion done = std::move(m.done);
  Status status = std::move(m.status);
  messages_.erase(m.self);  // before the callback, which may post new messages
  if (done && !shutting_down_) done(std::move(status));
}

void FabricTransport::abort(Message& m, const Status& status) {
  fail(m, status);
  if (m.completed == m.posted) {
    maybe_finish(m);
    return;
  }
  // Ask the provider to give the posted chunks back (receives usually can be cancelled,
  // sends rarely); report the failure now either way, so that nothing waits on a dead peer.
  Endpoint& e = *endpoints_[static_cast<std::size_t>(m.rail.local)];
  for (Slot& slot : direction_of(m).slots) {
    if (slot.message == &m) fi_cancel(&e.ep->fid, &slot);
  }
  m.abandoned = true;
  Completion done = std::move(m.done);
  Status reported = m.status;
  abandoned_.splice(abandoned_.end(), messages_, m.self);  // m.self stays valid
  if (done && !shutting_down_) done(std::move(reported));
}

void FabricTransport::fail_peer(int peer, const std::string& reason) {
  std::vector<Message*> victims;
  for (Message& m : messages_) {
    if (m.peer == peer) victims.push_back(&m);
  }
  // Callbacks may post new messages (to other peers); the victims were chosen before.
  for (Message* m : victims) abort(*m, Status::failure(describe_op(*m, m->chunks) + " failed: " + reason));
}

void FabricTransport::expire_timed_out() {
  const auto now = std::chrono::steady_clock::now();
  while (!messages_.empty() && messages_.front().deadline <= now) {
    Message& m = messages_.front();
    abort(m, Status::failure(describe_op(m, m.chunks) + " failed: not complete after " +
                             std::to_string(op_timeout_.count()) + " ms (peer unreachable or not receiving)"));
  }
}

void FabricTransport::on_chunk_done(Slot* slot, const Status& status, std::size_t received_len) {
  Message& m = *slot->message;
  const std::size_t chunk = slot->chunk;
  slot->message = nullptr;
  direction_of(m).free_slots.push_back(slot);
  ++m.completed;
  Endpoint& e = *endpoints_[static_cast<std::size_t>(m.rail.local)];
  if (!status.ok) {
    fail(m, status);
  } else if (m.is_send) {
    e.bytes_sent += chunk_bytes(m, chunk);
  } else if (received_len != chunk_bytes(m, chunk)) {
    fail(m, Status::failure(describe_op(m, chunk) + ": peer sent " + std::to_string(received_len) +
                            " bytes, expected " + std::to_string(chunk_bytes(m, chunk))));
  } else {
    e.bytes_received += received_len;
  }
  maybe_finish(m);
}

std::size_t FabricTransport::drain(Endpoint& e) {
  std::size_t handled = 0;
  std::array<fi_cq_tagged_entry, 32> entries{};
  for (;;) {
    ssize_t n = fi_cq_read(e.cq.get(), entries.data(), entries.size());
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        auto* slot = static_cast<Slot*>(entries[static_cast<std::size_t>(i)].op_context);
        on_chunk_done(slot, Status::success(), entries[static_cast<std::size_t>(i)].len);
      }
      handled += static_cast<std::size_t>(n);
      break;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(e.cq.get(), &err, 0) != 1) break;
      ++handled;
      auto* slot = static_cast<Slot*>(err.op_context);
      if (slot == nullptr || slot->message == nullptr) continue;  // not ours: nothing to complete
      std::array<char, 256> prov{};
      const char* prov_text = fi_cq_strerror(e.cq.get(), err.prov_errno, err.err_data, prov.data(), prov.size());
      std::string reason = error_text(err.err);
      if (err.err == FI_ETRUNC) reason += " (peer sent more bytes than posted)";
      if (err.err == FI_ECANCELED) reason = "cancelled";
      std::string text = describe_op(*slot->message, slot->chunk) + " failed: " + reason;
      if (err.prov_errno != 0) {
        text += " (provider errno " + std::to_string(err.prov_errno) + ": " + (prov_text ? prov_text : "?") + ")";
      }
      on_chunk_done(slot, Status::failure(std::move(text)), 0);
      continue;
    }
    if (n != -FI_EAGAIN) spdlog::warn("transport: fi_cq_read: {}", error_text(static_cast<int>(n)));
    break;
  }
  return handled;
}

std::size_t FabricTransport::progress() {
  // One batch from each endpoint's queue: every rail's messages go on at once.
  std::size_t handled = 0;
  for (auto& e : endpoints_) handled += drain(*e);
  if (!shutting_down_) {
    if (op_timeout_.count() > 0) expire_timed_out();
    for (auto& e : endpoints_) {
      post_queued(*e, e->sends);
      post_queued(*e, e->recvs);
    }
  }
  return handled;
}

std::vector<EndpointInfo> FabricTransport::endpoint_info() const {
  std::vector<EndpointInfo> out;
  for (const auto& e : endpoints_) {
    const fi_info* i = info_of(*e);
    EndpointInfo x;
    x.provider = i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "?";
    x.device = i->domain_attr->name ? i->domain_attr->name : "?";
    x.pci = fabric_info::pci_address(i);
    x.address = straddr(e->av.get(), e->address);
    x.bytes_sent = e->bytes_sent;
    x.bytes_received = e->bytes_received;
    out.push_back(std::move(x));
  }
  return out;
}

std::string FabricTransport::describe() const {
  std::ostringstream out;
  const fi_info* i = info();
  const int mr_mode = i->domain_attr->mr_mode;
  out << "libfabric " << FI_MAJOR(fi_version()) << "." << FI_MINOR(fi_version()) << " provider '"
      << i->fabric_attr->prov_name << "' fabric '" << i->fabric_attr->name << "'; " << endpoints_.size()
      << (endpoints_.size() == 1 ? " endpoint:" : " endpoints:");
  const auto infos = endpoint_info();
  for (std::size_t k = 0; k < infos.size(); ++k) {
    out << (k ? "," : "") << " " << k << " on domain '" << infos[k].device << "'";
    if (!infos[k].pci.empty()) out << " (pci " << infos[k].pci << ")";
    out << " address " << infos[k].address;
  }
  const auto& first = *endpoints_.front();
  out << "; caps " << fabric_info::caps_text(i->caps) << "; mr_mode [" << fabric_info::mr_mode_text(mr_mode)
      << "]; max_msg_size " << i->ep_attr->max_msg_size << " (chunks of " << max_message_ << "); inject "
      << i->tx_attr->inject_size << "; queues tx " << i->tx_attr->size << " rx " << i->rx_attr->size
      << "; in flight per endpoint: " << first.sends.slots.size() << " sends, " << first.recvs.slots.size()
      << " receives; FI_RMA " << (rma_offered_ ? "offered" : "not offered") << "; FI_HMEM "
      << (hmem_offered_ ? "offered" : "not offered") << "; send-after-send order "
      << (ordered_ ? "yes" : "no (same-tag messages may match out of order)");
  if (!interface_note_.empty()) out << "; " << interface_note_;
  return out.str();
}

}  // namespace smddp::daemon::transport
