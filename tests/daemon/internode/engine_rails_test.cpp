// The engine over several endpoints per node: operations spread over them, an operation with one
// member per node takes its members' endpoints, and a dead peer fails what waits on any of them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "daemon/internode/op.hpp"
#include "tests/daemon/internode/engine_fixture.hpp"

namespace smddp::daemon::internode {
namespace {

class EngineRails : public ::testing::TestWithParam<std::string> {
 protected:
  void make_nodes(int endpoints) {
    const auto job = unique_job();
    auto loopback = GetParam() == "loopback" ? std::make_shared<transport::LoopbackFabric>() : nullptr;
    for (int i = 0; i < 2; ++i) nodes.push_back(std::make_unique<Node>(i, job, loopback, endpoints));
  }
  std::vector<std::vector<Finished>> drive(std::size_t want) {
    std::vector<std::vector<Finished>> done(2);
    const auto until = Clock::now() + std::chrono::seconds(20);
    while ((done[0].size() < want || done[1].size() < want) && Clock::now() < until)
      for (int i = 0; i < 2; ++i)
        for (auto& f : nodes[i]->engine->progress(Clock::now())) done[i].push_back(std::move(f));
    return done;
  }
  static std::vector<std::uint64_t> minus(const std::vector<std::uint64_t>& a, const std::vector<std::uint64_t>& b) {
    std::vector<std::uint64_t> out;
    for (std::size_t i = 0; i < a.size(); ++i) out.push_back(a[i] - b[i]);
    return out;
  }
  std::vector<std::unique_ptr<Node>> nodes;
};

// Collectives of the 4-rank communicator (two members per node) stripe their chunks over the
// endpoints: after a few, every endpoint of both nodes has sent and received, and every result
// is right (a rail the two nodes disagreed on would never match).
TEST_P(EngineRails, ChunksOfOperationsSpreadOverEveryEndpoint) {
  make_nodes(3);
  start_engines(nodes);
  constexpr std::uint64_t n = 2 * kEagerBytes / 4;  // the two-step path
  constexpr int kOps = 24;
  for (int op = 0; op < kOps; ++op) {
    for (int i = 0; i < 2; ++i)
      for (int s = 0; s < kRanks; ++s)
        for (std::uint64_t k = 0; k < n; ++k) nodes[i]->in(s)[k] = static_cast<float>(op + i * kRanks + s);
    auto d = desc(OpType::AllReduce, n);
    d.seq = static_cast<std::uint64_t>(op + 1);
    for (int i = 0; i < 2; ++i) nodes[i]->engine->start(nodes[i]->match(d, i, n * 4, n * 4), Clock::now());
    auto done = drive(1);
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(done[i].size(), 1u) << "operation " << op;
      ASSERT_EQ(done[i][0].match.status, ipc::Status::Ok) << done[i][0].match.error;
      ASSERT_EQ(nodes[i]->out(1)[n - 1], static_cast<float>(4 * op + 6)) << "operation " << op;
    }
  }
  for (int i = 0; i < 2; ++i) {
    const auto sent = nodes[i]->sent(), received = nodes[i]->received();
    ASSERT_EQ(sent.size(), 3u);
    for (int e = 0; e < 3; ++e) {
      // Each operation moves n floats each way in all (half its data to and from the other node, twice).
      EXPECT_GE(sent[static_cast<std::size_t>(e)], n * 4) << "node " << i << " endpoint " << e;
      EXPECT_GE(received[static_cast<std::size_t>(e)], n * 4) << "node " << i << " endpoint " << e;
    }
  }
}

// One member per node (a send/recv; a collective of a communicator like the GPU path's per-GPU
// ones): the members' slots' endpoints on each node, from the tables the nodes published.
TEST_P(EngineRails, AnOperationWithOneMemberPerNodeTakesItsMembersEndpoints) {
  make_nodes(3);
  // Node 0: slot 0 -> endpoint 2, slot 1 -> 1. Node 1: slot 0 -> 1, slot 1 -> 2.
  start_engines(nodes, {{2, 1}, {1, 2}});
  constexpr std::uint64_t big = 2 * kEagerMessageBytes / 4;
  // Rank 0 (node 0, slot 0) sends to rank 2 (node 1, slot 0): node 0's endpoint 2 to node 1's 1.
  auto sent0 = nodes[0]->sent(), received1 = nodes[1]->received();
  for (std::uint64_t k = 0; k < big; ++k) nodes[0]->in(0)[k] = static_cast<float>(k);
  nodes[1]->engine->start_p2p(nodes[1]->comm, recv_2_from_0(big, 1), Clock::now());
  nodes[0]->engine->start_p2p(nodes[0]->comm, send_0_to_2(big, 1), Clock::now());
  auto done = drive(1);
  ASSERT_EQ(done[1].size(), 1u);
  ASSERT_EQ(done[1][0].match.status, ipc::Status::Ok) << done[1][0].match.error;
  ASSERT_EQ(nodes[1]->out(0)[big - 1], static_cast<float>(big - 1));
  auto d_sent = minus(nodes[0]->sent(), sent0), d_received = minus(nodes[1]->received(), received1);
  EXPECT_GE(d_sent[2], big * 4);
  EXPECT_EQ(d_sent[1], 0u);
  EXPECT_GE(d_received[1], big * 4);
  EXPECT_EQ(d_received[2], 0u);

  // The communicator {1, 3}: slot 1 on each node. Node 0's endpoint 1 to node 1's endpoint 2.
  std::vector<Communicator> pair(2);
  for (int i = 0; i < 2; ++i) {
    pair[static_cast<std::size_t>(i)].id = 7;
    pair[static_cast<std::size_t>(i)].global_ranks = {1, 3};
    pair[static_cast<std::size_t>(i)].slots = i == 0 ? std::vector<int>{1, -1} : std::vector<int>{-1, 1};
  }
  sent0 = nodes[0]->sent();
  received1 = nodes[1]->received();
  const auto sent1 = nodes[1]->sent();
  constexpr std::uint64_t n = 2 * kEagerBytes / 4;
  for (int i = 0; i < 2; ++i) {
    for (std::uint64_t k = 0; k < n; ++k) nodes[i]->in(1)[k] = static_cast<float>(i + 1);
    auto d = desc(OpType::AllReduce, n);
    d.comm_id = 7;
    Posted p;
    p.slot = 1;
    p.group_rank = i;
    p.desc = d;
    p.desc.input = {ipc::BufferKind::Arena, {}, 0, n * 4};
    p.desc.output = {ipc::BufferKind::Arena, {}, kOut, n * 4};
    nodes[i]->engine->start(Match{&pair[static_cast<std::size_t>(i)], {p}, ipc::Status::Ok, {}}, Clock::now());
  }
  done = drive(1);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(done[i].size(), 1u);
    ASSERT_EQ(done[i][0].match.status, ipc::Status::Ok) << done[i][0].match.error;
    ASSERT_EQ(nodes[i]->out(1)[n - 1], 3.0f);
  }
  d_sent = minus(nodes[0]->sent(), sent0);
  d_received = minus(nodes[1]->received(), received1);
  EXPECT_GE(d_sent[1], n * 2) << "half the data each way";
  EXPECT_EQ(d_sent[2], 0u);
  EXPECT_GE(d_received[2], n * 2);
  EXPECT_EQ(d_received[1], 0u);
  EXPECT_GE(minus(nodes[1]->sent(), sent1)[2], n * 2);
}

// Nodes with different endpoint counts: striping uses the smaller count, pinned rails each
// side's own table; everything arrives.
TEST_P(EngineRails, NodesWithDifferentEndpointCountsStillAgree) {
  const auto job = unique_job();
  auto loopback = GetParam() == "loopback" ? std::make_shared<transport::LoopbackFabric>() : nullptr;
  nodes.push_back(std::make_unique<Node>(0, job, loopback, 4));
  nodes.push_back(std::make_unique<Node>(1, job, loopback, 2));
  start_engines(nodes, {{3, 2}, {1, 0}});
  constexpr std::uint64_t n = 2 * kEagerBytes / 4;
  for (int op = 0; op < 8; ++op) {
    auto d = desc(OpType::AllReduce, n);
    d.seq = static_cast<std::uint64_t>(op + 1);
    for (int i = 0; i < 2; ++i)
      for (int s = 0; s < kRanks; ++s)
        for (std::uint64_t k = 0; k < n; ++k) nodes[i]->in(s)[k] = 1.0f;
    for (int i = 0; i < 2; ++i) nodes[i]->engine->start(nodes[i]->match(d, i, n * 4, n * 4), Clock::now());
    nodes[1]->engine->start_p2p(nodes[1]->comm, recv_2_from_0(64, 100 + op), Clock::now());
    nodes[0]->engine->start_p2p(nodes[0]->comm, send_0_to_2(64, 100 + op), Clock::now());
    auto done = drive(2);
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(done[i].size(), 2u);
      for (const auto& f : done[i]) ASSERT_EQ(f.match.status, ipc::Status::Ok) << f.match.error;
      ASSERT_EQ(nodes[i]->out(1)[n - 1], 4.0f);  // slot 0's output also takes the send/recv
    }
  }
  EXPECT_EQ(nodes[0]->sent()[2], 0u) << "striping stays below the smaller count; no slot of node 0 takes endpoint 2";
  EXPECT_GT(nodes[0]->sent()[3], 0u) << "rank 0's sends take its slot's endpoint";
  EXPECT_EQ(nodes[0]->sent()[0] > 0 && nodes[0]->sent()[1] > 0, true);
}

// Beats every 50 ms, a peer silent for 400 ms is gone: the silence tests take well under a second.
Engine::Options quick_heartbeats() {
  Engine::Options o;
  o.heartbeat_every = std::chrono::milliseconds(50);
  o.heartbeat_timeout = std::chrono::milliseconds(400);
  return o;
}

// Drives both engines for `how_long`: they exchange beats, so each has heard from the other.
void exchange_beats(std::vector<std::unique_ptr<Node>>& nodes, std::chrono::milliseconds how_long) {
  const auto until = Clock::now() + how_long;
  while (Clock::now() < until)
    for (auto& n : nodes) EXPECT_TRUE(n->engine->progress(Clock::now()).empty());
}

// Starts a small all-reduce on node 1 alone and drives node 1 only, up to 10 s; what ended.
std::vector<Finished> lone_allreduce_on_node_1(std::vector<std::unique_ptr<Node>>& nodes) {
  auto d = desc(OpType::AllReduce, 64);
  d.timeout_ms = 60000;
  nodes[1]->engine->start(nodes[1]->match(d, 1, 256, 256), Clock::now());
  const auto start = Clock::now();
  std::vector<Finished> done;
  while (done.empty() && Clock::now() - start < std::chrono::seconds(10))
    for (auto& f : nodes[1]->engine->progress(Clock::now())) done.push_back(std::move(f));
  return done;
}

// A peer that falls silent is declared dead: what waits on it fails at once, on every endpoint
// (here: operation chunks striped over all three), not at the operations' timeout.
TEST_P(EngineRails, ADeadPeerFailsWhatWaitsOnEveryEndpoint) {
  make_nodes(3);
  const Engine::Options o = quick_heartbeats();
  start_engines(nodes, {}, o, /*hosts_differ=*/true);
  exchange_beats(nodes, std::chrono::milliseconds(200));  // then node 0 falls silent
  constexpr int kChunks = 12;
  constexpr std::uint64_t n = 2 * kEagerBytes / 4;
  for (int c = 0; c < kChunks; ++c) {
    auto d = desc(OpType::AllReduce, kChunks * n);
    d.chunk_count = n;
    d.chunk_offset = static_cast<std::uint64_t>(c) * n;
    d.timeout_ms = 60000;
    nodes[1]->engine->start(nodes[1]->match(d, 1, n * 4, n * 4), Clock::now());  // node 0 never posts
  }
  const auto start = Clock::now();
  std::vector<Finished> done;
  while (done.size() < kChunks && Clock::now() - start < std::chrono::seconds(10))
    for (auto& f : nodes[1]->engine->progress(Clock::now())) done.push_back(std::move(f));
  ASSERT_EQ(done.size(), static_cast<std::size_t>(kChunks));
  for (const auto& f : done) {
    EXPECT_EQ(f.match.status, ipc::Status::PeerFailed) << f.match.error;
    EXPECT_NE(f.match.error.find("on node 0 stopped answering: no heartbeat from test-host for 400 ms"), std::string::npos) << f.match.error;
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  const auto failure = nodes[1]->engine->take_peer_failure();
  ASSERT_TRUE(failure);
  EXPECT_NE(failure->error.find("smddp daemon (pid"), std::string::npos) << failure->error;
}

// The same on one host, where a live pid is no proof of an answering daemon (stopped, hung, or
// its network gone): silence is judged there too.
TEST_P(EngineRails, ASilentPeerOnTheSameHostIsDeclaredGone) {
  make_nodes(1);
  const Engine::Options o = quick_heartbeats();
  start_engines(nodes, {}, o, /*hosts_differ=*/false);
  exchange_beats(nodes, std::chrono::milliseconds(200));
  const auto start = Clock::now();
  const auto done = lone_allreduce_on_node_1(nodes);  // node 0 never runs again
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].match.status, ipc::Status::PeerFailed);
  EXPECT_NE(done[0].match.error.find("on node 0 stopped answering: no heartbeat from test-host for 400 ms"),
            std::string::npos)
      << done[0].match.error;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

// A peer never heard from since the job started is unreachable, not dead: the error names the
// address this daemon was given for it (a wrong interface, no route, a firewall).
TEST_P(EngineRails, APeerNeverHeardFromIsNamedUnreachable) {
  make_nodes(1);
  start_engines(nodes, {}, quick_heartbeats(), /*hosts_differ=*/true);
  const auto start = Clock::now();
  const auto done = lone_allreduce_on_node_1(nodes);  // node 0 never runs
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].match.status, ipc::Status::PeerFailed);
  const auto& e = done[0].match.error;
  EXPECT_NE(e.find("cannot reach the smddp daemon (pid"), std::string::npos) << e;
  EXPECT_NE(e.find("on node 0 (host test-host, address test-address-0): nothing arrived from it in 400 ms"), std::string::npos) << e;
  EXPECT_EQ(e.find("stopped answering"), std::string::npos) << e;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

// A dead daemon's connections break at once, usually before its pid is next checked: what
// failed on the broken connection names the dead daemon, as the rest of the job hears it.
// (The loopback transport breaks on request: no parameter.)
TEST(EngineFailures, AnOperationBrokenByADeadDaemonNamesTheDaemonNotTheSocket) {
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  int st = 0;
  ::waitpid(gone, &st, 0);  // a pid that no longer runs
  auto fabric = std::make_shared<transport::LoopbackFabric>();
  const auto job = unique_job();
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < 2; ++i) nodes.push_back(std::make_unique<Node>(i, job, fabric));
  start_engines(nodes, {}, quick_heartbeats(), /*hosts_differ=*/false, gone);
  fabric->break_transport(0);  // node 0's, the first made
  auto d = desc(OpType::AllReduce, 2 * kEagerBytes / 4);
  d.timeout_ms = 60000;
  nodes[1]->engine->start(nodes[1]->match(d, 1, d.count * 4, d.count * 4), Clock::now());
  std::vector<Finished> done;
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (done.empty() && Clock::now() < until)
    for (auto& f : nodes[1]->engine->progress(Clock::now())) done.push_back(std::move(f));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].match.status, ipc::Status::PeerFailed);
  EXPECT_EQ(done[0].match.error, "smddp daemon (pid " + std::to_string(gone) + ") on node 0 died");
}

// A daemon that was not looking (descheduled; here: a thread that drives both engines and
// stopped) does not blame its peers for the beats it did not read.
TEST_P(EngineRails, TimeTheEngineWasNotLookingIsNotThePeersSilence) {
  make_nodes(1);
  const Engine::Options o = quick_heartbeats();
  start_engines(nodes, {}, o, /*hosts_differ=*/true);
  const auto drive = [&](std::chrono::milliseconds how_long) {
    const auto until = Clock::now() + how_long;
    while (Clock::now() < until)
      for (auto& n : nodes) EXPECT_TRUE(n->engine->progress(Clock::now()).empty());
  };
  drive(std::chrono::milliseconds(300));
  std::this_thread::sleep_for(std::chrono::milliseconds(900));  // both asleep, well past the timeout
  drive(std::chrono::milliseconds(600));
  for (auto& n : nodes) {
    const auto failure = n->engine->take_peer_failure();
    EXPECT_FALSE(failure) << failure->error;
  }
}

#ifdef SMDDP_HAVE_FABRIC
INSTANTIATE_TEST_SUITE_P(Transports, EngineRails, ::testing::Values("loopback", "fabric"));
#else
INSTANTIATE_TEST_SUITE_P(Transports, EngineRails, ::testing::Values("loopback"));
#endif

}  // namespace
}  // namespace smddp::daemon::internode
