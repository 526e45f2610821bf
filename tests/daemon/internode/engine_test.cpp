// Inter-node engine: two "nodes" in one process, each with its own segment (2 ranks), worker
// pool and transport with one or three endpoints: an in-process loopback (always; sanitizer
// builds too) and, where libfabric is built, tcp;ofi_rxm on loopback. Matches built by hand as
// the matcher hands them over, both engines driven until their operations end.
#include "daemon/internode/engine.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/internode/op.hpp"
#include "tests/daemon/internode/engine_fixture.hpp"
#include "tests/daemon/internode/loopback_transport.hpp"

namespace smddp::daemon::internode {
namespace {

TEST_P(EngineTest, AllReduceSumsEveryRankOfEveryNode) {
  constexpr std::uint64_t n = 1001;  // odd: shards of unequal size
  for (int i = 0; i < 2; ++i)
    for (int s = 0; s < kRanks; ++s)
      for (std::uint64_t k = 0; k < n; ++k) nodes[i]->in(s)[k] = static_cast<float>((i * kRanks + s + 1) * k);
  for (int i = 0; i < 2; ++i) nodes[i]->engine->start(nodes[i]->match(desc(OpType::AllReduce, n), i, n * 4, n * 4), Clock::now());
  auto done = drive();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(done[i].size(), 1u);
    EXPECT_EQ(done[i][0].match.status, ipc::Status::Ok) << done[i][0].match.error;
    for (int s = 0; s < kRanks; ++s)
      for (std::uint64_t k = 0; k < n; ++k) ASSERT_EQ(nodes[i]->out(s)[k], static_cast<float>(10 * k)) << i << s << k;
  }
}

// The operator's counters: what each node reduced on its CPU and sent on the fabric, under the
// operation's type. 2 nodes x 2 ranks, N bytes a rank: the node's sum (N) and its half of the
// chunk across nodes (N/2) are reduced; half the chunk goes out in each of the two steps, plus
// the descriptors.
TEST_P(EngineTest, CountsTheBytesItReducesAndSendsByOperationType) {
  constexpr std::uint64_t n = 64 << 10;  // 256 KiB a rank: above the eager exchange
  constexpr std::uint64_t N = n * 4;
  static_assert(kRanks == 2);
  for (int i = 0; i < 2; ++i)
    for (int s = 0; s < kRanks; ++s)
      for (std::uint64_t k = 0; k < n; ++k) nodes[i]->in(s)[k] = 1.0f;
  for (int i = 0; i < 2; ++i) nodes[i]->engine->start(nodes[i]->match(desc(OpType::AllReduce, n), i, N, N), Clock::now());
  auto done = drive();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(done[i].size(), 1u);
    ASSERT_EQ(done[i][0].match.status, ipc::Status::Ok) << done[i][0].match.error;
    const Engine& e = *nodes[i]->engine;
    EXPECT_EQ(e.host_reduced()[OpType::AllReduce], N + N / 2) << "node " << i;
    EXPECT_GE(e.fabric_sent()[OpType::AllReduce], N) << "node " << i;
    EXPECT_LE(e.fabric_sent()[OpType::AllReduce], N + 4 * sizeof(ipc::RequestDesc)) << "node " << i;
    EXPECT_EQ(e.fabric_sent()[OpType::AllGather], 0u);
    EXPECT_EQ(e.host_reduced()[OpType::AllGather], 0u);
  }
}

// The staging buffers of one operation are reused by the next ones (StagingPool): what an
// earlier operation received must never show in a later one's result, and operations in flight
// together never share one.
TEST_P(EngineTest, AllReducesInFlightTogetherAndOneAfterAnotherEachSumTheirOwnInputs) {
  constexpr std::uint64_t n = 4099;  // per chunk
  constexpr int chunks = 3;           // in flight together, each in its own part of the arenas
  constexpr std::uint64_t stride = 32ull << 10;  // bytes, more than a chunk
  const auto value = [](int round, int chunk, int g, std::uint64_t k) {
    return static_cast<float>((g + 1) * (round * chunks + chunk + 1)) + static_cast<float>(k % 7);
  };
  for (int round = 0; round < 8; ++round) {
    for (int c = 0; c < chunks; ++c)
      for (int i = 0; i < 2; ++i)
        for (int s = 0; s < kRanks; ++s)
          for (std::uint64_t k = 0; k < n; ++k) nodes[i]->in(s)[c * stride / 4 + k] = value(round, c, i * kRanks + s, k);
    for (int c = 0; c < chunks; ++c) {
      auto d = desc(OpType::AllReduce, chunks * n);
      d.seq = static_cast<std::uint64_t>(round + 1);
      d.chunk_count = n;
      d.chunk_offset = static_cast<std::uint64_t>(c) * n;
      for (int i = 0; i < 2; ++i) {
        auto m = nodes[i]->match(d, i, n * 4, n * 4);
        for (auto& p : m.posted) {
          p.desc.input.offset = c * stride;
          p.desc.output.offset = kOut + c * stride;
        }
        nodes[i]->engine->start(std::move(m), Clock::now());
      }
    }
    auto done = drive(chunks);
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(done[i].size(), static_cast<std::size_t>(chunks));
      for (const auto& f : done[i]) ASSERT_EQ(f.match.status, ipc::Status::Ok) << f.match.error;
      for (int c = 0; c < chunks; ++c)
        for (int s = 0; s < kRanks; ++s)
          for (std::uint64_t k = 0; k < n; ++k) {
            float want = 0;
            for (int g = 0; g < 2 * kRanks; ++g) want += value(round, c, g, k);
            ASSERT_EQ(nodes[i]->out(s)[c * stride / 4 + k], want)
                << "round " << round << " chunk " << c << " node " << i << " rank " << s << " element " << k;
          }
    }
  }
}

// Captures the log at trace level while alive (the default logger is restored however the test
// leaves).
class TraceCapture {
 public:
  TraceCapture()
      : before_(spdlog::default_logger()),
        logger_(std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(text_))) {
    logger_->set_level(spdlog::level::trace);
    spdlog::set_default_logger(logger_);
  }
  ~TraceCapture() { spdlog::set_default_logger(before_); }
  TraceCapture(const TraceCapture&) = delete;
  TraceCapture& operator=(const TraceCapture&) = delete;
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::logger> before_, logger_;
};

// log_level = trace: each step of an operation across nodes is logged with its timing.
TEST_P(EngineTest, TraceLevelLogsEveryStepOfAnOperation) {
  TraceCapture trace;
  // Too large to send with the descriptors: the reduce-scatter, then the all-gather.
  constexpr std::uint64_t n = 2 * kEagerBytes / 4;
  for (int i = 0; i < 2; ++i) nodes[i]->engine->start(nodes[i]->match(desc(OpType::AllReduce, n), i, n * 4, n * 4), Clock::now());
  auto done = drive();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(done[i].size(), 1u);
    EXPECT_EQ(done[i][0].match.status, ipc::Status::Ok) << done[i][0].match.error;
  }
  const std::string log = trace.text();
  for (const char* step : {"internode: allreduce #1 chunk at 0 phase 0 started", "phase 1 posted", "phase 2 posted", "done"})
    EXPECT_NE(log.find(step), std::string::npos) << step << " not in:\n" << log;
  EXPECT_NE(log.find(" us, +"), std::string::npos) << log;
}

// Small AllReduce and AllGather send their data with their descriptors: one exchange, so no
// step after the descriptors posts messages (the trace shows none), and the results are right.
// A larger one takes the two steps.
TEST_P(EngineTest, SmallOperationsSendTheirDataWithTheirDescriptors) {
  TraceCapture trace;
  constexpr std::uint64_t n = kEagerMessageBytes / 4 / kRanks;  // the largest AllGather that goes eagerly
  for (int i = 0; i < 2; ++i)
    for (int s = 0; s < kRanks; ++s)
      for (std::uint64_t k = 0; k < n; ++k) nodes[i]->in(s)[k] = static_cast<float>(1000 * (i * kRanks + s) + k);
  for (int i = 0; i < 2; ++i)
    nodes[i]->engine->start(nodes[i]->match(desc(OpType::AllGather, n), i, n * 4, 2 * kRanks * n * 4), Clock::now());
  auto gathered = drive();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(gathered[i].size(), 1u);
    EXPECT_EQ(gathered[i][0].match.status, ipc::Status::Ok) << gathered[i][0].match.error;
    for (int s = 0; s < kRanks; ++s)
      for (int g = 0; g < 2 * kRanks; ++g)
        for (std::uint64_t k = 0; k < n; ++k)
          ASSERT_EQ(nodes[i]->out(s)[g * n + k], static_cast<float>(1000 * g + k)) << "node " << i << " rank " << s;
  }
  auto sum = desc(OpType::AllReduce, n);
  sum.seq = 2;
  sum.reduce_op = ReduceOp::Avg;
  for (int i = 0; i < 2; ++i) nodes[i]->engine->start(nodes[i]->match(sum, i, n * 4, n * 4), Clock::now());
  auto averaged = drive();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(averaged[i].size(), 1u);
    EXPECT_EQ(averaged[i][0].match.status, ipc::Status::Ok) << averaged[i][0].match.error;
    for (int s = 0; s < kRanks; ++s)
      for (std::uint64_t k = 0; k < n; ++k)
        ASSERT_EQ(nodes[i]->out(s)[k], static_cast<float>(1500 + k)) << "node " << i << " rank " << s << " element " << k;
  }
  auto larger = desc(OpType::AllGather, n + 1);  // a node's blocks just over one eager message
  larger.seq = 3;
  for (int i = 0; i < 2; ++i)
    nodes[i]->engine->start(nodes[i]->match(larger, i, (n + 1) * 4, 2 * kRanks * (n + 1) * 4), Clock::now());
  auto two_step = drive();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(two_step[i].size(), 1u);
    EXPECT_EQ(two_step[i][0].match.status, ipc::Status::Ok) << two_step[i][0].match.error;
  }
  const std::string log = trace.text();
  EXPECT_NE(log.find("allgather #1 chunk at 0 phase 1 done"), std::string::npos) << log;
  EXPECT_NE(log.find("allreduce #2 chunk at 0 phase 1 done"), std::string::npos) << log;
  const std::string first_posted = "allgather #3 chunk at 0 phase 1 posted";
  const auto two_steps = log.find(first_posted);
  ASSERT_NE(two_steps, std::string::npos) << log;
  EXPECT_EQ(log.find("posted"), two_steps + first_posted.size() - 6)
      << "a small operation posted messages after its descriptors:\n" << log;
}

// Reduce, ReduceScatter, Broadcast, Gather, Scatter and AllToAll go in one exchange too while
// small (their results as the two-step algorithms give them), and in two steps just above the
// bound.
TEST_P(EngineTest, OtherSmallCollectivesGoInOneExchangeToo) {
  constexpr int kWorld = 2 * kRanks;
  // Whole numbers: every order of addition gives the same sum.
  const auto input = [](int g, std::uint64_t k) { return static_cast<float>(1000 * g + static_cast<int>(k % 997)); };
  struct Case {
    OpType op;
    std::uint64_t count;  // elements of a block (Broadcast, Reduce: of the tensor)
    ReduceOp reduce;
    int root;
  };
  constexpr std::uint64_t whole = kEagerMessageBytes / 4;  // Reduce, Broadcast: one message
  constexpr std::uint64_t blocks = whole / kRanks;          // a node's blocks in one message
  constexpr std::uint64_t pairs = blocks / kRanks;          // AllToAll: a node's blocks for another's ranks
  const std::vector<Case> cases = {
      {OpType::Reduce, whole, ReduceOp::Sum, 1},          {OpType::Reduce, 7, ReduceOp::Avg, 3},
      {OpType::Reduce, whole + 1, ReduceOp::Sum, 2},      {OpType::ReduceScatter, blocks, ReduceOp::Sum, 0},
      {OpType::ReduceScatter, 3, ReduceOp::Avg, 0},       {OpType::ReduceScatter, blocks + 1, ReduceOp::Sum, 0},
      {OpType::Broadcast, whole, ReduceOp::Sum, 2},       {OpType::Broadcast, 1, ReduceOp::Sum, 1},
      {OpType::Broadcast, whole + 1, ReduceOp::Sum, 3},   {OpType::Gather, blocks, ReduceOp::Sum, 2},
      {OpType::Gather, 5, ReduceOp::Sum, 1},              {OpType::Gather, blocks + 1, ReduceOp::Sum, 0},
      {OpType::Scatter, blocks, ReduceOp::Sum, 3},        {OpType::Scatter, 5, ReduceOp::Sum, 0},
      {OpType::Scatter, blocks + 1, ReduceOp::Sum, 1},    {OpType::AllToAll, pairs, ReduceOp::Sum, 0},
      {OpType::AllToAll, 2, ReduceOp::Sum, 0},            {OpType::AllToAll, pairs + 1, ReduceOp::Sum, 0},
  };
  TraceCapture trace;
  std::uint64_t seq = 0;
  for (const auto& k : cases) {
    auto d = desc(k.op, k.count);
    d.seq = ++seq;
    d.reduce_op = k.reduce;
    d.root = k.root;
    const bool many_in = k.op == OpType::ReduceScatter || k.op == OpType::Scatter || k.op == OpType::AllToAll;
    const bool many_out = k.op == OpType::Gather || k.op == OpType::AllToAll;
    const std::uint64_t in_count = many_in ? kWorld * k.count : k.count, out_count = many_out ? kWorld * k.count : k.count;
    for (int i = 0; i < 2; ++i)
      for (int s = 0; s < kRanks; ++s) {
        for (std::uint64_t e = 0; e < in_count; ++e) nodes[i]->in(s)[e] = input(i * kRanks + s, e);
        for (std::uint64_t e = 0; e < out_count; ++e) nodes[i]->out(s)[e] = -1;
      }
    for (int i = 0; i < 2; ++i) nodes[i]->engine->start(nodes[i]->match(d, i, in_count * 4, out_count * 4), Clock::now());
    auto done = drive();
    const std::string what = std::string(ipc::to_string(k.op)) + " of " + std::to_string(k.count);
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(done[i].size(), 1u) << what;
      ASSERT_EQ(done[i][0].match.status, ipc::Status::Ok) << what << ": " << done[i][0].match.error;
      for (int s = 0; s < kRanks; ++s) {
        const int g = i * kRanks + s;
        if ((k.op == OpType::Reduce || k.op == OpType::Gather) && g != k.root) continue;
        for (std::uint64_t e = 0; e < out_count; ++e) {
          const auto q = static_cast<int>(e / k.count);  // Gather, AllToAll: whose block
          float want = 0;
          switch (k.op) {
            case OpType::Broadcast: want = input(k.root, e); break;
            case OpType::Gather: want = input(q, e % k.count); break;
            case OpType::Scatter: want = input(k.root, static_cast<std::uint64_t>(g) * k.count + e); break;
            case OpType::AllToAll: want = input(q, static_cast<std::uint64_t>(g) * k.count + e % k.count); break;
            default: {
              const std::uint64_t at = k.op == OpType::ReduceScatter ? static_cast<std::uint64_t>(g) * k.count + e : e;
              for (int r = 0; r < kWorld; ++r) want += input(r, at);
              if (k.reduce == ReduceOp::Avg) want /= kWorld;
            }
          }
          ASSERT_EQ(nodes[i]->out(s)[e], want) << what << ", rank " << g << ", element " << e;
        }
      }
    }
  }
  // One exchange: their first step after the descriptors finishes; above the bound it posts.
  const std::string log = trace.text();
  for (std::uint64_t op = 1; op <= cases.size(); ++op) {
    const std::string step = "internode: " + std::string(ipc::to_string(cases[op - 1].op)) + " #" + std::to_string(op) +
                             " chunk at 0 phase 1 " + (op % 3 ? "done" : "posted");
    EXPECT_NE(log.find(step), std::string::npos) << step << " not in:\n" << log;
  }
}

// A node that called something else sends data of another size with its descriptors, or none
// at all (too large to go eagerly): every node still reports the mismatch naming every call,
// not the data message that failed to match, nor a timeout.
TEST_P(EngineTest, AMismatchWithDataSentEagerlyIsStillTheMismatch) {
  struct Case {
    ipc::RequestDesc on0, on1;
    std::uint64_t out1;  // node 1's output elements
    const char* call0;
    const char* call1;
  };
  auto big = desc(OpType::AllReduce, 2 * kEagerBytes / 4);
  const std::vector<Case> cases = {
      {desc(OpType::AllReduce, 8), desc(OpType::AllReduce, 9), 9, "allreduce(float32, count=8", "allreduce(float32, count=9"},
      {desc(OpType::AllReduce, 8), big, big.count, "allreduce(float32, count=8", "allreduce(float32, count=32768"},
      {desc(OpType::AllReduce, 8), desc(OpType::AllGather, 8), 8 * 2 * kRanks, "allreduce(float32, count=8",
       "allgather(float32, count=8"},
  };
  std::uint64_t seq = 1;
  for (const auto& k : cases) {
    auto on0 = k.on0, on1 = k.on1;
    on0.seq = on1.seq = seq++;
    on0.timeout_ms = on1.timeout_ms = 10000;
    nodes[0]->engine->start(nodes[0]->match(on0, 0, on0.count * 4, on0.count * 4), Clock::now());
    nodes[1]->engine->start(nodes[1]->match(on1, 1, on1.count * 4, k.out1 * 4), Clock::now());
    auto done = drive();
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(done[i].size(), 1u) << k.call1;
      EXPECT_EQ(done[i][0].match.status, ipc::Status::Mismatch) << done[i][0].match.error;
      EXPECT_TRUE(done[i][0].mismatch);
      EXPECT_NE(done[i][0].match.error.find(std::string("rank 0 called ") + k.call0), std::string::npos)
          << done[i][0].match.error;
      EXPECT_NE(done[i][0].match.error.find(std::string("rank 3 called ") + k.call1), std::string::npos)
          << done[i][0].match.error;
    }
  }
}

TEST_P(EngineTest, AllGatherPlacesEveryBlock) {
  constexpr std::uint64_t n = 300;
  for (int i = 0; i < 2; ++i)
    for (int s = 0; s < kRanks; ++s)
      for (std::uint64_t k = 0; k < n; ++k) nodes[i]->in(s)[k] = static_cast<float>(1000 * (i * kRanks + s) + k);
  for (int i = 0; i < 2; ++i)
    nodes[i]->engine->start(nodes[i]->match(desc(OpType::AllGather, n), i, n * 4, 4 * n * 4), Clock::now());
  auto done = drive();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(done[i].size(), 1u);
    EXPECT_EQ(done[i][0].match.status, ipc::Status::Ok) << done[i][0].match.error;
    for (int s = 0; s < kRanks; ++s)
      for (int g = 0; g < 4; ++g)
        for (std::uint64_t k = 0; k < n; ++k) ASSERT_EQ(nodes[i]->out(s)[g * n + k], static_cast<float>(1000 * g + k));
  }
}

TEST_P(EngineTest, MismatchAcrossNodesIsOneMessageNamingEveryCallOnBothNodes) {
  for (int i = 0; i < 2; ++i) {
    auto m = nodes[i]->match(desc(OpType::AllReduce, 8), i, 64, 64);
    if (i == 1) m.posted[1].desc.count = m.posted[1].desc.chunk_count = 9;  // rank 3
    nodes[i]->engine->start(std::move(m), Clock::now());
  }
  auto done = drive();
  ASSERT_EQ(done[0].size(), 1u);
  ASSERT_EQ(done[1].size(), 1u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(done[i][0].match.status, ipc::Status::Mismatch);
    EXPECT_TRUE(done[i][0].mismatch);
    EXPECT_EQ(done[i][0].match.error, done[0][0].match.error);
    EXPECT_NE(done[i][0].match.error.find("rank 0 called allreduce(float32, count=8"), std::string::npos);
    EXPECT_NE(done[i][0].match.error.find("rank 3 called allreduce(float32, count=9"), std::string::npos);
  }
}

TEST_P(EngineTest, AnOperationOtherNodesNeverPostStallsThenTimesOutNamingTheirRanks) {
  auto d = desc(OpType::AllReduce, 8);
  d.timeout_ms = 300;
  nodes[0]->engine->start(nodes[0]->match(d, 0, 64, 64), Clock::now());
  auto stalls = nodes[0]->engine->stalls(Clock::now() + std::chrono::seconds(5), std::chrono::seconds(1), true);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].missing_global_ranks, (std::vector<int>{2, 3}));
  EXPECT_TRUE(nodes[0]->engine->stalls(Clock::now() + std::chrono::seconds(5), std::chrono::seconds(1), true).empty());
  const auto done = progress_until_done(0, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].match.status, ipc::Status::Timeout);
  EXPECT_NE(done[0].match.error.find("rank(s) 2 3 on other node(s) never posted it"), std::string::npos)
      << done[0].match.error;
}

// The other node's daemon says which of its ranks are late (its stall warning, in its beats):
// the timeout names the rank behind the ranks that never posted.
TEST_P(EngineTest, ATimeoutRepeatsWhatTheOtherNodeSaysOfItsLateRanks) {
  nodes[1]->engine->set_stall_note("rank(s) 3 late: allreduce on communicator 7 (operation #5) has waited 3 s for them");
  auto d = desc(OpType::AllReduce, 8);
  d.timeout_ms = 600;
  nodes[0]->engine->start(nodes[0]->match(d, 0, 64, 64), Clock::now());
  const auto done = progress_until_done(0, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].match.status, ipc::Status::Timeout);
  EXPECT_NE(done[0].match.error.find("rank(s) 2 3 on other node(s) never posted it (or not all of their node's ranks "
                                     "did); node 1 says: rank(s) 3 late: allreduce on communicator 7 (operation #5)"),
            std::string::npos)
      << done[0].match.error;
}

// The ranks a timeout waited for may wait themselves: the error follows every node's waits
// (each node's beats carry its own) to the rank holding them up.
TEST_P(EngineTest, ATimeoutFollowsTheWaitsToTheRankHoldingUpTheOthers) {
  nodes[1]->engine->set_waits({{2, false, 0, OpType::AllGather, 9, 58, 7.0, {0, 1}},
                               {3, false, 0, OpType::AllGather, 9, 58, 6.6, {2}}});
  nodes[0]->engine->set_waits({{1, true, 4242}});
  auto d = desc(OpType::AllReduce, 8);
  d.timeout_ms = 600;
  nodes[0]->engine->start(nodes[0]->match(d, 0, 64, 64), Clock::now());
  // The engine's own part of the graph: both local ranks wait in it for node 1's.
  std::vector<RankWait> mine;
  nodes[0]->engine->add_waits(Clock::now(), mine);
  ASSERT_EQ(mine.size(), 2u);
  EXPECT_EQ(mine[0].waits_for, (std::vector<int>{2, 3}));
  EXPECT_EQ(mine[1].op, OpType::AllReduce);
  const auto done = progress_until_done(0, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].match.status, ipc::Status::Timeout);
  EXPECT_NE(done[0].match.error.find("never posted it (or not all of their node's ranks did); rank 2 waits in allgather "
                                     "on communicator 9 (operation #58) for rank(s) 0 1 (7 s); rank 1 (pid 4242) is "
                                     "stopped (a signal or a debugger)"),
            std::string::npos)
      << done[0].match.error;
}

// A receive whose sender never sends (held up by a late rank of its own node): the timeout names
// the sender, repeats what the sender's node says of its late ranks, and gives the time it waited.
TEST_P(EngineTest, AReceiveThatTimesOutNamesTheSenderAndWhatItsNodeSays) {
  nodes[0]->engine->set_stall_note("rank(s) 1 late: allreduce on communicator 7 (operation #5) has waited 3 s for them");
  auto r = recv_2_from_0(8, 1);
  r.desc.timeout_ms = 600;
  nodes[1]->engine->start_p2p(nodes[1]->comm, r, Clock::now());
  const auto done = progress_until_done(1, 0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].match.status, ipc::Status::Timeout);
  const auto& e = done[0].match.error;
  EXPECT_NE(e.find("timed out after 0.6 s: rank 0 on node 0 did not finish its send; node 0 says: rank(s) 1 late"),
            std::string::npos)
      << e;
}

// An operation that failed on node 0 before node 0 started it (a refused request, a local
// timeout): node 1's part of it ends at once with node 0's text, instead of at the timeout;
// its later chunks fail as they start, and the next operation runs.
TEST_P(EngineTest, AnOperationThatFailedOnANodeBeforeItStartedThereFailsOnTheOthersAtOnce) {
  const std::string why = "smddp: rank 1's allreduce was refused: input buffer missing";
  nodes[1]->engine->start(nodes[1]->match(desc(OpType::AllReduce, 8), 1, 64, 64), Clock::now());
  const Engine::OpFailure f{0, 1, -1, -1, ipc::Status::InvalidRequest, why};
  EXPECT_TRUE(nodes[0]->engine->announce_op_failure(nodes[0]->comm, f));
  EXPECT_FALSE(nodes[0]->engine->announce_op_failure(nodes[0]->comm, f)) << "announced twice";
  std::vector<Finished> done;
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (done.empty() && Clock::now() < until) {
    for (auto& x : nodes[1]->engine->progress(Clock::now())) done.push_back(std::move(x));
    EXPECT_TRUE(nodes[0]->engine->progress(Clock::now()).empty());
  }
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].match.status, ipc::Status::InvalidRequest);
  EXPECT_EQ(done[0].match.error, why);
  EXPECT_EQ(done[0].match.posted.size(), static_cast<std::size_t>(kRanks));
  const auto told = nodes[1]->engine->take_op_failures();
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].comm, 0u);
  EXPECT_EQ(told[0].seq, 1u);
  EXPECT_EQ(told[0].src, -1);
  EXPECT_EQ(told[0].status, ipc::Status::InvalidRequest);
  EXPECT_EQ(told[0].error, why);
  EXPECT_TRUE(nodes[1]->engine->take_op_failures().empty());
  EXPECT_TRUE(nodes[0]->engine->take_op_failures().empty());
  // Node 1 knows now: it does not echo the failure back.
  EXPECT_FALSE(nodes[1]->engine->announce_op_failure(nodes[1]->comm, f));
  // A later chunk of the same operation ends as it starts.
  auto chunk = desc(OpType::AllReduce, 8);
  chunk.chunk_offset = 8;
  nodes[1]->engine->start(nodes[1]->match(chunk, 1, 64, 64), Clock::now());
  auto later = nodes[1]->engine->progress(Clock::now());
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].match.error, why);
  // The next operation runs on both nodes.
  auto next = desc(OpType::AllReduce, 8);
  next.seq = 2;
  for (int i = 0; i < 2; ++i) nodes[i]->engine->start(nodes[i]->match(next, i, 64, 64), Clock::now());
  auto ok = drive();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(ok[i].size(), 1u);
    EXPECT_EQ(ok[i][0].match.status, ipc::Status::Ok) << ok[i][0].match.error;
  }
}

// Once a node started a part of an operation the others wait for that part, which runs: a
// failure of another part there is not announced (the others fall back to their timeout).
TEST_P(EngineTest, AFailureOfAnOperationThisNodeStartedIsNotAnnounced) {
  nodes[0]->engine->start(nodes[0]->match(desc(OpType::AllReduce, 8), 0, 64, 64), Clock::now());
  EXPECT_FALSE(nodes[0]->engine->announce_op_failure(nodes[0]->comm, {0, 1, -1, -1, ipc::Status::InvalidRequest, "x"}));
  nodes[1]->engine->start(nodes[1]->match(desc(OpType::AllReduce, 8), 1, 64, 64), Clock::now());
  auto done = drive();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(done[i].size(), 1u);
    EXPECT_EQ(done[i][0].match.status, ipc::Status::Ok) << done[i][0].match.error;
  }
}

// A send longer or shorter than its receive, small or large: the receiver reports the pair's
// calls, the sender finishes, and the two nodes' later messages still arrive (tcp;ofi_rxm loses a pair's later
// messages after a truncated receive, heartbeats included: a peer then looks dead).
TEST_P(EngineTest, ASendRecvSizeMismatchFailsThePairAndLaterMessagesStillArrive) {
  std::uint64_t seq = 1;
  constexpr std::uint64_t big = 2 * kEagerMessageBytes / 4;  // received straight into the output
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> pairs = {{16, 8}, {4, 8}, {big + 100, big}, {big - 100, big}};
  for (const auto& [sent, wanted] : pairs) {  // elements
    auto s = send_0_to_2(sent, seq);
    auto r = recv_2_from_0(wanted, seq++);
    s.desc.timeout_ms = r.desc.timeout_ms = 5000;
    nodes[0]->engine->start_p2p(nodes[0]->comm, s, Clock::now());
    nodes[1]->engine->start_p2p(nodes[1]->comm, r, Clock::now());
    auto done = drive();
    ASSERT_EQ(done[0].size(), 1u) << "the send finishes";
    ASSERT_EQ(done[1].size(), 1u);
    EXPECT_EQ(done[1][0].match.status, ipc::Status::Mismatch) << done[1][0].match.error;
    EXPECT_NE(done[1][0].match.error.find("rank 0 called send(float32, count=" + std::to_string(sent)), std::string::npos)
        << done[1][0].match.error;
  }
  {  // A receive in two chunks of 8 against a send of 8: the chunk no send will ever match fails
     // with the mismatch at once, not at its timeout.
    auto s = send_0_to_2(8, seq);
    s.desc.timeout_ms = 5000;
    nodes[0]->engine->start_p2p(nodes[0]->comm, s, Clock::now());
    for (std::uint64_t chunk = 0; chunk < 2; ++chunk) {
      auto r = recv_2_from_0(16, seq);
      r.desc.timeout_ms = 5000;
      r.desc.chunk_count = 8;
      r.desc.chunk_offset = 8 * chunk;
      r.desc.output = {ipc::BufferKind::Arena, {}, kOut + 32 * chunk, 32};
      nodes[1]->engine->start_p2p(nodes[1]->comm, r, Clock::now());
    }
    ++seq;
    const auto start = Clock::now();
    std::vector<std::vector<Finished>> done(2);
    while ((done[0].empty() || done[1].size() < 2) && Clock::now() - start < std::chrono::seconds(20))
      for (int i = 0; i < 2; ++i)
        for (auto& f : nodes[i]->engine->progress(Clock::now())) done[i].push_back(std::move(f));
    ASSERT_EQ(done[1].size(), 2u);
    for (const auto& f : done[1]) {
      EXPECT_EQ(f.match.status, ipc::Status::Mismatch) << f.match.error;
      EXPECT_NE(f.match.error.find("rank 0 called send(float32, count=8"), std::string::npos) << f.match.error;
    }
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(4)) << "a chunk waited for its timeout";
  }
  // A pair that agrees, small and large, still delivers.
  for (const std::uint64_t count : {std::uint64_t{8}, big}) {
    for (std::uint64_t k = 0; k < count; ++k) nodes[0]->in(0)[k] = static_cast<float>(k + count);
    const auto s = send_0_to_2(count, seq);
    const auto r = recv_2_from_0(count, seq++);
    nodes[1]->engine->start_p2p(nodes[1]->comm, r, Clock::now());
    nodes[0]->engine->start_p2p(nodes[0]->comm, s, Clock::now());
    auto done = drive();
    ASSERT_EQ(done[1].size(), 1u);
    EXPECT_EQ(done[1][0].match.status, ipc::Status::Ok) << done[1][0].match.error;
    for (std::uint64_t k = 0; k < count; ++k) ASSERT_EQ(nodes[1]->out(0)[k], static_cast<float>(k + count)) << k;
  }
  // Both ways, large enough to leave the providers' eager protocols.
  constexpr std::uint64_t n = 2 * kEagerBytes / 4;
  for (int i = 0; i < 2; ++i)
    for (int r = 0; r < kRanks; ++r)
      for (std::uint64_t k = 0; k < n; ++k) nodes[i]->in(r)[k] = 1.0f;
  auto d = desc(OpType::AllReduce, n);
  d.seq = seq;
  d.timeout_ms = 5000;
  for (int i = 0; i < 2; ++i) nodes[i]->engine->start(nodes[i]->match(d, i, n * 4, n * 4), Clock::now());
  auto done = drive();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(done[i].size(), 1u);
    EXPECT_EQ(done[i][0].match.status, ipc::Status::Ok) << done[i][0].match.error;
    EXPECT_EQ(nodes[i]->out(0)[n - 1], 4.0f);
  }
}

// A send/recv: the failure names the pair, and only that pair's operation ends.
TEST_P(EngineTest, ASendThatFailedOnItsNodeFailsTheReceiverOnTheOther) {
  auto r = recv_2_from_0(8, 1);
  nodes[1]->engine->start_p2p(nodes[1]->comm, r, Clock::now());
  auto other = r;  // rank 3 receives from rank 1: not the failed pair
  other.slot = 1;
  other.group_rank = 3;
  other.desc.root = 1;
  other.desc.timeout_ms = 500;
  nodes[1]->engine->start_p2p(nodes[1]->comm, other, Clock::now());
  EXPECT_TRUE(nodes[0]->engine->announce_op_failure(nodes[0]->comm, {0, 1, 0, 2, ipc::Status::InvalidRequest, "refused"}));
  std::vector<Finished> done;
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (done.size() < 2 && Clock::now() < until) {
    for (auto& x : nodes[1]->engine->progress(Clock::now())) done.push_back(std::move(x));
    nodes[0]->engine->progress(Clock::now());
  }
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].match.posted.front().group_rank, 2);
  EXPECT_EQ(done[0].match.status, ipc::Status::InvalidRequest);
  EXPECT_EQ(done[0].match.error, "refused");
  EXPECT_EQ(done[1].match.posted.front().group_rank, 3);
  EXPECT_EQ(done[1].match.status, ipc::Status::Timeout) << done[1].match.error;
  const auto told = nodes[1]->engine->take_op_failures();
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].src, 0);
  EXPECT_EQ(told[0].dst, 2);
}

TEST_P(EngineTest, AFailedNodeTellsTheOther) {
  nodes[0]->engine->announce_failure("rank 1 (pid 42) on node 0 was killed by signal 9 (SIGKILL)", 137);
  std::optional<Engine::PeerFailure> f;
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (!f && Clock::now() < until) {
    nodes[0]->engine->progress(Clock::now());
    nodes[1]->engine->progress(Clock::now());
    f = nodes[1]->engine->take_peer_failure();
  }
  ASSERT_TRUE(f);
  EXPECT_EQ(f->error, "rank 1 (pid 42) on node 0 was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(f->exit_code, 137);
  EXPECT_FALSE(nodes[0]->engine->take_peer_failure());
}

#ifdef SMDDP_HAVE_FABRIC
// Where the provider wants registered buffers (efa), every staging buffer is registered once,
// when the pool makes it: no data message goes unregistered (the transport would register it for
// that one message), and operations after the first make no new registrations.
TEST(EngineRegistration, StagingBuffersAreRegisteredOnceAndEveryMessageCarriesARegion) {
  const auto job = unique_job();
  auto loopback = std::make_shared<transport::LoopbackFabric>();
  std::vector<std::shared_ptr<transport::LoopbackTransport::Registrations>> counts;
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < 2; ++i) {
    counts.push_back(std::make_shared<transport::LoopbackTransport::Registrations>());
    nodes.push_back(std::make_unique<Node>(i, job, loopback, 1, counts.back()));
  }
  start_engines(nodes);
  // The arenas, once each, and the buffers that take the other node's heartbeats and notices.
  for (int i = 0; i < 2; ++i) EXPECT_EQ(counts[i]->made, static_cast<std::size_t>(kRanks) + 2);
  constexpr std::uint64_t n = 20000;  // 80 KB per rank: shards far above a heartbeat's size
  std::vector<std::size_t> after_first(2);
  for (int round = 0; round < 6; ++round) {
    for (int i = 0; i < 2; ++i)
      for (int s = 0; s < kRanks; ++s)
        for (std::uint64_t k = 0; k < n; ++k) nodes[i]->in(s)[k] = static_cast<float>(i * kRanks + s + round);
    auto d = desc(round % 2 ? OpType::ReduceScatter : OpType::AllReduce, round % 2 ? n / 4 : n);
    d.seq = static_cast<std::uint64_t>(round + 1);
    for (int i = 0; i < 2; ++i)
      nodes[i]->engine->start(nodes[i]->match(d, i, n * 4, (round % 2 ? n / 4 : n) * 4), Clock::now());
    std::vector<std::size_t> finished(2);
    const auto until = Clock::now() + std::chrono::seconds(20);
    while ((finished[0] < 1 || finished[1] < 1) && Clock::now() < until)
      for (int i = 0; i < 2; ++i)
        for (auto& f : nodes[i]->engine->progress(Clock::now())) {
          EXPECT_EQ(f.match.status, ipc::Status::Ok) << f.match.error;
          ++finished[i];
        }
    ASSERT_EQ(finished, (std::vector<std::size_t>{1, 1})) << "round " << round;
    if (round == 1) {
      // A failure notice each way (for an operation nobody runs) and heartbeats: their buffers
      // come from the pool too.
      for (int i = 0; i < 2; ++i)
        EXPECT_TRUE(nodes[i]->engine->announce_op_failure(nodes[i]->comm, {0, 99, -1, -1, ipc::Status::InvalidRequest, "x"}));
      const auto beats = Clock::now() + 2 * Engine::Options{}.heartbeat_every;
      while (Clock::now() < beats)
        for (int i = 0; i < 2; ++i) nodes[i]->engine->progress(Clock::now());
      for (int i = 0; i < 2; ++i) after_first[i] = counts[i]->made;
    }
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_GT(counts[i]->made, static_cast<std::size_t>(kRanks) + 2) << "staging buffers registered";
    EXPECT_EQ(counts[i]->made, after_first[i]) << "rounds 3-6 reused the buffers of rounds 1-2";
    EXPECT_EQ(counts[i]->messages_without_region, 0u)
        << "every message carries a region (heartbeats and notices too); the largest without: "
        << counts[i]->largest_without_region << " bytes";
    EXPECT_EQ(nodes[i]->engine->staging_registration_failures(), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, EngineTest,
                         ::testing::Values(Setup{"loopback", 1}, Setup{"loopback", 3}, Setup{"fabric", 1},
                                           Setup{"fabric", 3}),
                         setup_name);
#else
INSTANTIATE_TEST_SUITE_P(Transports, EngineTest, ::testing::Values(Setup{"loopback", 1}, Setup{"loopback", 3}),
                         setup_name);
#endif

}  // namespace
}  // namespace smddp::daemon::internode
