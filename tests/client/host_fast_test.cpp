// The host fast path (client/host_fast_path.cpp): small host collectives of a group within one
// node run among the ranks' fast cells. Here two or three clients of one process are the
// ranks, and the test plays the daemon (fake_daemon.hpp), which only sees the requests.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "client/client_impl.hpp"
#include "client/host_fast.hpp"
#include "ipc/cross_memory.hpp"
#include "fake_daemon.hpp"

namespace {

using namespace std::chrono_literals;
using smddp::client::Client;
using smddp::client::ClientPtr;
using smddp::client::DType;
using smddp::client::Error;
using smddp::client::OpType;
using smddp::client::ReduceOp;
using smddp::client::Status;
using smddp::client::WorkPtr;
using smddp::testing::Answer;
using smddp::testing::attach_options;
using smddp::testing::FakeDaemon;
using smddp::testing::small_spec;
using smddp::testing::unique_job;
namespace ipc = smddp::ipc;

constexpr std::uint64_t kCell = 4096;

// How the ranks' threads spin: as the machine decides (yielding where the ranks outnumber the
// cores, as on 2 cores), or each on a core of its own (a waiting caller of a fast op then polls
// the cells itself, ClientImpl::wait_fast).
enum class Spin { Machine, CoreEach };

struct Job {
  // single_copy_reduce: all-reduces by single copy from that input size, with 2, 3 or 4 members.
  explicit Job(int n, std::uint64_t cell = kCell, std::uint64_t read = 1ull << 20, std::uint64_t reduce = 1ull << 20,
               bool reduce_shrinks = false, std::uint64_t single_copy = 0, std::uint64_t single_copy_reduce = 0,
               Spin spin = Spin::Machine)
      : job(unique_job("fast")), daemon(spec(job, n, cell, read, reduce, reduce_shrinks, single_copy, single_copy_reduce)) {
    daemon.start();
    for (int r = 0; r < n; ++r) {
      auto o = attach_options(job, r, n, n);
      if (spin == Spin::CoreEach) o.yield_between_polls = false;
      ranks.push_back(Client::attach(o));
    }
  }
  Job(int n, Spin spin) : Job(n, kCell, 1ull << 20, 1ull << 20, false, 0, 0, spin) {}
  static ipc::SegmentSpec spec(const std::string& job, int n, std::uint64_t cell, std::uint64_t read,
                               std::uint64_t reduce, bool reduce_shrinks, std::uint64_t single_copy,
                               std::uint64_t single_copy_reduce) {
    auto s = small_spec(job, n, n);
    s.fast_single_copy_bytes = single_copy;
    s.fast_single_copy_gather_wide_bytes = single_copy;  // gathers of 3-4 members from the same size
    s.fast_single_copy_reduce_bytes = single_copy_reduce;
    s.fast_single_copy_reduce_wide_bytes = single_copy_reduce;
    s.fast_cell_bytes = cell;
    s.fast_read_bytes = read;
    s.fast_reduce_bytes = reduce;
    s.fast_reduce_shrinks = reduce_shrinks;
    return s;
  }
  // Runs f(rank) on a thread per rank; rethrows the first failure.
  void each(const std::function<void(int)>& f) {
    std::vector<std::future<void>> done;
    for (int r = 0; r < static_cast<int>(ranks.size()); ++r) done.push_back(std::async(std::launch::async, f, r));
    for (auto& d : done) d.get();
  }
  std::size_t fast_requests() const {
    std::size_t n = 0;
    for (const auto& d : daemon.requests()) n += (d.flags & ipc::kFlagHostFast) != 0;
    return n;
  }
  std::size_t single_copy_requests() const {
    std::size_t n = 0;
    for (const auto& d : daemon.requests()) n += (d.flags & ipc::kFlagSingleCopy) != 0;
    return n;
  }
  std::string job;
  FakeDaemon daemon;
  std::vector<ClientPtr> ranks;
};

std::vector<float> iota(std::size_t n, float from) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

void every_collective_of_two_ranks(Spin spin) {
  Job j(2, spin);
  constexpr std::uint64_t n = 5;
  j.each([&](int r) {
    auto w = j.ranks[static_cast<std::size_t>(r)]->world();
    const float base = static_cast<float>(10 * r);
    auto in = iota(2 * n, base);  // two blocks, for reduce_scatter, scatter and alltoall
    std::vector<float> out(2 * n, -1);

    w->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum)->wait();
    for (std::uint64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], 2 * i + 10) << "allreduce " << i;

    std::fill(out.begin(), out.end(), -1.f);
    w->reduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Max, 1)->wait();
    for (std::uint64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], r == 1 ? i + 10.f : -1.f) << "reduce " << i;

    auto b = in;
    w->broadcast(b.data(), n, DType::Float32, 1)->wait();
    for (std::uint64_t i = 0; i < n; ++i) EXPECT_EQ(b[i], i + 10.f) << "broadcast " << i;

    w->allgather(in.data(), out.data(), n, DType::Float32)->wait();
    for (std::uint64_t i = 0; i < 2 * n; ++i) EXPECT_EQ(out[i], (i / n) * 10.f + i % n) << "allgather " << i;

    w->reduce_scatter(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum)->wait();
    for (std::uint64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], 2.f * (r * n + i) + 10) << "reduce_scatter " << i;

    std::fill(out.begin(), out.end(), -1.f);
    w->gather(in.data(), out.data(), n, DType::Float32, 0)->wait();
    if (r == 0) {
      for (std::uint64_t i = 0; i < 2 * n; ++i) EXPECT_EQ(out[i], (i / n) * 10.f + i % n) << "gather " << i;
    }

    w->scatter(in.data(), out.data(), n, DType::Float32, 0)->wait();
    for (std::uint64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], static_cast<float>(r * n + i)) << "scatter " << i;

    w->alltoall(in.data(), out.data(), n, DType::Float32)->wait();
    for (std::uint64_t q = 0; q < 2; ++q)
      for (std::uint64_t i = 0; i < n; ++i)
        EXPECT_EQ(out[q * n + i], q * 10.f + r * n + i) << "alltoall " << q << "," << i;

    w->barrier()->wait();
    // In place: the input is in the cell before the output is written.
    auto x = iota(n, base);
    w->allreduce(x.data(), x.data(), n, DType::Float32, ReduceOp::Avg)->wait();
    for (std::uint64_t i = 0; i < n; ++i) EXPECT_EQ(x[i], i + 5.f) << "in-place avg " << i;
  });
  j.daemon.settle();
  EXPECT_EQ(j.fast_requests(), 20u);  // ten collectives on each rank, every one fast
  EXPECT_EQ(j.daemon.requests().size(), 20u);
}

TEST(HostFast, EveryCollectiveOfTwoRanksComputesTheRightOutput) { every_collective_of_two_ranks(Spin::Machine); }

TEST(HostFast, EveryCollectiveOfTwoRanksWithACoreEachComputesTheRightOutput) {
  every_collective_of_two_ranks(Spin::CoreEach);
}

// An input starts in its cell's first line, beside the tag, and runs on past it: every size
// around that line's end lands whole, for a reduction, a copy and a call with a block per member,
// and a premul_sum scales by the caller's factor.
TEST(HostFast, InputsAroundTheCellsFirstLineLandWhole) {
  Job j(2, Spin::CoreEach);
  j.each([&](int r) {
    auto w = j.ranks[static_cast<std::size_t>(r)]->world();
    for (std::uint64_t n = 0; n <= ipc::kFastInlineBytes + 16; ++n) {
      std::vector<std::uint8_t> in(2 * n), out(2 * n, 0xee);
      for (std::uint64_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint8_t>(i * 7 + r + 1);
      w->allreduce(in.data(), out.data(), n, DType::UInt8, ReduceOp::Sum)->wait(10000ms);
      for (std::uint64_t i = 0; i < n; ++i)
        ASSERT_EQ(out[i], static_cast<std::uint8_t>(2 * (i * 7) + 3)) << "allreduce of " << n << " bytes, byte " << i;
      w->allgather(in.data(), out.data(), n, DType::UInt8)->wait(10000ms);
      for (std::uint64_t i = 0; i < 2 * n; ++i)
        ASSERT_EQ(out[i], static_cast<std::uint8_t>((i % n) * 7 + i / n + 1)) << "allgather of " << n << " bytes, byte " << i;
      w->alltoall(in.data(), out.data(), n, DType::UInt8)->wait(10000ms);
      for (std::uint64_t i = 0; i < 2 * n; ++i)  // block m of the output is member m's block r
        ASSERT_EQ(out[i], static_cast<std::uint8_t>((r * n + i % n) * 7 + i / n + 1))
            << "alltoall of " << n << " bytes, byte " << i;
    }
    const float f[3] = {1.f, 2.f, 4.f};
    float of[3] = {};
    smddp::client::CallOptions o;
    o.scale = 0.5;
    w->allreduce(f, of, 3, DType::Float32, ReduceOp::PremulSum, o)->wait(10000ms);
    EXPECT_EQ(of[0], 1.f);
    EXPECT_EQ(of[2], 4.f);
  });
  j.daemon.settle();
  EXPECT_EQ(j.fast_requests(), 2 * (3 * (ipc::kFastInlineBytes + 17) + 1));  // every one fast
}

// As the daemon: no answer to a fast request (the client that would take it may be gone); then
// it stops taking requests (a busy daemon). Returns the fast requests it took before.
std::size_t stop_taking_requests(Job& j) {
  j.daemon.set_policy([](const ipc::RequestDesc& d, std::size_t) {
    Answer a;
    if (d.flags & ipc::kFlagHostFast) a.kind = Answer::Hold;
    return a;
  });
  j.daemon.settle();
  const std::size_t before = j.fast_requests();
  j.daemon.pause_rings(true);
  return before;
}

// Fast requests that found the daemon's ring full wait in the outbox, without their ops (long
// done): a client that ends hands them over as the daemon drains the ring, and ends.
TEST(HostFast, RequestsLeftInTheOutboxReachTheDaemonWhenTheClientEnds) {
  Job j(1, Spin::CoreEach);
  const std::size_t before = stop_taking_requests(j);
  constexpr std::size_t kOps = ipc::kRequestRingCapacity + 40;
  {
    auto w = j.ranks[0]->world();
    const float x = 1;
    float y = 0;
    for (std::size_t i = 0; i < kOps; ++i) w->allreduce(&x, &y, 1, DType::Float32, ReduceOp::Sum)->wait(10000ms);
    EXPECT_EQ(y, 1.f);
  }
  std::thread busy_for_a_while([&] {
    std::this_thread::sleep_for(100ms);
    j.daemon.pause_rings(false);
  });
  j.ranks.clear();  // the last reference: the client ends here
  busy_for_a_while.join();
  EXPECT_EQ(j.daemon.segment().slot(0).state.load(), static_cast<std::uint32_t>(ipc::SlotState::Exited));
  j.daemon.settle();
  EXPECT_EQ(j.fast_requests(), before + kOps);
}

// While the daemon takes no requests, a rank's outbox of fast requests stops at kOutboxFastLimit:
// the next call waits for the daemon, and goes on once the daemon drains the ring again.
TEST(HostFast, AStalledDaemonHoldsACallerAtTheOutboxLimit) {
  Job j(1, Spin::CoreEach);
  const std::size_t before = stop_taking_requests(j);
  const std::size_t room = ipc::kRequestRingCapacity + smddp::client::kOutboxFastLimit;
  std::atomic<std::size_t> returned{0};
  std::thread caller([&] {
    auto w = j.ranks[0]->world();
    const float x = 1;
    float y = 0;
    for (std::size_t i = 0; i < room + 10; ++i) {
      w->allreduce(&x, &y, 1, DType::Float32, ReduceOp::Sum)->wait(10000ms);
      returned.fetch_add(1);
    }
  });
  // Until the count stops moving (200 ms), or 10 s.
  const auto until = std::chrono::steady_clock::now() + 10s;
  for (std::size_t last = ~std::size_t{0}; returned.load() != last && std::chrono::steady_clock::now() < until;) {
    last = returned.load();
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_EQ(returned.load(), room);
  j.daemon.pause_rings(false);
  caller.join();
  EXPECT_EQ(returned.load(), room + 10);
  // The rest reach the daemon as the progress thread pushes them (a ring at a time).
  const auto drained = std::chrono::steady_clock::now() + 10s;
  while (j.fast_requests() < before + room + 10 && std::chrono::steady_clock::now() < drained) {
    j.daemon.settle();
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(j.fast_requests(), before + room + 10);
}

// A sum of a few elements skips the kernels' dispatch: the same results, integers wrapping as
// the kernels' do, for each dtype it takes, and a dtype it does not take still right.
TEST(HostFast, AFewElementsSumAsTheKernelsDo) {
  Job j(3);
  j.each([&](int r) {
    auto w = j.ranks[static_cast<std::size_t>(r)]->world();
    const std::int32_t i32[2] = {r == 0 ? INT32_MAX : 1, -r};
    std::int32_t o32[2] = {};
    w->allreduce(i32, o32, 2, DType::Int32, ReduceOp::Sum)->wait(10000ms);
    EXPECT_EQ(o32[0], INT32_MIN + 1);  // INT32_MAX + 1 + 1, wrapped
    EXPECT_EQ(o32[1], -3);
    const std::int64_t i64 = r == 2 ? INT64_MAX : 0;
    std::int64_t o64 = 0;
    w->allreduce(&i64, &o64, 1, DType::Int64, ReduceOp::Sum)->wait(10000ms);
    EXPECT_EQ(o64, INT64_MAX);
    const double d[3] = {0.1 * r, 1e300, -1.5};
    double od[3] = {};
    w->allreduce(d, od, 3, DType::Float64, ReduceOp::Sum)->wait(10000ms);
    EXPECT_EQ(od[0], (0.0 + 0.1) + 0.2);  // in rank order
    EXPECT_EQ(od[1], 3e300);
    EXPECT_EQ(od[2], -4.5);
    std::vector<float> f(16, 0.5f), of(16);
    w->allreduce(f.data(), of.data(), 16, DType::Float32, ReduceOp::Sum)->wait(10000ms);
    EXPECT_EQ(of[15], 1.5f);
    const std::uint8_t u[2] = {200, static_cast<std::uint8_t>(r)};
    std::uint8_t ou[2] = {};
    w->allreduce(u, ou, 2, DType::UInt8, ReduceOp::Max)->wait(10000ms);  // the kernels
    EXPECT_EQ(ou[0], 200);
    EXPECT_EQ(ou[1], 2);
  });
}

TEST(HostFast, TheCellSizeIsTheBoundaryForEveryRole) {
  Job j(2);
  const std::uint64_t fits = kCell / 4;  // float32 elements of a whole cell
  j.each([&](int r) {
    auto w = j.ranks[static_cast<std::size_t>(r)]->world();
    std::vector<float> in(2 * fits + 2, 1.f), out(4 * fits + 4);
    w->allreduce(in.data(), out.data(), fits, DType::Float32, ReduceOp::Sum)->wait();  // fast
    EXPECT_EQ(out[fits - 1], 2.f);
    // Two blocks of fits / 2: the reduce_scatter's whole input just fits.
    w->reduce_scatter(in.data(), out.data(), fits / 2, DType::Float32, ReduceOp::Sum)->wait();
    EXPECT_EQ(out[fits / 2 - 1], 2.f);
  });
  j.daemon.settle();
  EXPECT_EQ(j.fast_requests(), 4u);
  // One element more goes through the daemon (whose fake answers as a world of one would).
  j.each([&](int r) {
    auto w = j.ranks[static_cast<std::size_t>(r)]->world();
    std::vector<float> in(2 * fits + 2, 1.f), out(4 * fits + 4);
    w->allreduce(in.data(), out.data(), fits + 1, DType::Float32, ReduceOp::Sum)->wait();
    w->reduce_scatter(in.data(), out.data(), fits / 2 + 1, DType::Float32, ReduceOp::Sum)->wait();
  });
  j.daemon.settle();
  EXPECT_EQ(j.fast_requests(), 4u);
  EXPECT_EQ(j.daemon.requests().size(), 8u);
}

// Every member reads the whole call from the cells: the read limit bounds what one member reads
// (n inputs of an all-reduce or all-gather, one block of a broadcast), so with more members
// smaller calls are fast. Checked at the limit and one element past it, for 2 and 3 ranks.
TEST(HostFast, TheReadLimitIsTheBoundaryForEachGroupSize) {
  constexpr std::uint64_t kRead = 12288;
  for (int n : {2, 3}) {
    SCOPED_TRACE(n);
    Job j(n, 4 * kRead, kRead);
    const std::uint64_t fits = kRead / 4 / static_cast<std::uint64_t>(n);  // float32 elements of a member's input
    const auto run = [&](std::uint64_t extra) {
      j.each([&](int r) {
        auto w = j.ranks[static_cast<std::size_t>(r)]->world();
        std::vector<float> in(kRead, 1.f), out(4 * kRead);
        w->allreduce(in.data(), out.data(), fits + extra, DType::Float32, ReduceOp::Sum)->wait();
        w->allgather(in.data(), out.data(), fits + extra, DType::Float32)->wait();
        // A broadcast reads one block: the whole limit, not a member's share of it.
        w->broadcast(in.data(), kRead / 4 + extra, DType::Float32, 0)->wait();
        // A reduce_scatter reads its block from each member: n blocks.
        w->reduce_scatter(in.data(), out.data(), fits + extra, DType::Float32, ReduceOp::Sum)->wait();
      });
      j.daemon.settle();
    };
    run(0);
    EXPECT_EQ(j.fast_requests(), 4u * static_cast<std::size_t>(n));
    run(1);
    EXPECT_EQ(j.fast_requests(), 4u * static_cast<std::size_t>(n));  // none more
    EXPECT_EQ(j.daemon.requests().size(), 8u * static_cast<std::size_t>(n));
  }
}

// All-reduce and reduce have a limit of their own: every member reduces every input, n times the
// arithmetic of the reduction split among the ranks. It bounds them alone; an all-gather that
// reads as much still takes the path. Checked at the limit and one element past it.
TEST(HostFast, TheReduceLimitBoundsAllReduceAndReduceAlone) {
  constexpr std::uint64_t kRead = 12288, kReduce = 4096;
  for (const bool shrinks : {false, true})
  for (int n : {2, 3}) {
    SCOPED_TRACE(testing::Message() << n << " members, shrinks " << shrinks);
    Job j(n, 4 * kRead, kRead, kReduce, shrinks);
    // Float32 elements of a member's input: its read (n inputs) within the limit, or the limit
    // x 2 / n where it shrinks.
    const auto members = static_cast<std::uint64_t>(n);
    const std::uint64_t limit = shrinks ? kReduce * 2 / members : kReduce;
    const std::uint64_t fits = limit / 4 / members;
    const auto run = [&](std::uint64_t extra) {
      j.each([&](int r) {
        auto w = j.ranks[static_cast<std::size_t>(r)]->world();
        std::vector<float> in(kRead, 1.f), out(4 * kRead);
        w->allreduce(in.data(), out.data(), fits + extra, DType::Float32, ReduceOp::Sum)->wait();
        w->reduce(in.data(), out.data(), fits + extra, DType::Float32, ReduceOp::Sum, 0)->wait();
        w->allgather(in.data(), out.data(), fits + extra, DType::Float32)->wait();
        // A reduce_scatter reads a block from each member and reduces it once: the read limit.
        w->reduce_scatter(in.data(), out.data(), fits + extra, DType::Float32, ReduceOp::Sum)->wait();
      });
      j.daemon.settle();
    };
    run(0);
    EXPECT_EQ(j.fast_requests(), 4u * static_cast<std::size_t>(n));
    run(1);
    EXPECT_EQ(j.fast_requests(), 6u * static_cast<std::size_t>(n));  // the all-gather and reduce_scatter only
    EXPECT_EQ(j.daemon.requests().size(), 8u * static_cast<std::size_t>(n));
  }
}

TEST(HostFast, FinishesWithoutTheDaemonsAnswer) {
  Job j(2);
  j.daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  j.each([&](int r) {
    auto w = j.ranks[static_cast<std::size_t>(r)]->world();
    for (int i = 0; i < 50; ++i) {
      float x = static_cast<float>(r + i), y = 0;
      w->allreduce(&x, &y, 1, DType::Float32, ReduceOp::Sum)->wait(5000ms);
      EXPECT_EQ(y, static_cast<float>(2 * i + 1));
    }
  });
  j.daemon.settle();
  EXPECT_EQ(j.daemon.held_count(), 100u);  // the daemon heard of every one, answered none
  j.daemon.release_held();
}

// One thread drives both ranks: a call returns within its bounded wait whether or not the other
// member came. The rank that comes second finds the first one's cell and finishes within its
// call: its Work is done when the call returns (no OpState: ClientImpl::run_fast_now_locked); the
// first one's call left a Work the wait finishes. The daemon heard of both.
void a_call_that_finds_every_member_there_finishes_within_it(Spin spin) {
  Job j(2, spin);
  auto w0 = j.ranks[0]->world();
  auto w1 = j.ranks[1]->world();
  j.daemon.settle();
  const std::size_t before = j.fast_requests();
  for (int i = 0; i < 3; ++i) {
    const float x0 = 1.f + i, x1 = 10.f;
    float y0 = 0, y1 = 0;
    auto first = w0->allreduce(&x0, &y0, 1, DType::Float32, ReduceOp::Sum);
    EXPECT_FALSE(first->done()) << i;  // rank 1 has not called yet
    auto second = w1->allreduce(&x1, &y1, 1, DType::Float32, ReduceOp::Sum);
    ASSERT_TRUE(second->done()) << i;
    EXPECT_TRUE(second->test());
    EXPECT_EQ(second->status(), Status::Ok);
    EXPECT_EQ(second->error(), "");
    EXPECT_EQ(y1, 11.f + i);
    bool called = false;
    second->on_complete([&] { called = true; });
    EXPECT_TRUE(called);
    second->wait();
    first->wait(5000ms);
    EXPECT_EQ(y0, 11.f + i);
  }
  j.daemon.settle();
  EXPECT_EQ(j.fast_requests(), before + 6);
}

TEST(HostFast, ACallThatFindsEveryMemberThereFinishesWithinIt) {
  a_call_that_finds_every_member_there_finishes_within_it(Spin::Machine);
}

TEST(HostFast, ACallThatFindsEveryMemberThereFinishesWithinItWithACoreEach) {
  a_call_that_finds_every_member_there_finishes_within_it(Spin::CoreEach);
}

// A call issued while an earlier one on its memory is unfinished does not finish within the
// call, though its members are all there: it reads what the earlier one writes, after it.
TEST(HostFast, ACallBehindAnUnfinishedOneOnItsMemoryWaitsForIt) {
  Job j(2, Spin::CoreEach);
  auto w0 = j.ranks[0]->world();
  auto w1 = j.ranks[1]->world();
  float a0 = 1, a1 = 2, b1 = 5, y1 = 0;
  float x0 = 0;  // rank 0: the first call writes x0, the second reads it
  float out0 = 0;
  auto first = w0->allreduce(&a0, &x0, 1, DType::Float32, ReduceOp::Sum);
  ASSERT_FALSE(first->done());
  auto second = w0->allreduce(&x0, &out0, 1, DType::Float32, ReduceOp::Sum);
  EXPECT_FALSE(second->done());
  w1->allreduce(&a1, &y1, 1, DType::Float32, ReduceOp::Sum)->wait(5000ms);
  EXPECT_EQ(y1, 3.f);
  w1->allreduce(&b1, &y1, 1, DType::Float32, ReduceOp::Sum)->wait(5000ms);
  first->wait(5000ms);
  second->wait(5000ms);
  EXPECT_EQ(x0, 3.f);
  EXPECT_EQ(out0, 8.f);  // 3 (the first call's output) + 5
  EXPECT_EQ(y1, 8.f);
}

TEST(HostFast, AsynchronousOpsReuseTheCellsInOrderAndCallBackWithoutWait) {
  Job j(3);
  constexpr int kOps = 40;
  j.each([&](int r) {
    auto w = j.ranks[static_cast<std::size_t>(r)]->world();
    std::vector<std::vector<std::int64_t>> in(kOps), out(kOps);
    std::vector<WorkPtr> works;
    std::atomic<int> called{0};
    for (int i = 0; i < kOps; ++i) {
      in[static_cast<std::size_t>(i)] = {r * 100 + i, i};
      out[static_cast<std::size_t>(i)].assign(2, -1);
      works.push_back(w->allreduce(in[static_cast<std::size_t>(i)].data(), out[static_cast<std::size_t>(i)].data(), 2,
                                   DType::Int64, ReduceOp::Sum));
      works.back()->on_complete([&] { called.fetch_add(1); });
    }
    // Nobody waits: the progress thread finishes them.
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (called.load() < kOps && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    ASSERT_EQ(called.load(), kOps);
    for (int i = 0; i < kOps; ++i) {
      EXPECT_EQ(works[static_cast<std::size_t>(i)]->status(), Status::Ok);
      EXPECT_EQ(out[static_cast<std::size_t>(i)][0], 300 + 3 * i) << i;
      EXPECT_EQ(out[static_cast<std::size_t>(i)][1], 3 * i) << i;
    }
  });
}

TEST(HostFast, SubgroupsGetTheirOwnLaneFromTheDaemonsAnswer) {
  Job j(3);
  // The fake daemon answers the communicator's creation with lane 2 (daemon_value 3).
  j.daemon.set_policy([](const ipc::RequestDesc& d, std::size_t) {
    Answer a;
    if (d.op == OpType::CommCreate) a.daemon_value = 3;
    return a;
  });
  std::vector<smddp::client::CommunicatorPtr> groups(3);
  j.each([&](int r) {
    if (r != 1) groups[static_cast<std::size_t>(r)] = j.ranks[static_cast<std::size_t>(r)]->create_communicator(7, {0, 2}, 5000ms);
  });
  j.each([&](int r) {
    if (r == 1) return;
    float x = 1.f + r, y = 0;
    groups[static_cast<std::size_t>(r)]->allreduce(&x, &y, 1, DType::Float32, ReduceOp::Sum)->wait(5000ms);
    EXPECT_EQ(y, 4.f);
  });
  j.daemon.settle();
  EXPECT_EQ(j.fast_requests(), 2u);
  for (const auto& d : j.daemon.requests()) {
    if (d.flags & ipc::kFlagHostFast) {
      EXPECT_EQ(d.comm_id, 7u);
    }
  }
  // Lane 2 of each member's slot carried it.
  EXPECT_EQ(j.daemon.segment().slot(0).fast_done[2].k.load(), 1u);
  EXPECT_EQ(j.daemon.segment().slot(2).fast_done[2].k.load(), 1u);
  EXPECT_EQ(j.daemon.segment().slot(0).fast_done[0].k.load(), 0u);
}

TEST(HostFast, TheDaemonsErrorFailsAWaitingOpAndTurnsThePathOffForTheCommunicator) {
  Job j(2);
  const std::string text = "collective mismatch on communicator 0 (operation #1): rank 0 called allreduce(float32, count=1), "
                           "rank 1 called allreduce(float32, count=100000)";
  // By value: the daemon's thread outlives this test's locals.
  j.daemon.set_policy([text](const ipc::RequestDesc& d, std::size_t) {
    return d.seq == 1 ? Answer{Answer::Fail, Status::Mismatch, text} : Answer{};
  });
  auto w = j.ranks[0]->world();
  float x = 1, y = 0;
  // Rank 1 never publishes (it took the daemon path): only the daemon's answer ends the wait.
  try {
    w->allreduce(&x, &y, 1, DType::Float32, ReduceOp::Sum)->wait(10000ms);
    FAIL() << "expected the daemon's mismatch";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Mismatch);
    EXPECT_EQ(std::string(e.what()), text);
  }
  // The next collective of the communicator goes through the daemon.
  w->allreduce(&x, &y, 1, DType::Float32, ReduceOp::Sum)->wait(10000ms);
  j.daemon.settle();
  const auto seen = j.daemon.requests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen[0].flags & ipc::kFlagHostFast);
  EXPECT_FALSE(seen[1].flags & ipc::kFlagHostFast);
  // Rank 0 gave its lane up at fast op #1.
  EXPECT_EQ(j.daemon.segment().slot(0).fast_done[0].given_up.load(), 1u);
}

TEST(HostFast, AnOpNumberedOnALaneThisRankGaveUpFailsAtOnce) {
  Job j(2);
  j.daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  // As if fast op #1 of the world had failed here while op #2 was being issued.
  j.daemon.segment().slot(0).fast_done[0].given_up.store(1);
  float x = 1, y = 0;
  auto w = j.ranks[0]->world();
  auto first = w->allreduce(&x, &y, 1, DType::Float32, ReduceOp::Sum);  // #1: publishes, waits
  auto second = w->allreduce(&x, &y, 1, DType::Float32, ReduceOp::Sum);  // #2: can never publish
  try {
    second->wait(5000ms);
    FAIL() << "expected the given-up lane to fail it";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::PeerFailed);
    EXPECT_NE(std::string(e.what()).find("an earlier collective of this communicator failed"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(first->done());  // #1 itself is not given up: it waits for rank 1, which never comes
  j.daemon.release_held();
}

void a_member_that_gave_up_ends_the_others_wait(Spin spin) {
  Job j(2, spin);
  j.daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  // Rank 0's fast op #1 failed before it published its cell (as after a timeout).
  j.daemon.segment().slot(0).fast_done[0].given_up.store(1);
  float x = 1, y = 0;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    j.ranks[1]->world()->allreduce(&x, &y, 1, DType::Float32, ReduceOp::Sum)->wait(10000ms);
    FAIL() << "expected the given-up lane to fail it";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::PeerFailed);
    EXPECT_NE(std::string(e.what()).find("rank 0 gave up on this communicator's host fast path"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  j.daemon.release_held();
}

TEST(HostFast, AMemberThatGaveUpItsLaneEndsTheOthersWait) { a_member_that_gave_up_ends_the_others_wait(Spin::Machine); }

TEST(HostFast, AMemberThatGaveUpItsLaneEndsTheOthersWaitWithACoreEach) {
  a_member_that_gave_up_ends_the_others_wait(Spin::CoreEach);
}

TEST(HostFast, MembersThatDisagreeWaitForTheDaemonsVerdict) {
  Job j(2);
  const std::string text = "collective mismatch on communicator 0 (operation #1): rank 0 called allreduce(float32, "
                           "count=2), rank 1 called allgather(float32, count=2)";
  j.daemon.set_policy([text](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Fail, Status::Mismatch, text}; });
  j.each([&](int r) {
    auto w = j.ranks[static_cast<std::size_t>(r)]->world();
    float in[2] = {1, 2}, out[4] = {};
    try {
      if (r == 0) w->allreduce(in, out, 2, DType::Float32, ReduceOp::Sum)->wait(10000ms);
      else w->allgather(in, out, 2, DType::Float32)->wait(10000ms);
      ADD_FAILURE() << "rank " << r << " expected the mismatch";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::Mismatch);
      EXPECT_EQ(std::string(e.what()), text);
    }
    EXPECT_EQ(out[0], 0.f) << "nothing is written on a mismatch";
  });
}

void the_jobs_failure_ends_a_wait_for_a_peer_that_never_came(Spin spin) {
  Job j(2, spin);
  auto w = j.ranks[0]->world();
  float x = 1, y = 0;
  auto work = w->allreduce(&x, &y, 1, DType::Float32, ReduceOp::Sum);
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(work->done());
  const std::string why = "rank 1 (pid 4242) was killed by signal 9";
  auto& h = j.daemon.header();
  std::strncpy(h.job_error, why.c_str(), sizeof h.job_error - 1);
  h.job_failed.store(1, std::memory_order_release);  // nothing rings: the waiting thread looks by itself
  const auto t0 = std::chrono::steady_clock::now();
  try {
    work->wait(10000ms);
    FAIL() << "expected the job's failure";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::PeerFailed);
    EXPECT_EQ(std::string(e.what()), why);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

TEST(HostFast, TheJobsFailureEndsAWaitForAPeerThatNeverCame) {
  the_jobs_failure_ends_a_wait_for_a_peer_that_never_came(Spin::Machine);
}

TEST(HostFast, TheJobsFailureEndsAWaitForAPeerThatNeverCameWithACoreEach) {
  the_jobs_failure_ends_a_wait_for_a_peer_that_never_came(Spin::CoreEach);
}

TEST(HostFast, AnOpWhoseCellsAreAllThereCompletesAfterTheJobFailed) {
  Job j(2);
  // Rank 1 publishes and waits; the job fails; rank 0 then finds every cell there: its op
  // completes (rank 1's may have already), and only its next op fails.
  float x0 = 1, y0 = 0, x1 = 2, y1 = 0;
  auto w1 = j.ranks[1]->world()->allreduce(&x1, &y1, 1, DType::Float32, ReduceOp::Sum);
  auto& h = j.daemon.header();
  std::strncpy(h.job_error, "rank 3 corrupted its request ring", sizeof h.job_error - 1);
  h.job_failed.store(1, std::memory_order_release);
  j.ranks[0]->world()->allreduce(&x0, &y0, 1, DType::Float32, ReduceOp::Sum)->wait(5000ms);
  EXPECT_EQ(y0, 3.f);
  EXPECT_THROW(j.ranks[0]->world()->allreduce(&x0, &y0, 1, DType::Float32, ReduceOp::Sum)->wait(5000ms), Error);
  try {
    w1->wait(5000ms);  // done, or failed by the job: either is right
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::PeerFailed) << e.what();
  }
}

TEST(HostFast, AFrozenDaemonIsNoticedWhilePeersSpin) {
  Job j(2);
  auto w = j.ranks[0]->world();
  float x = 1, y = 0;
  auto work = w->allreduce(&x, &y, 1, DType::Float32, ReduceOp::Sum);
  j.daemon.freeze_heartbeat(true);
  try {
    work->wait(10000ms);
    FAIL() << "expected the daemon to be declared dead";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::PeerFailed);
    EXPECT_NE(std::string(e.what()).find("stopped responding"), std::string::npos) << e.what();
  }
}

// --- Single copy: the members read each other's inputs where they are -------------------

constexpr std::uint64_t kSingleCopy = 8192;  // from 8 KiB of largest input; cells hold 4 KiB

// The daemon turns single copy off where the system refuses process_vm_readv; these tests set it
// on themselves, so they skip there.
#define SKIP_WITHOUT_PEER_READS()                                                 \
  do {                                                                            \
    if (const auto why = smddp::ipc::peer_reads_unavailable()) GTEST_SKIP() << *why; \
  } while (0)

// Where one copy saves half of the shared-memory route's: alltoall and scatter at any size of
// group, all-gather and gather of 2 members; from the size on, and never when off.
TEST(HostFastSingleCopy, TakesAlltoallScatterAndTwoMembersGathersFromItsSizeOn) {
  using smddp::client::host_fast::single_copy;
  EXPECT_TRUE(single_copy(OpType::AllGather, 2048, DType::Float32, 2, kSingleCopy));
  EXPECT_FALSE(single_copy(OpType::AllGather, 2047, DType::Float32, 2, kSingleCopy));
  EXPECT_FALSE(single_copy(OpType::AllGather, 1 << 20, DType::Float32, 2, 0));  // off
  EXPECT_TRUE(single_copy(OpType::Gather, 2048, DType::Float32, 2, kSingleCopy));
  EXPECT_FALSE(single_copy(OpType::AllGather, 1 << 20, DType::Float32, 3, kSingleCopy, kSingleCopy));
  // A gather of 3 or 4 members from the larger of the two sizes, where the node resolved one.
  EXPECT_FALSE(single_copy(OpType::Gather, 1 << 20, DType::Float32, 4, kSingleCopy));
  EXPECT_TRUE(single_copy(OpType::Gather, 1 << 16, DType::Float32, 4, kSingleCopy, 256 << 10));
  EXPECT_FALSE(single_copy(OpType::Gather, (1 << 16) - 1, DType::Float32, 3, kSingleCopy, 256 << 10));
  EXPECT_TRUE(single_copy(OpType::Gather, 2048, DType::Float32, 3, kSingleCopy, 4096));
  EXPECT_FALSE(single_copy(OpType::Gather, 2047, DType::Float32, 3, kSingleCopy, 4096));  // below kSingleCopy
  EXPECT_FALSE(single_copy(OpType::Gather, 1 << 20, DType::Float32, 5, kSingleCopy, 4096));
  EXPECT_FALSE(single_copy(OpType::Gather, 1 << 20, DType::Float32, 4, 0, 4096));  // off
  // The scatter root's and alltoall's n blocks are the largest input.
  EXPECT_TRUE(single_copy(OpType::Scatter, 1024, DType::Float32, 2, kSingleCopy));
  EXPECT_FALSE(single_copy(OpType::Scatter, 1023, DType::Float32, 2, kSingleCopy));
  EXPECT_TRUE(single_copy(OpType::AllToAll, 512, DType::Float64, 2, kSingleCopy));
  EXPECT_TRUE(single_copy(OpType::AllToAll, 256, DType::Float64, 4, kSingleCopy));
  EXPECT_TRUE(single_copy(OpType::Scatter, 1 << 20, DType::Float32, 8, kSingleCopy));
  for (auto op : {OpType::Broadcast, OpType::AllReduce, OpType::Reduce, OpType::ReduceScatter, OpType::Barrier})
    EXPECT_FALSE(single_copy(op, 1 << 20, DType::Float32, 2, kSingleCopy)) << ipc::to_string(op);
}

TEST(HostFastSingleCopy, AMemberPublishesItsOwnInputUnlessItsWritesWouldChangeIt) {
  using smddp::client::host_fast::input_stays_put;
  std::vector<std::byte> buf(1 << 16);
  std::byte* b = buf.data();
  constexpr std::uint64_t n = 256;  // float32: 1 KiB blocks; the spans are the op's own (OpState)
  EXPECT_TRUE(input_stays_put(OpType::AllGather, n, DType::Float32, 1, b, 1024, b + 8192, 2048));      // apart
  EXPECT_TRUE(input_stays_put(OpType::AllGather, n, DType::Float32, 1, b + 1024, 1024, b, 2048));      // in place
  EXPECT_FALSE(input_stays_put(OpType::AllGather, n, DType::Float32, 1, b, 1024, b, 2048));            // over block 0
  EXPECT_TRUE(input_stays_put(OpType::Gather, n, DType::Float32, 1, b, 1024, b, 0));                // a non-root writes nothing
  EXPECT_FALSE(input_stays_put(OpType::Gather, n, DType::Float32, 0, b + 1024, 1024, b, 2048));        // the root's block 1 is rank 1's
  EXPECT_TRUE(input_stays_put(OpType::Broadcast, n, DType::Float32, 0, b, 1024, b, 0));             // the root writes nothing
  EXPECT_FALSE(input_stays_put(OpType::AllToAll, n, DType::Float32, 0, b, 2048, b, 2048));             // in place
  EXPECT_FALSE(input_stays_put(OpType::Scatter, n, DType::Float32, 0, b, 2048, b + 1024, 1024));       // the root's block 1
  EXPECT_TRUE(input_stays_put(OpType::AllReduce, n, DType::Float32, 0, b, 1024, b, 1024));             // in place
  EXPECT_FALSE(input_stays_put(OpType::AllReduce, n, DType::Float32, 0, b + 64, 1024, b, 1024));       // overlapping
}

// Every collective that takes it, at 4x the cell, for 2 and 3 members, in and out of place;
// an all-reduce of that size still goes through the daemon.
TEST(HostFastSingleCopy, EveryCollectiveThatTakesItComputesTheRightOutputAboveTheCell) {
  SKIP_WITHOUT_PEER_READS();
  for (int members : {2, 3, 4}) {
    SCOPED_TRACE(members);
    Job j(members, kCell, 1ull << 20, 1ull << 20, false, kSingleCopy);
    const auto nm = static_cast<std::uint64_t>(members);
    const bool pair = members == 2;  // all-gather too
    constexpr std::uint64_t n = 4 * kCell / 4;  // float32 elements of a block
    j.each([&](int r) {
      auto w = j.ranks[static_cast<std::size_t>(r)]->world();
      const auto rr = static_cast<std::uint64_t>(r);
      const float base = static_cast<float>(100000 * r);
      auto in = iota(nm * n, base);
      std::vector<float> out(nm * n, -1);
      const auto value = [&](std::uint64_t rank, std::uint64_t i) { return static_cast<float>(100000 * rank + i); };

      if (pair) {
        w->allgather(in.data(), out.data(), n, DType::Float32)->wait(10000ms);
        for (std::uint64_t i = 0; i < nm * n; ++i) ASSERT_EQ(out[i], value(i / n, i % n)) << "allgather " << i;

        // In place: the input is its block of the output, published as it is.
        auto g = std::vector<float>(nm * n, -1);
        std::copy_n(in.begin(), n, g.begin() + static_cast<std::ptrdiff_t>(rr * n));
        w->allgather(g.data() + rr * n, g.data(), n, DType::Float32)->wait(10000ms);
        for (std::uint64_t i = 0; i < nm * n; ++i) ASSERT_EQ(g[i], value(i / n, i % n)) << "in-place allgather " << i;
      }

      std::fill(out.begin(), out.end(), -1.f);
      w->gather(in.data(), out.data(), n, DType::Float32, 0)->wait(10000ms);
      for (std::uint64_t i = 0; i < nm * n && r == 0; ++i) ASSERT_EQ(out[i], value(i / n, i % n)) << "gather " << i;

      // In place at the last rank, the root: its input is its block of the output.
      const int root = members - 1;
      auto g = std::vector<float>(nm * n, -1);
      std::copy_n(in.begin(), n, g.begin() + static_cast<std::ptrdiff_t>(rr * n));
      w->gather(g.data() + rr * n, g.data(), n, DType::Float32, root)->wait(10000ms);
      for (std::uint64_t i = 0; i < nm * n && r == root; ++i) ASSERT_EQ(g[i], value(i / n, i % n)) << "in-place gather " << i;

      w->scatter(in.data(), out.data(), n, DType::Float32, 1)->wait(10000ms);
      for (std::uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], value(1, rr * n + i)) << "scatter " << i;

      w->alltoall(in.data(), out.data(), n, DType::Float32)->wait(10000ms);
      for (std::uint64_t i = 0; i < nm * n; ++i) ASSERT_EQ(out[i], value(i / n, rr * n + i % n)) << "alltoall " << i;

      // In place, an alltoall's input is its output: published as a copy, since this rank
      // writes over it while the others read.
      auto a = in;
      w->alltoall(a.data(), a.data(), n, DType::Float32)->wait(10000ms);
      for (std::uint64_t i = 0; i < nm * n; ++i) ASSERT_EQ(a[i], value(i / n, rr * n + i % n)) << "in-place alltoall " << i;

      w->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum)->wait(10000ms);  // through the daemon
    });
    j.daemon.settle();
    const std::size_t single = (pair ? 7u : 5u) * nm;
    EXPECT_EQ(j.single_copy_requests(), single);
    EXPECT_EQ(j.fast_requests(), single);
    EXPECT_EQ(j.daemon.requests().size(), single + nm);
  }
}

// A member returns only once the others are done reading its input: here rank 1 is played by
// the test, which publishes its cell and marks its reads done by hand.
TEST(HostFastSingleCopy, AMemberReturnsOnlyOnceTheOthersReadItsInput) {
  SKIP_WITHOUT_PEER_READS();
  Job j(2, kCell, 1ull << 20, 1ull << 20, false, kSingleCopy);
  constexpr std::uint64_t n = kSingleCopy / 4;
  std::vector<float> in0(n, 1.f), in1(n, 2.f), out(2 * n, 0.f);
  auto& seg = j.daemon.segment();
  auto& cell = seg.fast_cell(1, 0, 1);
  cell.comm_id = 0;
  cell.seq = 1;
  cell.count = n;
  cell.op = OpType::AllGather;
  cell.dtype = DType::Float32;
  cell.by_address = 1;
  ipc::Segment::set_fast_address(cell, reinterpret_cast<std::uintptr_t>(in1.data()));
  cell.tag.store(1, std::memory_order_release);
  auto work = j.ranks[0]->world()->allgather(in0.data(), out.data(), n, DType::Float32);
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (seg.slot(0).fast_done[0].k.load() < 1 && std::chrono::steady_clock::now() < until) {
    work->test();
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(seg.slot(0).fast_done[0].k.load(), 1u);  // it read rank 1's input
  EXPECT_EQ(out[0], 1.f);
  EXPECT_EQ(out[n], 2.f);
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(work->test()) << "rank 0 returned while rank 1 may still read its input";
  seg.slot(1).fast_done[0].k.store(1, std::memory_order_release);
  seg.slot(0).client_bell.ring();
  work->wait(5000ms);
}

// What the one before shows, end to end: each member writes over its input as soon as its call
// returns, and no member ever reads the new values.
TEST(HostFastSingleCopy, AMemberMayWriteOverItsInputAsSoonAsItsCallReturns) {
  SKIP_WITHOUT_PEER_READS();
  Job j(3, kCell, 1ull << 20, 1ull << 20, false, kSingleCopy);
  constexpr std::uint64_t n = 4 * kCell;  // a block
  j.each([&](int r) {
    auto w = j.ranks[static_cast<std::size_t>(r)]->world();
    std::vector<float> in(3 * n), out(3 * n);
    for (int it = 0; it < 200; ++it) {
      std::fill(in.begin(), in.end(), static_cast<float>(10 * it + r));
      w->alltoall(in.data(), out.data(), n, DType::Float32)->wait(10000ms);
      std::fill(in.begin(), in.end(), -1.f);
      for (std::uint64_t i = 0; i < 3 * n; i += 97)
        ASSERT_EQ(out[i], static_cast<float>(10 * it + static_cast<int>(i / n))) << "iteration " << it << ", " << i;
    }
  });
}

// A child running `sleep` (its exec done: the pipe closes on it), whose memory holds nothing at
// this process's heap addresses.
pid_t start_sleeper() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return -1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::execl("/bin/sleep", "sleep", "60", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(p[1]);
  char c;
  while (::read(p[0], &c, 1) > 0) {}
  ::close(p[0]);
  return child;
}

// A read that the kernel cannot make (here: rank 1's pid names another program, where its input's
// address is not mapped, or a child that has ended) fails that member with the reason, and what
// turns the path off unless the other member ended. The other, whose own read went through,
// finishes or fails; its next collective on the communicator fails naming the member (the lane
// is given up).
TEST(HostFastSingleCopy, AReadThatFailsIsANamedErrorAndEndsTheCommunicatorsFastPath) {
  SKIP_WITHOUT_PEER_READS();
  for (const bool ended : {false, true}) {
    SCOPED_TRACE(ended ? "the owner ended" : "the read refused");
    Job j(2, kCell, 1ull << 20, 1ull << 20, false, kSingleCopy);
    pid_t owner = -1;
    if (ended) {
      owner = ::fork();
      if (owner == 0) ::_exit(0);
      ::waitpid(owner, nullptr, 0);
    } else {
      owner = start_sleeper();
      ASSERT_GT(owner, 0);
    }
    j.daemon.segment().slot(1).pid = owner;  // rank 0 reads rank 1 from another process
    std::vector<std::string> errors(2);
    j.each([&](int r) {
      auto w = j.ranks[static_cast<std::size_t>(r)]->world();
      std::vector<float> in(kSingleCopy, 1.f), out(2 * kSingleCopy);
      try {
        w->allgather(in.data(), out.data(), kSingleCopy, DType::Float32)->wait(10000ms);
        if (r == 1) w->allgather(in.data(), out.data(), 1, DType::Float32)->wait(10000ms);
      } catch (const Error& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
    if (ended) {
      EXPECT_NE(errors[0].find("rank 1 (pid " + std::to_string(owner) + ") ended while this rank read its memory"),
                std::string::npos) << errors[0];
    } else {
      EXPECT_NE(errors[0].find("process_vm_readv"), std::string::npos) << errors[0];
      EXPECT_NE(errors[0].find("daemon.host_single_copy_kib=off"), std::string::npos) << errors[0];
    }
    EXPECT_NE(errors[1].find("rank 0"), std::string::npos) << errors[1];
    if (!ended) {
      ::kill(owner, SIGKILL);
      ::waitpid(owner, nullptr, 0);
    }
  }
}

// --- All-reduce by single copy: each member reduces a share, then reads the others' ------------

// Beyond the cells: with 2 members from its size (up to a bound where there is one), with 3 or
// 4 from the wide size, never with more, and never for another operation.
TEST(HostFastSingleCopyReduce, TakesAllReduceByMembersAndSize) {
  using smddp::client::host_fast::single_copy_reduce;
  constexpr std::uint64_t from = 64 << 10, upto = 4 << 20, wide = 16 << 20;
  EXPECT_TRUE(single_copy_reduce(OpType::AllReduce, from / 4, DType::Float32, 2, from, 0, wide));
  EXPECT_FALSE(single_copy_reduce(OpType::AllReduce, from / 4 - 1, DType::Float32, 2, from, 0, wide));
  EXPECT_TRUE(single_copy_reduce(OpType::AllReduce, 1ull << 30, DType::Float32, 2, from, 0, wide));  // no bound
  EXPECT_TRUE(single_copy_reduce(OpType::AllReduce, upto / 2, DType::Float16, 2, from, upto, 0));
  EXPECT_FALSE(single_copy_reduce(OpType::AllReduce, upto / 2 + 1, DType::Float16, 2, from, upto, 0));
  EXPECT_FALSE(single_copy_reduce(OpType::AllReduce, 1ull << 20, DType::Float32, 2, 0, 0, wide));  // off
  for (int members : {3, 4}) {
    EXPECT_FALSE(single_copy_reduce(OpType::AllReduce, wide / 4 - 1, DType::Float32, members, from, 0, wide));
    EXPECT_TRUE(single_copy_reduce(OpType::AllReduce, wide / 4, DType::Float32, members, from, 0, wide));
    EXPECT_FALSE(single_copy_reduce(OpType::AllReduce, 1ull << 30, DType::Float32, members, from, 0, 0));
  }
  EXPECT_FALSE(single_copy_reduce(OpType::AllReduce, 1ull << 30, DType::Float32, 5, from, 0, wide));
  EXPECT_FALSE(single_copy_reduce(OpType::AllReduce, 1ull << 30, DType::Float32, 8, from, 0, wide));
  for (auto op : {OpType::Reduce, OpType::ReduceScatter, OpType::AllGather, OpType::Broadcast})
    EXPECT_FALSE(single_copy_reduce(op, 1ull << 20, DType::Float32, 2, from, 0, wide)) << ipc::to_string(op);
}

// 2, 3 and 4 members, in and out of place, a count whose shares are uneven (whole 64-element
// runs; the last member's is shorter): every member ends with the same bits, the sum in
// group-rank order, for float32 sums (inexact), averages, maxima and int64 sums.
TEST(HostFastSingleCopyReduce, EveryMemberGetsTheSameBitsInAndOutOfPlace) {
  SKIP_WITHOUT_PEER_READS();
  for (int members : {2, 3, 4}) {
    SCOPED_TRACE(members);
    Job j(members, kCell, 1ull << 20, 1ull << 20, false, kSingleCopy, kSingleCopy);
    constexpr std::uint64_t n = 5000;  // 20,000 bytes: beyond the cells, 2.4x the single-copy size
    const auto value = [](int r, std::uint64_t i) { return 0.1f * static_cast<float>(i + 1) * static_cast<float>(r + 1) + 1e-3f * static_cast<float>(r); };
    std::vector<std::vector<float>> sums(static_cast<std::size_t>(members)), avgs = sums, maxes = sums, in_place = sums;
    std::vector<std::vector<std::int64_t>> ints(static_cast<std::size_t>(members));
    j.each([&](int r) {
      auto w = j.ranks[static_cast<std::size_t>(r)]->world();
      const auto rr = static_cast<std::size_t>(r);
      std::vector<float> in(n);
      for (std::uint64_t i = 0; i < n; ++i) in[i] = value(r, i);
      sums[rr].assign(n, -1.f);
      w->allreduce(in.data(), sums[rr].data(), n, DType::Float32, ReduceOp::Sum)->wait(10000ms);
      avgs[rr].assign(n, -1.f);
      w->allreduce(in.data(), avgs[rr].data(), n, DType::Float32, ReduceOp::Avg)->wait(10000ms);
      maxes[rr].assign(n, -1.f);
      std::vector<float> m(n);
      for (std::uint64_t i = 0; i < n; ++i) m[i] = static_cast<float>((i * 7 + static_cast<std::uint64_t>(r) * 13) % 101);
      w->allreduce(m.data(), maxes[rr].data(), n, DType::Float32, ReduceOp::Max)->wait(10000ms);
      std::vector<std::int64_t> k(n);
      for (std::uint64_t i = 0; i < n; ++i) k[i] = static_cast<std::int64_t>(i) * (1ll << 40) + r;
      ints[rr].assign(n, -1);
      w->allreduce(k.data(), ints[rr].data(), n, DType::Int64, ReduceOp::Sum)->wait(10000ms);
      in_place[rr] = in;
      w->allreduce(in_place[rr].data(), in_place[rr].data(), n, DType::Float32, ReduceOp::Sum)->wait(10000ms);
    });
    for (std::uint64_t i = 0; i < n; ++i) {
      float sum = value(0, i);
      float most = static_cast<float>((i * 7) % 101);
      std::int64_t isum = static_cast<std::int64_t>(i) * (1ll << 40);
      for (int r = 1; r < members; ++r) {
        sum += value(r, i);
        most = std::max(most, static_cast<float>((i * 7 + static_cast<std::uint64_t>(r) * 13) % 101));
        isum += static_cast<std::int64_t>(i) * (1ll << 40) + r;
      }
      ASSERT_EQ(sums[0][i], sum) << "sum " << i;
      ASSERT_NEAR(avgs[0][i], sum / static_cast<float>(members), 1e-5f * sum) << "avg " << i;
      ASSERT_EQ(maxes[0][i], most) << "max " << i;
      ASSERT_EQ(ints[0][i], isum) << "int64 sum " << i;
      ASSERT_EQ(in_place[0][i], sum) << "in-place sum " << i;
    }
    for (std::size_t r = 1; r < static_cast<std::size_t>(members); ++r) {
      EXPECT_EQ(0, std::memcmp(sums[r].data(), sums[0].data(), n * 4)) << "rank " << r;
      EXPECT_EQ(0, std::memcmp(avgs[r].data(), avgs[0].data(), n * 4)) << "rank " << r;
      EXPECT_EQ(0, std::memcmp(maxes[r].data(), maxes[0].data(), n * 4)) << "rank " << r;
      EXPECT_EQ(ints[r], ints[0]) << "rank " << r;
      EXPECT_EQ(0, std::memcmp(in_place[r].data(), sums[0].data(), n * 4)) << "rank " << r;
    }
    j.daemon.settle();
    const auto nm = static_cast<std::size_t>(members);
    EXPECT_EQ(j.single_copy_requests(), 5 * nm);
    EXPECT_EQ(j.daemon.requests().size(), 5 * nm);  // none through the daemon
  }
}

// Rank 1, played by the test: publishes the world's first fast op, a float32 sum all-reduce of n
// elements by single copy, from `in` into `out`.
void publish_allreduce_of_rank_1(ipc::Segment& seg, std::uint64_t n, std::vector<float>& in, std::vector<float>& out) {
  auto& cell = seg.fast_cell(1, 0, 1);
  cell.comm_id = 0;
  cell.seq = 1;
  cell.count = n;
  cell.op = OpType::AllReduce;
  cell.dtype = DType::Float32;
  cell.reduce_op = ReduceOp::Sum;
  cell.by_address = 1;
  ipc::Segment::set_fast_address(cell, reinterpret_cast<std::uintptr_t>(in.data()));
  ipc::Segment::set_fast_output_address(cell, reinterpret_cast<std::uintptr_t>(out.data()));
  cell.tag.store(1, std::memory_order_release);
}

// The phases, with rank 1 played by the test: rank 0, in place, reduces share 0 (reading rank
// 1's input) and marks it; it writes share 1 of its tensor, which rank 1 reads as input, only
// once rank 1 marked its share reduced; and it returns only once rank 1 is done reading.
TEST(HostFastSingleCopyReduce, AMemberWritesAShareOfItsTensorOnlyOnceItsOwnerReducedIt) {
  SKIP_WITHOUT_PEER_READS();
  Job j(2, kCell, 1ull << 20, 1ull << 20, false, kSingleCopy, kSingleCopy);
  constexpr std::uint64_t n = 4096;  // shares of 2048
  const std::uint64_t half = ipc::share_range(n, 2, 1).first;
  ASSERT_EQ(half, 2048u);
  std::vector<float> x0(n, 1.f), in1(n, 2.f), out1(n, -1.f);
  auto& seg = j.daemon.segment();
  publish_allreduce_of_rank_1(seg, n, in1, out1);
  auto work = j.ranks[0]->world()->allreduce(x0.data(), x0.data(), n, DType::Float32, ReduceOp::Sum);
  const auto poll_until = [&](const std::function<bool()>& f) {
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (!f() && std::chrono::steady_clock::now() < until) {
      work->test();
      std::this_thread::sleep_for(1ms);
    }
    return f();
  };
  auto& done0 = seg.slot(0).fast_done[0];
  ASSERT_TRUE(poll_until([&] { return done0.reduced.load() == 1; }));
  EXPECT_EQ(x0[0], 3.f);
  EXPECT_EQ(x0[half - 1], 3.f);
  std::this_thread::sleep_for(50ms);
  work->test();
  EXPECT_EQ(x0[half], 1.f) << "rank 0 wrote share 1 while rank 1 may still read it as input";
  EXPECT_EQ(done0.k.load(), 0u);
  // Rank 1 reduces its share into its output and marks it.
  for (std::uint64_t i = half; i < n; ++i) out1[i] = 1.f + in1[i];
  seg.slot(1).fast_done[0].reduced.store(1, std::memory_order_release);
  seg.slot(0).client_bell.ring();
  ASSERT_TRUE(poll_until([&] { return done0.k.load() == 1; }));
  EXPECT_EQ(x0[half], 3.f);
  EXPECT_EQ(x0[n - 1], 3.f);
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(work->test()) << "rank 0 returned while rank 1 may still read its share";
  seg.slot(1).fast_done[0].k.store(1, std::memory_order_release);
  seg.slot(0).client_bell.ring();
  work->wait(5000ms);
}

// End to end: each member writes over its tensor as soon as its in-place all-reduce returns,
// and no member ever reads the new values.
TEST(HostFastSingleCopyReduce, AMemberMayWriteOverItsTensorAsSoonAsItsCallReturns) {
  SKIP_WITHOUT_PEER_READS();
  Job j(3, kCell, 1ull << 20, 1ull << 20, false, kSingleCopy, kSingleCopy);
  constexpr std::uint64_t n = 3 * kCell + 100;
  j.each([&](int r) {
    auto w = j.ranks[static_cast<std::size_t>(r)]->world();
    std::vector<float> x(n);
    for (int it = 0; it < 200; ++it) {
      std::fill(x.begin(), x.end(), static_cast<float>(it + r));
      w->allreduce(x.data(), x.data(), n, DType::Float32, ReduceOp::Sum)->wait(10000ms);
      const float want = static_cast<float>(3 * it + 3);
      for (std::uint64_t i = 0; i < n; i += 61) ASSERT_EQ(x[i], want) << "iteration " << it << ", " << i;
      ASSERT_EQ(x[n - 1], want) << "iteration " << it;
      std::fill(x.begin(), x.end(), -1000.f);
    }
  });
}

// A member that gives the lane up (its op failed) before it reduced its share ends the other's
// wait with an error naming it, instead of a hang.
TEST(HostFastSingleCopyReduce, AMemberThatGaveUpBeforeItsShareEndsTheOthersWait) {
  SKIP_WITHOUT_PEER_READS();
  Job j(2, kCell, 1ull << 20, 1ull << 20, false, kSingleCopy, kSingleCopy);
  constexpr std::uint64_t n = 4096;
  std::vector<float> x0(n, 1.f), in1(n, 2.f), out1(n, -1.f);
  auto& seg = j.daemon.segment();
  publish_allreduce_of_rank_1(seg, n, in1, out1);
  auto work = j.ranks[0]->world()->allreduce(x0.data(), x0.data(), n, DType::Float32, ReduceOp::Sum);
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (seg.slot(0).fast_done[0].reduced.load() != 1 && std::chrono::steady_clock::now() < until) {
    work->test();
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(seg.slot(0).fast_done[0].reduced.load(), 1u);
  seg.slot(1).fast_done[0].given_up.store(1, std::memory_order_release);
  seg.slot(0).client_bell.ring();
  try {
    work->wait(5000ms);
    ADD_FAILURE() << "the all-reduce finished without rank 1's share";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::PeerFailed) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1 gave up"), std::string::npos) << e.what();
  }
}

}  // namespace
