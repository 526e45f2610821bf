// The daemon is a forked child that owns the segment (so daemon_pid is the child's pid) and
// dies while a rank waits on it.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "fake_daemon.hpp"
#include "ipc/names.hpp"

using namespace std::chrono_literals;
using smddp::client::Client;
using smddp::client::DType;
using smddp::client::Error;
using smddp::client::ReduceOp;
using smddp::client::Status;
using smddp::testing::attach_options;
using smddp::testing::FakeDaemon;
using smddp::testing::small_spec;
using smddp::testing::unique_job;
namespace ipc = smddp::ipc;

namespace {

// Child: create the segment, say so on `ready`, keep the heartbeat going, exit (without
// unlinking the segment, as a crashed daemon would) when `go` is written or closed.
[[noreturn]] void run_doomed_daemon(const std::string& job, int ready, int go) {
  int code = 0;
  try {
    auto seg = ipc::Segment::create(small_spec(job));
    seg.header().state.store(static_cast<std::uint32_t>(ipc::DaemonState::Ready));
    const char c = 'r';
    if (::write(ready, &c, 1) != 1) code = 2;
    for (;;) {
      seg.header().heartbeat.fetch_add(1);
      pollfd p{go, POLLIN, 0};
      if (::poll(&p, 1, 50) != 0) break;
    }
    seg.disown();
  } catch (...) {
    code = 3;
  }
  ::_exit(code);  // no destructors, no gtest teardown in the child
}

// Removes the segment and kills the child if the test ends early.
struct ChildGuard {
  std::string job;
  pid_t pid = -1;
  ~ChildGuard() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    ipc::Segment::remove(job, 0);
  }
};

// Forks a doomed daemon of `job` (owned by `guard`) and waits until it is ready. Returns the pipe
// end whose closing makes it exit, or -1 if it did not start. Call it before this process has a
// thread of ours (the client starts one): fork copies only the calling thread.
int start_doomed_daemon(const std::string& job, ChildGuard& guard) {
  int ready[2], go[2];
  if (::pipe(ready) != 0) return -1;
  if (::pipe(go) != 0) {
    ::close(ready[0]);
    ::close(ready[1]);
    return -1;
  }
  guard.pid = ::fork();
  if (guard.pid == 0) {
    ::close(ready[0]);
    ::close(go[1]);
    run_doomed_daemon(job, ready[1], go[0]);
  }
  ::close(ready[1]);
  ::close(go[0]);
  char c = 0;
  const bool started = guard.pid > 0 && ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  if (!started) {
    ::close(go[1]);
    return -1;
  }
  return go[1];
}

}  // namespace

TEST(DaemonDeath, PendingWaitThrowsPeerFailedAndTheSegmentIsRemoved) {
  const auto job = unique_job("death");
  const auto shm = std::filesystem::path("/dev/shm") / ipc::segment_name(job, 0);
  ChildGuard guard{job};
  const int go = start_doomed_daemon(job, guard);
  ASSERT_GE(go, 0) << "the child daemon did not start";

  auto client = Client::attach(attach_options(job));
  EXPECT_EQ(client->daemon_pid(), guard.pid);
  std::vector<float> buf(1000, 1.0f);
  auto w = client->world()->allreduce(buf.data(), buf.data(), buf.size(), DType::Float32, ReduceOp::Sum);
  EXPECT_FALSE(w->test());

  // The daemon dies while wait() below is pending; reaping it makes its pid disappear.
  const pid_t child = guard.pid;
  std::thread killer([&] {
    std::this_thread::sleep_for(100ms);
    ::close(go);
    int st = 0;
    if (::waitpid(child, &st, 0) == child) guard.pid = -1;
  });
  const auto t0 = std::chrono::steady_clock::now();
  Status status = Status::Ok;
  std::string what;
  try {
    w->wait(20s);
  } catch (const Error& e) {
    status = e.status();
    what = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  killer.join();
  EXPECT_EQ(status, Status::PeerFailed) << what;
  const std::string expected = "smddp daemon (pid " + std::to_string(child) + ") on node 0 died";
  EXPECT_NE(what.find(expected), std::string::npos) << what;
  EXPECT_LT(took, 5s);
  EXPECT_TRUE(w->done());
  EXPECT_EQ(w->status(), Status::PeerFailed);
  EXPECT_FALSE(std::filesystem::exists(shm)) << "the client must remove a dead daemon's segment";

  // The client stays unusable and says why.
  EXPECT_NE(client->job_error().find(expected), std::string::npos) << client->job_error();
  try {
    client->world()->barrier();
    ADD_FAILURE() << "a submission after the daemon died was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::PeerFailed);
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST(DaemonDeath, HungDaemonIsDetectedByItsHeartbeat) {
  const auto job = unique_job("hung");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return smddp::testing::Answer{smddp::testing::Answer::Hold}; });
  daemon.start();
  auto client = Client::attach(attach_options(job));
  std::vector<float> buf(100, 1.0f);
  auto w = client->world()->allreduce(buf.data(), buf.data(), buf.size(), DType::Float32, ReduceOp::Sum);
  ASSERT_TRUE(daemon.wait_for_requests(1));
  daemon.freeze_heartbeat(true);
  try {
    w->wait(20s);
    ADD_FAILURE() << "wait() returned although the daemon stopped its heartbeat";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::PeerFailed) << e.what();
    EXPECT_NE(std::string(e.what()).find("stopped responding"), std::string::npos) << e.what();
  }
  // A live but hung daemon keeps its segment: only a dead one's is removed.
  EXPECT_TRUE(ipc::Segment::exists(job, 0));
}

// A killed job leaves its segment marked Ready; a rank of a later job with the same id must not
// attach to it (its daemon is gone), and attaches once a new daemon has replaced it.
TEST(DaemonDeath, AttachRefusesASegmentWhoseDaemonHasExited) {
  const auto job = unique_job("leftover");
  ChildGuard guard{job};
  const int go = start_doomed_daemon(job, guard);
  ASSERT_GE(go, 0) << "the child daemon did not start";
  ::close(go);
  const pid_t child = guard.pid;
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  guard.pid = -1;
  ASSERT_TRUE(ipc::Segment::exists(job, 0)) << "the dead daemon must have left its segment";

  auto o = attach_options(job);
  o.attach_timeout = 300ms;
  try {
    Client::attach(o);
    ADD_FAILURE() << "attached to a segment whose daemon has exited";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("left by daemon pid " + std::to_string(child) + ", which has exited"), std::string::npos) << m;
  }
  FakeDaemon replacement(small_spec(job));  // a new daemon of the job replaces the leftover
  replacement.start();
  auto client = Client::attach(attach_options(job));
  EXPECT_EQ(client->daemon_pid(), ::getpid());
}
