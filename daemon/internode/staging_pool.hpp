#pragma once

#include <cstddef>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace smddp::daemon::internode {

// Staging buffers for operations across nodes (what a node receives before it reduces or
// scatters it), kept for reuse. Fresh heap memory for every message made the fabric's copies
// into it fault in each page, and glibc handed large freed blocks straight back to the kernel:
// with the memory kept, 16-64 MiB allreduces across 2 simulated nodes ran 25-50% faster
// (README, across nodes).
//
// Buffers come in power-of-two sizes from 4 KiB, page-aligned. A lease returns its buffer when
// it goes; the pool keeps returned buffers up to `max_cached_bytes` and frees the rest. Leases
// may outlive the pool (an operation kept alive by a transport callback): they then free their
// buffer themselves.
class StagingPool {
 public:
  explicit StagingPool(std::size_t max_cached_bytes);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  class Lease {
   public:
    Lease() = default;
    Lease(Lease&&) noexcept = default;
    Lease& operator=(Lease&& other) noexcept;
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    std::byte* get() const noexcept { return block_.get(); }
    std::size_t capacity() const noexcept { return capacity_; }

   private:
    friend class StagingPool;
    struct Free {
      void operator()(std::byte* p) const noexcept { std::free(p); }
    };
    using Block = std::unique_ptr<std::byte, Free>;
    struct Shared;
    Lease(std::shared_ptr<Shared> pool, Block block, std::size_t capacity)
        : pool_(std::move(pool)), block_(std::move(block)), capacity_(capacity) {}
    void give_back() noexcept;
    std::shared_ptr<Shared> pool_;
    Block block_;
    std::size_t capacity_ = 0;
  };

  // A buffer of at least `bytes` (at least one byte). Throws std::bad_alloc.
  Lease take(std::size_t bytes);

  // For tests and the operator: bytes held in returned buffers, and buffers made so far.
  std::size_t cached_bytes() const;
  std::size_t allocations() const;

 private:
  std::shared_ptr<Lease::Shared> shared_;
};

}  // namespace smddp::daemon::internode
