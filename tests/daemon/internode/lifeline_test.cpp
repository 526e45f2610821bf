// Lifelines between daemons: a peer's end shows at once, and only once; a lifeline that cannot be
// made is reported, not fatal. Over 127.0.0.1.
#include "daemon/internode/lifeline.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <thread>

namespace smddp::daemon::internode {
namespace {

using namespace std::chrono_literals;

// closed() until it reports something or `limit` passes.
std::vector<int> wait_closed(Lifelines& l, std::chrono::milliseconds limit = 2000ms) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    auto ended = l.closed();
    if (!ended.empty() || std::chrono::steady_clock::now() > until) return ended;
    std::this_thread::sleep_for(5ms);
  }
}

TEST(Lifelines, APeersEndShowsOnceAndOnlyForThatPeer) {
  Lifelines a("127.0.0.1");
  auto b = std::make_unique<Lifelines>("127.0.0.1");
  Lifelines c("127.0.0.1");
  const std::vector<std::string> all = {a.address(), b->address(), c.address()};
  EXPECT_TRUE(a.connect(all, 0, 1000ms).empty());
  EXPECT_TRUE(b->connect(all, 1, 1000ms).empty());
  EXPECT_TRUE(c.connect(all, 2, 1000ms).empty());
  EXPECT_TRUE(wait_closed(a, 100ms).empty()) << "nothing ended yet";
  EXPECT_TRUE(wait_closed(c, 100ms).empty());
  b.reset();  // node 1's daemon is gone: its sockets close
  EXPECT_EQ(wait_closed(a), std::vector<int>{1});
  EXPECT_EQ(wait_closed(c), std::vector<int>{1});
  EXPECT_TRUE(wait_closed(a, 100ms).empty()) << "reported once";
}

TEST(Lifelines, OnesThatCannotBeMadeAreReportedNotFatal) {
  Lifelines a("127.0.0.1");
  std::string gone;
  {
    Lifelines b("127.0.0.1");
    gone = b.address();  // nobody listens there once b is gone
  }
  const auto missing = a.connect({a.address(), gone, "not-an-address", ""}, 0, 500ms);
  ASSERT_EQ(missing.size(), 2u);
  EXPECT_NE(missing[0].find("node 1 at " + gone), std::string::npos) << missing[0];
  EXPECT_NE(missing[1].find("node 2: 'not-an-address' is not IP:PORT"), std::string::npos) << missing[1];
  EXPECT_TRUE(a.closed().empty());
}

TEST(Lifelines, AnAddressThatIsNotOursIsRefused) {
  EXPECT_THROW(Lifelines("10.77.0"), std::runtime_error);
  EXPECT_THROW(Lifelines("192.0.2.1"), std::runtime_error);  // TEST-NET-1: not this host's
}

}  // namespace
}  // namespace smddp::daemon::internode
