#include "daemon/internode/staging_pool.hpp"

#include <bit>
#include <new>

namespace smddp::daemon::internode {

namespace {
constexpr std::size_t kPage = 4096;
}  // namespace

struct StagingPool::Lease::Shared {
  std::mutex mu;
  bool open = true;  // false once the pool is gone: leases free their buffers themselves
  std::size_t max_cached = 0;
  std::size_t cached = 0;
  std::size_t allocations = 0;
  std::map<std::size_t, std::vector<Block>> free;  // by capacity
};

StagingPool::StagingPool(std::size_t max_cached_bytes) : shared_(std::make_shared<Lease::Shared>()) {
  shared_->max_cached = max_cached_bytes;
}

StagingPool::~StagingPool() {
  std::lock_guard lk(shared_->mu);
  shared_->open = false;
  shared_->free.clear();
  shared_->cached = 0;
}

StagingPool::Lease StagingPool::take(std::size_t bytes) {
  const std::size_t capacity = std::bit_ceil(std::max(bytes, kPage));
  {
    std::lock_guard lk(shared_->mu);
    auto it = shared_->free.find(capacity);
    if (it != shared_->free.end() && !it->second.empty()) {
      Lease::Block b = std::move(it->second.back());
      it->second.pop_back();
      shared_->cached -= capacity;
      return Lease(shared_, std::move(b), capacity);
    }
    ++shared_->allocations;
  }
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kPage, capacity));
  if (p == nullptr) throw std::bad_alloc();
  return Lease(shared_, Lease::Block(p), capacity);
}

std::size_t StagingPool::cached_bytes() const {
  std::lock_guard lk(shared_->mu);
  return shared_->cached;
}

std::size_t StagingPool::allocations() const {
  std::lock_guard lk(shared_->mu);
  return shared_->allocations;
}

void StagingPool::Lease::give_back() noexcept {
  if (!block_ || !pool_) return;
  {
    std::lock_guard lk(pool_->mu);
    if (pool_->open && pool_->cached + capacity_ <= pool_->max_cached) {
      try {
        pool_->free[capacity_].push_back(std::move(block_));
        pool_->cached += capacity_;
      } catch (const std::bad_alloc&) {
        // The list could not grow: the buffer is freed below instead.
      }
    }
  }
  block_.reset();
  pool_.reset();
}

StagingPool::Lease& StagingPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    give_back();
    pool_ = std::move(other.pool_);
    block_ = std::move(other.block_);
    capacity_ = other.capacity_;
  }
  return *this;
}

StagingPool::Lease::~Lease() { give_back(); }

}  // namespace smddp::daemon::internode
