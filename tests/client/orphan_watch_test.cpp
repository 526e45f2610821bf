// The orphan watch: a rank whose parent daemon dies is ended after the grace; one whose daemon
// lives, or that is not its daemon's child, is left alone. The test process is a subreaper, so
// the orphaned "rank" becomes its child and can be waited for.
#include "client/orphan_watch.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <thread>

namespace smddp::client {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Forks a "daemon" that forks a "rank"; the rank arms the watch naming `watched` (its parent's
// pid when `watched` is 0) and sleeps. The daemon writes the rank's pid to the pipe and, if
// `daemon_dies`, exits. Returns the rank's pid, with the daemon reaped when it died.
struct Family {
  pid_t daemon = -1, rank = -1;
};
Family start(bool daemon_dies, pid_t watched) {
  int fd[2];
  EXPECT_EQ(::pipe(fd), 0);
  Family f;
  f.daemon = ::fork();
  if (f.daemon == 0) {
    int ready[2];
    if (::pipe(ready) != 0) ::_exit(2);
    const pid_t rank = ::fork();
    if (rank == 0) {
      watch_for_orphaning(watched ? watched : ::getppid(), 1s);
      [[maybe_unused]] auto n = ::write(ready[1], "r", 1);
      for (;;) ::pause();
    }
    char c;
    [[maybe_unused]] auto r = ::read(ready[0], &c, 1);  // the watch is armed
    [[maybe_unused]] auto w = ::write(fd[1], &rank, sizeof rank);
    if (daemon_dies) ::_exit(0);
    for (;;) ::pause();
  }
  ::close(fd[1]);
  EXPECT_EQ(::read(fd[0], &f.rank, sizeof f.rank), static_cast<ssize_t>(sizeof f.rank));
  ::close(fd[0]);
  if (daemon_dies) {
    int st = 0;
    ::waitpid(f.daemon, &st, 0);
  }
  return f;
}

// The rank's wait status once it ended (it is our child once orphaned), or nothing by `limit`.
std::optional<int> ended_within(pid_t rank, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    int st = 0;
    if (::waitpid(rank, &st, WNOHANG) == rank) return st;
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

class OrphanWatch : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }
  void TearDown() override { ::prctl(PR_SET_CHILD_SUBREAPER, 0); }
  // Ends what a test left running.
  static void end(pid_t pid) {
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
  }
};

TEST_F(OrphanWatch, ARankWhoseDaemonDiedIsEndedAfterTheGrace) {
  const auto f = start(/*daemon_dies=*/true, 0);
  const auto died_at = Clock::now();
  const auto st = ended_within(f.rank, 10s);
  ASSERT_TRUE(st) << "the orphaned rank is still running";
  EXPECT_TRUE(WIFSIGNALED(*st) && WTERMSIG(*st) == SIGTERM) << *st;
  EXPECT_GE(Clock::now() - died_at, 1s) << "the grace comes first";
}

TEST_F(OrphanWatch, ARankWhoseDaemonLivesIsLeftAlone) {
  const auto f = start(/*daemon_dies=*/false, 0);
  EXPECT_FALSE(ended_within(f.rank, 3s));
  end(f.daemon);  // the rank is orphaned now, and ended by its watch or by us
  if (!ended_within(f.rank, 10s)) end(f.rank);
}

TEST_F(OrphanWatch, ARankThatIsNotItsDaemonsChildIsNotWatched) {
  // Plain mpirun or torchrun: the daemon is not the rank's parent.
  const auto f = start(/*daemon_dies=*/true, /*watched=*/::getpid());
  EXPECT_FALSE(ended_within(f.rank, 3500ms));
  end(f.rank);
}

TEST(OrphanGrace, IsTheDaemonsNumberOrElseTheDefault) {
  ::unsetenv("SMDDP_ORPHAN_GRACE_S");
  EXPECT_EQ(orphan_grace_from_env(), kOrphanGrace);
  ::setenv("SMDDP_ORPHAN_GRACE_S", "1800", 1);
  EXPECT_EQ(orphan_grace_from_env(), 1800s);
  for (const char* bad : {"", "0", "-5", "12x", "x"}) {
    ::setenv("SMDDP_ORPHAN_GRACE_S", bad, 1);
    EXPECT_EQ(orphan_grace_from_env(), kOrphanGrace) << "'" << bad << "'";
  }
  ::unsetenv("SMDDP_ORPHAN_GRACE_S");
}

}  // namespace
}  // namespace smddp::client
