#include "daemon/internode/staging_pool.hpp"

#include <bit>
#include <new>

#include <spdlog/spdlog.h>

namespace smddp::daemon::internode {

namespace {
constexpr std::size_t kPage = 4096;
}  // namespace

struct StagingPool::Buffer::Shared {
  std::mutex mu;
  bool open = true;  // false once the pool is gone: buffers free their memory themselves
  std::size_t max_cached = 0;
  std::size_t cached = 0;
  std::size_t allocations = 0;
  std::size_t registration_failures = 0;
  std::map<std::size_t, std::vector<std::unique_ptr<Block>>> free;  // by capacity
};

StagingPool::StagingPool(std::size_t max_cached_bytes, Registrar registrar)
    : shared_(std::make_shared<Buffer::Shared>()), registrar_(std::move(registrar)) {
  shared_->max_cached = max_cached_bytes;
}

StagingPool::~StagingPool() {
  std::vector<std::unique_ptr<Buffer::Block>> dropped;  // freed outside the lock
  std::lock_guard lk(shared_->mu);
  shared_->open = false;
  for (auto& [capacity, blocks] : shared_->free)
    for (auto& b : blocks) dropped.push_back(std::move(b));
  shared_->free.clear();
  shared_->cached = 0;
}

StagingPool::Buffer StagingPool::take(std::size_t bytes) {
  const std::size_t capacity = std::bit_ceil(std::max(bytes, kPage));
  {
    std::lock_guard lk(shared_->mu);
    auto it = shared_->free.find(capacity);
    if (it != shared_->free.end() && !it->second.empty()) {
      auto b = std::move(it->second.back());
      it->second.pop_back();
      shared_->cached -= capacity;
      return Buffer(shared_, std::move(b));
    }
    ++shared_->allocations;
  }
  auto block = std::make_unique<Buffer::Block>();
  block->data.reset(static_cast<std::byte*>(std::aligned_alloc(kPage, capacity)));
  if (!block->data) throw std::bad_alloc();
  block->capacity = capacity;
  if (registrar_) {
    try {
      block->region = registrar_(block->data.get(), capacity);
      block->registered = true;
    } catch (const std::exception& e) {
      // Still correct: the transport registers it per message, as any unregistered buffer.
      std::size_t failures = 0;
      {
        std::lock_guard lk(shared_->mu);
        failures = ++shared_->registration_failures;
      }
      if (failures == 1)
        spdlog::warn("registering a staging buffer of {} bytes with the fabric failed ({}); such buffers are "
                     "registered per message",
                     capacity, e.what());
    }
  }
  return Buffer(shared_, std::move(block));
}

std::size_t StagingPool::cached_bytes() const {
  std::lock_guard lk(shared_->mu);
  return shared_->cached;
}

std::size_t StagingPool::allocations() const {
  std::lock_guard lk(shared_->mu);
  return shared_->allocations;
}

std::size_t StagingPool::registration_failures() const {
  std::lock_guard lk(shared_->mu);
  return shared_->registration_failures;
}

void StagingPool::Buffer::give_back() noexcept {
  if (!block_ || !pool_) {
    block_.reset();
    pool_.reset();
    return;
  }
  {
    std::lock_guard lk(pool_->mu);
    if (pool_->open && pool_->cached + block_->capacity <= pool_->max_cached) {
      const std::size_t capacity = block_->capacity;
      try {
        pool_->free[capacity].push_back(std::move(block_));
        pool_->cached += capacity;
      } catch (const std::bad_alloc&) {
        // The list could not grow: the buffer is freed below instead.
      }
    }
  }
  block_.reset();  // not kept: deregistered and freed here, outside the lock
  pool_.reset();
}

StagingPool::Buffer& StagingPool::Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    give_back();
    pool_ = std::move(other.pool_);
    block_ = std::move(other.block_);
  }
  return *this;
}

StagingPool::Buffer::~Buffer() { give_back(); }

}  // namespace smddp::daemon::internode
