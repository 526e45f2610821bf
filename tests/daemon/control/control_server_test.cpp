// ControlServer, queried through the client smddp-ctl uses.
#include "daemon/control/control_server.hpp"
#include "ipc/unique_fd.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "client/ctl/control_client.hpp"
#include "ipc/names.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using smddp::ctl::query_daemon;
using smddp::ctl::query_status;
using smddp::daemon::ControlServer;
using namespace std::chrono_literals;

// A private socket directory named by SMDDP_SOCKET_DIR for the test's lifetime.
class SocketDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/smddp-ctltest-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    ASSERT_EQ(::setenv("SMDDP_SOCKET_DIR", tmpl, 1), 0);
  }
  void TearDown() override {
    ::unsetenv("SMDDP_SOCKET_DIR");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

using smddp::ipc::UniqueFd;

sockaddr_un address_of(const fs::path& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return addr;
}

// A connected client socket, or -1.
int connect_to(const fs::path& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr = address_of(path);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads until the server hangs up; nullopt if it does not within `limit` (a generous bound, not a timing
// check). A hang-up is EOF, or ECONNRESET when the server closed with our request unread.
std::optional<std::string> read_to_eof(int fd, std::chrono::milliseconds limit = 10s) {
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) return std::nullopt;
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == ECONNRESET) return out;
    if (n < 0) return std::nullopt;
    if (n == 0) return out;
    out.append(buf, static_cast<std::size_t>(n));
  }
}

std::string raw_request(const fs::path& path, const std::string& request) {
  UniqueFd fd(connect_to(path));
  EXPECT_GE(fd.get(), 0);
  EXPECT_EQ(::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  return read_to_eof(fd.get()).value_or("<no EOF>");
}

json example_status() {
  return json::parse(R"({"version":"0.1.0","job_id":"j1","node_id":0,"num_nodes":1,"pid":123,"state":"ready",
    "uptime_s":12.3,"ranks":[{"rank":0,"local_rank":0,"pid":4567,"device":"cpu","state":"registered","alive":true,
    "exit_status":null,"last_seq_posted":12,"pending":1}],"collectives_done":100,"bytes_moved":123456})");
}

int open_fd_count() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

TEST_F(SocketDirTest, ServesTheSnapshotAsJson) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  ControlServer server(path, [] { return example_status(); });
  EXPECT_EQ(server.path(), path);

  auto reply = query_daemon(path);
  ASSERT_TRUE(reply.status) << reply.error;
  EXPECT_EQ(*reply.status, example_status());

  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST_F(SocketDirTest, CreatesTheSocketDirectory) {
  fs::path sub = dir_ / "sub";
  ASSERT_EQ(::setenv("SMDDP_SOCKET_DIR", sub.c_str(), 1), 0);
  ControlServer server(smddp::ipc::socket_path("j1", 0), [] { return json::object(); });
  struct stat st {};
  ASSERT_EQ(::stat(sub.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_TRUE(query_status(sub / "j1.n0.sock"));
}

TEST_F(SocketDirTest, CallsTheSnapshotForEachRequest) {
  std::atomic<int> calls{0};
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  ControlServer server(path, [&] { return json{{"calls", ++calls}}; });
  for (int i = 1; i <= 3; ++i) {
    auto doc = query_status(path);
    ASSERT_TRUE(doc);
    EXPECT_EQ((*doc)["calls"], i);
  }
}

TEST_F(SocketDirTest, AcceptsARequestEndedByEofOrCrLf) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  ControlServer server(path, [] { return json{{"state", "ready"}}; });
  EXPECT_EQ(json::parse(raw_request(path, "status\r\n"))["state"], "ready");

  UniqueFd fd(connect_to(path));
  ASSERT_GE(fd.get(), 0);
  ASSERT_EQ(::write(fd.get(), "status", 6), 6);
  ASSERT_EQ(::shutdown(fd.get(), SHUT_WR), 0);
  auto reply = read_to_eof(fd.get());
  ASSERT_TRUE(reply);
  EXPECT_EQ(json::parse(*reply)["state"], "ready");
}

TEST_F(SocketDirTest, AnswersAnUnknownRequestWithAnError) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  ControlServer server(path, [] { return example_status(); });
  json reply = json::parse(raw_request(path, "bogus\n"));
  ASSERT_TRUE(reply.contains("error"));
  EXPECT_NE(reply["error"].get<std::string>().find("bogus"), std::string::npos);
}

TEST_F(SocketDirTest, DropsAnOverlongRequestAndKeepsServing) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  ControlServer server(path, [] { return example_status(); });
  EXPECT_EQ(raw_request(path, std::string(4096, 'x')), "");
  EXPECT_TRUE(query_status(path));
}

TEST_F(SocketDirTest, ReportsASnapshotThatThrows) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  ControlServer server(path, []() -> json { throw std::runtime_error("matcher busy"); });
  auto doc = query_status(path);
  ASSERT_TRUE(doc);
  EXPECT_NE((*doc)["error"].get<std::string>().find("matcher busy"), std::string::npos);
}

TEST_F(SocketDirTest, SendsALargeReplyWhole) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  const std::string big(2 << 20, 'a');  // larger than a socket buffer: the server must write in pieces
  ControlServer server(path, [&] { return json{{"big", big}}; });
  auto doc = query_status(path, 60s);  // generous: sanitizer builds are slow
  ASSERT_TRUE(doc);
  EXPECT_EQ((*doc)["big"].get<std::string>().size(), big.size());
}

TEST_F(SocketDirTest, ReplacesAStaleSocket) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  {  // a socket file whose listener is gone, as a crashed daemon leaves it
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM, 0));
    sockaddr_un addr = address_of(path);
    ASSERT_EQ(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(::listen(fd.get(), 1), 0);
  }
  ASSERT_TRUE(fs::exists(fs::symlink_status(path)));
  EXPECT_FALSE(query_status(path));

  ControlServer server(path, [] { return example_status(); });
  EXPECT_TRUE(query_status(path));
}

TEST_F(SocketDirTest, RefusesWhenALiveServerListens) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  ControlServer first(path, [] { return json{{"who", "first"}}; });
  try {
    ControlServer second(path, [] { return json{{"who", "second"}}; });
    FAIL() << "a second server bound a live socket";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("already listens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  auto doc = query_status(path);
  ASSERT_TRUE(doc);
  EXPECT_EQ((*doc)["who"], "first");
}

TEST_F(SocketDirTest, RefusesToRemoveAFileThatIsNotASocket) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  std::ofstream(path) << "not a socket";
  EXPECT_THROW(ControlServer(path, [] { return json::object(); }), std::runtime_error);
  EXPECT_TRUE(fs::is_regular_file(path));
}

TEST_F(SocketDirTest, RefusesAPathTooLongForASocket) {
  const fs::path path = dir_ / (std::string(120, 'x') + ".sock");
  EXPECT_THROW(ControlServer(path, [] { return json::object(); }), std::runtime_error);
}

TEST_F(SocketDirTest, SilentClientsDoNotBlockOthers) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  ControlServer server(path, [] { return example_status(); });
  // Each silent client may hold its connection for the 1 s request limit; a server that served them one
  // after another would not answer within the 2 s query timeout.
  std::vector<std::unique_ptr<UniqueFd>> silent;
  for (int i = 0; i < 8; ++i) {
    silent.push_back(std::make_unique<UniqueFd>(connect_to(path)));
    ASSERT_GE(silent.back()->get(), 0);
  }
  auto reply = query_daemon(path, 2s);
  EXPECT_TRUE(reply.status) << reply.error;
  // And the server hangs up on each of them rather than waiting forever.
  for (const auto& fd : silent) EXPECT_EQ(read_to_eof(fd->get()), std::optional<std::string>(""));
  EXPECT_TRUE(query_status(path));
}

TEST_F(SocketDirTest, DestructorUnlinksTheSocket) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  {
    ControlServer server(path, [] { return example_status(); });
    ASSERT_TRUE(fs::exists(fs::symlink_status(path)));
  }
  EXPECT_FALSE(fs::exists(fs::symlink_status(path)));
  EXPECT_FALSE(query_status(path));
  // The name is free again.
  ControlServer again(path, [] { return example_status(); });
  EXPECT_TRUE(query_status(path));
}

TEST_F(SocketDirTest, StopsWhileAClientIsConnected) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  auto server = std::make_unique<ControlServer>(path, [] { return example_status(); });
  UniqueFd silent(connect_to(path));
  ASSERT_GE(silent.get(), 0);
  server.reset();  // must not wait for the silent client
  EXPECT_EQ(read_to_eof(silent.get()), std::optional<std::string>(""));
  EXPECT_FALSE(fs::exists(fs::symlink_status(path)));
}

TEST_F(SocketDirTest, ClosesEveryConnection) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  ControlServer server(path, [] { return example_status(); });
  ASSERT_TRUE(query_status(path));  // the first request may allocate lazily
  const int before = open_fd_count();
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(query_status(path));
  // The server closes each connection before the client sees EOF, so nothing is left open.
  EXPECT_EQ(open_fd_count(), before);
}

TEST_F(SocketDirTest, IdleServerUsesNoCpu) {
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  ControlServer server(path, [] { return example_status(); });
  ASSERT_TRUE(query_status(path));
  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(500ms);
  ::getrusage(RUSAGE_SELF, &after);
  auto cpu_us = [](const rusage& r) {
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1'000'000LL + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
  };
  // A polling loop would burn most of the 500 ms; an idle poll() burns none.
  EXPECT_LT(cpu_us(after) - cpu_us(before), 100'000);
}

TEST_F(SocketDirTest, RefusesAClientOfAnotherUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  const fs::path path = smddp::ipc::socket_path("j1", 0);
  ControlServer server(path, [] { return example_status(); });
  // Let uid 65534 reach the socket, so only the server's own check stands in its way.
  ASSERT_EQ(::chmod(dir_.c_str(), 0711), 0);
  ASSERT_EQ(::chmod(path.c_str(), 0666), 0);

  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    int fd = connect_to(path);
    if (fd < 0) ::_exit(11);
    // The server may hang up before this is sent (EPIPE): that too is a refusal, seen by the read below.
    (void)::send(fd, "status\n", 7, MSG_NOSIGNAL);
    auto reply = read_to_eof(fd);
    ::_exit(!reply ? 13 : reply->empty() ? 0 : 14);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 10) GTEST_SKIP() << "cannot change uid here";
  EXPECT_NE(WEXITSTATUS(status), 11) << "uid 65534 could not connect at all: the test proves nothing";
  EXPECT_NE(WEXITSTATUS(status), 14) << "the server answered a client of another uid";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(query_status(path));  // and still serves its own uid
}

}  // namespace
