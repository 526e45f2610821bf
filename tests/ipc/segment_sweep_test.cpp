// Segment::remove_all_stale sweeps every segment of this user, so these tests run alone
// (RUN_SERIAL): a sweep beside another test would take that test's deliberate leftovers.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ipc/names.hpp"
#include "ipc/segment.hpp"
#include "segment_fixtures.hpp"

using namespace smddp::ipc;
using namespace std::chrono_literals;

using smddp::ipc::fixtures::crashed_daemon;
using smddp::ipc::fixtures::small_spec;
using smddp::ipc::fixtures::unique_job;

namespace {

std::filesystem::path shm(const std::string& job) { return std::filesystem::path("/dev/shm") / segment_name(job, 0); }


bool removed(const std::vector<StaleSegment>& v, const std::string& job) {
  return std::any_of(v.begin(), v.end(), [&](const StaleSegment& s) { return s.job_id == job; });
}

// Points the control sockets at a folder of this test's own.
struct SocketDir {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("smddp-sweep-" + std::to_string(::getpid()));
  SocketDir() {
    std::filesystem::create_directories(dir);
    ::setenv("SMDDP_SOCKET_DIR", dir.c_str(), 1);
  }
  ~SocketDir() {
    ::unsetenv("SMDDP_SOCKET_DIR");
    std::filesystem::remove_all(dir);
  }
};

}  // namespace

TEST(SegmentSweep, RemovesADeadDaemonsSegmentSocketAndFabricRegionsAndKeepsLiveOnes) {
  SocketDir sockets;
  const auto dead_job = unique_job("sweep-dead"), live_job = unique_job("sweep-live");
  const pid_t child = crashed_daemon(dead_job);
  ASSERT_GT(child, 0);
  const auto sock = std::filesystem::path(socket_path(dead_job, 0));
  std::ofstream(sock) << "socket";
  const auto region = std::filesystem::path("/dev/shm") / (std::to_string(child) + ":0:0");
  std::ofstream(region) << "region";
  auto live = Segment::create(small_spec(live_job));

  const auto t0 = std::chrono::steady_clock::now();
  const auto out = Segment::remove_all_stale(200ms);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 200ms) << "a candidate must be watched before it goes";
  ASSERT_TRUE(removed(out, dead_job));
  const auto& s = *std::find_if(out.begin(), out.end(), [&](const StaleSegment& x) { return x.job_id == dead_job; });
  EXPECT_EQ(s.daemon_pid, child);
  EXPECT_EQ(s.node_id, 0);
  EXPECT_EQ(s.name, segment_name(dead_job, 0));
  EXPECT_FALSE(std::filesystem::exists(shm(dead_job)));
  EXPECT_FALSE(std::filesystem::exists(sock)) << "the dead daemon's control socket goes with its segment";
  EXPECT_FALSE(std::filesystem::exists(region)) << "and so do its libfabric regions";
  EXPECT_FALSE(removed(out, live_job));
  EXPECT_TRUE(std::filesystem::exists(shm(live_job)));
  std::filesystem::remove(region);
}

TEST(SegmentSweep, NothingToRemoveReturnsAtOnce) {
  Segment::remove_all_stale(0ms);  // what earlier tests of the run may have left
  const auto t0 = std::chrono::steady_clock::now();
  const auto out = Segment::remove_all_stale(5s);
  EXPECT_TRUE(out.empty());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s) << "no candidates, no wait";
}

// A daemon in another pid namespace sharing /dev/shm looks dead to kill() from here; its
// heartbeat still moves, and that keeps its segment.
TEST(SegmentSweep, AMovingHeartbeatKeepsASegmentWhoseOwnerLooksDead) {
  const auto job = unique_job("sweep-foreign");
  const pid_t gone = crashed_daemon(unique_job("sweep-gone"));  // a pid that is surely not alive
  ASSERT_GT(gone, 0);
  Segment::remove_all_stale(0ms);  // clears that helper's own segment
  auto seg = Segment::create(small_spec(job));
  seg.header().daemon_pid = gone;
  std::atomic<bool> stop{false};
  std::thread beat([&] {
    while (!stop.load()) {
      seg.header().heartbeat.fetch_add(1);
      std::this_thread::sleep_for(10ms);
    }
  });
  const auto out = Segment::remove_all_stale(300ms);
  stop.store(true);
  beat.join();
  EXPECT_FALSE(removed(out, job));
  EXPECT_TRUE(std::filesystem::exists(shm(job)));
  // The same segment with its heartbeat stopped is a leftover.
  const auto again = Segment::remove_all_stale(300ms);
  EXPECT_TRUE(removed(again, job));
  EXPECT_FALSE(std::filesystem::exists(shm(job)));
}

TEST(SegmentSweep, AnotherUsersSegmentIsLeftAlone) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a segment to another user";
  const auto job = unique_job("sweep-other-user");
  ASSERT_GT(crashed_daemon(job), 0);
  ASSERT_EQ(::chown(shm(job).c_str(), 65534, 65534), 0);  // nobody
  const auto out = Segment::remove_all_stale(100ms);
  EXPECT_FALSE(removed(out, job));
  EXPECT_TRUE(std::filesystem::exists(shm(job)));
  Segment::remove(job, 0);
}
