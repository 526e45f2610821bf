// The built smddp-ctl against ControlServers running in this test process.
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "daemon/control/control_server.hpp"
#include "ipc/names.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using smddp::daemon::ControlServer;

struct CtlResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

json healthy_status(const std::string& job = "j1", int node = 0) {
  json s = json::parse(R"({"version":"0.1.0","num_nodes":2,"pid":123,"state":"ready","uptime_s":12.3,
    "config":"configs/local.ini","transport":"none","hostname":"h","world_size":2,"local_world_size":2,
    "ranks":[{"rank":0,"local_rank":0,"pid":4567,"device":"cpu","state":"registered","alive":true,
              "exit_status":null,"last_seq_posted":12,"pending":1},
             {"rank":1,"local_rank":1,"pid":4568,"device":"cpu","state":"registered","alive":true,
              "exit_status":null,"last_seq_posted":12,"pending":0}],
    "collectives_done":100,"bytes_moved":123456,"kernel_launches":0,"recent_bandwidth_gbps":1.25,
    "errors":[],"stalls":[],"job_error":""})");
  s["job_id"] = job;
  s["node_id"] = node;
  return s;
}

json stalled_status(const std::string& job = "j1", int node = 0) {
  json s = healthy_status(job, node);
  s["stalls"] = json::parse(R"([{"comm_id":0,"seq":5,"op":"allreduce","waiting_s":61.2,"missing_ranks":[2,3]}])");
  return s;
}

class CtlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/smddp-ctlcli-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    ASSERT_EQ(::setenv("SMDDP_SOCKET_DIR", tmpl, 1), 0);  // the in-process servers read it
  }
  void TearDown() override {
    servers_.clear();
    ::unsetenv("SMDDP_SOCKET_DIR");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void serve(const std::string& job, int node, json status) {
    servers_.push_back(std::make_unique<ControlServer>(smddp::ipc::socket_path(job, node),
                                                       [status = std::move(status)] { return status; }));
  }

  CtlResult ctl(const std::string& args) const {
    std::string cmd = "SMDDP_SOCKET_DIR='" + dir_.string() + "' '" SMDDP_CTL_PATH "' " + args + " 2>&1";
    CtlResult r;
    FILE* pipe = ::popen(cmd.c_str(), "r");
    if (pipe == nullptr) return r;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
    int status = ::pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  }

  fs::path dir_;
  std::vector<std::unique_ptr<ControlServer>> servers_;
};

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_F(CtlTest, NoDaemon) {
  auto health = ctl("health");
  EXPECT_EQ(health.exit_code, 2) << health.output;
  EXPECT_TRUE(contains(health.output, "no smddp daemon is running (looked in " + dir_.string() + ")")) << health.output;
  EXPECT_EQ(ctl("status").exit_code, 1);
  EXPECT_EQ(ctl("metrics").exit_code, 1);
}

TEST_F(CtlTest, MissingSocketDirectoryIsNoDaemon) {
  std::string cmd_dir = (dir_ / "absent").string();
  std::string cmd = "SMDDP_SOCKET_DIR='" + cmd_dir + "' '" SMDDP_CTL_PATH "' health >/dev/null 2>&1";
  int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
}

TEST_F(CtlTest, Healthy) {
  serve("j1", 0, healthy_status());
  auto health = ctl("health");
  EXPECT_EQ(health.exit_code, 0) << health.output;
  EXPECT_TRUE(contains(health.output, "healthy: job j1 node 0")) << health.output;

  auto status = ctl("status");
  EXPECT_EQ(status.exit_code, 0) << status.output;
  for (const char* s : {"job j1, node 0 of 2", "ready", "RANK", "4568", "100 done", "1.25 GB/s", "stalls:        none"})
    EXPECT_TRUE(contains(status.output, s)) << "missing '" << s << "' in\n" << status.output;

  auto metrics = ctl("metrics");
  EXPECT_EQ(metrics.exit_code, 0) << metrics.output;
  EXPECT_TRUE(contains(metrics.output, "smddp_up{job=\"j1\",node=\"0\"} 1\n")) << metrics.output;
  EXPECT_TRUE(contains(metrics.output, "smddp_rank_pending{job=\"j1\",node=\"0\",rank=\"0\"} 1\n")) << metrics.output;
}

TEST_F(CtlTest, StatusJsonIsTheDocumentAsReceived) {
  serve("j1", 0, healthy_status());
  auto r = ctl("status --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(r.output), healthy_status());
}

TEST_F(CtlTest, DegradedByAStall) {
  serve("j1", 0, stalled_status());
  auto health = ctl("health");
  EXPECT_EQ(health.exit_code, 1) << health.output;
  EXPECT_TRUE(contains(health.output, "degraded: job j1 node 0")) << health.output;
  EXPECT_TRUE(contains(health.output, "ranks 2, 3")) << health.output;
  auto status = ctl("status");
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_TRUE(contains(status.output, "allreduce seq 5 on comm 0 waiting 61.2 s for ranks 2, 3")) << status.output;
}

TEST_F(CtlTest, DegradedByADeadRank) {
  json s = healthy_status();
  s["ranks"][1]["alive"] = false;
  s["ranks"][1]["state"] = "exited";
  s["ranks"][1]["exit_status"] = 137;
  serve("j1", 0, s);
  auto health = ctl("health");
  EXPECT_EQ(health.exit_code, 1) << health.output;
  EXPECT_TRUE(contains(health.output, "rank 1 (pid 4568) is not alive (exit status 137)")) << health.output;
}

TEST_F(CtlTest, StaleSocketIsUnreachable) {
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, smddp::ipc::socket_path("j1", 0).c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  auto health = ctl("health");
  EXPECT_EQ(health.exit_code, 2) << health.output;
  EXPECT_TRUE(contains(health.output, "unreachable: job j1 node 0")) << health.output;
  EXPECT_EQ(ctl("status").exit_code, 1);
  auto metrics = ctl("metrics");
  EXPECT_EQ(metrics.exit_code, 0);
  EXPECT_TRUE(contains(metrics.output, "smddp_up{job=\"j1\",node=\"0\"} 0\n")) << metrics.output;
}

TEST_F(CtlTest, SeveralNodesOfOneJob) {
  serve("j1", 0, healthy_status("j1", 0));
  serve("j1", 1, stalled_status("j1", 1));
  auto all = ctl("health");
  EXPECT_EQ(all.exit_code, 1) << all.output;
  EXPECT_TRUE(contains(all.output, "healthy: job j1 node 0")) << all.output;
  EXPECT_TRUE(contains(all.output, "degraded: job j1 node 1")) << all.output;
  EXPECT_EQ(ctl("health --node 0").exit_code, 0);
  EXPECT_EQ(ctl("health --node=1").exit_code, 1);
  EXPECT_EQ(ctl("health --node 7").exit_code, 2);

  auto json_all = ctl("status --json");
  ASSERT_EQ(json_all.exit_code, 0) << json_all.output;
  json docs = json::parse(json_all.output);
  ASSERT_TRUE(docs.is_array());
  EXPECT_EQ(docs.size(), 2u);
}

TEST_F(CtlTest, SeveralJobs) {
  serve("alpha", 0, healthy_status("alpha"));
  serve("beta", 0, stalled_status("beta"));
  auto health = ctl("health");
  EXPECT_EQ(health.exit_code, 1) << health.output;
  auto status = ctl("status");
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_TRUE(contains(status.output, "job alpha, node 0")) << status.output;
  EXPECT_TRUE(contains(status.output, "job beta, node 0")) << status.output;
  EXPECT_EQ(ctl("health --job alpha").exit_code, 0);
  EXPECT_EQ(ctl("health --job=beta").exit_code, 1);
  auto gamma = ctl("health --job gamma");
  EXPECT_EQ(gamma.exit_code, 2);
  EXPECT_TRUE(contains(gamma.output, "no smddp daemon for job gamma is running")) << gamma.output;
}

TEST_F(CtlTest, Usage) {
  auto help = ctl("--help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* s : {"status", "health", "metrics", "--job", "--node", "--json", "--timeout"})
    EXPECT_TRUE(contains(help.output, s)) << s;
  for (const char* bad : {"", "bogus", "status --bogus", "health --json", "status --node x", "status --node -1",
                          "status --job", "status --job 'a b'", "status extra", "health --timeout 0"}) {
    auto r = ctl(bad);
    EXPECT_EQ(r.exit_code, 2) << "smddp-ctl " << bad << ":\n" << r.output;
    EXPECT_TRUE(contains(r.output, "usage: smddp-ctl")) << bad;
  }
}

}  // namespace
