// An in-process Transport for tests: endpoints of one LoopbackFabric deliver tagged messages
// to each other by memcpy inside the receiver's progress(). No libfabric, so the engine's
// tests also run in the sanitizer builds.
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
    int src, dst;
    std::uint64_t tag;
    const void* sbuf = nullptr;
    void* rbuf = nullptr;
    std::size_t bytes;
    Completion done;
  };
  std::deque<Pending> sends;
  std::vector<std::deque<std::pair<Completion, Status>>> completions;  // by endpoint
  std::vector<std::deque<Pending>> recvs;                               // by endpoint
  std::vector<char> broken;                                             // by endpoint
  int add_endpoint() {
    completions.emplace_back();
    recvs.emplace_back();
    broken.push_back(0);
    return static_cast<int>(completions.size()) - 1;
  }
  // As a node whose network fails (its process gone, its link down): from the endpoints' next
  // progress() on, its own messages fail and sends to it fail; receives from it wait, as they
  // do on a real fabric, until the engine gives up on the peer (fail_peer).
  void break_endpoint(int e) { broken.at(static_cast<std::size_t>(e)) = 1; }
};

class LoopbackTransport final : public Transport {
 public:
  explicit LoopbackTransport(std::shared_ptr<LoopbackFabric> f) : f_(std::move(f)), me_(f_->add_endpoint()) {}
  // As a provider that wants local buffers registered (efa): registrations are counted, and so
  // are messages whose buffer came without a region (the fabric transport would register those
  // for the one message).
  struct Registrations {
    std::size_t made = 0;
    std::size_t messages_without_region = 0;
    std::size_t largest_without_region = 0;  // bytes
  };
  LoopbackTransport(std::shared_ptr<LoopbackFabric> f, std::shared_ptr<Registrations> counts)
      : LoopbackTransport(std::move(f)) {
    counts_ = std::move(counts);
  }
  bool needs_registration() const override { return counts_ != nullptr; }
  std::vector<std::uint8_t> local_address() const override { return {static_cast<std::uint8_t>(me_)}; }
  int add_peer(const std::vector<std::uint8_t>& a) override {
    peers_.push_back(a.at(0));
    return static_cast<int>(peers_.size()) - 1;
  }
  MemoryRegion register_memory(void* base, std::size_t bytes) override {
    if (counts_) ++counts_->made;
    return MemoryRegion(base, bytes, nullptr);
  }
  void send(int peer, std::uint64_t tag, const void* buf, std::size_t bytes, const MemoryRegion* region,
            Completion done) override {
    note(buf, bytes, region);
    f_->sends.push_back({me_, peers_.at(static_cast<std::size_t>(peer)), tag, buf, nullptr, bytes, std::move(done)});
  }
  void recv(int peer, std::uint64_t tag, void* buf, std::size_t bytes, const MemoryRegion* region,
            Completion done) override {
    note(buf, bytes, region);
    f_->recvs[static_cast<std::size_t>(me_)].push_back(
        {peers_.at(static_cast<std::size_t>(peer)), me_, tag, nullptr, buf, bytes, std::move(done)});
  }
  void fail_peer(int peer, const std::string& reason) override {
    const int p = peers_.at(static_cast<std::size_t>(peer));
    auto& rs = f_->recvs[static_cast<std::size_t>(me_)];
    for (auto it = rs.begin(); it != rs.end();) {
      if (it->src == p) {
        auto done = std::move(it->done);
        it = rs.erase(it);
        done(Status::failure(reason));
      } else {
        ++it;
      }
    }
  }
  std::size_t progress() override {
    std::size_t n = 0;
    fail_broken();
    // Match sends addressed to us, in posting order, with our receives, in posting order.
    auto& rs = f_->recvs[static_cast<std::size_t>(me_)];
    for (auto s = f_->sends.begin(); s != f_->sends.end();) {
      if (s->dst != me_) {
        ++s;
        continue;
      }
      auto r = rs.begin();
      while (r != rs.end() && !(r->src == s->src && r->tag == s->tag)) ++r;
      if (r == rs.end()) {
        ++s;
        continue;
      }
      Status st;
      if (r->bytes != s->bytes) st = Status::failure("size mismatch");
      else if (s->bytes) std::memcpy(r->rbuf, s->sbuf, s->bytes);
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
  std::string describe() const override { return "loopback (tests)"; }

 private:
  bool broken(int e) const { return f_->broken[static_cast<std::size_t>(e)] != 0; }
  void fail_broken() {
    auto& mine = f_->completions[static_cast<std::size_t>(me_)];
    for (auto s = f_->sends.begin(); s != f_->sends.end();) {
      if (s->src == me_ && (broken(me_) || broken(s->dst))) {
        mine.push_back({std::move(s->done), Status::failure("loopback endpoint " + std::to_string(broken(me_) ? me_ : s->dst) +
                                                            " failed")});
        s = f_->sends.erase(s);
      } else {
        ++s;
      }
    }
    if (!broken(me_)) return;
    auto& rs = f_->recvs[static_cast<std::size_t>(me_)];
    for (auto& r : rs) mine.push_back({std::move(r.done), Status::failure("loopback endpoint " + std::to_string(me_) + " failed")});
    rs.clear();
  }
  void note(const void* buf, std::size_t bytes, const MemoryRegion* region) {
    if (region != nullptr && !region->contains(buf, bytes))
      throw std::invalid_argument("loopback: buffer lies outside its memory region");
    if (counts_ && region == nullptr && bytes != 0) {
      ++counts_->messages_without_region;
      counts_->largest_without_region = std::max(counts_->largest_without_region, bytes);
    }
  }
  std::shared_ptr<LoopbackFabric> f_;
  int me_;
  std::vector<int> peers_;
  std::shared_ptr<Registrations> counts_;
};

}  // namespace smddp::daemon::transport
