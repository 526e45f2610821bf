// The engine tests' two "nodes" in one process, each with its own segment (2 ranks), worker
// pool and transport: an in-process loopback (always; sanitizer builds too) or, where libfabric
// is built, tcp;ofi_rxm on loopback; with one or more endpoints each.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "daemon/internode/engine.hpp"
#include "tests/daemon/internode/loopback_transport.hpp"

namespace smddp::daemon::internode {
namespace {

using ipc::DType;
using ipc::OpType;
using ipc::ReduceOp;

constexpr std::uint64_t kArena = 1ull << 20;
constexpr std::uint64_t kOut = 512ull << 10;
constexpr int kRanks = 2;  // per node

inline std::string unique_job() {
  static std::atomic<int> n{0};
  return "t-inter-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

struct Node {
  Node(int id, const std::string& job, const std::shared_ptr<transport::LoopbackFabric>& loopback, int endpoints = 1,
       std::shared_ptr<transport::LoopbackTransport::Registrations> registrations = nullptr)
      : seg(ipc::Segment::create(spec(id, job))),
        pool(2),
        transport(registrations ? std::make_unique<transport::LoopbackTransport>(loopback, std::move(registrations), endpoints)
                                : open(loopback, endpoints)) {
    comm.id = 0;
    for (int g = 0; g < 2 * kRanks; ++g) {
      comm.global_ranks.push_back(g);
      comm.slots.push_back(g / kRanks == id ? g % kRanks : -1);
    }
  }
  static ipc::SegmentSpec spec(int id, const std::string& job) {
    ipc::SegmentSpec s;
    s.job_id = job;
    s.node_id = id;
    s.num_nodes = 2;
    s.local_world_size = kRanks;
    s.world_size = 2 * kRanks;
    s.first_rank = id * kRanks;
    s.arena_bytes = kArena;
    return s;
  }
  static std::unique_ptr<transport::Transport> open(const std::shared_ptr<transport::LoopbackFabric>& loopback,
                                                     int endpoints) {
    if (loopback) return std::make_unique<transport::LoopbackTransport>(loopback, endpoints);
#ifndef SMDDP_HAVE_FABRIC
    throw std::logic_error("no libfabric in this build");
#else
    transport::TransportConfig c;
    c.provider = "tcp;ofi_rxm";
    c.interface = "lo";
    c.endpoints = endpoints;
    return transport::make_fabric_transport(c);
#endif
  }
  // Bytes each endpoint sent and received so far.
  std::vector<std::uint64_t> sent() const { return bytes(&transport::EndpointInfo::bytes_sent); }
  std::vector<std::uint64_t> received() const { return bytes(&transport::EndpointInfo::bytes_received); }
  std::vector<std::uint64_t> bytes(std::uint64_t transport::EndpointInfo::*field) const {
    std::vector<std::uint64_t> out;
    for (const auto& e : engine->endpoint_info()) out.push_back(e.*field);
    return out;
  }
  float* in(int slot) { return reinterpret_cast<float*>(seg.arena(slot).data()); }
  float* out(int slot) { return reinterpret_cast<float*>(seg.arena(slot).data() + kOut); }
  Match match(ipc::RequestDesc d, int node_id, std::uint64_t in_bytes, std::uint64_t out_bytes) {
    Match m{&comm, {}, ipc::Status::Ok, {}};
    for (int s = 0; s < kRanks; ++s) {
      Posted p;
      p.slot = s;
      p.group_rank = node_id * kRanks + s;
      p.desc = d;
      p.desc.input = {ipc::BufferKind::Arena, {}, 0, in_bytes};
      p.desc.output = {ipc::BufferKind::Arena, {}, kOut, out_bytes};
      m.posted.push_back(p);
    }
    return m;
  }
  ipc::Segment seg;
  WorkerPool pool;
  std::unique_ptr<transport::Transport> transport;
  Communicator comm;
  std::unique_ptr<Engine> engine;
};

// Gives each of the two nodes its engine, over the transports they were made with. Slot s
// takes endpoint s mod N unless `rail_of_slot` (by node) says otherwise.
// `hosts` differ: each node takes the other for a daemon on another host, judged by its heartbeats.
// `node0_pid`: the pid node 1 takes node 0's daemon for (0: this process).
inline void start_engines(std::vector<std::unique_ptr<Node>>& nodes, std::vector<std::vector<int>> rail_of_slot = {},
                          Engine::Options options = {}, bool hosts_differ = false, pid_t node0_pid = 0) {
  Topology t;
  t.num_nodes = 2;
  t.nproc_per_node = kRanks;
  t.nodes = {{node0_pid ? node0_pid : ::getpid(), "test-host", "test-address-0"},
             {::getpid(), hosts_differ ? "other-test-host" : "test-host", "test-address-1"}};
  std::vector<NodeCard> cards;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    NodeCard card{nodes[i]->transport->local_addresses(), {}};
    if (i < rail_of_slot.size()) card.rail_of_slot = rail_of_slot[i];
    else
      for (int s = 0; s < kRanks; ++s) card.rail_of_slot.push_back(s % nodes[i]->transport->endpoints());
    cards.push_back(std::move(card));
  }
  for (int i = 0; i < 2; ++i) {
    t.node_id = i;
    nodes[i]->engine = std::make_unique<Engine>(t, std::move(nodes[i]->transport), cards, nodes[i]->seg,
                                               nodes[i]->pool, options);
  }
}

// Parameter: the transport ("loopback" or "fabric") and the endpoints per node.
struct Setup {
  std::string transport;
  int endpoints = 1;
};
inline std::string setup_name(const ::testing::TestParamInfo<Setup>& info) {
  return info.param.transport + "_" + std::to_string(info.param.endpoints) + "_endpoints";
}

class EngineTest : public ::testing::TestWithParam<Setup> {
 protected:
  void SetUp() override {
    const auto job = unique_job();
    auto loopback = GetParam().transport == "loopback" ? std::make_shared<transport::LoopbackFabric>() : nullptr;
    for (int i = 0; i < 2; ++i) nodes.push_back(std::make_unique<Node>(i, job, loopback, GetParam().endpoints));
    start_engines(nodes);
  }
  // Drives both engines until each has finished `want` operations.
  std::vector<std::vector<Finished>> drive(std::size_t want = 1) {
    std::vector<std::vector<Finished>> done(2);
    const auto until = Clock::now() + std::chrono::seconds(20);
    while ((done[0].size() < want || done[1].size() < want) && Clock::now() < until)
      for (int i = 0; i < 2; ++i)
        for (auto& f : nodes[i]->engine->progress(Clock::now())) done[i].push_back(std::move(f));
    return done;
  }
  // Drives node `waiter` until it finishes something (10 s at most), and node `other` beside it
  // (its beats carry its stall note and waits).
  std::vector<Finished> progress_until_done(int waiter, int other) {
    std::vector<Finished> done;
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (done.empty() && Clock::now() < until) {
      done = nodes[static_cast<std::size_t>(waiter)]->engine->progress(Clock::now());
      nodes[static_cast<std::size_t>(other)]->engine->progress(Clock::now());
    }
    return done;
  }
  std::vector<std::unique_ptr<Node>> nodes;
};

inline ipc::RequestDesc desc(OpType op, std::uint64_t count) {
  ipc::RequestDesc d;
  d.op = op;
  d.dtype = DType::Float32;
  d.reduce_op = ReduceOp::Sum;
  d.count = count;
  d.chunk_count = count;
  d.seq = 1;
  return d;
}

// Group rank 0 (node 0) sends `count` floats from its arena to group rank 2 (node 1).
inline Posted send_0_to_2(std::uint64_t count, std::uint64_t seq) {
  Posted s;
  s.slot = 0;
  s.group_rank = 0;
  s.desc = desc(OpType::Send, count);
  s.desc.seq = seq;
  s.desc.root = 2;
  s.desc.input = {ipc::BufferKind::Arena, {}, 0, count * 4};
  return s;
}

// Group rank 2 (node 1) receives `count` floats from group rank 0 into its output.
inline Posted recv_2_from_0(std::uint64_t count, std::uint64_t seq) {
  Posted r;
  r.slot = 0;
  r.group_rank = 2;
  r.desc = desc(OpType::Recv, count);
  r.desc.seq = seq;
  r.desc.root = 0;
  r.desc.output = {ipc::BufferKind::Arena, {}, kOut, count * 4};
  return r;
}

}  // namespace
}  // namespace smddp::daemon::internode
