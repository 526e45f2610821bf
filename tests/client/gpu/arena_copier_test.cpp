// The CUDA copier that stages CUDA tensors through the arena across nodes (ArenaCopyLanes,
// OpCopier), on a real GPU: bytes go through both ways, fences pass, the Out lane never
// overtakes the caller's work, and a fence's host function holds nothing back on its lane.
// Skips (saying so) where there is no GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "client/gpu/arena_copier.hpp"

namespace smddp::client::gpu {
namespace {

using Lane = StagingCopier::Lane;
using namespace std::chrono_literals;

constexpr std::size_t kArena = 4 << 20;

bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(50us);
  }
  return true;
}

// A host function that holds its stream until released.
struct Latch {
  std::atomic<bool> open{false};
  static void CUDART_CB hold(void* arg) {
    auto* l = static_cast<Latch*>(arg);
    while (!l->open.load()) std::this_thread::sleep_for(100us);
  }
};

class ArenaCopier : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "needs a CUDA GPU (GPU tests skip on CPU machines)";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    arena_ = static_cast<std::byte*>(std::aligned_alloc(4096, kArena));
    ASSERT_NE(arena_, nullptr);
    lanes_ = std::make_shared<ArenaCopyLanes>(0, arena_, kArena);
    ASSERT_EQ(cudaMalloc(&in_, kArena), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out_, kArena), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&producer_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (producer_) cudaStreamSynchronize(producer_);
    lanes_.reset();  // waits for every copy, unregisters the arena
    if (producer_) cudaStreamDestroy(producer_);
    if (in_) cudaFree(in_);
    if (out_) cudaFree(out_);
    std::free(arena_);
  }
  std::vector<unsigned char> read(const void* dev, std::size_t bytes) {
    std::vector<unsigned char> v(bytes);
    EXPECT_EQ(cudaMemcpy(v.data(), dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

  std::byte* arena_ = nullptr;
  std::shared_ptr<ArenaCopyLanes> lanes_;
  void* in_ = nullptr;
  void* out_ = nullptr;
  cudaStream_t producer_ = nullptr;
};

TEST_F(ArenaCopier, BytesGoThroughBothWaysAndFencesPassAndWake) {
  constexpr std::size_t kBytes = 1 << 20;
  ASSERT_EQ(cudaMemsetAsync(in_, 0x5a, kBytes, producer_), cudaSuccess);  // the caller's producer
  auto copier = lanes_->copier(in_, out_, producer_);
  std::atomic<int> wakes{0};
  copier->set_wake([&] { ++wakes; });
  copier->copy_in(arena_, 0, kBytes);
  const auto in_ticket = copier->fence(Lane::In);
  ASSERT_TRUE(wait_until([&] { return copier->passed(Lane::In, in_ticket); }));
  for (std::size_t i = 0; i < kBytes; i += 4093) ASSERT_EQ(static_cast<unsigned char>(arena_[i]), 0x5a) << i;
  ASSERT_TRUE(wait_until([&] { return wakes.load() >= 1; })) << "the fence's host function never woke the client";

  for (std::size_t i = 0; i < kBytes; ++i) arena_[i] = std::byte{0x3c};
  copier->copy_out(0, arena_, kBytes);
  const auto out_ticket = copier->fence(Lane::Out);
  ASSERT_TRUE(wait_until([&] { return copier->passed(Lane::Out, out_ticket); }));
  ASSERT_TRUE(wait_until([&] { return wakes.load() >= 2; }));
  // What follows the copies out on their stream sees them (the plugin ends the op there).
  ASSERT_EQ(cudaStreamSynchronize(ArenaCopyLanes::out_stream(*copier)), cudaSuccess);
  const auto got = read(out_, kBytes);
  for (std::size_t i = 0; i < kBytes; i += 4093) ASSERT_EQ(got[i], 0x3c) << i;
  EXPECT_EQ(copier->error(), "");
}

TEST_F(ArenaCopier, TheOutLaneWaitsForTheCallersWorkWhenNothingWasCopiedIn) {
  // A receive (no input): its copy out must not overtake the caller's work before the op, which
  // may still read the output.
  Latch latch;
  ASSERT_EQ(cudaLaunchHostFunc(producer_, Latch::hold, &latch), cudaSuccess);
  auto copier = lanes_->copier(nullptr, out_, producer_);
  for (std::size_t i = 0; i < 4096; ++i) arena_[i] = std::byte{0x11};
  copier->copy_out(0, arena_, 4096);
  const auto ticket = copier->fence(Lane::Out);
  std::this_thread::sleep_for(30ms);
  EXPECT_FALSE(copier->passed(Lane::Out, ticket)) << "the copy out ran before the caller's stream got to the op";
  latch.open = true;
  ASSERT_TRUE(wait_until([&] { return copier->passed(Lane::Out, ticket); }));
  EXPECT_EQ(read(out_, 4096)[4095], 0x11);
}

TEST_F(ArenaCopier, TheInLaneWaitsForTheCallersWork) {
  Latch latch;
  ASSERT_EQ(cudaLaunchHostFunc(producer_, Latch::hold, &latch), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(in_, 0x77, 4096, producer_), cudaSuccess);
  auto copier = lanes_->copier(in_, out_, producer_);
  copier->copy_in(arena_, 0, 4096);
  const auto ticket = copier->fence(Lane::In);
  std::this_thread::sleep_for(30ms);
  EXPECT_FALSE(copier->passed(Lane::In, ticket));
  latch.open = true;
  ASSERT_TRUE(wait_until([&] { return copier->passed(Lane::In, ticket); }));
  EXPECT_EQ(static_cast<unsigned char>(arena_[4095]), 0x77);
}

TEST_F(ArenaCopier, AFencesHostFunctionHoldsNothingBackOnItsLane) {
  // The client's wake is stuck inside the first fence's host function: the next chunk's copy
  // in must still run, and its event show it (before, the host function sat on the lane).
  ASSERT_EQ(cudaMemsetAsync(in_, 0x42, 2 * 4096, producer_), cudaSuccess);
  auto copier = lanes_->copier(in_, out_, producer_);
  Latch stuck;
  std::atomic<int> woken{0};
  copier->set_wake([&] {
    if (woken++ == 0) Latch::hold(&stuck);
  });
  copier->copy_in(arena_, 0, 4096);
  const auto first = copier->fence(Lane::In);
  ASSERT_TRUE(wait_until([&] { return woken.load() == 1; })) << "the first fence's host function never ran";
  copier->copy_in(arena_ + 4096, 4096, 4096);
  const auto second = copier->fence(Lane::In);
  EXPECT_TRUE(wait_until([&] { return copier->passed(Lane::In, second); }, 2000ms))
      << "the second copy waited for the first fence's host function";
  EXPECT_TRUE(copier->passed(Lane::In, first));
  EXPECT_EQ(static_cast<unsigned char>(arena_[2 * 4096 - 1]), 0x42);
  stuck.open = true;
  ASSERT_TRUE(wait_until([&] { return woken.load() == 2; }));
}

}  // namespace
}  // namespace smddp::client::gpu
