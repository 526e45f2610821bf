// FabricTransport: the Transport over one libfabric reliable-datagram (FI_EP_RDM) endpoint.
//
// Object chain as in aws-ofi-nccl: fabric → domain → {completion queue, address vector} →
// endpoint; peers are address-vector entries. Every fid is owned by a FidPtr and closed in
// reverse order of creation.
//
// Each message is cut into chunks of at most max_message bytes (one chunk for 0 bytes); chunk
// i travels as its own tagged message with tag = user tag | (i mod 2^16) << 48, so both sides
// split alike and no chunk can match another chunk's receive. Each chunk takes one slot while
// posted; sends and receives have separate slot pools (max_inflight and max_posted_receives).
// Operations beyond the pools, or refused by the provider with -FI_EAGAIN, wait in FIFO
// queues that progress() drains, so order per (peer, tag) is kept.
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

#include "daemon/transport/transport.hpp"

namespace smddp::daemon::transport {

// Owns one libfabric object (fid_fabric, fid_domain, fid_ep, fid_mr...) and fi_close()s it.
template <typename T>
class FidPtr {
 public:
  FidPtr() = default;
  explicit FidPtr(T* p) : p_(p) {}
  FidPtr(const FidPtr&) = delete;
  FidPtr& operator=(const FidPtr&) = delete;
  FidPtr(FidPtr&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  FidPtr& operator=(FidPtr&& other) noexcept {
    if (this != &other) reset(std::exchange(other.p_, nullptr));
    return *this;
  }
  ~FidPtr() { reset(); }

  void reset(T* p = nullptr) {
    if (p_ != nullptr) fi_close(&p_->fid);
    p_ = p;
  }
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  // For libfabric's out-parameters: fi_domain(fabric, info, fp.out(), nullptr).
  T** out() {
    reset();
    return &p_;
  }

 private:
  T* p_ = nullptr;
};

struct FiInfoDeleter {
  void operator()(fi_info* info) const { fi_freeinfo(info); }
};
using FiInfoPtr = std::unique_ptr<fi_info, FiInfoDeleter>;

class FabricTransport final : public Transport {
 public:
  explicit FabricTransport(const TransportConfig& config);
  ~FabricTransport() override;
  FabricTransport(const FabricTransport&) = delete;
  FabricTransport& operator=(const FabricTransport&) = delete;

  std::vector<std::uint8_t> local_address() const override { return address_; }
  int add_peer(const std::vector<std::uint8_t>& address) override;
  MemoryRegion register_memory(void* base, std::size_t bytes) override;
  bool needs_registration() const override;
  void send(int peer, std::uint64_t tag, const void* buf, std::size_t bytes,
            const MemoryRegion* region, Completion done) override;
  void recv(int peer, std::uint64_t tag, void* buf, std::size_t bytes,
            const MemoryRegion* region, Completion done) override;
  void fail_peer(int peer, const std::string& reason) override;
  std::size_t progress() override;
  std::size_t pending() const override { return messages_.size(); }
  std::string describe() const override;

  // Printable name of a peer's address ("fi_sockaddr_in://127.0.0.1:4242").
  std::string peer_name(int peer) const;
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

  void select_info(const TransportConfig& config);
  void open_objects();
  void submit(bool is_send, int peer, std::uint64_t tag, std::uint8_t* buf, std::size_t bytes,
              const MemoryRegion* region, Completion done);
  void post_queued(Direction& dir);
  void on_chunk_done(Slot* slot, const Status& status, std::size_t received_len);
  void fail(Message& message, const Status& status);
  void maybe_finish(Message& message);
  void abort(Message& message, const Status& status);
  void expire_timed_out();
  std::string describe_op(const Message& message, std::size_t chunk) const;
  std::size_t chunk_bytes(const Message& message, std::size_t chunk) const;

  FiInfoPtr info_;
  // Declared in creation order; destroyed (fi_close) in reverse.
  FidPtr<fid_fabric> fabric_;
  FidPtr<fid_domain> domain_;
  FidPtr<fid_cq> cq_;
  FidPtr<fid_av> av_;
  FidPtr<fid_ep> ep_;

  std::vector<std::uint8_t> address_;
  std::vector<fi_addr_t> peers_;
  std::vector<std::string> peer_names_;
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
  Direction sends_;
  Direction recvs_;
};

}  // namespace smddp::daemon::transport
