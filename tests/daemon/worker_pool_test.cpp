// WorkerPool: every index runs exactly once per call, with any number of threads and tasks,
// and a call returns only after all of its work is done (checked without sleeping; TSan
// checks the hand-offs).
#include "daemon/worker_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace smddp::daemon {
namespace {

// Runs parallel_for(tasks) and checks each index ran exactly once.
void expect_each_once(WorkerPool& pool, int tasks) {
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(tasks));
  pool.parallel_for(tasks, [&](int i) {
    ASSERT_GE(i, 0);
    ASSERT_LT(i, tasks);
    hits[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
  });
  for (int i = 0; i < tasks; ++i)
    ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << "index " << i << " of " << tasks;
}

TEST(WorkerPool, ParallelismCountsTheCaller) {
  WorkerPool one(1), four(4);
  EXPECT_EQ(one.parallelism(), 1);
  EXPECT_EQ(four.parallelism(), 4);
  WorkerPool zero(0);  // no workers: the caller does everything
  EXPECT_EQ(zero.parallelism(), 1);
  expect_each_once(zero, 5);
}

TEST(WorkerPool, SingleThreadRunsInOrderOnTheCaller) {
  WorkerPool pool(1);
  std::vector<int> order;
  const auto caller = std::this_thread::get_id();
  pool.parallel_for(6, [&](int i) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(i);
  });
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST(WorkerPool, ZeroOrNegativeTasksRunNothing) {
  WorkerPool pool(3);
  int calls = 0;
  pool.parallel_for(0, [&](int) { ++calls; });
  pool.parallel_for(-4, [&](int) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(WorkerPool, EveryIndexOnceForManyShapes) {
  for (int threads : {2, 3, 4, 8}) {
    WorkerPool pool(threads);
    for (int tasks : {1, 2, threads - 1, threads, threads + 1, 3 * threads, 1000}) {
      if (tasks < 1) continue;
      SCOPED_TRACE(testing::Message() << threads << " threads, " << tasks << " tasks");
      expect_each_once(pool, tasks);
    }
  }
}

TEST(WorkerPool, RepeatedCallsSeeOnlyTheirOwnLoop) {
  // A worker waking late must not run an old loop's function, nor miss a new one's tasks.
  WorkerPool pool(4);
  std::vector<int> sums(500, 0);
  for (int call = 0; call < 500; ++call) {
    std::atomic<int> sum{0};
    std::atomic<int> seen{0};
    const int tasks = 1 + call % 13;
    pool.parallel_for(tasks, [&, call](int i) {
      sum.fetch_add(call * 100 + i, std::memory_order_relaxed);
      seen.fetch_add(1, std::memory_order_relaxed);
    });
    ASSERT_EQ(seen.load(), tasks) << "call " << call;
    ASSERT_EQ(sum.load(), call * 100 * tasks + tasks * (tasks - 1) / 2) << "call " << call;
  }
}

TEST(WorkerPool, ResultsWrittenByWorkersAreVisibleAfterTheCall) {
  // Plain (non-atomic) writes by workers, read by the caller after parallel_for: the pool's
  // synchronization must order them (TSan reports a race otherwise).
  WorkerPool pool(4);
  std::vector<std::uint64_t> out(64);
  for (int round = 0; round < 50; ++round) {
    pool.parallel_for(64, [&](int i) {
      std::uint64_t v = 0;
      for (int k = 0; k <= i; ++k) v += static_cast<std::uint64_t>(k + round);
      out[static_cast<std::size_t>(i)] = v;
    });
    for (int i = 0; i < 64; ++i)
      ASSERT_EQ(out[static_cast<std::size_t>(i)],
                static_cast<std::uint64_t>(i) * (i + 1) / 2 + static_cast<std::uint64_t>(round) * (i + 1));
  }
}

TEST(WorkerPool, UsesMoreThanOneThreadWhenTasksBlockUntilOthersRun) {
  // Two tasks that each wait for the other can only finish on two threads at once: proves the
  // workers take part (no timing involved: it would hang, and ctest's timeout would fail it).
  WorkerPool pool(2);
  std::atomic<int> arrived{0};
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.parallel_for(2, [&](int) {
    {
      std::lock_guard lk(mu);
      ids.insert(std::this_thread::get_id());
    }
    arrived.fetch_add(1);
    while (arrived.load() < 2) std::this_thread::yield();
  });
  EXPECT_EQ(ids.size(), 2u);
}

// Small loops run on the caller alone, in order (waking the workers would cost more than the
// work); loops moving kInlineBytes or more are shared as before.
TEST(WorkerPool, LoopsMovingLittleRunOnTheCaller) {
  WorkerPool pool(4);
  const auto caller = std::this_thread::get_id();
  std::vector<int> order;
  pool.parallel_for(8, WorkerPool::kInlineBytes - 1, [&](int i) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(i);
  });
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Two tasks that each wait for the other finish only when two threads run them.
  std::atomic<int> arrived{0};
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.parallel_for(2, WorkerPool::kInlineBytes, [&](int) {
    {
      std::lock_guard lk(mu);
      ids.insert(std::this_thread::get_id());
    }
    arrived.fetch_add(1);
    while (arrived.load() < 2) std::this_thread::yield();
  });
  EXPECT_EQ(ids.size(), 2u);
}

TEST(WorkerPool, DestroysCleanlyRightAfterConstruction) {
  for (int i = 0; i < 20; ++i) {
    WorkerPool pool(4);
  }
  SUCCEED();
}

}  // namespace
}  // namespace smddp::daemon
