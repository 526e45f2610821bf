#include "client/copy_pool.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
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

namespace {

constexpr std::uint64_t kPartBits = 0xffff;
int next_of(std::uint64_t w) { return static_cast<int>(w & kPartBits); }
int parts_of(std::uint64_t w) { return static_cast<int>((w >> 16) & kPartBits); }

}  // namespace

CopyPool::CopyPool(int threads, std::chrono::microseconds spin) : threads_(std::max(1, threads)), spin_(spin) {
  for (int j = 1; j < threads_; ++j) helpers_.emplace_back([this] { helper(); });
}

CopyPool::~CopyPool() {
  stop_.store(true, std::memory_order_release);
  bell_.ring();
  helpers_.clear();  // joins
}

int CopyPool::take() {
  auto w = batch_.load(std::memory_order_acquire);
  // A helper that looked at an earlier batch fails the exchange: a part is taken from the word
  // as it is, so never twice, and never one of a batch that ended.
  while (next_of(w) < parts_of(w))
    if (batch_.compare_exchange_weak(w, w + 1, std::memory_order_acquire, std::memory_order_acquire)) return next_of(w);
  return -1;
}

void CopyPool::run_part(int j) {
  try {
    (*part_)(j);
  } catch (...) {
    std::lock_guard lk(error_mu_);
    if (!first_) first_ = std::current_exception();
  }
  // Releases the part's writes (and its error) to the caller, which waits for none left.
  unfinished_.fetch_sub(1, std::memory_order_acq_rel);
}

void CopyPool::helper() {
  const auto work = [&] {
    const auto w = batch_.load(std::memory_order_acquire);
    return next_of(w) < parts_of(w) || stop_.load(std::memory_order_acquire);
  };
  for (;;) {
    if (!ipc::spin_for(work, spin_, false))
      while (!work()) bell_.wait(bell_.ticket(), std::chrono::seconds(1), work);
    if (stop_.load(std::memory_order_acquire)) return;
    for (int j; (j = take()) >= 0;) run_part(j);
  }
}

void CopyPool::run(int parts, const std::function<void(int)>& part) {
  if (parts <= 0) return;
  if (parts > kMaxParts)
    throw std::invalid_argument("CopyPool::run: " + std::to_string(parts) + " parts, at most " + std::to_string(kMaxParts));
  std::lock_guard batch(run_mu_);
  // The batch before ended with every part taken and run: no helper reads these meanwhile.
  part_ = &part;
  first_ = nullptr;
  unfinished_.store(parts, std::memory_order_relaxed);
  const std::uint64_t number = (batch_.load(std::memory_order_relaxed) >> 32) + 1;
  batch_.store(number << 32 | static_cast<std::uint64_t>(parts) << 16 | 1, std::memory_order_release);  // 0: the caller's
  if (parts > 1) {
    ipc::Doorbell::order_before_sleeper_checks();
    if (bell_.has_sleepers()) bell_.ring();
  }
  run_part(0);
  // Parts no helper took yet are the caller's too: it never waits on a helper that is late.
  for (int j; (j = take()) >= 0;) run_part(j);
  // What is left runs on helpers (a part: a copy of kCopyPart, or a share of a single copy).
  const auto finished = [&] { return unfinished_.load(std::memory_order_acquire) == 0; };
  if (!ipc::spin_for(finished, spin_, false))
    while (!finished()) std::this_thread::yield();
  part_ = nullptr;
  std::lock_guard lk(error_mu_);
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
  run_parts(*pool, jobs, total, parts, 1, [](const CopyJob& j, std::uint64_t from, std::uint64_t n) {
    std::memcpy(j.dst + from, j.src + from, n);
  });
}

}  // namespace smddp::client
