// Host collectives that only move bytes, through a real Daemon on a thread with in-process
// Clients as its ranks: with the daemon told to answer with arena sources at every size, each
// rank copies its output from the members' arenas, and a member's region comes back once its
// readers' counts passed the chunk; with it off, the daemon copies. Both must give the same,
// exact results, over many chunks and rounds in a small arena (a region never freed would fill
// it and the next op would wait for ever; one freed too soon would be overwritten while a peer
// still reads it), and the daemon's status must show which way they ran and no copy left behind.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "client/ctl/control_client.hpp"
#include "ipc/names.hpp"
#include "tests/daemon/daemon_thread.hpp"

namespace smddp::daemon {
namespace {

using namespace std::chrono_literals;
using client::Client;
using client::WorkPtr;
using ipc::DType;

constexpr int kRanks = 3;

std::vector<std::shared_ptr<Client>> attach(const std::string& job) {
  std::vector<std::shared_ptr<Client>> ranks;
  for (int r = 0; r < kRanks; ++r) ranks.push_back(Client::attach(test_daemon::rank_options(job, r, kRanks)));
  return ranks;
}

// Rank r's element i of block b of its input: names all three.
std::int32_t value(int r, std::uint64_t b, std::uint64_t i) {
  return static_cast<std::int32_t>(r * 1'000'000 + b * 100'000 + i % 100'000);
}

using test_daemon::wait_all;

// Runs every byte-moving collective at `count` elements a block, `rounds` times, and checks
// each rank's output element by element.
void run_and_check(const std::vector<std::shared_ptr<Client>>& ranks, std::uint64_t count, int rounds) {
  const auto n = static_cast<std::uint64_t>(kRanks);
  const int root = 1;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::vector<std::int32_t>> in(kRanks), out(kRanks);
    const auto fill = [&](std::uint64_t in_blocks, std::uint64_t out_elems) {
      for (int r = 0; r < kRanks; ++r) {
        in[r].resize(in_blocks * count);
        for (std::uint64_t b = 0; b < in_blocks; ++b)
          for (std::uint64_t i = 0; i < count; ++i) in[r][b * count + i] = value(r, b, i);
        out[r].assign(out_elems, -1);
      }
    };
    std::vector<WorkPtr> w;

    fill(1, n * count);
    for (int r = 0; r < kRanks; ++r) w.push_back(ranks[r]->world()->allgather(in[r].data(), out[r].data(), count, DType::Int32));
    wait_all(w);
    for (int r = 0; r < kRanks; ++r)
      for (std::uint64_t q = 0; q < n; ++q)
        for (std::uint64_t i = 0; i < count; ++i)
          ASSERT_EQ(out[r][q * count + i], value(static_cast<int>(q), 0, i)) << "allgather rank " << r << " block " << q;

    fill(1, 0);
    w.clear();
    for (int r = 0; r < kRanks; ++r) w.push_back(ranks[r]->world()->broadcast(in[r].data(), count, DType::Int32, root));
    wait_all(w);
    for (int r = 0; r < kRanks; ++r)
      for (std::uint64_t i = 0; i < count; ++i) ASSERT_EQ(in[r][i], value(root, 0, i)) << "broadcast rank " << r;

    fill(1, n * count);
    w.clear();
    for (int r = 0; r < kRanks; ++r)
      w.push_back(ranks[r]->world()->gather(in[r].data(), out[r].data(), count, DType::Int32, root));
    wait_all(w);
    for (std::uint64_t q = 0; q < n; ++q)
      for (std::uint64_t i = 0; i < count; ++i) ASSERT_EQ(out[root][q * count + i], value(static_cast<int>(q), 0, i)) << "gather";
    for (int r = 0; r < kRanks; ++r) {
      if (r != root) {
        ASSERT_EQ(out[r][0], -1) << "gather wrote a non-root's output";
      }
    }

    fill(n, count);
    w.clear();
    for (int r = 0; r < kRanks; ++r)
      w.push_back(ranks[r]->world()->scatter(in[r].data(), out[r].data(), count, DType::Int32, root));
    wait_all(w);
    for (int r = 0; r < kRanks; ++r)
      for (std::uint64_t i = 0; i < count; ++i)
        ASSERT_EQ(out[r][i], value(root, static_cast<std::uint64_t>(r), i)) << "scatter rank " << r;

    fill(n, n * count);
    w.clear();
    for (int r = 0; r < kRanks; ++r) w.push_back(ranks[r]->world()->alltoall(in[r].data(), out[r].data(), count, DType::Int32));
    wait_all(w);
    for (int r = 0; r < kRanks; ++r)
      for (std::uint64_t q = 0; q < n; ++q)
        for (std::uint64_t i = 0; i < count; ++i)
          ASSERT_EQ(out[r][q * count + i], value(static_cast<int>(q), static_cast<std::uint64_t>(r), i))
              << "alltoall rank " << r << " from " << q;
  }
}

// The daemon's status once every copy it sent was made (the counts trail the ops a little).
std::optional<nlohmann::json> settled_status(const std::string& job) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  std::optional<nlohmann::json> s;
  do {
    s = ctl::query_status(ipc::socket_path(job, 0));
    if (s && (*s)["direct_reads"].value("copies_behind", 1) == 0) return s;
    std::this_thread::sleep_for(20ms);
  } while (std::chrono::steady_clock::now() < until);
  return s;
}

void run_job(const char* tag, std::optional<std::uint64_t> min_bytes, bool expect_direct) {
  spdlog::set_level(spdlog::level::warn);
  const auto job = test_daemon::unique_job("t-direct-", tag);
  auto config = test_daemon::small_config();
  config.direct_read_min_bytes = min_bytes;
  config.host_fast_bytes = 0;  // the 1-element ops too go through the daemon
  test_daemon::DaemonThread daemon(job, kRanks, config);
  auto ranks = attach(job);
  // 1 element; a few chunks; and enough chunks (each round moves some 10 MiB through 1 MiB
  // arenas) that every region is reused many times.
  for (const std::uint64_t count : {1ull, 5000ull, 300000ull}) {
    SCOPED_TRACE("count " + std::to_string(count));
    run_and_check(ranks, count, count > 100000 ? 3 : 2);
  }
  const auto s = settled_status(job);
  ASSERT_TRUE(s) << "no status from the daemon";
  const auto& dr = (*s)["direct_reads"];
  EXPECT_EQ(dr.value("copies_behind", -1), 0) << s->dump();
  if (expect_direct) EXPECT_GT(dr.value("chunks", 0), 100) << s->dump();
  else EXPECT_EQ(dr.value("chunks", -1), 0) << s->dump();
  for (auto& r : ranks) r->detach();
}

TEST(DaemonDirectRead, RanksReadTheMembersArenasAtEverySizeAndEveryRegionComesBack) {
  run_job("all", 0, true);
}

TEST(DaemonDirectRead, OffTheDaemonCopiesAndTheResultsAreTheSame) { run_job("off", std::nullopt, false); }

// Rank 2 leaves in the middle of a many-chunk allgather, before it copies what it was sent:
// the regions ranks 0 and 1 hold for its reads must come back (it reads nothing any more), or
// their own group, which then fills their 1 MiB arenas many times over, waits for ever.
TEST(DaemonDirectRead, AReaderThatLeftHoldsNoRegion) {
  spdlog::set_level(spdlog::level::err);
  const auto job = test_daemon::unique_job("t-direct-", "left");
  auto config = test_daemon::small_config();
  config.direct_read_min_bytes = 0;
  config.host_fast_bytes = 0;
  test_daemon::DaemonThread daemon(job, kRanks, config);
  auto ranks = attach(job);
  client::CommunicatorPtr pair[2];
  std::thread second([&] { pair[1] = ranks[1]->create_communicator(5, {0, 1}); });
  pair[0] = ranks[0]->create_communicator(5, {0, 1});
  second.join();

  const std::uint64_t count = 100000;  // 25 chunks a rank
  std::vector<std::vector<std::int32_t>> in(kRanks, std::vector<std::int32_t>(count, 7)),
      out(kRanks, std::vector<std::int32_t>(kRanks * count));
  std::vector<WorkPtr> w;
  for (int r = 0; r < kRanks; ++r) w.push_back(ranks[r]->world()->allgather(in[r].data(), out[r].data(), count, DType::Int32));
  ranks[2]->detach();
  for (int r = 0; r < 2; ++r) {
    try {
      w[r]->wait(20s);  // done, or failed naming rank 2: either way its regions are no longer read
    } catch (const client::Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    }
  }
  for (int round = 0; round < 20; ++round) {
    // Inputs that differ per rank, element and round, and outputs reset: a pair allgather that
    // copied nothing, left stale bytes or swapped the blocks fails.
    auto value = [&](int r, std::uint64_t i) { return static_cast<std::int32_t>(round * 1000 + r * 100 + static_cast<int>(i)); };
    for (int r = 0; r < 2; ++r) {
      for (std::uint64_t i = 0; i < count; ++i) in[static_cast<std::size_t>(r)][i] = value(r, i);
      std::fill(out[static_cast<std::size_t>(r)].begin(), out[static_cast<std::size_t>(r)].end(), -1);
    }
    std::vector<WorkPtr> p;
    for (int r = 0; r < 2; ++r)
      p.push_back(pair[r]->allgather(in[r].data(), out[r].data(), count, DType::Int32));
    wait_all(p);
    for (int r = 0; r < 2; ++r)
      for (int q = 0; q < 2; ++q)
        for (std::uint64_t i = 0; i < count; ++i)
          ASSERT_EQ(out[static_cast<std::size_t>(r)][static_cast<std::uint64_t>(q) * count + i], value(q, i))
              << "round " << round << ", rank " << r << "'s block of rank " << q << ", element " << i;
  }
  for (auto& r : ranks) r->detach();
}

}  // namespace
}  // namespace smddp::daemon
