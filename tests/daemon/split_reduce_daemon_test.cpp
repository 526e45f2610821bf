// Host reductions split among the ranks (ipc::CompletionKind::Shares), through a real Daemon on
// a thread with in-process Clients as its ranks. With the daemon told to split every chunk, each
// rank reduces its share of the chunk from the members' arenas and copies the others' shares;
// with it off, the daemon reduces. Both must give the same bits (every share is reduced in
// group-rank order, as the daemon does), over many chunks in small arenas (a region never freed
// would fill the arena, one freed too soon would be overwritten while a peer still reads it),
// for every reducing collective, in the world and in a subgroup, and the status must say which
// way they ran with no share left behind.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "client/ctl/control_client.hpp"
#include "ipc/names.hpp"
#include "ipc/protocol.hpp"
#include "tests/daemon/daemon_thread.hpp"

namespace smddp::daemon {
namespace {

using namespace std::chrono_literals;
using client::Client;
using client::CommunicatorPtr;
using client::WorkPtr;
using ipc::DType;
using ipc::OpType;
using ipc::ReduceOp;

constexpr int kRanks = 3;

struct Job {
  Job(const char* tag, std::optional<std::uint64_t> split_min)
      : id(test_daemon::unique_job("t-split-", tag)), daemon(id, kRanks, config(split_min)) {
    spdlog::set_level(spdlog::level::warn);
    for (int r = 0; r < kRanks; ++r) ranks.push_back(Client::attach(test_daemon::rank_options(id, r, kRanks)));
  }
  ~Job() {
    for (auto& r : ranks) r->detach();
  }
  static DaemonConfig config(std::optional<std::uint64_t> split_min) {
    auto c = test_daemon::small_config();
    c.split_reduce_min = SplitReduceMin::fixed(split_min);
    c.host_fast_bytes = 0;  // the small ops too go through the daemon
    return c;
  }
  std::vector<CommunicatorPtr> create(std::uint64_t comm_id, const std::vector<int>& members) {
    return test_daemon::create_communicator(ranks, comm_id, members);
  }
  // The status once every share the ranks were sent is reduced (the counts trail the ops).
  nlohmann::json settled_status() {
    std::optional<nlohmann::json> s;
    const auto until = std::chrono::steady_clock::now() + 10s;
    do {
      s = ctl::query_status(ipc::socket_path(id, 0));
      if (s && (*s)["split_reductions"].value("shares_behind", 1) == 0 &&
          (*s)["direct_reads"].value("copies_behind", 1) == 0)
        return *s;
      std::this_thread::sleep_for(20ms);
    } while (std::chrono::steady_clock::now() < until);
    return s.value_or(nlohmann::json::object());
  }
  std::string id;
  test_daemon::DaemonThread daemon;
  std::vector<std::shared_ptr<Client>> ranks;
};

// Member r's input: values whose sums round differently in another order (floating types).
std::vector<std::byte> input(DType t, int r, std::uint64_t elems, int round) {
  std::vector<std::byte> b(elems * ipc::dtype_size(t));
  for (std::uint64_t i = 0; i < elems; ++i) {
    const double v = (static_cast<double>((i * 7919 + static_cast<std::uint64_t>(r) * 104729 + round) % 1000) - 500) /
                     (r == 1 ? 3.0 : 7.0);
    switch (t) {
      case DType::Float32: {
        const auto f = static_cast<float>(v);
        std::memcpy(b.data() + i * 4, &f, 4);
        break;
      }
      case DType::Float64: std::memcpy(b.data() + i * 8, &v, 8); break;
      case DType::BFloat16: {
        const auto f = static_cast<float>(v);
        std::uint32_t u;
        std::memcpy(&u, &f, 4);
        const auto h = static_cast<std::uint16_t>(u >> 16);
        std::memcpy(b.data() + i * 2, &h, 2);
        break;
      }
      default: {
        const auto x = static_cast<std::int32_t>(v * 1000);
        std::memcpy(b.data() + i * 4, &x, 4);
      }
    }
  }
  return b;
}

struct Case {
  OpType op;
  DType dtype;
  ReduceOp reduce;
  std::uint64_t count;  // per block
};

// Runs `c` on `comms` (members in group order) and returns every member's output.
std::vector<std::vector<std::byte>> run(const std::vector<CommunicatorPtr>& comms, const Case& c, int round) {
  const auto n = comms.size();
  const std::uint64_t e = ipc::dtype_size(c.dtype);
  const std::uint64_t in_elems = c.op == OpType::ReduceScatter ? c.count * n : c.count;
  std::vector<std::vector<std::byte>> in, out;
  std::vector<WorkPtr> w;
  for (std::size_t g = 0; g < n; ++g) {
    in.push_back(input(c.dtype, static_cast<int>(g), in_elems, round));
    out.emplace_back(c.count * e, std::byte{0xEE});
    switch (c.op) {
      case OpType::AllReduce:
        w.push_back(comms[g]->allreduce(in[g].data(), out[g].data(), c.count, c.dtype, c.reduce));
        break;
      case OpType::Reduce:
        w.push_back(comms[g]->reduce(in[g].data(), out[g].data(), c.count, c.dtype, c.reduce, 1));
        break;
      default:
        w.push_back(comms[g]->reduce_scatter(in[g].data(), out[g].data(), c.count, c.dtype, c.reduce));
    }
  }
  test_daemon::wait_all(w);
  if (c.op == OpType::Reduce)
    for (std::size_t g = 0; g < n; ++g)
      if (g != 1) out[g].clear();  // nothing is written there
  return out;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  // One element; a chunk's share smaller than a 64-element run (members get nothing); chunks
  // of 64 KiB (small_config) in the arena of 1 MiB, reused over and over.
  for (const std::uint64_t count : {1ull, 100ull, 20000ull, 300000ull}) {
    v.push_back({OpType::AllReduce, DType::Float32, ReduceOp::Sum, count});
    v.push_back({OpType::Reduce, DType::Float32, ReduceOp::Sum, count});
    v.push_back({OpType::ReduceScatter, DType::Float32, ReduceOp::Sum, count / 3 + 1});
  }
  for (const DType t : {DType::Float64, DType::BFloat16, DType::Int32}) {
    v.push_back({OpType::AllReduce, t, ReduceOp::Sum, 50000});
    v.push_back({OpType::ReduceScatter, t, ReduceOp::Max, 20000});
  }
  v.push_back({OpType::AllReduce, DType::Float32, ReduceOp::Avg, 50000});
  v.push_back({OpType::AllReduce, DType::BFloat16, ReduceOp::Avg, 50000});
  v.push_back({OpType::Reduce, DType::Float64, ReduceOp::Min, 50000});
  v.push_back({OpType::AllReduce, DType::Int32, ReduceOp::BXor, 50000});
  return v;
}

// Every case on the world and on the pair {2, 0} (group ranks 0, 1 = global 2, 0), twice.
std::vector<std::vector<std::vector<std::byte>>> run_all(Job& job) {
  std::vector<CommunicatorPtr> world;
  for (auto& r : job.ranks) world.push_back(r->world());
  const auto pair = job.create(7, {2, 0});
  std::vector<std::vector<std::vector<std::byte>>> all;
  for (int round = 0; round < 2; ++round)
    for (const auto& c : cases()) {
      SCOPED_TRACE(std::string(ipc::to_string(c.op)) + " " + std::string(ipc::to_string(c.dtype)) + " count " +
                   std::to_string(c.count));
      all.push_back(run(world, c, round));
      if (c.op != OpType::Reduce) all.push_back(run(pair, c, round));  // reduce's root 1 is world-only
    }
  return all;
}

TEST(DaemonSplitReduce, TheRanksSharesGiveTheDaemonsBitsForEveryReduction) {
  std::vector<std::vector<std::vector<std::byte>>> split, daemon;
  {
    Job job("on", 0);
    split = run_all(job);
    const auto s = job.settled_status();
    EXPECT_GT(s["split_reductions"].value("chunks", 0), 100) << s.dump();
    EXPECT_EQ(s["split_reductions"].value("shares_behind", -1), 0) << s.dump();
  }
  {
    Job job("off", std::nullopt);
    daemon = run_all(job);
    const auto s = job.settled_status();
    EXPECT_EQ(s["split_reductions"].value("chunks", -1), 0) << s.dump();
  }
  ASSERT_EQ(split.size(), daemon.size());
  for (std::size_t k = 0; k < split.size(); ++k)
    for (std::size_t g = 0; g < split[k].size(); ++g)
      ASSERT_TRUE(split[k][g] == daemon[k][g]) << "call " << k << ", member " << g << " differs from the daemon's result";
}

TEST(DaemonSplitReduce, IntegerSumsAreExact) {
  Job job("exact", 0);
  std::vector<CommunicatorPtr> world;
  for (auto& r : job.ranks) world.push_back(r->world());
  const std::uint64_t count = 200000;  // 13 chunks a rank
  std::vector<std::vector<std::int64_t>> in(kRanks), out(kRanks, std::vector<std::int64_t>(count, -1));
  std::vector<WorkPtr> w;
  for (int r = 0; r < kRanks; ++r) {
    for (std::uint64_t i = 0; i < count; ++i) in[r].push_back(static_cast<std::int64_t>(i) * (r + 1));
    w.push_back(world[r]->allreduce(in[r].data(), out[r].data(), count, DType::Int64, ReduceOp::Sum));
  }
  test_daemon::wait_all(w);
  for (int r = 0; r < kRanks; ++r)
    for (std::uint64_t i = 0; i < count; ++i) ASSERT_EQ(out[r][i], static_cast<std::int64_t>(i) * 6) << "rank " << r << " element " << i;
  EXPECT_GT(job.settled_status()["split_reductions"].value("chunks", 0), 10);
}

}  // namespace
}  // namespace smddp::daemon
