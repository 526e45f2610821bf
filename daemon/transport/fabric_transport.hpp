// FabricTransport: the Transport over libfabric reliable-datagram (FI_EP_RDM) endpoints, one
// or more ("rails").
//
// Object chain as in aws-ofi-nccl: fabric → domain per device, then per endpoint → {completion
// queue, address vector} → endpoint; peers are address-vector entries. Every fid is owned by a
// FidPtr and closed in reverse order of creation. On efa each endpoint has a device (domain) of
// its own; tcp and shm open every endpoint on the one domain.
//
// Each message is cut into chunks of at most max_message bytes (one chunk for 0 bytes); chunk
// i travels as its own tagged message with tag = user tag | (i mod 2^16) << 48, so both sides
// split alike and no chunk can match another chunk's receive. Each chunk takes one slot of
// its endpoint while posted; sends and receives have separate slot pools per endpoint
// (max_inflight and max_posted_receives). Operations beyond the pools, or refused by the
// provider with -FI_EAGAIN, wait in per-endpoint FIFO queues that progress() drains, so order
// per (peer, rail, tag) is kept and a busy endpoint holds up no other.
//
// A peer's endpoint address is inserted into a local endpoint's address vector the first time
// a message uses that pair (p5: 32 x 32 pairs per peer, of which a job uses few); add_peer
// checks every address once by inserting it where the striped rails will use it.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "daemon/transport/fabric_info.hpp"
#include "daemon/transport/transport.hpp"

namespace smddp::daemon::transport {

class FabricTransport final : public Transport {
 public:
  explicit FabricTransport(const TransportConfig& config);
  ~FabricTransport() override;
  FabricTransport(const FabricTransport&) = delete;
  FabricTransport& operator=(const FabricTransport&) = delete;

  int endpoints() const override { return static_cast<int>(endpoints_.size()); }
  std::vector<std::vector<std::uint8_t>> local_addresses() const override;
  int add_peer(const std::vector<std::vector<std::uint8_t>>& addresses) override;
  int peer_endpoints(int peer) const override;
  MemoryRegion register_memory(void* base, std::size_t bytes) override;
  bool needs_registration() const override;
  void send(int peer, Rail rail, std::uint64_t tag, const void* buf, std::size_t bytes,
            const MemoryRegion* region, Completion done) override;
  void recv(int peer, Rail rail, std::uint64_t tag, void* buf, std::size_t bytes,
            const MemoryRegion* region, Completion done) override;
  void fail_peer(int peer, const std::string& reason) override;
  std::size_t progress() override;
  std::size_t pending() const override { return messages_.size(); }
  std::string describe() const override;
  std::vector<EndpointInfo> endpoint_info() const override;

  // Printable name of a peer's endpoint ("fi_sockaddr_in://127.0.0.1:4242").
  std::string peer_name(int peer, int endpoint = 0) const;
  std::size_t max_message() const { return max_message_; }

 private:
  struct Message;
  // One posted chunk. Standard layout with the fi_context2 first: the provider may use the
  // context memory (FI_CONTEXT2 mode), and a completion's op_context converts back to it.
  struct Slot {
    fi_context2 context;
    Message* message;
    std::size_t chunk;
  };
  struct Message {
    bool is_send = false;
    int peer = 0;
    Rail rail;
    fi_addr_t address = FI_ADDR_UNSPEC;  // the peer's endpoint in the local endpoint's vector
    std::uint64_t tag = 0;
    std::uint8_t* buf = nullptr;
    std::size_t bytes = 0;
    void* descriptor = nullptr;
    MemoryRegion own_region;  // per-message registration when the provider needs one
    Completion done;
    std::size_t chunks = 1;
    std::size_t next_chunk = 0;  // next chunk to post
    std::size_t posted = 0;
    std::size_t completed = 0;
    bool queued = false;     // still in its direction's queue
    bool abandoned = false;  // failed and reported; waits only for the provider's chunks
    std::chrono::steady_clock::time_point deadline;
    Status status;
    std::list<Message>::iterator self;
  };
  struct Direction {
    std::vector<Slot> slots;         // sized once: the addresses stay valid
    std::vector<Slot*> free_slots;
    std::deque<Message*> queue;      // messages with chunks still to post
  };
  // One fi_info the provider listed: its fabric and domain. Endpoints on it share them.
  struct Device {
    FiInfoPtr info;
    FidPtr<fid_fabric> fabric;
    FidPtr<fid_domain> domain;
  };
  struct Endpoint {
    int device = 0;
    // Declared in creation order; destroyed (fi_close) in reverse.
    FidPtr<fid_cq> cq;
    FidPtr<fid_av> av;
    FidPtr<fid_ep> ep;
    std::vector<std::uint8_t> address;
    Direction sends, recvs;
    std::uint64_t bytes_sent = 0, bytes_received = 0;
  };
  struct Peer {
    std::vector<std::vector<std::uint8_t>> addresses;  // by the peer's endpoint
    std::vector<std::string> names;
    // addr[local * addresses.size() + remote]: FI_ADDR_NOTAVAIL until first used.
    std::vector<fi_addr_t> addr;
  };

  void select_devices(const TransportConfig& config);
  void open_endpoint(Endpoint& e);
  const fi_info* info_of(const Endpoint& e) const { return devices_[static_cast<std::size_t>(e.device)].info.get(); }
  const fi_info* info() const { return devices_.front().info.get(); }
  // Why a peer's endpoint address would make fi_av_insert read past it; "" when it is sound.
  std::string address_fault(const std::vector<std::uint8_t>& address) const;
  // The peer endpoint's entry in the local endpoint's address vector, inserted on first use.
  fi_addr_t resolve(int peer, Rail rail);
  MemoryRegion register_on(void* base, std::size_t bytes, int only_endpoint);
  void submit(bool is_send, int peer, Rail rail, std::uint64_t tag, std::uint8_t* buf, std::size_t bytes,
              const MemoryRegion* region, Completion done);
  Direction& direction_of(const Message& m) {
    Endpoint& e = *endpoints_[static_cast<std::size_t>(m.rail.local)];
    return m.is_send ? e.sends : e.recvs;
  }
  void post_queued(Endpoint& e, Direction& dir);
  std::size_t drain(Endpoint& e);
  void on_chunk_done(Slot* slot, const Status& status, std::size_t received_len);
  void fail(Message& message, const Status& status);
  void maybe_finish(Message& message);
  void abort(Message& message, const Status& status);
  void expire_timed_out();
  std::string describe_op(const Message& message, std::size_t chunk) const;
  std::size_t chunk_bytes(const Message& message, std::size_t chunk) const;

  // Declared before the endpoints: domains close after every endpoint on them.
  std::vector<Device> devices_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;

  std::vector<Peer> peers_;
  std::size_t max_message_ = 0;
  bool rma_offered_ = false;
  bool hmem_offered_ = false;
  bool ordered_ = false;
  std::string interface_note_;
  std::uint64_t next_mr_key_ = 1;  // for providers without FI_MR_PROV_KEY
  bool shutting_down_ = false;

  std::chrono::milliseconds op_timeout_{0};
  std::list<Message> messages_;   // pending, in posting order (so deadlines ascend)
  std::list<Message> abandoned_;  // reported failed, chunks still with the provider
};

}  // namespace smddp::daemon::transport
