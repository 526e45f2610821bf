// The host fast path through a real Daemon on a thread, with in-process Clients as its ranks:
// small collectives of the world and of subgroups run among the ranks' fast cells, the daemon
// gives each communicator a lane, checks and counts what the ranks ran, reports a rank that
// went the other way as a mismatch, and leaves communicators it has no lane for on its own path.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <memory>
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
using client::CommunicatorPtr;
using client::WorkPtr;
using ipc::DType;
using ipc::ReduceOp;

constexpr int kRanks = 3;

struct Job {
  explicit Job(const char* tag, DaemonConfig config = test_daemon::small_config())
      : id(test_daemon::unique_job("t-hostfast-", tag)), daemon(id, kRanks, std::move(config)) {
    spdlog::set_level(spdlog::level::warn);
    for (int r = 0; r < kRanks; ++r) ranks.push_back(Client::attach(test_daemon::rank_options(id, r, kRanks)));
  }
  ~Job() {
    for (auto& r : ranks) r->detach();
  }
  // Every member of `members` creates communicator `comm_id` (concurrently, as ranks would).
  std::vector<CommunicatorPtr> create(std::uint64_t comm_id, const std::vector<int>& members) {
    return test_daemon::create_communicator(ranks, comm_id, members);
  }
  // The daemon's status once it has matched `fast` fast-path operations (it learns of them late).
  nlohmann::json status_after(std::uint64_t fast) {
    std::optional<nlohmann::json> s;
    const auto until = std::chrono::steady_clock::now() + 5s;
    do {
      ranks[0]->world();  // nothing to do: the daemon wakes by itself within 100 ms
      s = ctl::query_status(ipc::socket_path(id, 0));
      if (s && (*s)["host_fast_path"].value("operations", std::uint64_t{0}) >= fast) return *s;
      std::this_thread::sleep_for(20ms);
    } while (std::chrono::steady_clock::now() < until);
    return s.value_or(nlohmann::json::object());
  }
  std::string id;
  test_daemon::DaemonThread daemon;
  std::vector<std::shared_ptr<Client>> ranks;
};

// An allreduce of `comms` (one per member, in member order) with rank r's input r + 1.
std::vector<float> allreduce(const std::vector<CommunicatorPtr>& comms, const std::vector<int>& members,
                             std::uint64_t count) {
  std::vector<std::vector<float>> in, out(comms.size(), std::vector<float>(count, -1));
  std::vector<WorkPtr> w;
  for (std::size_t i = 0; i < comms.size(); ++i) {
    in.emplace_back(count, static_cast<float>(members[i] + 1));
    w.push_back(comms[i]->allreduce(in[i].data(), out[i].data(), count, DType::Float32, ReduceOp::Sum));
  }
  test_daemon::wait_all(w);
  for (std::size_t i = 1; i < out.size(); ++i) EXPECT_EQ(out[i], out[0]) << "member " << i;
  return out[0];
}

TEST(DaemonHostFast, WorldAndSubgroupsRunAmongTheRanksAndTheDaemonCountsThem) {
  Job j("count");
  std::vector<CommunicatorPtr> world;
  for (auto& r : j.ranks) world.push_back(r->world());
  auto pair = j.create(5, {0, 2});
  for (int round = 0; round < 50; ++round) {
    EXPECT_EQ(allreduce(world, {0, 1, 2}, 7), std::vector<float>(7, 6.f));
    EXPECT_EQ(allreduce(pair, {0, 2}, 3), std::vector<float>(3, 4.f));
  }
  const auto s = j.status_after(100);  // 50 world and 50 pair collectives
  ASSERT_TRUE(s.contains("host_fast_path")) << s.dump();
  EXPECT_EQ(s["host_fast_path"].value("operations", 0), 100) << s.dump();
  EXPECT_EQ(s["host_fast_path"].value("communicators", 0), 2) << s.dump();  // the world's lane and the pair's
  EXPECT_TRUE(s["stalls"].empty()) << s.dump();
  // Each member's output bytes count as moved: 50 x (3 x 7 + 2 x 3) floats.
  EXPECT_EQ(s.value("bytes_moved", 0), 50 * (3 * 7 + 2 * 3) * 4) << s.dump();
}

// The ranks never wait for the daemon's answers to their fast operations, so a burst of them
// can leave a full completion ring behind: a rank that then computes for a while, or exits,
// has not failed. (The daemon failed the job once with "does not drain its completion ring",
// after 5 s of a rank's computing, or at once when the rank had exited: exit status 1 for a job
// whose ranks all succeeded.)
TEST(DaemonHostFast, UnreadAnswersOfABurstFailNeitherARankThatComputesNorOneThatExits) {
  for (int job = 0; job < 3; ++job) {
    std::optional<Job> j(std::in_place, "burst");
    std::vector<CommunicatorPtr> world;
    for (auto& r : j->ranks) world.push_back(r->world());
    const auto burst = [&] {
      for (int i = 0; i < 1500; ++i) allreduce(world, {0, 1, 2}, 1);
    };
    burst();
    if (job == 0) {
      std::this_thread::sleep_for(6s);  // longer than the daemon waits for a full ring
      EXPECT_EQ(allreduce(world, {0, 1, 2}, 2), std::vector<float>(2, 6.f));
      burst();
    }
    const auto s = j->status_after(0);
    EXPECT_EQ(s.value("job_error", std::string("?")), "") << s.dump();
    world.clear();
    for (auto& r : j->ranks) r->detach();
    EXPECT_EQ(j->daemon.join(), 0) << "job " << job;
  }
}

TEST(DaemonHostFast, ARankOnTheDaemonsPathIsAMismatchNamingEveryCallAndTheGroupGoesOn) {
  Job j("mixed");
  std::vector<float> small(8, 1.f), big(100000, 1.f), out(100000);
  std::vector<WorkPtr> w;
  w.push_back(j.ranks[0]->world()->allreduce(small.data(), small.data(), 8, DType::Float32, ReduceOp::Sum));
  for (int r = 1; r < kRanks; ++r)
    w.push_back(j.ranks[r]->world()->allreduce(big.data(), out.data(), 100000, DType::Float32, ReduceOp::Sum));
  for (int r = 0; r < kRanks; ++r) {
    try {
      w[static_cast<std::size_t>(r)]->wait(20s);
      ADD_FAILURE() << "rank " << r << " expected the mismatch";
    } catch (const client::Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.status(), client::Status::Mismatch) << what;
      EXPECT_NE(what.find("rank 0 called allreduce(float32, count=8, op=sum)"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 2 called allreduce(float32, count=100000"), std::string::npos) << what;
    }
  }
  // Every rank turned the path off for the world: the next collective runs through the daemon.
  std::vector<CommunicatorPtr> world;
  for (auto& r : j.ranks) world.push_back(r->world());
  EXPECT_EQ(allreduce(world, {0, 1, 2}, 4), std::vector<float>(4, 6.f));
  const auto s = j.status_after(0);
  EXPECT_EQ(s["host_fast_path"].value("operations", -1), 0) << s.dump();
}

TEST(DaemonHostFast, ACommunicatorBeyondTheLanesUsesTheDaemon) {
  Job j("lanes");
  // The world holds lane 0; 15 pairs take lanes 1-15 of slots 0 and 1; the 16th gets none.
  std::vector<std::vector<CommunicatorPtr>> pairs;
  for (std::uint64_t id = 1; id <= ipc::kFastLanes; ++id) pairs.push_back(j.create(id, {0, 1}));
  for (auto& p : pairs) EXPECT_EQ(allreduce(p, {0, 1}, 5), std::vector<float>(5, 3.f));
  // Slot 2 still has every lane but 0: a pair of it and slot 0 gets no lane either.
  auto other = j.create(100, {0, 2});
  EXPECT_EQ(allreduce(other, {0, 2}, 5), std::vector<float>(5, 4.f));
  const auto s = j.status_after(ipc::kFastLanes - 1);
  EXPECT_EQ(s["host_fast_path"].value("operations", 0), ipc::kFastLanes - 1) << s.dump();
  EXPECT_EQ(s["host_fast_path"].value("communicators", 0), ipc::kFastLanes) << s.dump();
}

TEST(DaemonHostFast, OffInTheConfigEverythingGoesThroughTheDaemon) {
  auto config = test_daemon::small_config();
  config.host_fast_bytes = 0;
  Job j("off", config);
  std::vector<CommunicatorPtr> world;
  for (auto& r : j.ranks) world.push_back(r->world());
  EXPECT_EQ(allreduce(world, {0, 1, 2}, 7), std::vector<float>(7, 6.f));
  const auto s = j.status_after(0);
  EXPECT_EQ(s["host_fast_path"].value("operations", -1), 0) << s.dump();
  EXPECT_EQ(s["host_fast_path"].value("communicators", -1), 0) << s.dump();
  EXPECT_GE(s.value("collectives_done", 0), 1) << s.dump();
}


// The daemon's ledger holds a fast operation for 100 ms at most; one whose members come further
// apart leaves for its matcher, where the late members' requests meet it: counted once, no error,
// and the operations after it are the ledger's again.
TEST(DaemonHostFast, AnOperationWhoseMembersComeFarApartIsCountedOnce) {
  Job j("apart");
  std::vector<CommunicatorPtr> world;
  for (auto& r : j.ranks) world.push_back(r->world());
  std::vector<std::vector<float>> in(kRanks, std::vector<float>(5)), out(kRanks, std::vector<float>(5, -1));
  for (int r = 0; r < kRanks; ++r) in[static_cast<std::size_t>(r)].assign(5, static_cast<float>(r + 1));
  std::vector<WorkPtr> w;
  w.push_back(world[0]->allreduce(in[0].data(), out[0].data(), 5, DType::Float32, ReduceOp::Sum));
  std::this_thread::sleep_for(400ms);  // the daemon wakes within 100 ms and takes rank 0's request
  for (int r = 1; r < kRanks; ++r)
    w.push_back(world[static_cast<std::size_t>(r)]->allreduce(in[static_cast<std::size_t>(r)].data(),
                                                              out[static_cast<std::size_t>(r)].data(), 5,
                                                              DType::Float32, ReduceOp::Sum));
  test_daemon::wait_all(w);
  for (const auto& o : out) EXPECT_EQ(o, std::vector<float>(5, 6.f));
  for (int round = 0; round < 20; ++round) EXPECT_EQ(allreduce(world, {0, 1, 2}, 5), std::vector<float>(5, 6.f));
  const auto s = j.status_after(21);
  EXPECT_EQ(s["host_fast_path"].value("operations", 0), 21) << s.dump();
  EXPECT_EQ(s.value("bytes_moved", 0), 21 * 3 * 5 * 4) << s.dump();
  EXPECT_EQ(s.value("job_error", std::string("?")), "") << s.dump();
  EXPECT_TRUE(s["errors"].empty()) << s.dump();
  EXPECT_TRUE(s["stalls"].empty()) << s.dump();
}

}  // namespace
}  // namespace smddp::daemon
