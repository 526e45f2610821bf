#include "ipc/doorbell.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <ctime>

namespace smddp::ipc {
namespace {
// Shared (not FUTEX_PRIVATE) futexes: the word lives in a segment mapped by several processes.
long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, val, ts, nullptr, 0);
}
}  // namespace

void Doorbell::ring() noexcept {
  seq_.fetch_add(1, std::memory_order_acq_rel);
  if (sleepers_.load(std::memory_order_seq_cst) != 0) futex(&seq_, FUTEX_WAKE, INT_MAX, nullptr);
}

void Doorbell::wait(std::uint32_t ticket, std::chrono::microseconds timeout) noexcept {
  wait(ticket, timeout, [] { return false; });
}

void Doorbell::sleep(std::uint32_t ticket, std::chrono::microseconds timeout) noexcept {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000000) * 1000);
  futex(&seq_, FUTEX_WAIT, ticket, &ts);
}

int usable_cores() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
}

bool yield_between_polls(int spinners) noexcept { return spinners > usable_cores(); }

int copy_threads(int local_ranks, int cores) noexcept {
  if (local_ranks < 1) return 1;
  const int spare = cores - local_ranks - 1;
  if (spare <= 0) return 1;
  return std::min(4, 1 + spare / local_ranks);
}

}  // namespace smddp::ipc
