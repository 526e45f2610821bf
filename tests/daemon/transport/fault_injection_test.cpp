// The fault-injecting transport over the in-process loopback one: it passes messages until its
// trigger file appears, then holds them (silence) or makes them late (delay), and fail_peer()
// still ends everything it holds, before it returns.
#include "daemon/transport/fault_injection.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "tests/daemon/internode/loopback_transport.hpp"

namespace smddp::daemon::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(FaultPlan, ParsesTheThreeFormsAndRefusesTheRest) {
  EXPECT_EQ(FaultPlan::parse("none").kind, FaultPlan::Kind::None);
  EXPECT_EQ(FaultPlan::parse("silence").kind, FaultPlan::Kind::Silence);
  const auto d = FaultPlan::parse("delay:250");
  EXPECT_EQ(d.kind, FaultPlan::Kind::Delay);
  EXPECT_EQ(d.delay, 250ms);
  for (const char* bad : {"", "loud", "delay:", "delay:0", "delay:-5", "delay:12x", "delay:600001", "silence "}) {
    try {
      FaultPlan::parse(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("use none, silence or delay:MS"), std::string::npos) << e.what();
    }
  }
}

// Two loopback transports; side A wrapped with `plan`.
struct Pair {
  explicit Pair(FaultPlan plan) {
    auto fabric = std::make_shared<LoopbackFabric>();
    a = make_fault_injecting_transport(std::make_unique<LoopbackTransport>(fabric), std::move(plan));
    b = std::make_unique<LoopbackTransport>(fabric);
    a->add_peer(b->local_addresses());
    b->add_peer(a->local_addresses());
  }
  // A sends `v` to B; returns when both completions ran or `limit` passed, with A's status.
  // The callbacks own what they write: a held message may complete after this returns.
  std::optional<Status> exchange(int v, std::chrono::milliseconds limit, int& got) {
    auto sent = std::make_shared<std::optional<Status>>(), received = std::make_shared<std::optional<Status>>();
    auto value = std::make_shared<int>(v);
    a->send(0, {}, 7, value.get(), sizeof v, nullptr, [sent, value](Status s) { *sent = s; });
    b->recv(0, {}, 7, &got, sizeof got, nullptr, [received](Status s) { *received = s; });
    const auto until = Clock::now() + limit;
    while ((!*sent || !*received) && Clock::now() < until) {
      a->progress();
      b->progress();
      std::this_thread::sleep_for(1ms);
    }
    return *sent && *received ? *sent : std::nullopt;
  }
  std::unique_ptr<Transport> a, b;
};

std::filesystem::path trigger_path() {
  return std::filesystem::temp_directory_path() / ("smddp-fault-" + std::to_string(::getpid()) + "-" +
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
}

TEST(FaultInjectingTransport, SilenceStartsWhenTheTriggerAppearsAndFailPeerEndsWhatItHolds) {
  const auto trigger = trigger_path();
  std::filesystem::remove(trigger);
  FaultPlan plan = FaultPlan::parse("silence");
  plan.trigger = trigger.string();
  Pair p(plan);
  int got = 0;
  ASSERT_TRUE(p.exchange(41, 5s, got)) << "before the trigger, messages pass";
  EXPECT_EQ(got, 41);
  EXPECT_NE(p.a->describe().find("fault injection: silence, once " + trigger.string() + " exists"), std::string::npos)
      << p.a->describe();

  std::ofstream(trigger).put('1');
  std::this_thread::sleep_for(30ms);  // the trigger is looked for at most every 20 ms
  p.a->progress();
  got = 0;
  EXPECT_FALSE(p.exchange(42, 300ms, got)) << "silent: nothing leaves";
  EXPECT_EQ(got, 0);
  int late = 0;
  std::optional<Status> from_b;
  p.b->send(0, {}, 8, &late, sizeof late, nullptr, [](Status) {});
  p.a->recv(0, {}, 8, &late, sizeof late, nullptr, [&](Status s) { from_b = s; });
  for (int i = 0; i < 50; ++i) {
    p.a->progress();
    p.b->progress();
  }
  EXPECT_FALSE(from_b) << "silent: nothing arrives";
  EXPECT_EQ(p.a->pending(), 2u) << "the send and the receive, held";

  p.a->fail_peer(0, "peer 0 stopped answering");
  ASSERT_TRUE(from_b);
  EXPECT_FALSE(from_b->ok);
  EXPECT_NE(from_b->error.find("peer 0 stopped answering"), std::string::npos) << from_b->error;
  EXPECT_EQ(p.a->pending(), 0u);
  std::filesystem::remove(trigger);
}

TEST(FaultInjectingTransport, DelayMakesEveryCompletionLateButDeliversIt) {
  Pair p(FaultPlan::parse("delay:150"));  // no trigger: from the start
  int got = 0;
  const auto start = Clock::now();
  const auto st = p.exchange(43, 5s, got);
  ASSERT_TRUE(st);
  EXPECT_TRUE(st->ok) << st->error;
  EXPECT_EQ(got, 43);
  EXPECT_GE(Clock::now() - start, 150ms);
}

TEST(FaultInjectingTransport, FailPeerEndsDelayedCompletionsAtOnce) {
  Pair p(FaultPlan::parse("delay:60000"));
  int v = 5, got = 0;
  std::optional<Status> sent;
  p.a->send(0, {}, 9, &v, sizeof v, nullptr, [&](Status s) { sent = s; });
  p.b->recv(0, {}, 9, &got, sizeof got, nullptr, [](Status) {});
  for (int i = 0; i < 20; ++i) {
    p.b->progress();
    p.a->progress();
  }
  EXPECT_FALSE(sent) << "a minute late";
  EXPECT_EQ(p.a->pending(), 1u);
  p.a->fail_peer(0, "gone");
  ASSERT_TRUE(sent);
  EXPECT_FALSE(sent->ok);
}

TEST(FaultInjectingTransport, RefusesToWrapWithoutAFault) {
  auto fabric = std::make_shared<LoopbackFabric>();
  EXPECT_THROW(make_fault_injecting_transport(std::make_unique<LoopbackTransport>(fabric), FaultPlan{}),
               std::invalid_argument);
}

}  // namespace
}  // namespace smddp::daemon::transport
