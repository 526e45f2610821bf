// Hierarchical GPU operations across nodes (ipc::kFlagHierarchical) through two real Daemons,
// one per simulated node, each on a thread of the test and joined by the fabric transport over
// loopback (tcp;ofi_rxm); the ranks are in-process Clients. The daemons never touch CUDA here:
// the buffer references carry fake IPC handles.
//
// What is checked: each node's members get a plan of themselves alone (their local slots, `me`
// their local index), with the handles of their node's peers only, and nothing crosses the
// nodes for it; a rail (one member per node) carries host operations across the nodes; and a
// request that cannot run hierarchically fails on every member with a message that says why:
// a group within one node, nodes that hold unequal numbers of members, members that disagree.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "daemon/config.hpp"
#include "daemon/daemon.hpp"
#include "daemon/internode/node_card.hpp"
#include "daemon/transport/transport.hpp"
#include "ipc/protocol.hpp"
#include "tests/daemon/daemon_thread.hpp"

namespace smddp::daemon {
namespace {

using namespace std::chrono_literals;
using client::Client;
using client::DeviceBuffer;
using client::DeviceCall;
using client::WorkPtr;
using ipc::CompletionKind;
using ipc::DType;
using ipc::OpType;
using ipc::ReduceOp;
using ipc::Status;

constexpr int kNodes = 2, kPerNode = 2, kWorld = kNodes * kPerNode;

// Two daemons of one job, nodes 0 and 1, connected over loopback.
class TwoNodes {
 public:
  explicit TwoNodes(const std::string& job) {
    transport::TransportConfig tc;  // tcp;ofi_rxm on lo
    tc.op_timeout = 30s;
    std::vector<std::unique_ptr<transport::Transport>> ts;
    std::vector<internode::NodeCard> cards;
    for (int n = 0; n < kNodes; ++n) {
      ts.push_back(transport::make_fabric_transport(tc));
      internode::NodeCard card;
      card.addresses = ts.back()->local_addresses();
      card.rail_of_slot.assign(kPerNode, 0);
      cards.push_back(std::move(card));
    }
    for (int n = 0; n < kNodes; ++n) {
      JobLayout l;
      l.job_id = job;
      l.node_id = n;
      l.num_nodes = kNodes;
      l.nproc_per_node = kPerNode;
      l.hostname = "localhost";
      InternodeSetup s;
      s.transport = std::move(ts[static_cast<std::size_t>(n)]);
      s.cards = cards;
      s.topology.node_id = n;
      s.topology.num_nodes = kNodes;
      s.topology.nproc_per_node = kPerNode;
      for (int k = 0; k < kNodes; ++k) s.topology.nodes.push_back({::getpid(), "localhost"});
      daemons_.push_back(std::make_unique<Daemon>(std::move(l), test_daemon::small_config(), std::move(s)));
    }
    for (auto& d : daemons_)
      threads_.emplace_back([&d = *d] { d.serve_attached(std::chrono::seconds(30)); });
  }
  ~TwoNodes() {
    for (auto& t : threads_) t.join();
  }

 private:
  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::vector<std::thread> threads_;
};

// What one rank's exec handler received.
struct Recorder {
  std::mutex mu;
  std::vector<ipc::CompletionDesc> calls;
  std::vector<ipc::CompletionDesc> take() {
    std::lock_guard lk(mu);
    return std::exchange(calls, {});
  }
};

struct Rank {
  Recorder rec;
  std::shared_ptr<Client> client;
  ~Rank() {
    if (client) client->detach();
  }
};

std::vector<std::unique_ptr<Rank>> attach(const std::string& job) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int g = 0; g < kWorld; ++g) {
    auto r = std::make_unique<Rank>();
    client::AttachOptions o;
    o.job_id = job;
    o.node_id = g / kPerNode;
    o.rank = g;
    o.local_rank = g % kPerNode;
    o.world_size = kWorld;
    o.local_world_size = kPerNode;
    o.attach_timeout = 10s;
    r->client = Client::attach(o);
    Recorder* rec = &r->rec;
    r->client->set_exec_handler([rec](std::uint64_t, const ipc::CompletionDesc& c) {
      std::lock_guard lk(rec->mu);
      rec->calls.push_back(c);
    });
    ranks.push_back(std::move(r));
  }
  return ranks;
}

DeviceCall hier_allreduce(int g, std::uint64_t count, bool hierarchical = true) {
  DeviceCall c;
  c.op = OpType::AllReduce;
  c.dtype = DType::Float32;
  c.reduce_op = ReduceOp::Sum;
  c.count = count;
  DeviceBuffer b;
  b.ipc_handle.fill(static_cast<std::uint8_t>(0x10 + g));
  b.alloc_id = 100 + static_cast<std::uint64_t>(g);
  b.alloc_bytes = 1 << 20;
  b.bytes = count * 4;
  c.input = c.output = b;
  c.rank_exec = true;
  c.exec_token = static_cast<std::uint64_t>(g) + 1;
  c.hierarchical = hierarchical;
  return c;
}

void expect_failure(const WorkPtr& w, const char* needle) {
  try {
    w->wait(20s);
    ADD_FAILURE() << "an op that cannot run hierarchically succeeded";
  } catch (const client::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DaemonHierarchical, EachNodesMembersGetAPlanOfThemselvesAndRailsCrossTheNodes) {
  spdlog::set_level(spdlog::level::warn);
  const auto job = test_daemon::unique_job("t-hier-", "plan");
  TwoNodes nodes(job);
  auto ranks = attach(job);
  std::vector<WorkPtr> w;
  for (int g = 0; g < kWorld; ++g) w.push_back(ranks[g]->client->world()->device_op(hier_allreduce(g, 1024)));
  test_daemon::wait_all(w);
  for (int g = 0; g < kWorld; ++g) {
    SCOPED_TRACE("rank " + std::to_string(g));
    const auto calls = ranks[g]->rec.take();
    ASSERT_EQ(calls.size(), 2u);  // the node peer's handle, then the plan
    ASSERT_EQ(calls[0].kind, CompletionKind::Handles);
    ASSERT_EQ(calls[0].plan_header().handles, 1);
    const int peer = g ^ 1;  // the other rank of this node
    EXPECT_EQ(calls[0].plan_handle(0).slot, peer % kPerNode);
    EXPECT_EQ(calls[0].plan_handle(0).alloc_id, 100u + static_cast<std::uint64_t>(peer));
    ASSERT_EQ(calls[1].kind, CompletionKind::Plan);
    const auto h = calls[1].plan_header();
    EXPECT_EQ(h.members, kPerNode);
    EXPECT_EQ(h.me, g % kPerNode);
    for (int i = 0; i < kPerNode; ++i) {
      EXPECT_EQ(calls[1].plan_member(i).slot, i);
      EXPECT_EQ(calls[1].plan_member(i).in.alloc_id, 100u + static_cast<std::uint64_t>(g / kPerNode * kPerNode + i));
    }
  }
  // Local index i's rail: ranks i and kPerNode + i. A host allreduce on it crosses the nodes.
  std::vector<client::CommunicatorPtr> rails(kWorld);
  std::vector<std::thread> makers;
  for (int g = 0; g < kWorld; ++g)
    makers.emplace_back([&, g] {
      rails[static_cast<std::size_t>(g)] =
          ranks[static_cast<std::size_t>(g)]->client->create_communicator(9000 + g % kPerNode, {g % kPerNode, kPerNode + g % kPerNode});
    });
  for (auto& t : makers) t.join();
  std::vector<std::vector<float>> data(kWorld, std::vector<float>(300));
  std::vector<WorkPtr> rw;
  for (int g = 0; g < kWorld; ++g) {
    for (std::size_t i = 0; i < 300; ++i) data[g][i] = static_cast<float>(g * 1000 + static_cast<int>(i));
    rw.push_back(rails[g]->allreduce(data[g].data(), data[g].data(), 300, DType::Float32, ReduceOp::Sum));
  }
  test_daemon::wait_all(rw);
  for (int g = 0; g < kWorld; ++g)
    for (std::size_t i = 0; i < 300; i += 97) {
      const int a = g % kPerNode, b = kPerNode + g % kPerNode;
      EXPECT_EQ(data[g][i], static_cast<float>((a + b) * 1000 + 2 * static_cast<int>(i))) << "rank " << g << " at " << i;
    }
}

TEST(DaemonHierarchical, RequestsThatCannotRunHierarchicallyFailOnEveryMemberSayingWhy) {
  spdlog::set_level(spdlog::level::off);
  const auto job = test_daemon::unique_job("t-hier-", "refuse");
  TwoNodes nodes(job);
  auto ranks = attach(job);
  {
    // Members that disagree: rank 1 asks for a plain in-node plan.
    std::vector<WorkPtr> w;
    for (int g = 0; g < kWorld; ++g) w.push_back(ranks[g]->client->world()->device_op(hier_allreduce(g, 64, g != 1)));
    expect_failure(w[0], "disagree");
    expect_failure(w[1], "disagree");
  }
  {
    // The members of node 0 disagree on the count (rank 1 skipped a call): they fail naming both
    // calls, and get no plan that would have them read each other's buffers.
    std::vector<WorkPtr> w;
    for (int g = 0; g < kWorld; ++g) w.push_back(ranks[g]->client->world()->device_op(hier_allreduce(g, g == 1 ? 128 : 64)));
    for (int g = 0; g < 2; ++g) {
      expect_failure(w[g], "collective mismatch");
      expect_failure(w[g], "rank 1 called allreduce(float32, count=128");
      for (const auto& c : ranks[g]->rec.take()) EXPECT_NE(c.kind, CompletionKind::Plan) << "rank " << g;
    }
  }
  {
    // A group within node 0.
    std::vector<client::CommunicatorPtr> local(2);
    std::thread t([&] { local[1] = ranks[1]->client->create_communicator(501, {0, 1}); });
    local[0] = ranks[0]->client->create_communicator(501, {0, 1});
    t.join();
    std::vector<WorkPtr> w;
    for (int g = 0; g < 2; ++g) w.push_back(local[g]->device_op(hier_allreduce(g, 64)));
    for (auto& x : w) expect_failure(x, "within one node");
  }
  {
    // Nodes that hold unequal numbers of members: ranks 0, 1 (node 0) and 2 (node 1).
    std::vector<client::CommunicatorPtr> odd(3);
    std::vector<std::thread> ts;
    for (int g = 1; g < 3; ++g) ts.emplace_back([&, g] { odd[g] = ranks[g]->client->create_communicator(502, {0, 1, 2}); });
    odd[0] = ranks[0]->client->create_communicator(502, {0, 1, 2});
    for (auto& t : ts) t.join();
    std::vector<WorkPtr> w;
    for (int g = 0; g < 3; ++g) w.push_back(odd[g]->device_op(hier_allreduce(g, 64)));
    for (auto& x : w) expect_failure(x, "as many on every node");
  }
}

}  // namespace
}  // namespace smddp::daemon
