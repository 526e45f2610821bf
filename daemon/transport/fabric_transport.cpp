#include "daemon/transport/fabric_transport.hpp"

#include <rdma/fi_cm.h>
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

constexpr int kChunkShift = Transport::kTagBits;
constexpr std::uint64_t kChunkMask = 0xFFFF;  // chunk index bits above the user tag
// Memory-registration modes we know how to honour (see register_memory).
constexpr std::uint64_t kSupportedMrModes =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT | FI_MR_HMEM;
constexpr std::uint64_t kRequiredCaps = FI_TAGGED | FI_MSG | FI_DIRECTED_RECV;

std::string fi_error(int code) { return fi_strerror(code < 0 ? -code : code); }

void check(int ret, const char* what) {
  if (ret != 0) throw std::runtime_error(std::string("libfabric: ") + what + " failed: " + fi_error(ret));
}

std::string to_string_caps(std::uint64_t caps) { return fi_tostr(&caps, FI_TYPE_CAPS); }
std::string to_string_mr_mode(int mode) { return fi_tostr(&mode, FI_TYPE_MR_MODE); }

FiInfoPtr make_hints(const std::string& provider, std::uint64_t caps, bool ordered) {
  FiInfoPtr hints(fi_allocinfo());
  if (!hints) throw std::runtime_error("libfabric: fi_allocinfo failed");
  hints->caps = caps;
  // Every operation carries a Slot whose first member is an fi_context2.
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = static_cast<int>(kSupportedMrModes);
  hints->domain_attr->threading = FI_THREAD_DOMAIN;  // one thread drives the transport
  hints->domain_attr->av_type = FI_AV_TABLE;         // fi_addr == insertion index
  if (ordered) {
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
  }
  hints->fabric_attr->prov_name = strdup(provider.c_str());  // fi_freeinfo frees it
  return hints;
}

FiInfoPtr get_info(const fi_info* hints) {
  fi_info* out = nullptr;
  int ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr, 0, hints, &out);
  if (ret != 0) return nullptr;
  return FiInfoPtr(out);
}

bool binds_to_interface(const fi_info* info) {
  return info->addr_format == FI_SOCKADDR || info->addr_format == FI_SOCKADDR_IN ||
         info->addr_format == FI_SOCKADDR_IN6;
}

// Picks the entry on the configured interface, IPv4 first; providers without network
// interfaces (shm, efa) take their first entry. Returns a copy that owns itself.
FiInfoPtr pick(const fi_info* list, const std::string& interface, std::string& note) {
  const fi_info* chosen = nullptr;
  for (int pass = 0; pass < 2 && chosen == nullptr; ++pass) {
    for (const fi_info* i = list; i != nullptr; i = i->next) {
      bool on_interface = interface.empty() || !binds_to_interface(i) ||
                          (i->domain_attr->name != nullptr && interface == i->domain_attr->name);
      bool preferred_family = pass == 1 || !binds_to_interface(i) || i->addr_format == FI_SOCKADDR_IN;
      if (on_interface && preferred_family) {
        chosen = i;
        break;
      }
    }
  }
  if (chosen == nullptr) {
    std::string domains;
    for (const fi_info* i = list; i != nullptr; i = i->next) {
      std::string name = i->domain_attr->name ? i->domain_attr->name : "?";
      if (domains.find(name) == std::string::npos) domains += (domains.empty() ? "" : ", ") + name;
    }
    throw std::runtime_error("libfabric provider '" + std::string(list->fabric_attr->prov_name) +
                             "' has no domain on interface '" + interface + "' (domains: " + domains + ")");
  }
  if (!interface.empty() && !binds_to_interface(chosen)) {
    note = "interface '" + interface + "' not applicable to this provider";
  }
  return FiInfoPtr(fi_dupinfo(chosen));
}

// Explains why no entry served: the first requirement the provider fails.
[[noreturn]] void explain_no_info(const std::string& provider) {
  FiInfoPtr hints(fi_allocinfo());
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  if (!get_info(hints.get())) {
    FiInfoPtr all = get_info(nullptr);
    std::string names;
    for (const fi_info* i = all.get(); i != nullptr; i = i->next) {
      std::string name = i->fabric_attr->prov_name;
      if (names.find(name) == std::string::npos) names += (names.empty() ? "" : ", ") + name;
    }
    throw std::runtime_error("libfabric provider '" + provider + "' is not available (available: " +
                             names + ")");
  }
  hints->ep_attr->type = FI_EP_RDM;
  if (!get_info(hints.get()))
    throw std::runtime_error("libfabric provider '" + provider + "' offers no reliable-datagram (FI_EP_RDM) endpoint");
  hints->caps = FI_TAGGED | FI_MSG;
  if (!get_info(hints.get()))
    throw std::runtime_error("libfabric provider '" + provider + "' lacks tagged messages (FI_TAGGED|FI_MSG) on FI_EP_RDM");
  hints->caps |= FI_DIRECTED_RECV;
  if (!get_info(hints.get()))
    throw std::runtime_error("libfabric provider '" + provider + "' lacks directed receive (FI_DIRECTED_RECV) on FI_EP_RDM");
  throw std::runtime_error("libfabric provider '" + provider +
                           "' requires an operation mode or memory-registration mode smddp does not "
                           "support (supported: FI_CONTEXT, FI_CONTEXT2, " + to_string_mr_mode(kSupportedMrModes) + ")");
}

class FabricMemoryHandle final : public MemoryRegion::Handle {
 public:
  explicit FabricMemoryHandle(FidPtr<fid_mr> mr) : mr_(std::move(mr)) {}
  void* descriptor() const override { return mr_ ? fi_mr_desc(mr_.get()) : nullptr; }
  std::uint64_t key() const override { return mr_ ? fi_mr_key(mr_.get()) : 0; }

 private:
  FidPtr<fid_mr> mr_;
};

}  // namespace

std::unique_ptr<Transport> make_fabric_transport(const TransportConfig& config) {
  return std::make_unique<FabricTransport>(config);
}

FabricTransport::FabricTransport(const TransportConfig& config) {
  select_info(config);
  open_objects();
  op_timeout_ = config.op_timeout;

  std::size_t provider_max = info_->ep_attr->max_msg_size;
  max_message_ = config.max_message == 0 ? provider_max : std::min(config.max_message, provider_max);
  if (max_message_ == 0) throw std::runtime_error("libfabric provider reports a max_msg_size of 0");

  // Never ask for more than the provider's queues hold: beyond them it would answer
  // -FI_EAGAIN, which works but wastes calls.
  // (A provider reporting queue size 0 leaves the bound to us; -FI_EAGAIN still protects.)
  auto bound = [](std::size_t wanted, std::size_t queue, std::size_t fallback) {
    if (wanted == 0) wanted = queue == 0 ? fallback : queue;
    return std::max<std::size_t>(queue == 0 ? wanted : std::min(wanted, queue), 1);
  };
  std::size_t send_slots = bound(config.max_inflight, info_->tx_attr->size, 64);
  std::size_t recv_slots = bound(config.max_posted_receives, info_->rx_attr->size, 1024);
  for (auto* dir : {&sends_, &recvs_}) {
    dir->slots.resize(dir == &sends_ ? send_slots : recv_slots);
    for (auto& slot : dir->slots) dir->free_slots.push_back(&slot);
  }
  spdlog::debug("transport: {}", describe());
}

void FabricTransport::select_info(const TransportConfig& config) {
  // Strongest request first: ordered matching (FI_ORDER_SAS) and RMA are wanted, not needed.
  for (bool ordered : {true, false}) {
    for (bool rma : {true, false}) {
      FiInfoPtr hints = make_hints(config.provider, kRequiredCaps | (rma ? FI_RMA : 0), ordered);
      FiInfoPtr found = get_info(hints.get());
      if (!found) continue;
      info_ = pick(found.get(), config.interface, interface_note_);
      rma_offered_ = (info_->caps & FI_RMA) != 0;
      ordered_ = ordered;
      // FI_HMEM is only reported: the daemon stages device data through host memory for now.
      hints->caps |= FI_HMEM;
      FiInfoPtr hmem = get_info(hints.get());
      for (const fi_info* i = hmem.get(); i != nullptr; i = i->next) {
        const char* a = i->domain_attr->name;
        const char* b = info_->domain_attr->name;
        if (a != nullptr && b != nullptr && std::strcmp(a, b) == 0) hmem_offered_ = true;
      }
      return;
    }
  }
  explain_no_info(config.provider);
}

void FabricTransport::open_objects() {
  check(fi_fabric(info_->fabric_attr, fabric_.out(), nullptr), "fi_fabric");
  check(fi_domain(fabric_.get(), info_.get(), domain_.out(), nullptr), "fi_domain");

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.wait_obj = FI_WAIT_NONE;  // the progress loop polls
  cq_attr.size = info_->tx_attr->size + info_->rx_attr->size;
  check(fi_cq_open(domain_.get(), &cq_attr, cq_.out(), nullptr), "fi_cq_open");

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  check(fi_av_open(domain_.get(), &av_attr, av_.out(), nullptr), "fi_av_open");

  check(fi_endpoint(domain_.get(), info_.get(), ep_.out(), nullptr), "fi_endpoint");
  check(fi_ep_bind(ep_.get(), &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  check(fi_ep_bind(ep_.get(), &av_->fid, 0), "fi_ep_bind(av)");
  check(fi_enable(ep_.get()), "fi_enable");

  std::size_t len = 0;
  int ret = fi_getname(&ep_->fid, nullptr, &len);
  if (ret != -FI_ETOOSMALL && ret != 0) check(ret, "fi_getname");
  address_.resize(len);
  check(fi_getname(&ep_->fid, address_.data(), &len), "fi_getname");
  address_.resize(len);
}

FabricTransport::~FabricTransport() {
  shutting_down_ = true;
  // Cancel posted receives and collect their completions so that no provider keeps a
  // pointer into a caller's buffer. Sends cannot be cancelled portably; closing the endpoint
  // drops them. Bounded: a provider that never reports a cancellation is not waited for.
  if (ep_) {
    std::size_t posted_recvs = recvs_.slots.size() - recvs_.free_slots.size();
    for (auto& slot : recvs_.slots) {
      if (slot.message != nullptr) fi_cancel(&ep_->fid, &slot);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (posted_recvs > 0 && std::chrono::steady_clock::now() < deadline) {
      progress();
      posted_recvs = recvs_.slots.size() - recvs_.free_slots.size();
    }
  }
  ep_.reset();
  av_.reset();
  // Per-message registrations go before the domain closes.
  messages_.clear();
  abandoned_.clear();
}

int FabricTransport::add_peer(const std::vector<std::uint8_t>& address) {
  if (address.empty()) throw std::invalid_argument("transport: empty peer address");
  fi_addr_t addr = FI_ADDR_UNSPEC;
  int inserted = fi_av_insert(av_.get(), address.data(), 1, &addr, 0, nullptr);
  if (inserted != 1) {
    throw std::invalid_argument("transport: fi_av_insert rejected a peer address of " +
                                std::to_string(address.size()) + " bytes" +
                                (inserted < 0 ? ": " + fi_error(inserted) : std::string()));
  }
  peers_.push_back(addr);
  std::array<char, 256> name{};
  std::size_t len = name.size();
  fi_av_straddr(av_.get(), address.data(), name.data(), &len);
  peer_names_.emplace_back(name.data());
  return static_cast<int>(peers_.size() - 1);
}

std::string FabricTransport::peer_name(int peer) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= peer_names_.size()) return "?";
  return peer_names_[static_cast<std::size_t>(peer)];
}

bool FabricTransport::needs_registration() const {
  return (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
}

MemoryRegion FabricTransport::register_memory(void* base, std::size_t bytes) {
  // Registration is real when the provider needs it for local buffers (FI_MR_LOCAL) or
  // offers RMA (the key will address the region remotely); otherwise the region is a label.
  if (!needs_registration() && !rma_offered_) return MemoryRegion(base, bytes, nullptr);
  if (bytes == 0) return MemoryRegion(base, bytes, nullptr);
  std::uint64_t access = FI_SEND | FI_RECV;
  if (rma_offered_) access |= FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  const int mode = info_->domain_attr->mr_mode;
  std::uint64_t requested_key = (mode & FI_MR_PROV_KEY) ? 0 : next_mr_key_++;
  FidPtr<fid_mr> mr;
  int ret = fi_mr_reg(domain_.get(), base, bytes, access, 0, requested_key, 0, mr.out(), nullptr);
  if (ret != 0) {
    throw std::runtime_error("transport: fi_mr_reg of " + std::to_string(bytes) + " bytes failed: " + fi_error(ret));
  }
  if (mode & FI_MR_ENDPOINT) {
    check(fi_mr_bind(mr.get(), &ep_->fid, 0), "fi_mr_bind");
    check(fi_mr_enable(mr.get()), "fi_mr_enable");
  }
  return MemoryRegion(base, bytes, std::make_unique<FabricMemoryHandle>(std::move(mr)));
}

void FabricTransport::send(int peer, std::uint64_t tag, const void* buf, std::size_t bytes,
                           const MemoryRegion* region, Completion done) {
  // The provider never writes through a send buffer; the cast only shares the Message type.
  submit(true, peer, tag, static_cast<std::uint8_t*>(const_cast<void*>(buf)), bytes, region, std::move(done));
}

void FabricTransport::recv(int peer, std::uint64_t tag, void* buf, std::size_t bytes,
                           const MemoryRegion* region, Completion done) {
  submit(false, peer, tag, static_cast<std::uint8_t*>(buf), bytes, region, std::move(done));
}

void FabricTransport::submit(bool is_send, int peer, std::uint64_t tag, std::uint8_t* buf,
                             std::size_t bytes, const MemoryRegion* region, Completion done) {
  const char* op = is_send ? "send" : "recv";
  if (peer < 0 || static_cast<std::size_t>(peer) >= peers_.size())
    throw std::invalid_argument(std::string("transport: ") + op + " to unknown peer " + std::to_string(peer));
  if (tag > kMaxTag)
    throw std::invalid_argument(std::string("transport: ") + op + " tag " + std::to_string(tag) + " exceeds " +
                                std::to_string(kTagBits) + " bits");
  if (buf == nullptr && bytes != 0) throw std::invalid_argument(std::string("transport: ") + op + " of a null buffer");
  if (region != nullptr && !region->contains(buf, bytes))
    throw std::invalid_argument(std::string("transport: ") + op + " buffer lies outside its memory region");

  Message& m = messages_.emplace_back();
  m.self = std::prev(messages_.end());
  m.is_send = is_send;
  m.peer = peer;
  m.tag = tag;
  m.buf = buf;
  m.bytes = bytes;
  m.done = std::move(done);
  if (op_timeout_.count() > 0) m.deadline = std::chrono::steady_clock::now() + op_timeout_;
  m.chunks = bytes == 0 ? 1 : 1 + (bytes - 1) / max_message_;  // no overflow at max_message_ = SIZE_MAX
  if (region != nullptr) {
    m.descriptor = region->descriptor();
  } else if (needs_registration() && bytes != 0) {
    m.own_region = register_memory(buf, bytes);
    m.descriptor = m.own_region.descriptor();
  }
  Direction& dir = is_send ? sends_ : recvs_;
  m.queued = true;
  dir.queue.push_back(&m);
  post_queued(dir);  // post at once when slots are free: saves a progress() round for latency
}

std::size_t FabricTransport::chunk_bytes(const Message& m, std::size_t chunk) const {
  std::size_t offset = chunk * max_message_;
  return std::min(max_message_, m.bytes - std::min(offset, m.bytes));
}

void FabricTransport::post_queued(Direction& dir) {
  while (!dir.queue.empty() && !dir.free_slots.empty()) {
    Message& m = *dir.queue.front();
    Slot* slot = dir.free_slots.back();
    const std::size_t chunk = m.next_chunk;
    std::uint8_t* data = m.buf == nullptr ? nullptr : m.buf + chunk * max_message_;
    const std::size_t len = chunk_bytes(m, chunk);
    const std::uint64_t wire_tag = m.tag | ((chunk & kChunkMask) << kChunkShift);
    const fi_addr_t addr = peers_[static_cast<std::size_t>(m.peer)];
    slot->message = &m;
    slot->chunk = chunk;
    ssize_t ret = m.is_send ? fi_tsend(ep_.get(), data, len, m.descriptor, addr, wire_tag, slot)
                            : fi_trecv(ep_.get(), data, len, m.descriptor, addr, wire_tag, 0, slot);
    if (ret == -FI_EAGAIN) {
      slot->message = nullptr;
      return;  // the provider's queue is full: progress() retries after draining the CQ
    }
    if (ret != 0) {
      slot->message = nullptr;
      fail(m, Status::failure(describe_op(m, chunk) + ": posting failed: " + fi_error(static_cast<int>(ret))));
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
  out << (m.is_send ? "send to" : "recv from") << " peer " << m.peer << " (" << peer_name(m.peer) << ") tag "
      << m.tag << " (" << m.bytes << " bytes";
  if (m.chunks > 1 && chunk < m.chunks) out << ", chunk " << chunk + 1 << "/" << m.chunks;
  out << ")";
  return out.str();
}

void FabricTransport::fail(Message& m, const Status& status) {
  if (m.status.ok) m.status = status;  // the first error explains best
  if (m.queued) {
    // Chunks not yet posted are dropped: the message has already failed.
    Direction& dir = m.is_send ? sends_ : recvs_;
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
  Direction& dir = m.is_send ? sends_ : recvs_;
  for (Slot& slot : dir.slots) {
    if (slot.message == &m) fi_cancel(&ep_->fid, &slot);
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
  Direction& dir = m.is_send ? sends_ : recvs_;
  dir.free_slots.push_back(slot);
  ++m.completed;
  if (!status.ok) {
    fail(m, status);
  } else if (!m.is_send && received_len != chunk_bytes(m, chunk)) {
    fail(m, Status::failure(describe_op(m, chunk) + ": peer sent " + std::to_string(received_len) +
                            " bytes, expected " + std::to_string(chunk_bytes(m, chunk))));
  }
  maybe_finish(m);
}

std::size_t FabricTransport::progress() {
  std::size_t handled = 0;
  std::array<fi_cq_tagged_entry, 32> entries{};
  for (;;) {
    ssize_t n = fi_cq_read(cq_.get(), entries.data(), entries.size());
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
      if (fi_cq_readerr(cq_.get(), &err, 0) != 1) break;
      ++handled;
      auto* slot = static_cast<Slot*>(err.op_context);
      if (slot == nullptr || slot->message == nullptr) continue;  // not ours: nothing to complete
      std::array<char, 256> prov{};
      const char* prov_text = fi_cq_strerror(cq_.get(), err.prov_errno, err.err_data, prov.data(), prov.size());
      std::string reason = fi_error(err.err);
      if (err.err == FI_ETRUNC) reason += " (peer sent more bytes than posted)";
      if (err.err == FI_ECANCELED) reason = "cancelled";
      std::string text = describe_op(*slot->message, slot->chunk) + " failed: " + reason;
      if (err.prov_errno != 0) {
        text += " (provider errno " + std::to_string(err.prov_errno) + ": " + (prov_text ? prov_text : "?") + ")";
      }
      on_chunk_done(slot, Status::failure(std::move(text)), 0);
      continue;
    }
    if (n != -FI_EAGAIN) spdlog::warn("transport: fi_cq_read: {}", fi_error(static_cast<int>(n)));
    break;
  }
  if (!shutting_down_) {
    if (op_timeout_.count() > 0) expire_timed_out();
    post_queued(sends_);
    post_queued(recvs_);
  }
  return handled;
}

std::string FabricTransport::describe() const {
  std::ostringstream out;
  const int mr_mode = info_->domain_attr->mr_mode;
  out << "libfabric " << FI_MAJOR(fi_version()) << "." << FI_MINOR(fi_version()) << " provider '"
      << info_->fabric_attr->prov_name << "' fabric '" << info_->fabric_attr->name << "' domain '"
      << info_->domain_attr->name << "' address ";
  std::array<char, 256> name{};
  std::size_t len = name.size();
  fi_av_straddr(av_.get(), address_.data(), name.data(), &len);
  out << name.data() << "; caps " << to_string_caps(info_->caps) << "; mr_mode ["
      << to_string_mr_mode(mr_mode) << "]; max_msg_size " << info_->ep_attr->max_msg_size << " (chunks of "
      << max_message_ << "); inject " << info_->tx_attr->inject_size << "; queues tx " << info_->tx_attr->size
      << " rx " << info_->rx_attr->size << "; in flight: " << sends_.slots.size() << " sends, "
      << recvs_.slots.size() << " receives; FI_RMA " << (rma_offered_ ? "offered" : "not offered") << "; FI_HMEM "
      << (hmem_offered_ ? "offered" : "not offered") << "; send-after-send order "
      << (ordered_ ? "yes" : "no (same-tag messages may match out of order)");
  if (!interface_note_.empty()) out << "; " << interface_note_;
  return out.str();
}

}  // namespace smddp::daemon::transport
