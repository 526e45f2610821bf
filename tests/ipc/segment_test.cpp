#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ipc/names.hpp"
#include "ipc/segment.hpp"
#include "segment_fixtures.hpp"

using namespace smddp::ipc;

using smddp::ipc::fixtures::crashed_daemon;
using smddp::ipc::fixtures::small_spec;
using smddp::ipc::fixtures::unique_job;

TEST(Segment, CreateAttachAndRemove) {
  const auto job = unique_job("basic");
  const auto path = std::filesystem::path("/dev/shm") / segment_name(job, 0);
  {
    auto seg = Segment::create(small_spec(job));
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    auto view = Segment::attach(job, 0);
    EXPECT_EQ(view.header().daemon_pid, ::getpid());
    EXPECT_EQ(view.header().local_world_size, 2);
    EXPECT_EQ(view.slot(1).rank, 1);
    EXPECT_EQ(view.arena(1).size(), 1u << 20);
    // Both mappings see the same memory.
    seg.arena(1)[5] = std::byte{42};
    EXPECT_EQ(view.arena(1)[5], std::byte{42});
    EXPECT_NE(seg.arena(0).data(), seg.arena(1).data());
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "the owner must unlink on destruction";
}

TEST(Segment, LiveOwnerIsAnError) {
  const auto job = unique_job("live");
  auto seg = Segment::create(small_spec(job));
  try {
    Segment::create(small_spec(job));
    FAIL() << "second create succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("already has a daemon on this node, pid " + std::to_string(::getpid())),
              std::string::npos)
        << e.what();
  }
}

TEST(Segment, StaleSegmentOfDeadDaemonIsReplaced) {
  const auto job = unique_job("stale");
  ASSERT_GT(crashed_daemon(job), 0);
  ASSERT_TRUE(Segment::exists(job, 0));
  auto seg = Segment::create(small_spec(job));  // replaces it
  EXPECT_EQ(seg.header().daemon_pid, ::getpid());
}

// A daemon killed outright also leaves libfabric's shm-provider regions, named for its pid
// (/dev/shm/<pid>:<domain>:<endpoint>, 16 MiB each): removing its stale segment removes them,
// and nothing named for a live process.
TEST(Segment, RemovingAStaleSegmentRemovesItsDaemonsFabricRegions) {
  const auto job = unique_job("fabric");
  const pid_t child = crashed_daemon(job);
  ASSERT_GT(child, 0);
  const auto dead_region = std::filesystem::path("/dev/shm") / (std::to_string(child) + ":0:0");
  const auto live_region = std::filesystem::path("/dev/shm") / (std::to_string(::getpid()) + ":9:9");
  const auto other_name = std::filesystem::path("/dev/shm") / (std::to_string(child) + ":notours");
  std::ofstream(dead_region) << "region";
  std::ofstream(live_region) << "region";
  std::ofstream(other_name) << "x";
  ASSERT_TRUE(std::filesystem::exists(dead_region));
  EXPECT_TRUE(Segment::remove_if_stale(job, 0));
  EXPECT_FALSE(std::filesystem::exists(dead_region));
  EXPECT_TRUE(std::filesystem::exists(live_region));
  EXPECT_TRUE(std::filesystem::exists(other_name)) << "only <pid>:<digits>:<digits> names are libfabric's";
  std::filesystem::remove(live_region);
  std::filesystem::remove(other_name);
  std::filesystem::remove(dead_region);
}

TEST(Segment, RemoveIfStaleKeepsLiveOnes) {
  const auto job = unique_job("keep");
  auto seg = Segment::create(small_spec(job));
  EXPECT_FALSE(Segment::remove_if_stale(job, 0));
  EXPECT_TRUE(Segment::exists(job, 0));
}

TEST(Segment, VersionMismatchNamesBothVersions) {
  const auto job = unique_job("ver");
  auto seg = Segment::create(small_spec(job));
  seg.header().layout_version = kLayoutVersion + 7;
  try {
    Segment::attach(job, 0);
    FAIL();
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(std::to_string(kLayoutVersion + 7)), std::string::npos) << m;
    EXPECT_NE(m.find("version " + std::to_string(kLayoutVersion)), std::string::npos) << m;
  }
}

TEST(Segment, AttachWithoutDaemonSaysSo) {
  try {
    Segment::attach(unique_job("none"), 3);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no smddp daemon"), std::string::npos);
  }
}

TEST(Names, JobIdsAreChecked) {
  EXPECT_NO_THROW(check_job_id("job-1.a_b"));
  EXPECT_THROW(check_job_id(""), std::invalid_argument);
  EXPECT_THROW(check_job_id("../etc"), std::invalid_argument);
  EXPECT_THROW(check_job_id("a b"), std::invalid_argument);
  EXPECT_THROW(check_job_id(std::string(49, 'a')), std::invalid_argument);
  EXPECT_EQ(segment_name("j", 2), "smddp.j.n2");
}

TEST(Names, SocketDirIsPrivate) {
  const auto dir = std::filesystem::temp_directory_path() / ("smddp-sock-test-" + std::to_string(::getpid()));
  ::setenv("SMDDP_SOCKET_DIR", dir.c_str(), 1);
  ::mkdir(dir.c_str(), 0755);
  EXPECT_EQ(ensure_socket_dir(), dir);
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(socket_path("j", 1), dir / "j.n1.sock");
  std::filesystem::remove_all(dir);
  ::unsetenv("SMDDP_SOCKET_DIR");
}

TEST(ProcessAlive, ZombiesCountAsGone) {
  EXPECT_TRUE(smddp::ipc::process_alive(::getpid()));
  EXPECT_FALSE(smddp::ipc::process_alive(0));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  // Not reaped yet: a zombie until waitpid below. Poll until the kernel has turned it into one.
  bool gone = false;
  for (int i = 0; i < 2000 && !gone; ++i) {
    gone = !smddp::ipc::process_alive(child);
    if (!gone) ::usleep(1000);
  }
  EXPECT_TRUE(gone) << "an exited, unreaped child still counts as alive";
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(smddp::ipc::process_alive(child));
}

TEST(ProcessStopped, SeesSigstopAndSigcont) {
  EXPECT_FALSE(smddp::ipc::process_stopped(::getpid()));
  EXPECT_FALSE(smddp::ipc::process_stopped(0));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) ::pause();
  }
  const auto becomes = [&](bool stopped) {
    for (int i = 0; i < 2000; ++i) {
      if (smddp::ipc::process_stopped(child) == stopped) return true;
      ::usleep(1000);
    }
    return false;
  };
  EXPECT_TRUE(becomes(false));
  ::kill(child, SIGSTOP);
  EXPECT_TRUE(becomes(true)) << "a SIGSTOPped child does not read as stopped";
  ::kill(child, SIGCONT);
  EXPECT_TRUE(becomes(false)) << "a continued child still reads as stopped";
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(smddp::ipc::process_stopped(child));
}
