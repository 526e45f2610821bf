// fabric.interface = auto and the loopback refusal, over made-up hosts and routes; and the real
// lookups (getifaddrs, a UDP connect, getaddrinfo) on this machine's loopback.
#include "daemon/internode/interface_choice.hpp"

#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

namespace smddp::daemon::internode {
namespace {

std::uint32_t ip(const char* text) {
  std::uint32_t a = 0;
  EXPECT_TRUE(parse_ipv4(text, a)) << text;
  return a;
}

HostAddress addr(const char* iface, const char* text, int prefix, bool loopback = false) {
  return {iface, ip(text), prefix, loopback};
}

// A host with loopback, a cluster interface, a second network and docker's bridge.
std::vector<HostAddress> a_host() {
  return {addr("lo", "127.0.0.1", 8, true), addr("eth0", "10.77.0.1", 24), addr("eth1", "192.168.5.1", 24),
          addr("docker0", "172.17.0.1", 16)};
}

// Routes by the longest matching prefix among `mine`, else through `default_via` ("" for none).
RouteLookup routes(const std::vector<HostAddress>& mine, std::string default_via = "") {
  return [mine, default_via](std::uint32_t to) -> std::string {
    std::string via = default_via;
    int best = -1;
    for (const auto& a : mine) {
      const std::uint32_t mask = a.prefix_length == 0 ? 0 : ~std::uint32_t{0} << (32 - a.prefix_length);
      if ((a.ipv4 & mask) == (to & mask) && a.prefix_length > best) {
        best = a.prefix_length;
        via = a.interface;
      }
    }
    return via;
  };
}

TEST(InterfaceChoice, AutoIsLoopbackWhenEveryNodeIsOnThisHost) {
  const auto c = choose_interface("auto", a_host(), {}, routes(a_host()));
  EXPECT_EQ(c.interface, "lo");
  EXPECT_NE(c.why.find("this host"), std::string::npos) << c.why;
}

TEST(InterfaceChoice, AutoTakesTheInterfaceTheRouteToThePeersLeavesThrough) {
  const std::vector<PeerHost> peers = {{1, "h2", {ip("10.77.0.2"), ip("172.17.0.1")}},
                                       {2, "h3", {ip("10.77.0.3")}}};
  const auto c = choose_interface("auto", a_host(), peers, routes(a_host()));
  EXPECT_EQ(c.interface, "eth0");
  EXPECT_NE(c.why.find("h2 (node 1)"), std::string::npos) << c.why;
}

TEST(InterfaceChoice, AutoFollowsARoutedNetworkThroughTheDefaultRoute) {
  const std::vector<PeerHost> peers = {{1, "far", {ip("10.200.3.4")}}};
  EXPECT_EQ(choose_interface("auto", a_host(), peers, routes(a_host(), "eth1")).interface, "eth1");
}

TEST(InterfaceChoice, AutoPrefersTheInterfaceThatReachesMostPeers) {
  // h2 is on both networks, h3 only on eth1's: eth1 reaches both.
  const std::vector<PeerHost> peers = {{1, "h2", {ip("10.77.0.2"), ip("192.168.5.2")}},
                                       {2, "h3", {ip("192.168.5.3")}}};
  EXPECT_EQ(choose_interface("auto", a_host(), peers, routes(a_host())).interface, "eth1");
}

TEST(InterfaceChoice, AutoRefusesWhenNoInterfaceReachesEveryPeer) {
  const std::vector<PeerHost> peers = {{1, "h2", {ip("10.77.0.2")}}, {2, "h3", {ip("10.9.9.9")}}};
  try {
    choose_interface("auto", a_host(), peers, routes(a_host()));
    FAIL() << "chose an interface that cannot reach h3";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("h3 (node 2) offered 10.9.9.9"), std::string::npos) << what;
    EXPECT_NE(what.find("fabric.interface"), std::string::npos) << what;
  }
}

TEST(InterfaceChoice, APeersAddressThatIsAlsoOursProvesNothing) {
  // Every host numbers docker0 alike: h2's 172.17.0.1 is our own, not a route to h2.
  const std::vector<PeerHost> peers = {{1, "h2", {ip("172.17.0.1")}}};
  EXPECT_THROW(choose_interface("auto", a_host(), peers, routes(a_host())), std::runtime_error);
}

TEST(InterfaceChoice, LoopbackConfiguredForAJobAcrossHostsIsRefused) {
  const std::vector<PeerHost> peers = {{1, "h2", {ip("10.77.0.2")}}};
  for (const char* configured : {"lo", "lo0"}) {
    auto mine = a_host();
    mine.push_back(addr("lo0", "127.0.0.2", 8, true));
    try {
      choose_interface(configured, mine, peers, routes(mine));
      FAIL() << configured << " accepted across hosts";
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("fabric.interface = ") + configured), std::string::npos) << what;
      EXPECT_NE(what.find("h2 (node 1)"), std::string::npos) << what;
      EXPECT_NE(what.find("loopback address"), std::string::npos) << what;
    }
  }
}

TEST(InterfaceChoice, ANamedInterfaceIsKept) {
  const std::vector<PeerHost> peers = {{1, "h2", {ip("10.77.0.2")}}};
  EXPECT_EQ(choose_interface("eth1", a_host(), peers, routes(a_host())).interface, "eth1");
  EXPECT_EQ(choose_interface("lo", a_host(), {}, routes(a_host())).interface, "lo");  // one host: fine
}

TEST(InterfaceChoice, OnlyAddressesOtherHostsCanUseAreOffered) {
  auto all = a_host();
  all.push_back(addr("eth2", "169.254.3.3", 16));
  all.push_back(addr("br-5f2a", "172.18.0.1", 16));
  all.push_back(addr("virbr0", "192.168.122.1", 24));
  const auto offered = reachable_from_elsewhere(all);
  ASSERT_EQ(offered.size(), 2u);
  EXPECT_EQ(offered[0].interface, "eth0");
  EXPECT_EQ(offered[1].interface, "eth1");
}

TEST(InterfaceChoice, TheRendezvousHostDecidesForLaunchPathTwo) {
  const auto mine = a_host();
  const auto route = routes(mine, "eth1");
  EXPECT_EQ(choose_interface_for_rendezvous("auto", "127.0.0.1", ip("127.0.0.1"), mine, route).interface, "lo");
  EXPECT_EQ(choose_interface_for_rendezvous("auto", "me", ip("10.77.0.1"), mine, route).interface, "eth0");
  EXPECT_EQ(choose_interface_for_rendezvous("auto", "h2", ip("10.77.0.2"), mine, route).interface, "eth0");
  EXPECT_EQ(choose_interface_for_rendezvous("auto", "far", ip("10.200.0.9"), mine, route).interface, "eth1");
  EXPECT_EQ(choose_interface_for_rendezvous("auto", "nowhere", 0, mine, route).interface, "lo");
  EXPECT_THROW(choose_interface_for_rendezvous("auto", "far", ip("10.200.0.9"), mine, routes(mine)), std::runtime_error);
  EXPECT_THROW(choose_interface_for_rendezvous("lo", "h2", ip("10.77.0.2"), mine, route), std::runtime_error);
  EXPECT_EQ(choose_interface_for_rendezvous("lo", "me", ip("10.77.0.1"), mine, route).interface, "lo");
}

TEST(InterfaceChoice, ThisMachinesLookupsWorkOnLoopback) {
  const auto mine = local_ipv4_addresses();
  bool has_loopback = false;
  for (const auto& a : mine) has_loopback |= a.loopback && a.ipv4 == ip("127.0.0.1") && a.prefix_length == 8;
  ASSERT_TRUE(has_loopback) << "no 127.0.0.1/8 on a loopback interface";
  EXPECT_EQ(kernel_route_lookup(mine)(ip("127.0.0.1")), "lo");
  EXPECT_EQ(resolve_ipv4("127.0.0.1"), ip("127.0.0.1"));
  EXPECT_EQ(resolve_ipv4("localhost"), ip("127.0.0.1"));
  EXPECT_EQ(resolve_ipv4("no-such-host.invalid"), 0u);
  EXPECT_EQ(format_ipv4(ip("10.77.0.254")), "10.77.0.254");
  std::uint32_t a = 0;
  EXPECT_FALSE(parse_ipv4("10.77.0", a));
}

}  // namespace
}  // namespace smddp::daemon::internode
