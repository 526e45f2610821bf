#include "daemon/job_cleanup.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ipc/names.hpp"
#include "ipc/segment.hpp"

using namespace std::chrono_literals;
using smddp::daemon::cleanup_job;
namespace ipc = smddp::ipc;

namespace {

std::string unique_job(const char* tag) { return std::string("t-clean-") + tag + "-" + std::to_string(::getpid()); }

// A daemon of `job` on node 0 that creates its segment, then lives `life` (forever if zero)
// and ends without unlinking it, as one that mpirun killed does. Returns once the segment names it.
pid_t daemon_that_dies_after(const std::string& job, std::chrono::milliseconds life) {
  const pid_t child = ::fork();
  if (child == 0) {
    ipc::SegmentSpec s;
    s.job_id = job;
    s.arena_bytes = 1 << 20;
    auto seg = ipc::Segment::create(s);
    seg.disown();
    if (life.count() == 0) ::pause();
    std::this_thread::sleep_for(life);
    ::_exit(0);
  }
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (ipc::Segment::owner_pid(job, 0) != child && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  return child;
}

// Reaps `child` in the background as its parent would, so its pid stops being alive.
std::thread reaper(pid_t child) {
  return std::thread([child] { ::waitpid(child, nullptr, 0); });
}

}  // namespace

// mpirun can return while a daemon it killed is still going away: the cleanup that follows
// must wait for it rather than skip its segment as a live daemon's.
TEST(JobCleanup, WaitsForADaemonStillExitingThenRemovesItsSegment) {
  const auto job = unique_job("exiting");
  const pid_t child = daemon_that_dies_after(job, 400ms);
  ASSERT_GT(child, 0);
  ASSERT_EQ(ipc::Segment::owner_pid(job, 0), child);
  auto reap = reaper(child);
  const auto report = cleanup_job(job, 10s);
  reap.join();
  EXPECT_GE(report.removed, 1);
  EXPECT_TRUE(report.nodes_left.empty());
  EXPECT_FALSE(ipc::Segment::exists(job, 0)) << "the segment of the daemon that ended must be gone";
}

// A daemon that outlives the wait is reported with its pid and left alone: operators run the
// same command beside live jobs.
TEST(JobCleanup, ALiveDaemonIsReportedAndLeftAlone) {
  const auto job = unique_job("live");
  const pid_t child = daemon_that_dies_after(job, 0ms);
  ASSERT_GT(child, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto report = cleanup_job(job, 300ms);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms) << "it must have waited for the daemon";
  ASSERT_EQ(report.nodes_left.size(), 1u);
  EXPECT_EQ(report.nodes_left[0], 0);
  EXPECT_EQ(report.owners_left[0], child);
  EXPECT_TRUE(ipc::Segment::exists(job, 0));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const auto after = cleanup_job(job, 1s);
  EXPECT_TRUE(after.nodes_left.empty());
  EXPECT_FALSE(ipc::Segment::exists(job, 0));
}

// A control socket whose node has no segment left is a leftover too.
TEST(JobCleanup, RemovesTheSocketOfANodeWithoutADaemon) {
  const auto job = unique_job("sock");
  const auto dir = std::filesystem::temp_directory_path() / ("smddp-clean-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all);
  ::setenv("SMDDP_SOCKET_DIR", dir.c_str(), 1);
  const auto sock = ipc::socket_path(job, 3);
  std::ofstream(sock) << "";
  ASSERT_TRUE(std::filesystem::exists(sock));
  const auto report = cleanup_job(job, 1s);
  ::unsetenv("SMDDP_SOCKET_DIR");
  EXPECT_EQ(report.removed, 1);
  EXPECT_TRUE(report.nodes_left.empty());
  EXPECT_FALSE(std::filesystem::exists(sock));
  std::filesystem::remove_all(dir);
}
