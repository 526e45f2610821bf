// FabricTransport with several endpoints ("rails") per side, over loopback providers: two
// transports in one process with 1, 2 and 4 endpoints each, and unequal counts. Timeouts only
// bound a hang; no result depends on timing.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "daemon/transport/fabric_transport.hpp"
#include "tests/daemon/transport/transport_test_util.hpp"

namespace smddp::daemon::transport {
namespace {

// Parameters: provider, a's endpoints, b's endpoints.
using Layout = std::tuple<std::string, int, int>;

class MultiRailTest : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    const auto& [provider, na, nb] = GetParam();
    std::string why;
    a_ = make_or_explain(config(na), why);
    if (a_) b_ = make_or_explain(config(nb), why);
    if (!a_ || !b_) GTEST_SKIP() << "provider '" << provider << "' unavailable: " << why;
    ASSERT_EQ(a_->endpoints(), na);
    ASSERT_EQ(b_->endpoints(), nb);
    ASSERT_EQ(a_->add_peer(b_->local_addresses()), 0);
    ASSERT_EQ(b_->add_peer(a_->local_addresses()), 0);
    ASSERT_EQ(a_->peer_endpoints(0), nb);
    ASSERT_EQ(b_->peer_endpoints(0), na);
  }
  TransportConfig config(int endpoints) const {
    TransportConfig c;
    c.provider = std::get<0>(GetParam());
    c.interface = "lo";
    c.endpoints = endpoints;
    return c;
  }
  int na() const { return std::get<1>(GetParam()); }
  int nb() const { return std::get<2>(GetParam()); }
  std::unique_ptr<Transport> a_, b_;
};

// Every pair of a's and b's endpoints carries messages both ways, the data intact, and each
// endpoint's byte counts say what went through it.
TEST_P(MultiRailTest, EveryRailPairCarriesMessagesBothWays) {
  constexpr std::size_t kBytes = 100 * 1024 + 7;  // past the providers' eager sizes
  struct Flow {
    Rail at_a;  // from a's side
    std::vector<std::uint8_t> to_b, to_a, got_b, got_a;
    Done sent_b, sent_a, recv_b, recv_a;
  };
  std::vector<Flow> flows(static_cast<std::size_t>(na() * nb()));
  for (int la = 0; la < na(); ++la)
    for (int lb = 0; lb < nb(); ++lb) {
      Flow& f = flows[static_cast<std::size_t>(la * nb() + lb)];
      f.at_a = {la, lb};
      const auto seed = static_cast<std::uint32_t>(la * 100 + lb);
      f.to_b = pattern(kBytes, seed);
      f.to_a = pattern(kBytes, seed + 50);
      f.got_b.assign(kBytes, 0);
      f.got_a.assign(kBytes, 0);
    }
  // One tag for all: only the rail tells the messages apart.
  for (auto& f : flows) {
    const Rail at_b{f.at_a.remote, f.at_a.local};
    b_->recv(0, at_b, 7, f.got_b.data(), kBytes, nullptr, f.recv_b.callback());
    a_->recv(0, f.at_a, 7, f.got_a.data(), kBytes, nullptr, f.recv_a.callback());
    a_->send(0, f.at_a, 7, f.to_b.data(), kBytes, nullptr, f.sent_b.callback());
    b_->send(0, at_b, 7, f.to_a.data(), kBytes, nullptr, f.sent_a.callback());
  }
  ASSERT_TRUE(drive({a_.get(), b_.get()}, [&] {
    for (auto& f : flows)
      if (!f.sent_a.ready() || !f.sent_b.ready() || !f.recv_a.ready() || !f.recv_b.ready()) return false;
    return true;
  })) << "a pending " << a_->pending() << ", b pending " << b_->pending();
  for (auto& f : flows) {
    SCOPED_TRACE(testing::Message() << "a's endpoint " << f.at_a.local << ", b's endpoint " << f.at_a.remote);
    for (Done* d : {&f.sent_a, &f.sent_b, &f.recv_a, &f.recv_b}) ASSERT_TRUE(d->status->ok) << d->status->error;
    EXPECT_TRUE(f.got_b == f.to_b);
    EXPECT_TRUE(f.got_a == f.to_a);
  }
  const auto ia = a_->endpoint_info(), ib = b_->endpoint_info();
  ASSERT_EQ(ia.size(), static_cast<std::size_t>(na()));
  ASSERT_EQ(ib.size(), static_cast<std::size_t>(nb()));
  for (int la = 0; la < na(); ++la) {
    EXPECT_EQ(ia[static_cast<std::size_t>(la)].bytes_sent, kBytes * static_cast<std::size_t>(nb())) << "a's endpoint " << la;
    EXPECT_EQ(ia[static_cast<std::size_t>(la)].bytes_received, kBytes * static_cast<std::size_t>(nb())) << "a's endpoint " << la;
    EXPECT_EQ(ia[static_cast<std::size_t>(la)].provider, std::get<0>(GetParam()));
  }
  for (int lb = 0; lb < nb(); ++lb) {
    EXPECT_EQ(ib[static_cast<std::size_t>(lb)].bytes_sent, kBytes * static_cast<std::size_t>(na())) << "b's endpoint " << lb;
    EXPECT_EQ(ib[static_cast<std::size_t>(lb)].bytes_received, kBytes * static_cast<std::size_t>(na())) << "b's endpoint " << lb;
  }
}

// A receive on b's endpoint j from a's endpoint i takes only a send from i to j: a send of the
// same tag over another pair waits for its own receive.
TEST_P(MultiRailTest, AReceiveMatchesOnlyASendOverItsRail) {
  if (na() < 2 && nb() < 2) GTEST_SKIP() << "one rail only";
  const Rail one = na() > 1 ? Rail{1, 0} : Rail{0, 1};  // from a's side
  const Rail first_at_b{0, 0}, one_at_b{one.remote, one.local};
  auto x = pattern(64, 1), y = pattern(64, 2);
  std::vector<std::uint8_t> got_one(64, 0), got_first(64, 0);
  Done r_one, r_first, s_first, s_one;
  b_->recv(0, one_at_b, 5, got_one.data(), 64, nullptr, r_one.callback());
  a_->send(0, kFirst, 5, x.data(), 64, nullptr, s_first.callback());
  for (int i = 0; i < 200; ++i) a_->progress(), b_->progress();
  EXPECT_FALSE(r_one.ready()) << "a receive on another rail took the message";
  b_->recv(0, first_at_b, 5, got_first.data(), 64, nullptr, r_first.callback());
  a_->send(0, one, 5, y.data(), 64, nullptr, s_one.callback());
  ASSERT_TRUE(drive({a_.get(), b_.get()}, [&] { return r_one.ready() && r_first.ready() && s_one.ready() && s_first.ready(); }));
  ASSERT_TRUE(r_one.status->ok) << r_one.status->error;
  ASSERT_TRUE(r_first.status->ok) << r_first.status->error;
  EXPECT_TRUE(got_first == x);
  EXPECT_TRUE(got_one == y);
}

// One registration serves every endpoint (one domain per device on efa: one per domain).
TEST_P(MultiRailTest, OneRegistrationServesEveryEndpoint) {
  const std::size_t slice = MiB + 13;
  const auto rails = static_cast<std::size_t>(na());
  std::vector<std::uint8_t> src = pattern(rails * slice, 9), dst(rails * slice, 0);
  MemoryRegion src_region = a_->register_memory(src.data(), src.size());
  MemoryRegion dst_region = b_->register_memory(dst.data(), dst.size());
  std::vector<Done> sent(rails), got(rails);
  for (std::size_t k = 0; k < rails; ++k) {
    const Rail r{static_cast<int>(k), static_cast<int>(k) % nb()};
    b_->recv(0, {r.remote, r.local}, 11, dst.data() + k * slice, slice, &dst_region, got[k].callback());
    a_->send(0, r, 11, src.data() + k * slice, slice, &src_region, sent[k].callback());
  }
  ASSERT_TRUE(drive({a_.get(), b_.get()}, [&] {
    for (std::size_t k = 0; k < rails; ++k)
      if (!sent[k].ready() || !got[k].ready()) return false;
    return true;
  }));
  for (std::size_t k = 0; k < rails; ++k) {
    ASSERT_TRUE(sent[k].status->ok) << sent[k].status->error;
    ASSERT_TRUE(got[k].status->ok) << got[k].status->error;
  }
  EXPECT_TRUE(src == dst);
}

// The failure detector's fail_peer ends the peer's messages on every rail at once.
TEST_P(MultiRailTest, FailPeerFailsMessagesOnEveryRail) {
  std::vector<std::uint8_t> buf(static_cast<std::size_t>(na() * nb()) * 1024);
  std::vector<Done> recvs(static_cast<std::size_t>(na() * nb()));
  for (int lb = 0; lb < nb(); ++lb)
    for (int la = 0; la < na(); ++la) {
      const auto k = static_cast<std::size_t>(lb * na() + la);
      b_->recv(0, Rail{lb, la}, 90, buf.data() + k * 1024, 1024, nullptr, recvs[k].callback());
    }
  EXPECT_EQ(b_->pending(), recvs.size());
  b_->fail_peer(0, "node 0 died");
  for (auto& d : recvs) {
    ASSERT_TRUE(d.ready());
    ASSERT_FALSE(d.status->ok);
    EXPECT_NE(d.status->error.find("node 0 died"), std::string::npos) << d.status->error;
    EXPECT_NE(d.status->error.find("recv from peer 0"), std::string::npos) << d.status->error;
  }
  EXPECT_EQ(b_->pending(), 0u);
}

// Transports with receives posted on several endpoints go without waiting long.
TEST_P(MultiRailTest, DestroyWithReceivesPostedOnEveryEndpointDoesNotHang) {
  std::vector<std::uint8_t> buf(MiB);
  bool called = false;
  for (int lb = 0; lb < nb(); ++lb) b_->recv(0, Rail{lb, 0}, 40, buf.data(), 100, nullptr, [&](Status) { called = true; });
  const auto start = std::chrono::steady_clock::now();
  b_.reset();
  EXPECT_FALSE(called);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

std::string name(const testing::TestParamInfo<Layout>& info) {
  const auto& [provider, na, nb] = info.param;
  return (provider == "shm" ? std::string("shm") : std::string("tcp_rxm")) + "_" + std::to_string(na) + "x" +
         std::to_string(nb);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MultiRailTest,
                         ::testing::Combine(::testing::Values("tcp;ofi_rxm", "shm"),
                                            ::testing::Values(1, 2, 4), ::testing::Values(1, 2, 4)),
                         name);

TEST(MultiRailConfig, EndpointCountOutsideOneToSixtyFourIsAClearError) {
  for (int n : {0, -1, Transport::kMaxEndpoints + 1}) {
    TransportConfig c;
    c.endpoints = n;
    try {
      make_fabric_transport(c);
      ADD_FAILURE() << n << " endpoints accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(n) + " endpoints requested (1..64)"), std::string::npos)
          << e.what();
    }
  }
}

TEST(MultiRailConfig, DescribeNamesEveryEndpointAndItsDomain) {
  TransportConfig c;
  c.endpoints = 3;
  std::string why;
  auto t = make_or_explain(c, why);
  if (!t) GTEST_SKIP() << why;
  const std::string d = t->describe();
  EXPECT_NE(d.find("3 endpoints: 0 on domain 'lo'"), std::string::npos) << d;
  EXPECT_NE(d.find(", 2 on domain 'lo'"), std::string::npos) << d;
  const auto addresses = t->local_addresses();
  ASSERT_EQ(addresses.size(), 3u);
  EXPECT_NE(addresses[0], addresses[1]);
  EXPECT_NE(addresses[1], addresses[2]);
}

}  // namespace
}  // namespace smddp::daemon::transport
