#pragma once

#include <cstddef>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "daemon/transport/transport.hpp"

namespace smddp::daemon::internode {

// Staging buffers for operations across nodes (what a node receives before it reduces or
// scatters it), kept for reuse. Fresh heap memory for every message made the fabric's copies
// into it fault in each page, and glibc handed large freed blocks straight back to the kernel:
// with the memory kept, 16-64 MiB allreduces across 2 simulated nodes ran 1.3-1.8x faster
// (docs/across-nodes.md, docs/performance.md).
//
// Buffers come in power-of-two sizes from 4 KiB, page-aligned. Where the provider wants local
// buffers registered (efa), each buffer is registered once, when it is made, instead of for
// every message. A Buffer returns its memory to the pool when it goes; the pool keeps returned
// memory up to `max_cached_bytes` and frees the rest. Buffers may outlive the pool (an operation
// kept alive by a transport callback): they then free their memory themselves. Their registrations must go
// before the transport's domain does: the transport runs (or drops) every callback, and so
// every operation's buffers, before it closes its domain.
class StagingPool {
 public:
  // Registers a new buffer with the fabric (throws when it cannot).
  using Registrar = std::function<transport::MemoryRegion(void*, std::size_t)>;
  // No registrar: the buffers are not registered.
  explicit StagingPool(std::size_t max_cached_bytes, Registrar registrar = {});
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&&) noexcept = default;
    Buffer& operator=(Buffer&& other) noexcept;
    ~Buffer();
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    std::byte* get() const noexcept { return block_ ? block_->data.get() : nullptr; }
    std::size_t capacity() const noexcept { return block_ ? block_->capacity : 0; }
    // The buffer's registration; null when the pool has no registrar or registering failed.
    const transport::MemoryRegion* region() const noexcept {
      return block_ && block_->registered ? &block_->region : nullptr;
    }

   private:
    friend class StagingPool;
    struct Free {
      void operator()(std::byte* p) const noexcept { std::free(p); }
    };
    struct Block {
      std::unique_ptr<std::byte, Free> data;
      std::size_t capacity = 0;
      transport::MemoryRegion region;  // declared after `data`: deregistered before it is freed
      bool registered = false;
    };
    struct Shared;
    Buffer(std::shared_ptr<Shared> pool, std::unique_ptr<Block> block) : pool_(std::move(pool)), block_(std::move(block)) {}
    void give_back() noexcept;
    std::shared_ptr<Shared> pool_;
    std::unique_ptr<Block> block_;
  };

  // A buffer of at least `bytes` (at least one byte). Throws std::bad_alloc.
  Buffer take(std::size_t bytes);

  // For tests and the operator: bytes held in returned buffers, buffers made so far, and how
  // many of those could not be registered (they go registered per message instead).
  std::size_t cached_bytes() const;
  std::size_t allocations() const;
  std::size_t registration_failures() const;

 private:
  std::shared_ptr<Buffer::Shared> shared_;
  Registrar registrar_;
};

}  // namespace smddp::daemon::internode
