// WorkerPool: a fixed set of threads that split one loop with the calling thread.
// parallel_for(n, fn) runs fn(0..n-1), returns when all are done. One caller at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace smddp::daemon {

class WorkerPool {
 public:
  explicit WorkerPool(int parallelism);  // threads in all, counting the caller
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int parallelism() const noexcept { return static_cast<int>(threads_.size()) + 1; }
  void parallel_for(int tasks, const std::function<void(int)>& fn);
  // As above for loops that move `bytes` in all: below kInlineBytes on the caller alone, since
  // waking the workers and waiting for them costs 10-20 us, about what moving that much takes.
  static constexpr std::uint64_t kInlineBytes = 128 << 10;
  void parallel_for(int tasks, std::uint64_t bytes, const std::function<void(int)>& fn);

 private:
  void worker();
  void drain(const std::function<void(int)>* fn, int tasks);

  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* fn_ = nullptr;
  int tasks_ = 0;
  std::atomic<int> next_{0};
  int busy_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace smddp::daemon
