#include <gtest/gtest.h>

#include "daemon/cli.hpp"

using smddp::daemon::parse_daemon_args;

TEST(DaemonCli, FlagsValuesAndCommand) {
  auto a = parse_daemon_args({"--job-id", "j1", "--nproc-per-node=4", "--config", "c.ini", "--set", "daemon.spin_us=0",
                              "--set=fabric.provider=shm", "--simulate-nodes", "2", "--", "python3", "-u", "t.py"});
  EXPECT_EQ(a.job_id, "j1");
  EXPECT_EQ(a.nproc_per_node, 4);
  EXPECT_EQ(a.config_path, "c.ini");
  EXPECT_EQ(a.simulate_nodes, 2);
  ASSERT_EQ(a.overrides.size(), 2u);
  EXPECT_EQ(a.overrides[1], "fabric.provider=shm");
  EXPECT_EQ(a.command, (std::vector<std::string>{"python3", "-u", "t.py"}));
}

TEST(DaemonCli, CommandMayStartWithoutDashDash) {
  auto a = parse_daemon_args({"--job-id", "j", "python3", "--nproc-per-node", "9"});
  EXPECT_EQ(a.nproc_per_node, 1) << "flags after the command belong to the command";
  EXPECT_EQ(a.command, (std::vector<std::string>{"python3", "--nproc-per-node", "9"}));
}

TEST(DaemonCli, AttachModeAndCleanup) {
  auto a = parse_daemon_args({"--attach-mode", "--node-id", "1", "--num-nodes", "2", "--attach-timeout=5"});
  EXPECT_TRUE(a.attach_mode);
  EXPECT_EQ(a.node_id, 1);
  EXPECT_EQ(a.num_nodes, 2);
  EXPECT_EQ(a.attach_timeout_s, 5);
  EXPECT_EQ(parse_daemon_args({"--cleanup-job", "x"}).cleanup_job, "x");
  EXPECT_TRUE(parse_daemon_args({"--cleanup-stale"}).cleanup_stale);
  EXPECT_FALSE(parse_daemon_args({"--cleanup-job", "x"}).cleanup_stale);
}

TEST(DaemonCli, BadInputIsNamed) {
  auto fails = [](std::vector<std::string> args, const char* needle) {
    try {
      parse_daemon_args(args);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fails({"--bogus"}, "--bogus");
  fails({"--nproc-per-node"}, "needs a value");
  fails({"--nproc-per-node", "0"}, "--nproc-per-node");
  fails({"--nproc-per-node", "4x"}, "4x");
  fails({"--attach-mode=1"}, "takes no value");
  fails({"--cleanup-stale=yes"}, "takes no value");
  fails({"--attach-mode", "--node-id", "2", "--num-nodes", "2"}, "--node-id 2 is not below --num-nodes 2");
  fails({"--node-id", "1"}, "is not below --num-nodes 1");
}
