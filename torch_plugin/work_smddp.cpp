#include "torch_plugin/work_smddp.hpp"

#include <ATen/core/jit_type.h>

#include <algorithm>

#include "torch_plugin/errors.hpp"

namespace smddp::torch_plugin {

WorkSMDDP::WorkSMDDP(int rank, c10d::OpType type, const char* op_name, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      op_name_(op_name),
      outputs_(std::move(outputs)),
      // Host path: no devices. The CUDA path will pass the output devices so the Future
      // records and waits on events (see reference/pytorch-c10d.md, Gotcha 2).
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

WorkSMDDP::~WorkSMDDP() = default;

void WorkSMDDP::release_resources() {
  // Nothing else holds this work any more (a weak reference cannot be locked now).
  outputs_.clear();
  keep_alive_.clear();
  epilogue_ = nullptr;
  future_.reset();
  ops_.clear();
  children_.clear();
  sync_children_.clear();
  staging_.clear();
  arena_copiers_.clear();
  fast_.reset();
  done_.reset();
}

void WorkSMDDP::add_op(client::WorkPtr op) {
  std::lock_guard lock(state_mutex_);
  ops_.push_back(std::move(op));
}

void WorkSMDDP::add_dependency(c10::intrusive_ptr<WorkSMDDP> child) {
  std::lock_guard lock(state_mutex_);
  children_.push_back(std::move(child));
}

void WorkSMDDP::keep_alive(at::Tensor t) { keep_alive_.push_back(std::move(t)); }

void WorkSMDDP::set_epilogue(std::function<void()> fn) { epilogue_ = std::move(fn); }

void WorkSMDDP::arm() {
  std::vector<client::WorkPtr> ops;
  std::vector<c10::intrusive_ptr<WorkSMDDP>> children;
  {
    std::lock_guard lock(state_mutex_);
    TORCH_INTERNAL_ASSERT(!armed_, "WorkSMDDP armed twice");
    armed_ = true;
    ops = ops_;
    children = children_;
    // A lone fast op: its kernel is enqueued, so its Future may complete at once, with the
    // events it records following the kernel (as ProcessGroupNCCL's). That happens when
    // somebody asks for it (getFuture): a plain synchronous call never pays for it.
    // finalize() then only reports failures.
    future_at_issue_ = stream_only_locked();
  }
  // One extra count held until every callback is registered, so completion cannot run while
  // we are still registering.
  pending_.store(static_cast<int>(ops.size() + children.size()) + 1);
  for (auto& op : ops) {
    // The callback owns a reference: a Work the caller dropped still completes its Future.
    op->on_complete([self = c10::intrusive_ptr<WorkSMDDP>::reclaim_copy(this)] { self->child_done(); });
  }
  for (auto& child : children) {
    child->when_finished([self = c10::intrusive_ptr<WorkSMDDP>::reclaim_copy(this)] { self->child_done(); });
  }
  child_done();
}

void WorkSMDDP::child_done() {
  if (pending_.fetch_sub(1) == 1) {
    finalize();
  }
}

void WorkSMDDP::finalize() {
  std::vector<client::WorkPtr> ops;
  std::vector<c10::intrusive_ptr<WorkSMDDP>> children;
  {
    std::lock_guard lock(state_mutex_);
    // Moving the client works out breaks the cycle work -> client op -> callback -> work.
    ops.swap(ops_);
    children.swap(children_);
  }
  std::exception_ptr error;
  for (const auto& op : ops) {
    if (op->status() != client::Status::Ok) {
      error = std::make_exception_ptr(from_client_error(op_name_, op->status(), op->error()));
      break;
    }
  }
  if (!error) {
    for (const auto& child : children) {
      if (!child->isSuccess()) {
        error = child->exception();
        break;
      }
    }
  }
  bool future_done = false;
  if (cuda_) {
    // GPU path: the daemon's events mark the device work done; the epilogue and the Future
    // run on a completion stream ordered after them.
    std::vector<gpu::CudaPath::DoneMark> daemon_events;
    for (const auto& op : ops) {
      daemon_events.push_back({op->daemon_event(), op->daemon_value()});
    }
    for (int idx : input_events_) {
      cuda_->release_event(idx);
    }
    input_events_.clear();
    // Rank-side execution: the plans arrived with the completions; enqueue this rank's GPU
    // work now (and that of any earlier plan), on the completion stream used below.
    std::vector<std::uint64_t> tokens;
    {
      std::lock_guard lock(state_mutex_);
      tokens.swap(exec_tokens_);
    }
    for (auto token : tokens) {
      // Even after an error: a plan that arrived must run (its barriers), or the other ranks
      // would wait for this one on their GPUs.
      cuda_->forget_rank_exec(token);
      try {
        if (auto why = cuda_->run_rank_exec(token); why && !error) {
          error = std::make_exception_ptr(SmddpException(ErrorKind::Internal, std::string("smddp ") + op_name_ +
                                                                                  ": the GPU work failed: " + *why));
        }
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error && !arena_copiers_.empty()) {
      // Copies out of the chunks that did finish may still run: the tensors' memory must not
      // go to a new owner before they end (the caller may drop them once it sees the
      // failure). As on success, a completion stream follows the copies and the tensors are
      // recorded on it; nothing here blocks.
      try {
        std::vector<at::Tensor> used = keep_alive_;
        used.insert(used.end(), outputs_.begin(), outputs_.end());
        cuda_->complete(cuda_device_, {}, used, [&] {
          for (const auto& copier : arena_copiers_) {
            gpu::CudaPath::after_arena_copies(*copier, cuda_device_);
          }
        }, nullptr);
      } catch (...) {
        // The failure already reported is the one the caller needs.
      }
    }
    if (!error && future_at_issue_) {
      future_done = true;  // nothing left to do on the GPU
    } else if (!error) {
      try {
        std::vector<at::Tensor> used = keep_alive_;
        used.insert(used.end(), outputs_.begin(), outputs_.end());
        std::shared_ptr<gpu::CudaPath::FastMark> fast;
        {
          std::lock_guard lock(state_mutex_);
          fast = fast_;
        }
        const auto on_gpu = [](const gpu::CudaPath::DoneMark& d) { return d.value > 0 || d.event >= 0; };
        if (arena_copiers_.size() == 1 && staging_.empty() && !fast && tokens.empty() &&
            std::none_of(daemon_events.begin(), daemon_events.end(), on_gpu)) {
          // Across nodes: the copier's Out lane is where the op ends.
          done_ = cuda_->complete_after_copies(cuda_device_, *arena_copiers_.front(), used, [&] {
            if (epilogue_) {
              epilogue_();
            }
            future_->markCompleted(c10::IValue(outputs_));
            future_done = true;
          });
        } else done_ = cuda_->complete(cuda_device_, daemon_events, used, [&] {
          for (const auto& [s, to] : staging_) {
            if (to.defined()) {
              gpu::CudaPath::copy_out(s, to);
            }
          }
          for (const auto& copier : arena_copiers_) {
            gpu::CudaPath::after_arena_copies(*copier, cuda_device_);
          }
          if (epilogue_) {
            epilogue_();
          }
          future_->markCompleted(c10::IValue(outputs_));
          future_done = true;
        }, fast);
      } catch (...) {
        error = std::current_exception();
      }
    }
    bool had_fast = false;
    {
      std::lock_guard lock(state_mutex_);
      had_fast = fast_ != nullptr;
    }
    if (error && had_fast) {
      // The members disagreed, one died or timed out: a kernel of this rank may wait for a
      // peer's flag that never comes. The path is off here from now on, which this rank's
      // next request tells the others.
      cuda_->release_fast();
    }
    for (auto& [s, to] : staging_) {
      cuda_->release_staging(s, done_);
    }
    staging_.clear();
    arena_copiers_.clear();
  } else if (!error && epilogue_) {
    try {
      epilogue_();
    } catch (...) {
      error = std::current_exception();
    }
  }
  epilogue_ = nullptr;
  keep_alive_.clear();
  sync_children_ = children;

  finish(error);
  bool fail_future = false;
  if (error && future_at_issue_) {
    std::lock_guard lock(state_mutex_);
    fail_future = !future_marked_;  // nobody asked for it yet: it reports the failure
    future_marked_ = true;
  }
  if (error) {
    if ((!future_done && !future_at_issue_) || fail_future) {
      future_->setError(error);
    }
  } else if (!future_done) {
    future_->markCompleted(c10::IValue(outputs_));
  }

  std::vector<std::function<void()>> listeners;
  {
    std::lock_guard lock(state_mutex_);
    finalized_ = true;
    if (!future_at_issue_) {
      fast_.reset();  // done_ follows it; its event goes back to the pool
    }
    // The caller may have seen success already: from wait() (which only ordered its stream)
    // or from the Future, completed when asked for. The next call reports the failure.
    const bool future_said_ok = future_at_issue_ && !fail_future;
    if (error && (waited_async_ || future_said_ok) && async_errors_) {
      async_errors_->note(error);
    }
    listeners.swap(listeners_);
  }
  for (auto& cb : listeners) {
    cb();
  }
}

bool WorkSMDDP::finalized() const {
  std::lock_guard lock(state_mutex_);
  return finalized_;
}

void WorkSMDDP::when_finished(std::function<void()> cb) {
  {
    std::lock_guard lock(state_mutex_);
    if (!finalized_) {
      listeners_.push_back(std::move(cb));
      return;
    }
  }
  cb();
}

bool WorkSMDDP::isCompleted() {
  std::vector<client::WorkPtr> ops;
  {
    std::lock_guard lock(state_mutex_);
    ops = ops_;
  }
  for (const auto& op : ops) {
    if (!op->done()) {
      op->test();  // progresses; never blocks
    }
  }
  std::lock_guard lock(mutex_);
  return completed_;
}

bool WorkSMDDP::isSuccess() const { return c10d::Work::isSuccess(); }

std::exception_ptr WorkSMDDP::exception() const { return c10d::Work::exception(); }

std::vector<at::Tensor> WorkSMDDP::result() { return outputs_; }

void WorkSMDDP::synchronize() {
  // Host path: the outputs are final once the work completed. GPU path: the caller's
  // current stream waits for the daemon's work (and our epilogue), as ProcessGroupNCCL's.
  std::shared_ptr<gpu::CudaPath::FastMark> fast;
  {
    std::lock_guard lock(state_mutex_);
    fast = fast_;  // a lone fast op keeps it; otherwise it is gone once done_ is set
  }
  if (fast) {
    gpu::CudaPath::block_current_stream(fast, cuda_device_);
  } else if (cuda_ && done_) {
    gpu::CudaPath::block_current_stream(done_, cuda_device_);
  }
  for (auto& child : sync_children_) {
    child->synchronize();
  }
}

void WorkSMDDP::set_cuda(std::shared_ptr<gpu::CudaPath> path, c10::Device device) {
  cuda_ = std::move(path);
  cuda_device_ = device;
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                     std::vector<c10::Device>{device});
}

void WorkSMDDP::add_staging(std::shared_ptr<gpu::CudaPath::Staging> s, at::Tensor copy_to) {
  std::lock_guard lock(state_mutex_);
  staging_.emplace_back(std::move(s), std::move(copy_to));
}

void WorkSMDDP::add_arena_copier(std::shared_ptr<client::StagingCopier> copier) {
  std::lock_guard lock(state_mutex_);
  arena_copiers_.push_back(std::move(copier));
}

void WorkSMDDP::add_exec_token(std::uint64_t token) {
  std::lock_guard lock(state_mutex_);
  exec_tokens_.push_back(token);
}

void WorkSMDDP::add_input_event(int index) {
  std::lock_guard lock(state_mutex_);
  input_events_.push_back(index);
}

void WorkSMDDP::set_fast(std::shared_ptr<gpu::CudaPath::FastMark> mark) {
  std::lock_guard lock(state_mutex_);
  fast_ = std::move(mark);
}

void WorkSMDDP::set_async_errors(std::shared_ptr<AsyncErrors> errors) { async_errors_ = std::move(errors); }

bool WorkSMDDP::stream_only_locked() const {
  return fast_ && ops_.size() == 1 && children_.empty() && !epilogue_ && staging_.empty() && arena_copiers_.empty();
}

bool WorkSMDDP::wait(std::chrono::milliseconds timeout) {
  std::vector<client::WorkPtr> ops;
  std::vector<c10::intrusive_ptr<WorkSMDDP>> children;
  {
    std::lock_guard lock(state_mutex_);
    if (!finalized_ && stream_only_locked()) {
      // The fast path's kernel is enqueued: order the caller's stream after it and return,
      // as ProcessGroupNCCL does; the daemon's check of the op reports any failure later.
      waited_async_ = true;
      auto fast = fast_;
      gpu::CudaPath::block_current_stream(fast, cuda_device_);
      return true;
    }
    ops = ops_;
    children = children_;
  }
  // Waiting on the client ops progresses them on this thread; failures are collected by
  // finalize(), so only a wait that ended before the op did is reported from here.
  for (const auto& op : ops) {
    try {
      op->wait(timeout);
    } catch (const client::Error& e) {
      if (!op->done()) {
        throw from_client_error(op_name_, e.status(), e.what());
      }
    }
  }
  for (const auto& child : children) {
    try {
      child->wait(timeout);
    } catch (...) {
      if (!child->isCompleted()) {
        throw;
      }
    }
  }
  std::unique_lock lock(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [this] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [this] { return completed_; })) {
    throw SmddpException(ErrorKind::Timeout, std::string("smddp ") + op_name_ + ": wait() gave up after " +
                                                 std::to_string(timeout.count()) + " ms; the operation is still running");
  }
  if (exception_) {
    std::rethrow_exception(exception_);
  }
  lock.unlock();
  synchronize();
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkSMDDP::getFuture() {
  std::shared_ptr<gpu::CudaPath::FastMark> fast;
  {
    std::lock_guard lock(state_mutex_);
    if (future_at_issue_ && !future_marked_) {
      future_marked_ = true;
      fast = fast_;
    }
  }
  if (fast) {
    gpu::CudaPath::on_stream_of(fast, cuda_device_, [this] { future_->markCompleted(c10::IValue(outputs_)); });
  }
  return future_;
}

}  // namespace smddp::torch_plugin
