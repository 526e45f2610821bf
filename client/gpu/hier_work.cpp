#include "client/gpu/hier_work.hpp"

#include <utility>

#include "client/gpu/hier_trace.hpp"

namespace smddp::client::gpu {

using Clock = std::chrono::steady_clock;

HierWork::HierWork(std::shared_ptr<PeerExecutor> exec, std::shared_ptr<HierOp> h, std::uint64_t token, WorkPtr request,
                   WorkPtr rail)
    : exec_(std::move(exec)), h_(std::move(h)), token_(token), request_(std::move(request)), rail_(std::move(rail)) {}

std::shared_ptr<HierWork> HierWork::start(std::shared_ptr<PeerExecutor> exec, std::shared_ptr<HierOp> h,
                                          std::uint64_t token, WorkPtr request, WorkPtr rail) {
  auto w = std::shared_ptr<HierWork>(new HierWork(std::move(exec), std::move(h), token, std::move(request), std::move(rail)));
  w->h_->rail = w->rail_;
  hier_trace("op %llu issued: %s, rail operation %s", static_cast<unsigned long long>(token),
             std::string(ipc::to_string(w->h_->op)).c_str(), w->rail_ ? "posted" : "none (empty shard)");
  // Weak: the executor keeps its callbacks until the tail, and nothing must keep the Work past
  // its end through them. The client operations' callbacks hold it until they ran.
  std::weak_ptr<HierWork> weak = w;
  w->exec_->hier_on_tail(w->h_, [weak] {
    if (auto self = weak.lock()) self->tail_done();
  });
  w->request_->on_complete([w] { w->request_done(); });
  if (w->rail_) w->rail_->on_complete([w] { w->rail_done(); });
  else w->rail_done();
  return w;
}

void HierWork::request_done() {
  hier_trace("op %llu request answered: %s", static_cast<unsigned long long>(token_),
             std::string(ipc::to_string(request_->status())).c_str());
  if (request_->status() == Status::Ok) {
    // The plan is in: enqueue it (and any earlier one) now, so the rail operation's copies,
    // which wait for its marks on the GPU, can go.
    try {
      exec_->drain();
    } catch (const std::exception& e) {
      std::lock_guard lk(mu_);
      if (gpu_error_.empty()) gpu_error_ = e.what();
    }
    if (auto why = exec_->take_error(token_)) {
      std::lock_guard lk(mu_);
      if (gpu_error_.empty()) gpu_error_ = *why;
    }
  } else {
    exec_->hier_abandon(h_);
  }
  {
    std::lock_guard lk(mu_);
    request_over_ = true;
  }
  finish_if_done();
}

void HierWork::rail_done() {
  hier_trace("op %llu rail operation ended: %s", static_cast<unsigned long long>(token_),
             rail_ ? std::string(ipc::to_string(rail_->status())).c_str() : "none");
  {
    std::lock_guard lk(mu_);
    rail_over_ = true;
  }
  exec_->hier_rail_done(h_);  // may enqueue this tail: tail_done() runs from here then
  finish_if_done();
}

void HierWork::tail_done() {
  {
    std::lock_guard lk(mu_);
    tail_over_ = true;
  }
  finish_if_done();
}

void HierWork::finish_if_done() {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lk(mu_);
    if (done_ || !request_over_ || !rail_over_ || !tail_over_) return;
    // The first failure of the parts, in their order: the request, the GPU work, the rail.
    if (request_->status() != Status::Ok) {
      status_ = request_->status();
      error_ = request_->error();
    } else if (!gpu_error_.empty() || !h_->error.empty()) {
      status_ = Status::Internal;
      error_ = "the GPU part of the hierarchical operation failed: " + (gpu_error_.empty() ? h_->error : gpu_error_);
    } else if (rail_ && rail_->status() != Status::Ok) {
      status_ = rail_->status();
      error_ = "its shard's operation across nodes failed: " + rail_->error();
    }
    done_ = true;
    callbacks.swap(callbacks_);
  }
  hier_trace("op %llu done: %s", static_cast<unsigned long long>(token_), error_.c_str());
  cv_.notify_all();
  for (auto& cb : callbacks) cb();
}

bool HierWork::test() {
  if (done()) return true;
  request_->test();
  if (rail_) rail_->test();
  return done();
}

void HierWork::wait(std::chrono::milliseconds timeout) {
  const auto until = timeout.count() > 0 ? Clock::now() + timeout : Clock::time_point::max();
  const auto left = [&] {
    if (until == Clock::time_point::max()) return std::chrono::milliseconds{0};  // the part's own timeout
    return std::max(std::chrono::milliseconds{1},
                    std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()));
  };
  const auto expired = [&] { return Clock::now() >= until; };
  for (const WorkPtr& part : {request_, rail_}) {
    if (!part) continue;
    try {
      part->wait(left());
    } catch (const Error& e) {
      // A failed part is reported below; a wait that ran out of time is this one's too.
      if (!part->done()) throw Error(Status::Timeout, e.what());
    }
  }
  if (!exec_->hier_wait_tail(h_, until))
    throw Error(Status::Timeout, "a hierarchical operation across nodes did not finish within " +
                                     std::to_string(timeout.count()) + " ms");
  std::unique_lock lk(mu_);
  // Its last callback may still be running on the thread that completed a part.
  while (!done_) {
    if (expired()) throw Error(Status::Timeout, "a hierarchical operation across nodes did not finish in time");
    cv_.wait_for(lk, std::chrono::milliseconds(20));
  }
  if (status_ != Status::Ok) throw Error(status_, error_);
}

bool HierWork::done() const {
  std::lock_guard lk(mu_);
  return done_;
}

Status HierWork::status() const {
  std::lock_guard lk(mu_);
  return status_;
}

std::string HierWork::error() const {
  std::lock_guard lk(mu_);
  return error_;
}

void HierWork::on_complete(std::function<void()> cb) {
  {
    std::lock_guard lk(mu_);
    if (!done_) {
      callbacks_.push_back(std::move(cb));
      return;
    }
  }
  cb();
}

}  // namespace smddp::client::gpu
