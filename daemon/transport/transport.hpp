// The daemon's inter-node transport: tagged, non-blocking point-to-point messages between
// daemons. The hierarchical algorithms (reduce-scatter / all-gather among node leaders) are
// written against this interface only; FabricTransport (fabric_transport.hpp) implements it
// over libfabric reliable-datagram endpoints.
//
// Endpoints ("rails"): a transport owns one or more endpoints (one per fabric device on efa:
// p4d has 4, p5 32; several on one interface for tcp and shm). Every message names the
// endpoint it leaves or arrives on here and the peer's endpoint at the other end (a Rail);
// both sides must name the same pair. Peers may own a different number of endpoints.
//
// Threading: a Transport is single-threaded. Every call, including progress(), comes from the
// daemon's progress loop thread; there are no internal threads. progress() reads every
// endpoint's completion queue in turn. Completion callbacks run inside progress() (never
// inside send()/recv()) and may post further operations.
//
// Failures: a failed message's callback gets a Status naming the operation, the peer, its
// address, the tag and the provider's reason. After a failure by timeout or fail_peer() the
// provider may still hold a posted chunk of the buffer (sends cannot be cancelled portably):
// keep such buffers alive until the transport is destroyed.
//
// Matching: a receive matches a send from the given peer over the same rail (the receive's
// local endpoint is the send's remote one and vice versa) with the same tag and the same size.
// Messages with the same (peer, rail, tag) match in the order they were posted; messages on
// different rails are not ordered with each other. Both sides must
// agree on the size: a size mismatch completes the receive with an error. Never let a message
// meet a shorter receive: tcp;ofi_rxm (libfabric 1.17) truncates it and then loses the pair's
// later messages. Where the sizes are not agreed first, put the size in the tag.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace smddp::daemon::transport {

struct TransportConfig {
  // libfabric provider name as fi_info prints it ("tcp;ofi_rxm", "shm", "efa").
  std::string provider = "tcp;ofi_rxm";
  // For providers that bind to a network interface (tcp, sockets, udp, verbs): the domain
  // (interface) to use. Ignored by providers without interfaces (shm, efa picks its device).
  std::string interface = "lo";
  // Sends (message chunks) posted to the provider at once, per endpoint; more are queued in order.
  std::size_t max_inflight = 64;
  // Receives (message chunks) posted at once, per endpoint; 0: the provider's receive queue size. Kept
  // large on purpose: bounding receives as tightly as sends can deadlock two peers whose
  // in-flight sends wait for receives that are still queued.
  std::size_t max_posted_receives = 0;
  // Endpoints to open (1..kMaxEndpoints). Providers with one domain per device (efa) open
  // each on a device of its own, in the order fi_getinfo lists them; tcp and shm open them
  // all on the one domain (interface).
  int endpoints = 1;
  // Largest single provider message; larger messages are split. 0: the provider's maximum.
  std::size_t max_message = 0;
  // A message not complete this long after it was posted fails, naming its peer. 0: never
  // (the daemon's collective timeout decides). Needed because some providers never report an
  // absent peer: ofi_rxm retries connecting for ever.
  std::chrono::milliseconds op_timeout{0};
};

struct Status {
  bool ok = true;
  std::string error;  // names the operation, the peer, the tag and the provider's reason

  static Status success() { return {}; }
  static Status failure(std::string what) { return {false, std::move(what)}; }
};

// A registered range of host memory, usable on every endpoint of the transport that made it
// (with one domain per device it is registered in each). Move-only; unregisters when
// destroyed. It must outlive every operation that uses it.
class MemoryRegion {
 public:
  // What a concrete transport keeps per registration (the fid_mrs for FabricTransport).
  class Handle {
   public:
    virtual ~Handle() = default;
    // fi_mr_desc for use on `endpoint`, or nullptr when not needed.
    virtual void* descriptor(int endpoint) const = 0;
    // Remote key on `endpoint` for future RMA, 0 when none.
    virtual std::uint64_t key(int endpoint) const = 0;
  };

  MemoryRegion() = default;
  MemoryRegion(void* base, std::size_t bytes, std::unique_ptr<Handle> handle)
      : base_(static_cast<std::uint8_t*>(base)), bytes_(bytes), handle_(std::move(handle)) {}

  void* base() const { return base_; }
  std::size_t bytes() const { return bytes_; }
  void* descriptor(int endpoint = 0) const { return handle_ ? handle_->descriptor(endpoint) : nullptr; }
  std::uint64_t key(int endpoint = 0) const { return handle_ ? handle_->key(endpoint) : 0; }
  bool contains(const void* p, std::size_t n) const {
    auto* b = static_cast<const std::uint8_t*>(p);
    return b >= base_ && n <= bytes_ && static_cast<std::size_t>(b - base_) <= bytes_ - n;
  }

 private:
  std::uint8_t* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::unique_ptr<Handle> handle_;
};

using Completion = std::function<void(Status)>;

// The pair of endpoints a message travels between: `local` is this transport's endpoint,
// `remote` the peer's. The peer names the same pair the other way round.
struct Rail {
  int local = 0;
  int remote = 0;
  friend bool operator==(const Rail&, const Rail&) = default;
};

// One endpoint, for logs and the operator's status.
struct EndpointInfo {
  std::string provider;  // "tcp;ofi_rxm", "shm", "efa"
  std::string device;    // the domain: an interface ("lo"), "shm", an EFA device ("rdmap16s27-rdm")
  std::string pci;       // the device's PCI address ("0000:10:1c.0") where the provider says; else ""
  std::string address;   // printable endpoint name
  std::uint64_t bytes_sent = 0;      // message bytes that completed
  std::uint64_t bytes_received = 0;
};

class Transport {
 public:
  // User tags carry this many bits; the bits above are the transport's (chunk index).
  static constexpr int kTagBits = 48;
  static constexpr std::uint64_t kMaxTag = (std::uint64_t{1} << kTagBits) - 1;

  static constexpr int kMaxEndpoints = 64;

  // Destroying a transport with messages pending cancels them without running their
  // callbacks; once the destructor returns the provider no longer touches their buffers.
  virtual ~Transport() = default;

  // How many endpoints this transport owns (1..kMaxEndpoints).
  virtual int endpoints() const = 0;
  // Every endpoint's name in endpoint order, to exchange through the bootstrap (MPI allgather
  // or a Store).
  virtual std::vector<std::vector<std::uint8_t>> local_addresses() const = 0;
  // Inserts a peer by its endpoints' names (as its local_addresses() gave them; it may own
  // more or fewer endpoints than this transport); returns its peer index (0, 1, 2... in
  // insertion order). Throws std::invalid_argument for no names, more than kMaxEndpoints, or
  // a name the provider rejects.
  virtual int add_peer(const std::vector<std::vector<std::uint8_t>>& addresses) = 0;
  // How many endpoints peer `peer` owns.
  virtual int peer_endpoints(int peer) const = 0;
  // Registers [base, base+bytes) with the provider, for use on every endpoint. Passing the
  // region to send/recv avoids a per-operation registration on providers that need
  // registered buffers (FI_MR_LOCAL).
  virtual MemoryRegion register_memory(void* base, std::size_t bytes) = 0;
  // Whether the provider wants local buffers registered (FI_MR_LOCAL, as efa does): a buffer
  // passed without a region is then registered for that one message.
  virtual bool needs_registration() const { return false; }

  // Non-blocking tagged send/receive. `done` runs from progress() once the whole message has
  // completed (send: the buffer may be reused; recv: the data is in place) or failed. `region`
  // may be null; if given it must contain the buffer. Throws std::invalid_argument for a bad
  // peer index, a rail naming an endpoint either side lacks, a tag above kMaxTag or a buffer
  // outside `region`.
  virtual void send(int peer, Rail rail, std::uint64_t tag, const void* buf, std::size_t bytes,
                    const MemoryRegion* region, Completion done) = 0;
  virtual void recv(int peer, Rail rail, std::uint64_t tag, void* buf, std::size_t bytes,
                    const MemoryRegion* region, Completion done) = 0;

  // Fails every pending message to or from `peer`, on every rail, at once with `reason` (the
  // daemon's failure detector calls this when a node is gone). Their callbacks run before
  // this returns.
  virtual void fail_peer(int peer, const std::string& reason) = 0;

  // Drives the provider: reads one batch of completions, runs their callbacks, posts queued
  // operations. Returns the number of completion entries handled (0: nothing happened); the
  // caller calls again while it waits for more. One batch, not all: the operations whose
  // messages completed go on at once instead of after every other message has landed.
  virtual std::size_t progress() = 0;
  // Messages whose callback has not run yet.
  virtual std::size_t pending() const = 0;
  // One paragraph for logs: provider, fabric, domains, capabilities, limits.
  virtual std::string describe() const = 0;
  // Each endpoint's device, address and byte counts, in endpoint order.
  virtual std::vector<EndpointInfo> endpoint_info() const = 0;
};

// Opens config.endpoints RDM endpoints of the configured provider. Throws std::runtime_error
// naming what the provider lacks when it cannot serve (no such provider, no tagged messages,
// no directed receive, no domain on the configured interface, fewer devices than endpoints),
// std::invalid_argument for an endpoint count outside 1..kMaxEndpoints.
std::unique_ptr<Transport> make_fabric_transport(const TransportConfig& config);

}  // namespace smddp::daemon::transport
