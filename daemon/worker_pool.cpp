#include "daemon/worker_pool.hpp"

namespace smddp::daemon {

WorkerPool::WorkerPool(int parallelism) {
  for (int i = 1; i < parallelism; ++i) threads_.emplace_back([this] { worker(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::drain(const std::function<void(int)>* fn, int tasks) {
  if (fn == nullptr) return;
  for (int i = next_.fetch_add(1); i < tasks; i = next_.fetch_add(1)) (*fn)(i);
}

void WorkerPool::worker() {
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* fn = nullptr;
    int tasks = 0;
    {
      std::unique_lock lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;  // snapshot under the lock: a late waker may see the next call's loop
      tasks = tasks_;
      ++busy_;
    }
    drain(fn, tasks);
    {
      std::lock_guard lk(mu_);
      --busy_;
    }
    done_cv_.notify_one();
  }
}

void WorkerPool::parallel_for(int tasks, const std::function<void(int)>& fn) {
  if (tasks <= 0) return;
  if (tasks == 1 || threads_.empty()) {
    for (int i = 0; i < tasks; ++i) fn(i);
    return;
  }
  {
    std::lock_guard lk(mu_);
    fn_ = &fn;
    tasks_ = tasks;
    next_.store(0);
    ++generation_;
  }
  start_cv_.notify_all();
  drain(&fn, tasks);
  std::unique_lock lk(mu_);
  // Workers that woke late find no task left; wait only for those still running one.
  done_cv_.wait(lk, [&] { return busy_ == 0; });
  fn_ = nullptr;
}

void WorkerPool::parallel_for(int tasks, std::uint64_t bytes, const std::function<void(int)>& fn) {
  if (bytes < kInlineBytes) {
    for (int i = 0; i < tasks; ++i) fn(i);
    return;
  }
  parallel_for(tasks, fn);
}

}  // namespace smddp::daemon
