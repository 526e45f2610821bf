// The client's host path through a StagingCopier (CUDA tensors across nodes): chunks are posted
// only once their copies in passed, regions are freed only once their copies out passed, and
// failures and teardown leave nothing waiting. A fake copier runs the copies on host memory
// when the test says so (or from a thread of its own), the fake daemon plays a world of one.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/client.hpp"
#include "fake_daemon.hpp"

using namespace std::chrono_literals;
using smddp::client::CallOptions;
using smddp::client::Client;
using smddp::client::DType;
using smddp::client::Error;
using smddp::client::ReduceOp;
using smddp::client::StagingCopier;
using smddp::client::Status;
using smddp::testing::Answer;
using smddp::testing::attach_options;
using smddp::testing::FakeDaemon;
using smddp::testing::small_spec;
using smddp::testing::unique_job;
namespace ipc = smddp::ipc;

namespace {

// Copies are queued, and run only when run() (or the auto thread) says so: as a GPU's copy
// engines would, later than the client asked.
class FakeCopier final : public StagingCopier {
 public:
  FakeCopier(const void* in, void* out) : in_(static_cast<const std::byte*>(in)), out_(static_cast<std::byte*>(out)) {}
  ~FakeCopier() override { stop_auto(); }

  void set_wake(std::function<void()> wake) override {
    std::lock_guard lk(mu_);
    wake_ = std::move(wake);
  }
  void copy_in(std::byte* to, std::uint64_t offset, std::uint64_t bytes) noexcept override {
    std::lock_guard lk(mu_);
    lanes_[0].copies.push_back({to, in_ + offset, bytes});
  }
  void copy_out(std::uint64_t offset, const std::byte* from, std::uint64_t bytes) noexcept override {
    std::lock_guard lk(mu_);
    lanes_[1].copies.push_back({out_ + offset, from, bytes});
  }
  std::uint64_t fence(Lane lane) noexcept override {
    std::lock_guard lk(mu_);
    auto& l = lanes_[static_cast<int>(lane)];
    l.fences.push_back({++l.issued, l.copies.size()});
    return l.issued;
  }
  bool passed(Lane lane, std::uint64_t ticket) const noexcept override {
    return lanes_[static_cast<int>(lane)].passed.load(std::memory_order_acquire) >= ticket;
  }
  std::string error() const override {
    std::lock_guard lk(mu_);
    return error_;
  }
  void set_error(std::string why) {
    std::lock_guard lk(mu_);
    error_ = std::move(why);
  }
  void drain() noexcept override {
    drained_.store(true);
    run(Lane::In);
    run(Lane::Out);
  }
  void follow(StagingCopier& earlier) noexcept override {
    std::lock_guard lk(mu_);
    followed_.push_back(&earlier);
  }
  std::vector<const StagingCopier*> followed() const {
    std::lock_guard lk(mu_);
    return followed_;
  }

  // Runs `lane`'s copies up to fence `upto`, then wakes the client unless `wake` is false (as
  // a GPU copy that an event shows finished before its host function ran); returns the
  // fences passed.
  int run(Lane lane, std::uint64_t upto = ~std::uint64_t{0}, bool wake_client = true) {
    int n = 0;
    std::function<void()> wake;
    {
      std::lock_guard lk(mu_);
      auto& l = lanes_[static_cast<int>(lane)];
      while (l.next_fence < l.fences.size() && l.fences[l.next_fence].ticket <= upto) {
        const auto& f = l.fences[l.next_fence++];
        for (; l.done < f.copies; ++l.done) std::memcpy(l.copies[l.done].dst, l.copies[l.done].src, l.copies[l.done].bytes);
        l.passed.store(f.ticket, std::memory_order_release);
        ++n;
      }
      wake = wake_;
    }
    if (n && wake && wake_client) wake();
    return n;
  }
  std::uint64_t issued(Lane lane) {
    std::lock_guard lk(mu_);
    return lanes_[static_cast<int>(lane)].issued;
  }
  // A thread that runs the lanes asked for every 100 us, as copy engines would.
  void start_auto(bool in, bool out) {
    stop_auto();
    stop_.store(false);
    auto_ = std::thread([this, in, out] {
      while (!stop_.load()) {
        if (in) run(Lane::In);
        if (out) run(Lane::Out);
        std::this_thread::sleep_for(100us);
      }
    });
  }
  void stop_auto() {
    stop_.store(true);
    if (auto_.joinable()) auto_.join();
  }
  bool drained() const { return drained_.load(); }

 private:
  struct Copy {
    std::byte* dst;
    const std::byte* src;
    std::uint64_t bytes;
  };
  struct Fence {
    std::uint64_t ticket;
    std::size_t copies;  // copies up to here belong to it
  };
  struct LaneState {
    std::vector<Copy> copies;
    std::vector<Fence> fences;
    std::size_t done = 0, next_fence = 0;
    std::uint64_t issued = 0;
    std::atomic<std::uint64_t> passed{0};
  };
  const std::byte* in_;
  std::byte* out_;
  mutable std::mutex mu_;
  LaneState lanes_[2];
  std::function<void()> wake_;
  std::string error_;
  std::atomic<bool> drained_{false};
  std::vector<const StagingCopier*> followed_;
  std::atomic<bool> stop_{false};
  std::thread auto_;
};

// A fake copier over `in` and `out`, and call options that hand it to the client.
std::pair<std::shared_ptr<FakeCopier>, CallOptions> copier_for(const void* in, void* out) {
  auto copier = std::make_shared<FakeCopier>(in, out);
  CallOptions co;
  co.copier = copier;
  return {copier, co};
}

std::vector<float> ramp(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 9973) + 0.25f;
  return v;
}

// Polls `pred` for up to 10 s.
template <class P>
bool eventually(P&& pred) {
  for (int i = 0; i < 10000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

}  // namespace

TEST(StagingCopier, ChunksArePostedOnlyOnceTheirCopiesInPassed) {
  const auto job = unique_job("copier-in");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const std::size_t n = 64 * 1024;  // 256 KiB of float32: 4 chunks of 64 KiB
  const auto in = ramp(n);
  std::vector<float> out(n, -1.0f);
  auto [copier, co] = copier_for(in.data(), out.data());
  auto w = c->world()->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum, co);
  ASSERT_TRUE(eventually([&] { return copier->issued(StagingCopier::Lane::In) == 4; }));
  std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(daemon.requests().empty()) << "a chunk went to the daemon before its bytes were in the arena";

  EXPECT_EQ(copier->run(StagingCopier::Lane::In, 2), 2);
  ASSERT_TRUE(daemon.wait_for_requests(2, 10s));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(daemon.requests().size(), 2u) << "only the chunks whose copies passed may go";
  copier->run(StagingCopier::Lane::In);
  ASSERT_TRUE(daemon.wait_for_requests(4, 10s));
  w->wait(10s);  // done once every copy out is enqueued
  EXPECT_EQ(w->status(), Status::Ok);
  EXPECT_EQ(out[0], -1.0f) << "the client wrote the output itself instead of through the copier";
  copier->run(StagingCopier::Lane::Out);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), n * sizeof(float)), 0);
  // In order: the daemon must see the chunks of one op as they come.
  const auto reqs = daemon.requests();
  for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(reqs[i].chunk_offset, i * (n / 4));
}

TEST(StagingCopier, CopiesInFinishedBeforeTheirWakeLetTheirChunksGo) {
  // The CUDA copier's passed() asks an event, which tells sooner than the host function that
  // wakes the client: threads that spin poll it. Here no wake ever comes for the copies in,
  // and both a waiting thread and the progress thread (no waiter) must still post the chunks.
  const auto job = unique_job("copier-nowake");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const std::size_t n = 64 * 1024;  // 4 chunks
  const auto in = ramp(n);
  for (const bool waiter : {true, false}) {
    SCOPED_TRACE(waiter ? "a thread waits" : "the progress thread");
    std::vector<float> out(n, -1.0f);
    auto [copier, co] = copier_for(in.data(), out.data());
    const auto before = daemon.requests().size();
    auto w = c->world()->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum, co);
    ASSERT_TRUE(eventually([&] { return copier->issued(StagingCopier::Lane::In) == 4; }));
    std::thread t;
    if (waiter) t = std::thread([&] { w->wait(10s); });
    for (std::uint64_t k = 1; k <= 4; ++k) {
      copier->run(StagingCopier::Lane::In, k, /*wake_client=*/false);
      ASSERT_TRUE(daemon.wait_for_requests(before + k, 10s)) << "chunk " << k << " was not posted";
    }
    if (t.joinable()) t.join();
    ASSERT_TRUE(eventually([&] { return w->done(); }));
    EXPECT_EQ(w->status(), Status::Ok);
    copier->run(StagingCopier::Lane::Out);
    EXPECT_EQ(std::memcmp(in.data(), out.data(), n * sizeof(float)), 0);
  }
}

TEST(StagingCopier, RegionsComeBackOnlyOnceTheirCopiesOutPassed) {
  const auto job = unique_job("copier-out");
  const auto spec = small_spec(job);  // 1 MiB arena, 64 KiB chunks
  FakeDaemon daemon(spec);
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const std::size_t n = (4u << 20) / 4;  // 4 MiB: four arenas' worth
  const auto in = ramp(n);
  std::vector<float> out(n, -1.0f);
  auto [copier, co] = copier_for(in.data(), out.data());
  copier->start_auto(/*in=*/true, /*out=*/false);
  auto w = c->world()->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum, co);
  const std::size_t fit = spec.arena_bytes / spec.chunk_bytes;
  ASSERT_TRUE(daemon.wait_for_requests(fit, 10s));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(daemon.requests().size(), fit) << "regions were reused while their copies out still read them";
  EXPECT_FALSE(w->done());
  copier->start_auto(true, true);
  w->wait(30s);
  EXPECT_EQ(w->status(), Status::Ok);
  copier->stop_auto();
  copier->run(StagingCopier::Lane::Out);  // the last fences may not have run yet
  EXPECT_EQ(std::memcmp(in.data(), out.data(), n * sizeof(float)), 0);
  EXPECT_EQ(daemon.requests().size(), n * sizeof(float) / spec.chunk_bytes);
  EXPECT_TRUE(daemon.problems().empty()) << daemon.problems().front();
}

TEST(StagingCopier, EveryCollectiveRoundTripsThroughTheCopierInAWorldOfOne) {
  const auto job = unique_job("copier-all");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  auto world = c->world();
  const std::size_t n = 100000 + 7;  // several chunks and a tail
  const auto in = ramp(n);
  auto run = [&](const char* what, auto&& issue) {
    SCOPED_TRACE(what);
    std::vector<float> out(n, -1.0f);
    auto [copier, co] = copier_for(in.data(), out.data());
    copier->start_auto(true, true);
    auto w = issue(out.data(), co);
    w->wait(30s);
    EXPECT_EQ(w->status(), Status::Ok);
    copier->stop_auto();
    copier->run(StagingCopier::Lane::Out);  // the last fences may not have run yet
    EXPECT_EQ(std::memcmp(in.data(), out.data(), n * sizeof(float)), 0);
  };
  run("allreduce", [&](float* out, const CallOptions& co) {
    return world->allreduce(in.data(), out, n, DType::Float32, ReduceOp::Sum, co);
  });
  run("allgather", [&](float* out, const CallOptions& co) { return world->allgather(in.data(), out, n, DType::Float32, co); });
  run("reduce_scatter", [&](float* out, const CallOptions& co) {
    return world->reduce_scatter(in.data(), out, n, DType::Float32, ReduceOp::Sum, co);
  });
  run("alltoall", [&](float* out, const CallOptions& co) { return world->alltoall(in.data(), out, n, DType::Float32, co); });
  run("alltoallv", [&](float* out, const CallOptions& co) {
    return world->alltoallv(in.data(), {n}, out, {n}, DType::Float32, co);
  });
}

TEST(StagingCopier, AFailedChunkDropsTheStagedRestAndFreesTheirRegions) {
  const auto job = unique_job("copier-fail");
  const auto spec = small_spec(job);
  FakeDaemon daemon(spec);
  const std::string text = "allreduce mismatch: rank 1 posted another count";
  daemon.set_policy([&](const ipc::RequestDesc& d, std::size_t) {
    if (d.seq == 1) return Answer{Answer::Fail, Status::Mismatch, text};
    return Answer{};
  });
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const std::size_t n = 64 * 1024;  // 4 chunks
  const auto in = ramp(n);
  std::vector<float> out(n, -1.0f);
  auto [copier, co] = copier_for(in.data(), out.data());
  auto w = c->world()->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum, co);
  ASSERT_TRUE(eventually([&] { return copier->issued(StagingCopier::Lane::In) == 4; }));
  copier->run(StagingCopier::Lane::In, 1);
  ASSERT_TRUE(daemon.wait_for_requests(1, 10s));
  // The failure is reported at once: the chunks still copying in never go.
  try {
    w->wait(10s);
    ADD_FAILURE() << "the op did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Mismatch);
    EXPECT_EQ(std::string(e.what()), text);
  }
  copier->run(StagingCopier::Lane::In);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(daemon.requests().size(), 1u) << "chunks of a failed op were posted";
  EXPECT_EQ(copier->issued(StagingCopier::Lane::Out), 0u);
  // Their regions came back once their copies in passed: an op that needs the whole arena
  // in one region (an uneven alltoall is not chunked) still fits.
  daemon.set_policy(nullptr);
  const std::size_t big = 131056;  // 64 B of split table + 2 x 524224 B: 1048512 of 1048576
  std::vector<float> a(big, 1.0f), b(big, 0.0f);
  c->world()->alltoallv(a.data(), {big}, b.data(), {big}, DType::Float32)->wait(10s);
  EXPECT_EQ(b.back(), 1.0f);
}

TEST(StagingCopier, AFailedCopyFailsTheOpAndItsChunksNeverGo) {
  const auto job = unique_job("copier-error");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const std::size_t n = 64 * 1024;  // 4 chunks
  const auto in = ramp(n);
  std::vector<float> out(n, -1.0f);
  auto [copier, co] = copier_for(in.data(), out.data());
  auto w = c->world()->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum, co);
  ASSERT_TRUE(eventually([&] { return copier->issued(StagingCopier::Lane::In) == 4; }));
  copier->set_error("cudaMemcpyAsync: an illegal memory access was encountered");
  copier->run(StagingCopier::Lane::In);
  try {
    w->wait(10s);
    ADD_FAILURE() << "the op did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Internal);
    EXPECT_NE(std::string(e.what()).find("illegal memory access"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(daemon.requests().empty()) << "chunks whose copies failed went to the daemon";
}

TEST(StagingCopier, ACopyThatFaultsWhileItRunsFailsTheOpWithoutItsFenceEverPassing) {
  // A faulted copy breaks the context: its fence never passes and nothing wakes the client,
  // which must still find the error (by asking the copier) long before the op's timeout.
  const auto job = unique_job("copier-fault");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const std::size_t n = 64 * 1024;
  const auto in = ramp(n);
  std::vector<float> out(n, -1.0f);
  auto [copier, co] = copier_for(in.data(), out.data());
  co.timeout = std::chrono::minutes(10);
  auto w = c->world()->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum, co);
  ASSERT_TRUE(eventually([&] { return copier->issued(StagingCopier::Lane::In) == 4; }));
  // The fault comes while this thread already waits.
  std::thread fault([&] {
    std::this_thread::sleep_for(100ms);
    copier->set_error("an illegal memory access was encountered");
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    w->wait(20s);
    ADD_FAILURE() << "the op did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Internal) << e.what();
  }
  // Found by the waiter's own look once per slice (20 ms), not when its wait ran out.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  fault.join();
  EXPECT_TRUE(daemon.requests().empty());
  copier->run(StagingCopier::Lane::In);  // the regions come back once the copies are over
}

TEST(StagingCopier, LaterCollectivesWaitForAnEarlierOnesCopiesIn) {
  const auto job = unique_job("copier-order");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  auto world = c->world();
  const std::size_t n = 1024;
  const auto in = ramp(n);
  std::vector<float> out(n, -1.0f), plain_out(n, -1.0f);
  auto [copier, co] = copier_for(in.data(), out.data());
  auto first = world->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum, co);
  auto second = world->allreduce(in.data(), plain_out.data(), n, DType::Float32, ReduceOp::Sum);
  std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(daemon.requests().empty()) << "a later collective went before an earlier one";
  copier->run(StagingCopier::Lane::In);
  ASSERT_TRUE(daemon.wait_for_requests(2, 10s));
  const auto reqs = daemon.requests();
  EXPECT_EQ(reqs[0].seq + 1, reqs[1].seq) << "collectives must reach the daemon in issue order";
  second->wait(10s);
  first->wait(10s);
  copier->run(StagingCopier::Lane::Out);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(in.data(), plain_out.data(), n * sizeof(float)), 0);
}

TEST(StagingCopier, DetachWithCopiesStillQueuedFailsTheOpAndTheClientWaitsForThem) {
  const auto job = unique_job("copier-detach");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  const std::size_t n = 64 * 1024;
  const auto in = ramp(n);
  std::vector<float> out(n, -1.0f);
  auto [copier, co] = copier_for(in.data(), out.data());
  smddp::client::WorkPtr w;
  {
    auto c = Client::attach(attach_options(job));
    w = c->world()->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum, co);
    ASSERT_TRUE(eventually([&] { return copier->issued(StagingCopier::Lane::In) == 4; }));
    c->detach();
    EXPECT_TRUE(w->done());
    EXPECT_EQ(w->status(), Status::Shutdown);
  }
  w.reset();  // the last reference to the client: it must not unmap the arena under queued copies
  EXPECT_TRUE(copier->drained());
  EXPECT_TRUE(daemon.requests().empty());
}

TEST(StagingCopier, AnOpOnTheSameMemoryWaitsAndItsCopierFollowsTheEarlierOnes) {
  // Two ops on one CUDA tensor, issued back to back: the second copies nothing in before the
  // first is done, and then its copies follow the first one's (which may still run on the GPU).
  const auto job = unique_job("copier-follow");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const std::size_t n = 64 * 1024;  // 4 chunks
  auto buf = ramp(n);
  auto [first, co1] = copier_for(buf.data(), buf.data());
  auto [second, co2] = copier_for(buf.data(), buf.data());
  auto a = c->world()->allreduce(buf.data(), buf.data(), n, DType::Float32, ReduceOp::Sum, co1);
  auto b = c->world()->allreduce(buf.data(), buf.data(), n, DType::Float32, ReduceOp::Sum, co2);
  ASSERT_TRUE(eventually([&] { return first->issued(StagingCopier::Lane::In) == 4; }));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(second->issued(StagingCopier::Lane::In), 0u) << "the second op copied in before the first was done";
  first->run(StagingCopier::Lane::In);
  a->wait(10s);
  ASSERT_TRUE(eventually([&] { return second->issued(StagingCopier::Lane::In) == 4; }));
  ASSERT_EQ(second->followed().size(), 1u);
  EXPECT_EQ(second->followed()[0], first.get());
  first->run(StagingCopier::Lane::Out);
  second->run(StagingCopier::Lane::In);
  b->wait(10s);
  second->run(StagingCopier::Lane::Out);
  EXPECT_EQ(b->status(), Status::Ok);
  EXPECT_EQ(buf, ramp(n));
  // Both done and their copies over: a third op on the memory has nothing to follow.
  auto [third, co3] = copier_for(buf.data(), buf.data());
  third->start_auto(true, true);
  c->world()->allreduce(buf.data(), buf.data(), n, DType::Float32, ReduceOp::Sum, co3)->wait(10s);
  third->stop_auto();
  third->run(StagingCopier::Lane::Out);  // the last copies out may not have run yet
  EXPECT_TRUE(third->followed().empty());
}
