// CopyPool: a rank's large single-copy reads (client/host_fast.hpp) split over helper threads,
// where the node has cores to spare. One core copies about 10 GB/s, far less than a server's
// memory delivers, and the ranks of a GPU node leave most of its cores idle.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <utility>
#include <thread>
#include <vector>

#include "ipc/doorbell.hpp"

namespace smddp::client {

// Threads a rank copies with (itself included): ipc::copy_threads.
using ipc::copy_threads;
inline constexpr const char* kCopyThreadsEnv = "SMDDP_COPY_THREADS";
// The threads a rank copies with: `env` (the value of SMDDP_COPY_THREADS; null or empty: unset)
// when set, else copy_threads. Throws std::invalid_argument naming the variable unless it is a
// whole number from 1 to 8.
int copy_threads_from(const char* env, int local_ranks, int cores);

// One batch of parts at a time, the caller taking part 0 and whatever part no helper took yet.
// Helpers spin for `spin` after a batch before they sleep (as a waiting rank does, kSpin), so
// that the next collective's batch finds them awake: a sleeping thread's wake-up took tens of us
// in a VM, as long as a 256 KiB copy. Parts are taken from one atomic word (the batch's number,
// its parts, the next part), not under a lock; not Boost.Asio's thread_pool, whose fences
// ThreadSanitizer cannot follow.
class CopyPool {
 public:
  // threads >= 2: threads - 1 helpers, the caller is the other.
  explicit CopyPool(int threads, std::chrono::microseconds spin = std::chrono::microseconds(50));
  ~CopyPool();
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;

  int threads() const { return threads_; }
  // Runs part(0) .. part(parts - 1), part(0) on the calling thread, the others on whichever
  // thread (a helper, or the caller once done with its own) takes them first, and returns once
  // all of them did: more parts than threads balance a helper that wakes late. The first
  // exception of any part is rethrown here. At most kMaxParts parts.
  void run(int parts, const std::function<void(int)>& part);
  static constexpr int kMaxParts = 0xffff;

 private:
  void helper();
  // The next part of the batch that runs, taken: its index, or -1 when none is left.
  int take();
  void run_part(int j);

  const int threads_;
  const std::chrono::microseconds spin_;
  std::mutex run_mu_;  // one batch at a time
  // Bits 0-15: the next part; 16-31: the batch's parts; 32-63: the batch's number.
  std::atomic<std::uint64_t> batch_{0};
  std::atomic<int> unfinished_{0};                  // parts of the batch not yet run to the end
  const std::function<void(int)>* part_ = nullptr;  // the batch's parts, while one runs
  std::mutex error_mu_;
  std::exception_ptr first_;
  std::atomic<bool> stop_{false};
  ipc::Doorbell bell_;                  // where helpers sleep between bursts
  std::vector<std::jthread> helpers_;  // last: they start once the rest is there
};

// Memory copies of at least kSplitCopiesFrom bytes in all (reads from the fast cells or the
// arenas, a chunk staged into the arena) are cut into parts of kCopyPart, which the caller and
// the helpers take as they come: one core copies about 10 GB/s, and a helper that wakes late
// takes fewer parts.
inline constexpr std::uint64_t kSplitCopiesFrom = 256ull << 10;
inline constexpr std::uint64_t kCopyPart = 64ull << 10;
struct CopyJob {
  std::byte* dst;
  const std::byte* src;
  std::uint64_t bytes;
};
// Part j of `parts` of the elements [lo, hi), cut at whole 64-element runs (no cache line written
// by two threads): its [first, second), empty for a late part of a short range.
std::pair<std::uint64_t, std::uint64_t> element_part(std::uint64_t lo, std::uint64_t hi, int parts, int j);

// Cuts the bytes of `pieces` (each with a `bytes` member; `total` of them), laid end to end, into
// `parts` parts at multiples of `align` and runs them over `pool`: copy(piece, from, n) for the n
// bytes of a piece, from byte `from` of it, that fall in one part.
template <class Piece, class Copy>
void run_parts(CopyPool& pool, std::span<const Piece> pieces, std::uint64_t total, int parts, std::uint64_t align,
               Copy&& copy) {
  const auto n = static_cast<std::uint64_t>(parts);
  const auto cut = [&](int i) { return i >= parts ? total : total * static_cast<std::uint64_t>(i) / n / align * align; };
  pool.run(parts, [&](int j) {
    const std::uint64_t begin = cut(j), end = cut(j + 1);
    std::uint64_t at = 0;  // where the piece starts among all the bytes
    for (const Piece& p : pieces) {
      const std::uint64_t lo = std::max(begin, at), hi = std::min(end, at + p.bytes);
      if (lo < hi) copy(p, lo - at, hi - lo);
      at += p.bytes;
    }
  });
}

// Runs the jobs (none overlapping another's destination, no destination overlapping a source),
// over `pool` where there is one with helpers and they come to kSplitCopiesFrom, else one
// memcpy each on this thread.
void copy_split(CopyPool* pool, std::span<const CopyJob> jobs);

}  // namespace smddp::client
