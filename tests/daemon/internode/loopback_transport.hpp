// An in-process Transport for tests: transports of one LoopbackFabric deliver tagged messages
// to each other by memcpy inside the receiver's progress(). Each transport may own several
// endpoints; a message matches only a receive on the rail it was sent over. No libfabric, so
// the engine's tests also run in the sanitizer builds.
#pragma once

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "daemon/transport/transport.hpp"

namespace smddp::daemon::transport {

class LoopbackFabric : public std::enable_shared_from_this<LoopbackFabric> {
 public:
  struct Pending {
    int src, dst;            // transports
    int src_ep, dst_ep;      // their endpoints
    std::uint64_t tag;
    const void* sbuf = nullptr;
    void* rbuf = nullptr;
    std::size_t bytes;
    Completion done;
  };
  std::deque<Pending> sends;
  std::vector<std::deque<std::pair<Completion, Status>>> completions;  // by transport
  std::vector<std::deque<Pending>> recvs;                               // by transport
  // Bytes sent, by transport and endpoint: counted where a send is matched (in the receiver's
  // progress()), so kept here.
  std::vector<std::vector<std::uint64_t>> bytes_sent;
  std::vector<char> broken;  // by transport
  int add_transport(int endpoints) {
    completions.emplace_back();
    recvs.emplace_back();
    bytes_sent.emplace_back(static_cast<std::size_t>(endpoints), 0);
    broken.push_back(0);
    return static_cast<int>(completions.size()) - 1;
  }
  // As a node whose network fails (its process gone, its link down): from the transports' next
  // progress() on, its own messages fail and sends to it fail; receives from it wait, as they
  // do on a real fabric, until the engine gives up on the peer (fail_peer).
  void break_transport(int t) { broken.at(static_cast<std::size_t>(t)) = 1; }
};

class LoopbackTransport final : public Transport {
 public:
  explicit LoopbackTransport(std::shared_ptr<LoopbackFabric> f, int endpoints = 1)
      : f_(std::move(f)), me_(f_->add_transport(endpoints)), info_(static_cast<std::size_t>(endpoints)) {
    for (int e = 0; e < endpoints; ++e) {
      info_[static_cast<std::size_t>(e)].provider = "loopback";
      info_[static_cast<std::size_t>(e)].device = "loopback" + std::to_string(e);
      info_[static_cast<std::size_t>(e)].address = std::to_string(me_) + "." + std::to_string(e);
    }
  }
  // As a provider that wants local buffers registered (efa): registrations are counted, and so
  // are messages whose buffer came without a region (the fabric transport would register those
  // for the one message).
  struct Registrations {
    std::size_t made = 0;
    std::size_t messages_without_region = 0;
    std::size_t largest_without_region = 0;  // bytes
  };
  LoopbackTransport(std::shared_ptr<LoopbackFabric> f, std::shared_ptr<Registrations> counts, int endpoints = 1)
      : LoopbackTransport(std::move(f), endpoints) {
    counts_ = std::move(counts);
  }
  bool needs_registration() const override { return counts_ != nullptr; }
  int endpoints() const override { return static_cast<int>(info_.size()); }
  // Endpoint e's name: {transport, e}.
  std::vector<std::vector<std::uint8_t>> local_addresses() const override {
    std::vector<std::vector<std::uint8_t>> out;
    for (int e = 0; e < endpoints(); ++e) out.push_back({static_cast<std::uint8_t>(me_), static_cast<std::uint8_t>(e)});
    return out;
  }
  int add_peer(const std::vector<std::vector<std::uint8_t>>& a) override {
    if (a.empty()) throw std::invalid_argument("loopback: a peer with no endpoint addresses");
    for (std::size_t e = 0; e < a.size(); ++e)
      if (a[e].size() != 2 || a[e][1] != e) throw std::invalid_argument("loopback: a malformed endpoint address");
    peers_.push_back({a.front().at(0), static_cast<int>(a.size())});
    return static_cast<int>(peers_.size()) - 1;
  }
  int peer_endpoints(int peer) const override { return peers_.at(static_cast<std::size_t>(peer)).endpoints; }
  MemoryRegion register_memory(void* base, std::size_t bytes) override {
    if (counts_) ++counts_->made;
    return MemoryRegion(base, bytes, nullptr);
  }
  void send(int peer, Rail rail, std::uint64_t tag, const void* buf, std::size_t bytes, const MemoryRegion* region,
            Completion done) override {
    note(peer, rail, buf, bytes, region);
    f_->sends.push_back({me_, peers_.at(static_cast<std::size_t>(peer)).id, rail.local, rail.remote, tag, buf, nullptr,
                         bytes, std::move(done)});
  }
  void recv(int peer, Rail rail, std::uint64_t tag, void* buf, std::size_t bytes, const MemoryRegion* region,
            Completion done) override {
    note(peer, rail, buf, bytes, region);
    f_->recvs[static_cast<std::size_t>(me_)].push_back(
        {peers_.at(static_cast<std::size_t>(peer)).id, me_, rail.remote, rail.local, tag, nullptr, buf, bytes, std::move(done)});
  }
  // Fails this side's receives from the peer and sends to it, on every rail.
  void fail_peer(int peer, const std::string& reason) override {
    const int p = peers_.at(static_cast<std::size_t>(peer)).id;
    std::vector<Completion> victims;
    auto& rs = f_->recvs[static_cast<std::size_t>(me_)];
    for (auto it = rs.begin(); it != rs.end();) {
      if (it->src == p) {
        victims.push_back(std::move(it->done));
        it = rs.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = f_->sends.begin(); it != f_->sends.end();) {
      if (it->src == me_ && it->dst == p) {
        victims.push_back(std::move(it->done));
        it = f_->sends.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& done : victims) done(Status::failure(reason));
  }
  std::size_t progress() override {
    std::size_t n = 0;
    fail_broken();
    // Match sends addressed to us, in posting order, with our receives on the same rail, in
    // posting order.
    auto& rs = f_->recvs[static_cast<std::size_t>(me_)];
    for (auto s = f_->sends.begin(); s != f_->sends.end();) {
      if (s->dst != me_) {
        ++s;
        continue;
      }
      auto r = rs.begin();
      while (r != rs.end() && !(r->src == s->src && r->src_ep == s->src_ep && r->dst_ep == s->dst_ep && r->tag == s->tag)) ++r;
      if (r == rs.end()) {
        ++s;
        continue;
      }
      Status st;
      if (r->bytes != s->bytes) st = Status::failure("size mismatch");
      else if (s->bytes) std::memcpy(r->rbuf, s->sbuf, s->bytes);
      if (st.ok) {
        received(static_cast<std::size_t>(s->dst_ep), s->bytes);
        f_->bytes_sent[static_cast<std::size_t>(s->src)][static_cast<std::size_t>(s->src_ep)] += s->bytes;
      }
      f_->completions[static_cast<std::size_t>(s->src)].push_back({std::move(s->done), st});
      f_->completions[static_cast<std::size_t>(me_)].push_back({std::move(r->done), st});
      rs.erase(r);
      s = f_->sends.erase(s);
    }
    auto& mine = f_->completions[static_cast<std::size_t>(me_)];
    while (!mine.empty()) {
      auto [done, st] = std::move(mine.front());
      mine.pop_front();
      done(st);
      ++n;
    }
    return n;
  }
  std::size_t pending() const override { return 0; }
  std::string describe() const override { return "loopback (tests), " + std::to_string(endpoints()) + " endpoint(s)"; }
  std::vector<EndpointInfo> endpoint_info() const override {
    auto out = info_;
    for (std::size_t e = 0; e < out.size(); ++e) out[e].bytes_sent = f_->bytes_sent[static_cast<std::size_t>(me_)][e];
    return out;
  }

 private:
  struct Peer {
    int id;
    int endpoints;
  };
  void received(std::size_t endpoint, std::size_t bytes) { info_[endpoint].bytes_received += bytes; }
  bool broken(int t) const { return f_->broken[static_cast<std::size_t>(t)] != 0; }
  void fail_broken() {
    auto& mine = f_->completions[static_cast<std::size_t>(me_)];
    for (auto s = f_->sends.begin(); s != f_->sends.end();) {
      if (s->src == me_ && (broken(me_) || broken(s->dst))) {
        mine.push_back({std::move(s->done),
                        Status::failure("loopback transport " + std::to_string(broken(me_) ? me_ : s->dst) + " failed")});
        s = f_->sends.erase(s);
      } else {
        ++s;
      }
    }
    if (!broken(me_)) return;
    auto& rs = f_->recvs[static_cast<std::size_t>(me_)];
    for (auto& r : rs) mine.push_back({std::move(r.done), Status::failure("loopback transport " + std::to_string(me_) + " failed")});
    rs.clear();
  }
  void note(int peer, Rail rail, const void* buf, std::size_t bytes, const MemoryRegion* region) {
    if (rail.local < 0 || rail.local >= endpoints() || rail.remote < 0 || rail.remote >= peer_endpoints(peer))
      throw std::invalid_argument("loopback: a rail naming an endpoint either side lacks");
    if (region != nullptr && !region->contains(buf, bytes))
      throw std::invalid_argument("loopback: buffer lies outside its memory region");
    if (counts_ && region == nullptr && bytes != 0) {
      ++counts_->messages_without_region;
      counts_->largest_without_region = std::max(counts_->largest_without_region, bytes);
    }
  }
  std::shared_ptr<LoopbackFabric> f_;
  int me_;
  std::vector<Peer> peers_;
  std::vector<EndpointInfo> info_;
  std::shared_ptr<Registrations> counts_;
};

}  // namespace smddp::daemon::transport
