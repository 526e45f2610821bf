// HierWork: the Work of a hierarchical GPU operation across nodes (client/gpu/hier_schedule.hpp).
// It joins the operation's two client operations: the rank-side request (kFlagHierarchical),
// whose plan enqueues the pre part, and the rail operation, a host operation whose copier moves
// the shard; and it ends once the tail is enqueued (after the rail operation, in plan order).
//
//   request done (plan)   -> the executor enqueues the plans received so far, this pre part
//                            among them (or, if the request failed, releases its marks)
//   rail operation done   -> the executor enqueues the tails that may go, in plan order
//   tail enqueued         -> done: the caller orders its stream after the copier's Out lane
//
// Threading: the steps run on whichever thread completes the client operations (a waiter or
// the client's progress thread), outside the client's lock; wait() drives the client, and the
// rail operations of the operations planned before this one, until the tail is enqueued.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/client.hpp"
#include "client/gpu/peer_executor.hpp"

namespace smddp::client::gpu {

class HierWork final : public Work, public std::enable_shared_from_this<HierWork> {
 public:
  // `request`: the rank-side request posted with `h` registered (LocalOp::hier); `rail`: its
  // rail operation, or null where this rank's shard is empty (nothing crosses the nodes).
  static std::shared_ptr<HierWork> start(std::shared_ptr<PeerExecutor> exec, std::shared_ptr<HierOp> h,
                                         std::uint64_t token, WorkPtr request, WorkPtr rail);

  bool test() override;
  void wait(std::chrono::milliseconds timeout) override;
  bool done() const override;
  Status status() const override;
  std::string error() const override;
  void on_complete(std::function<void()> cb) override;

 private:
  HierWork(std::shared_ptr<PeerExecutor> exec, std::shared_ptr<HierOp> h, std::uint64_t token, WorkPtr request,
           WorkPtr rail);
  void request_done();
  void rail_done();
  void tail_done();
  void finish_if_done();  // runs the callbacks once every part is over

  std::shared_ptr<PeerExecutor> exec_;
  std::shared_ptr<HierOp> h_;
  std::uint64_t token_;
  WorkPtr request_, rail_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool request_over_ = false, rail_over_ = false, tail_over_ = false, done_ = false;
  Status status_ = Status::Ok;
  std::string error_;
  std::string gpu_error_;  // enqueuing the plan failed
  std::vector<std::function<void()>> callbacks_;
};

}  // namespace smddp::client::gpu
