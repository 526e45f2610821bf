#include "client/copy_pool.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace smddp::client {

int copy_threads_from(const char* env, int local_ranks, int cores) {
  if (!env || !*env) return copy_threads(local_ranks, cores);
  const std::string_view v(env);
  int n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc{} || end != v.data() + v.size() || n < 1 || n > 8)
    throw std::invalid_argument(std::string(kCopyThreadsEnv) + "=" + std::string(v) +
                                ": expected the threads a rank copies large host collectives with, 1 to 8 (1: none "
                                "beside the caller)");
  return n;
}

CopyPool::CopyPool(int threads) : threads_(std::max(1, threads)) {
  for (int j = 1; j < threads_; ++j) helpers_.emplace_back([this] { helper(); });
}

CopyPool::~CopyPool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  work_.notify_all();
  helpers_.clear();  // joins
}

void CopyPool::guarded(int j) {
  try {
    (*part_)(j);
  } catch (...) {
    std::lock_guard lk(mu_);
    if (!first_) first_ = std::current_exception();
  }
}

void CopyPool::helper() {
  std::unique_lock lk(mu_);
  for (;;) {
    work_.wait(lk, [&] { return stop_ || next_ < parts_; });
    if (stop_) return;
    const int j = next_++;
    ++running_;
    lk.unlock();
    guarded(j);
    lk.lock();
    if (--running_ == 0 && next_ >= parts_) done_.notify_one();
  }
}

void CopyPool::run(int parts, const std::function<void(int)>& part) {
  if (parts <= 0) return;
  std::lock_guard batch(run_mu_);
  {
    std::lock_guard lk(mu_);
    part_ = &part;
    first_ = nullptr;
    parts_ = parts;
    next_ = 1;  // part 0 is the caller's
  }
  if (parts > 1) work_.notify_all();
  guarded(0);
  std::unique_lock lk(mu_);
  // Parts no helper took yet are the caller's too: it never waits on a helper that is late.
  while (next_ < parts_) {
    const int j = next_++;
    lk.unlock();
    guarded(j);
    lk.lock();
  }
  done_.wait(lk, [&] { return running_ == 0; });
  parts_ = next_ = 0;
  part_ = nullptr;
  if (first_) std::rethrow_exception(std::exchange(first_, nullptr));
}

std::pair<std::uint64_t, std::uint64_t> element_part(std::uint64_t lo, std::uint64_t hi, int parts, int j) {
  const auto cut = [&](int i) {
    if (i >= parts) return hi;
    return std::min(hi, lo + (hi - lo) * static_cast<std::uint64_t>(i) / static_cast<std::uint64_t>(parts) / 64 * 64);
  };
  return {cut(j), cut(j + 1)};
}

void copy_split(CopyPool* pool, std::span<const CopyJob> jobs) {
  std::uint64_t total = 0;
  for (const CopyJob& j : jobs) total += j.bytes;
  if (!pool || pool->threads() < 2 || total < kSplitCopiesFrom) {
    for (const CopyJob& j : jobs)
      if (j.bytes) std::memcpy(j.dst, j.src, j.bytes);
    return;
  }
  const auto parts = static_cast<int>(std::min<std::uint64_t>(64, (total + kCopyPart - 1) / kCopyPart));
  pool->run(parts, [&](int p) {
    const std::uint64_t begin = total * static_cast<std::uint64_t>(p) / static_cast<std::uint64_t>(parts);
    const std::uint64_t end = total * static_cast<std::uint64_t>(p + 1) / static_cast<std::uint64_t>(parts);
    std::uint64_t at = 0;  // where the job starts among all the bytes
    for (const CopyJob& j : jobs) {
      const std::uint64_t lo = std::max(begin, at), hi = std::min(end, at + j.bytes);
      if (lo < hi) std::memcpy(j.dst + (lo - at), j.src + (lo - at), hi - lo);
      at += j.bytes;
    }
  });
}

}  // namespace smddp::client
