#include "daemon/transport/fault_injection.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <deque>
#include <stdexcept>
#include <utility>
#include <vector>

namespace smddp::daemon::transport {

namespace {

using Clock = std::chrono::steady_clock;

class FaultInjectingTransport final : public Transport {
 public:
  FaultInjectingTransport(std::unique_ptr<Transport> inner, FaultPlan plan)
      : inner_(std::move(inner)), plan_(std::move(plan)) {
    if (plan_.kind == FaultPlan::Kind::None) throw std::invalid_argument("fault injection without a fault");
  }
  // Held and delayed callbacks are dropped unrun, as the interface promises; inner_ cancels its own.
  ~FaultInjectingTransport() override = default;

  int endpoints() const override { return inner_->endpoints(); }
  std::vector<std::vector<std::uint8_t>> local_addresses() const override { return inner_->local_addresses(); }
  int add_peer(const std::vector<std::vector<std::uint8_t>>& addresses) override {
    const int p = inner_->add_peer(addresses);
    peers_ = std::max(peers_, p + 1);
    return p;
  }
  int peer_endpoints(int peer) const override { return inner_->peer_endpoints(peer); }
  MemoryRegion register_memory(void* base, std::size_t bytes) override { return inner_->register_memory(base, bytes); }
  bool needs_registration() const override { return inner_->needs_registration(); }

  void send(int peer, Rail rail, std::uint64_t tag, const void* buf, std::size_t bytes, const MemoryRegion* region,
            Completion done) override {
    if (silent(peer)) return hold(peer, std::move(done), Status::success());
    inner_->send(peer, rail, tag, buf, bytes, region, wrap(peer, std::move(done)));
  }
  void recv(int peer, Rail rail, std::uint64_t tag, void* buf, std::size_t bytes, const MemoryRegion* region,
            Completion done) override {
    if (silent(peer)) return hold(peer, std::move(done), Status::success());
    inner_->recv(peer, rail, tag, buf, bytes, region, wrap(peer, std::move(done)));
  }

  void fail_peer(int peer, const std::string& reason) override {
    failing_ = peer;  // the inner transport's callbacks for it pass straight through
    inner_->fail_peer(peer, reason);
    failing_ = -1;
    std::vector<Completion> fail;
    for (auto* queue : {&held_, &delayed_}) {
      for (auto it = queue->begin(); it != queue->end();) {
        if (it->peer == peer) {
          fail.push_back(std::move(it->done));
          it = queue->erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& done : fail) done(Status::failure("message with peer " + std::to_string(peer) + " failed: " + reason));
  }

  std::size_t progress() override {
    started();
    std::size_t n = inner_->progress();
    const auto now = Clock::now();
    while (!delayed_.empty() && delayed_.front().due <= now) {
      auto d = std::move(delayed_.front());
      delayed_.pop_front();
      d.done(std::move(d.status));
      ++n;
    }
    return n;
  }
  std::size_t pending() const override { return inner_->pending() + held_.size() + delayed_.size(); }
  std::string describe() const override { return inner_->describe() + "; fault injection: " + plan_.describe(); }
  std::vector<EndpointInfo> endpoint_info() const override { return inner_->endpoint_info(); }

 private:
  struct Held {
    int peer;
    Completion done;
    Status status;
    Clock::time_point due{};
  };

  // Whether the fault has started: the trigger file is looked for at most every 20 ms.
  bool started() {
    if (started_) return true;
    const auto now = Clock::now();
    if (!plan_.trigger.empty()) {
      if (now - last_look_ < std::chrono::milliseconds(20)) return false;
      last_look_ = now;
      if (::access(plan_.trigger.c_str(), F_OK) != 0) return false;
    }
    started_ = true;
    spdlog::warn("fault injection: {} starts now", plan_.describe());
    return true;
  }
  bool silent(int peer) {
    if (peer < 0 || peer >= peers_) throw std::invalid_argument("no fabric peer " + std::to_string(peer));
    return plan_.kind == FaultPlan::Kind::Silence && started();
  }
  void hold(int peer, Completion done, Status status) { held_.push_back({peer, std::move(done), std::move(status)}); }

  Completion wrap(int peer, Completion done) {
    return [this, peer, done = std::move(done)](Status st) mutable {
      if (failing_ == peer || !started()) return done(std::move(st));
      if (plan_.kind == FaultPlan::Kind::Silence) return hold(peer, std::move(done), std::move(st));
      delayed_.push_back({peer, std::move(done), std::move(st), Clock::now() + plan_.delay});
    };
  }

  std::unique_ptr<Transport> inner_;
  FaultPlan plan_;
  int peers_ = 0;
  int failing_ = -1;
  bool started_ = false;
  Clock::time_point last_look_{};
  std::deque<Held> held_;     // silence: messages that will never complete
  std::deque<Held> delayed_;  // delay: completions waiting for their time, in order
};

}  // namespace

std::unique_ptr<Transport> make_fault_injecting_transport(std::unique_ptr<Transport> inner, FaultPlan plan) {
  return std::make_unique<FaultInjectingTransport>(std::move(inner), std::move(plan));
}

}  // namespace smddp::daemon::transport
