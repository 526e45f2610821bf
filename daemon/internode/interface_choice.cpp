#include "daemon/internode/interface_choice.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <map>
#include <memory>
#include <stdexcept>

#include "ipc/unique_fd.hpp"

namespace smddp::daemon::internode {
namespace {

struct IfaddrsDeleter {
  void operator()(ifaddrs* p) const { ::freeifaddrs(p); }
};

struct AddrinfoDeleter {
  void operator()(addrinfo* p) const { ::freeaddrinfo(p); }
};


bool starts_with_any(const std::string& name, std::initializer_list<const char*> prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](const char* p) { return name.starts_with(p); });
}

bool is_loopback_address(std::uint32_t ipv4) { return (ipv4 >> 24) == 127; }

// Whether `name` is a loopback interface of this host ("lo" even where it has no address).
bool is_loopback_interface(const std::string& name, const std::vector<HostAddress>& mine) {
  if (name == "lo") return true;
  return std::any_of(mine.begin(), mine.end(), [&](const HostAddress& a) { return a.interface == name && a.loopback; });
}

std::string join_hosts(const std::vector<PeerHost>& peers) {
  std::string out;
  for (const auto& p : peers) out += (out.empty() ? "" : ", ") + p.hostname + " (node " + std::to_string(p.node) + ")";
  return out;
}

std::string join_addresses(const std::vector<std::uint32_t>& addresses) {
  if (addresses.empty()) return "none it could offer";
  std::string out;
  for (auto a : addresses) out += (out.empty() ? "" : ", ") + format_ipv4(a);
  return out;
}

std::string join_interfaces(const std::vector<HostAddress>& mine) {
  std::string out;
  for (const auto& a : mine)
    out += (out.empty() ? "" : ", ") + a.interface + " " + format_ipv4(a.ipv4) + "/" + std::to_string(a.prefix_length);
  return out.empty() ? "no IPv4 address on any interface that is up" : out;
}

std::string refuse_loopback(const std::string& configured, const std::string& elsewhere) {
  return "fabric.interface = " + configured + " is a loopback interface, but this job also runs on " + elsewhere +
         ": the endpoints would advertise a loopback address that the other hosts cannot reach. Set "
         "fabric.interface = auto (the default) or the interface that reaches them (e.g. --set "
         "fabric.interface=eth0)";
}

}  // namespace

std::vector<HostAddress> local_ipv4_addresses() {
  ifaddrs* raw = nullptr;
  if (::getifaddrs(&raw) != 0) return {};
  std::unique_ptr<ifaddrs, IfaddrsDeleter> list(raw);
  std::vector<HostAddress> out;
  for (const ifaddrs* i = raw; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    HostAddress a;
    a.interface = i->ifa_name;
    a.ipv4 = ntohl(reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
    if (i->ifa_netmask != nullptr)
      a.prefix_length = std::popcount(ntohl(reinterpret_cast<const sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr));
    a.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    out.push_back(a);
  }
  return out;
}

std::vector<HostAddress> reachable_from_elsewhere(const std::vector<HostAddress>& all) {
  std::vector<HostAddress> out;
  for (const auto& a : all) {
    if (a.loopback || is_loopback_address(a.ipv4) || (a.ipv4 >> 16) == 0xA9FE) continue;  // 169.254/16
    if (starts_with_any(a.interface, {"docker", "br-", "virbr", "cni", "podman", "flannel", "cali"})) continue;
    out.push_back(a);
  }
  return out;
}

std::string format_ipv4(std::uint32_t ipv4) {
  return std::to_string(ipv4 >> 24) + "." + std::to_string((ipv4 >> 16) & 0xFF) + "." +
         std::to_string((ipv4 >> 8) & 0xFF) + "." + std::to_string(ipv4 & 0xFF);
}

bool parse_ipv4(const std::string& text, std::uint32_t& ipv4) {
  in_addr a{};
  if (::inet_pton(AF_INET, text.c_str(), &a) != 1) return false;
  ipv4 = ntohl(a.s_addr);
  return true;
}

RouteLookup kernel_route_lookup(const std::vector<HostAddress>& mine) {
  return [mine](std::uint32_t ipv4) -> std::string {
    const ipc::UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (s.get() < 0) return {};
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(9);  // any port: a UDP connect only picks the route
    to.sin_addr.s_addr = htonl(ipv4);
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) return {};
    sockaddr_in from{};
    socklen_t len = sizeof from;
    if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&from), &len) != 0) return {};
    const std::uint32_t source = ntohl(from.sin_addr.s_addr);
    for (const auto& a : mine)
      if (a.ipv4 == source) return a.interface;
    return {};
  };
}

InterfaceChoice choose_interface(const std::string& configured, const std::vector<HostAddress>& mine,
                                 const std::vector<PeerHost>& peers, const RouteLookup& route) {
  if (configured != "auto") {
    if (!peers.empty() && is_loopback_interface(configured, mine))
      throw std::runtime_error(refuse_loopback(configured, join_hosts(peers)));
    return {configured, "configured"};
  }
  if (peers.empty()) return {"lo", "every node is on this host"};
  // For each peer, the interfaces that some route to one of its addresses leaves through. An
  // address that is also ours (the same docker-style numbering on every host) proves nothing.
  std::map<std::string, int> reached;  // interface -> how many peers it reaches
  std::vector<std::vector<std::string>> routes(peers.size());
  for (std::size_t p = 0; p < peers.size(); ++p) {
    for (auto addr : peers[p].addresses) {
      if (std::any_of(mine.begin(), mine.end(), [&](const HostAddress& a) { return a.ipv4 == addr; })) continue;
      const auto via = route(addr);
      if (via.empty() || is_loopback_interface(via, mine)) continue;
      if (std::find(routes[p].begin(), routes[p].end(), via) == routes[p].end()) routes[p].push_back(via);
    }
    for (const auto& via : routes[p]) ++reached[via];
  }
  // The interface reaching most peers; among equals, the first that a peer's route named.
  std::string best;
  for (const auto& r : routes)
    for (const auto& via : r)
      if (best.empty() || reached[via] > reached[best]) best = via;
  std::vector<PeerHost> unreached;
  for (std::size_t p = 0; p < peers.size(); ++p)
    if (best.empty() || std::find(routes[p].begin(), routes[p].end(), best) == routes[p].end())
      unreached.push_back(peers[p]);
  if (!unreached.empty()) {
    std::string detail;
    for (const auto& p : unreached)
      detail += (detail.empty() ? "" : "; ") + p.hostname + " (node " + std::to_string(p.node) +
                ") offered " + join_addresses(p.addresses);
    throw std::runtime_error("fabric.interface = auto: no interface of this host (" + join_interfaces(mine) +
                             ") routes to every other host" +
                             (best.empty() ? "" : " (" + best + " reaches the most, but not these)") + ": " + detail +
                             ". Set fabric.interface to the interface that reaches them");
  }
  return {best, "the route to " + join_hosts(peers) + " leaves through it"};
}

InterfaceChoice choose_interface_for_rendezvous(const std::string& configured, const std::string& master_addr,
                                                std::uint32_t resolved, const std::vector<HostAddress>& mine,
                                                const RouteLookup& route) {
  const bool local = resolved == 0 || is_loopback_address(resolved) ||
                     std::any_of(mine.begin(), mine.end(), [&](const HostAddress& a) { return a.ipv4 == resolved; });
  if (configured != "auto") {
    if (!local && is_loopback_interface(configured, mine))
      throw std::runtime_error(refuse_loopback(configured, "another host (the rendezvous host, MASTER_ADDR=" +
                                                               master_addr + ")"));
    return {configured, "configured"};
  }
  if (resolved == 0) return {"lo", "MASTER_ADDR=" + master_addr + " did not resolve; assuming one host"};
  if (is_loopback_address(resolved)) return {"lo", "MASTER_ADDR=" + master_addr + " is this host's loopback"};
  for (const auto& a : mine)
    if (a.ipv4 == resolved) return {a.interface, "it holds MASTER_ADDR=" + master_addr};
  const auto via = route(resolved);
  if (via.empty() || is_loopback_interface(via, mine))
    throw std::runtime_error("fabric.interface = auto: no route from this host (" + join_interfaces(mine) +
                             ") to the rendezvous host MASTER_ADDR=" + master_addr + " (" + format_ipv4(resolved) +
                             "). Set fabric.interface to the interface that reaches it");
  return {via, "the route to MASTER_ADDR=" + master_addr + " leaves through it"};
}

std::string address_of(const std::vector<HostAddress>& mine, const std::string& interface) {
  for (const auto& a : mine)
    if (a.interface == interface) return format_ipv4(a.ipv4);
  return {};
}

std::uint32_t resolve_ipv4(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* raw = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &raw) != 0 || raw == nullptr) return 0;
  std::unique_ptr<addrinfo, AddrinfoDeleter> list(raw);
  return ntohl(reinterpret_cast<const sockaddr_in*>(raw->ai_addr)->sin_addr.s_addr);
}

}  // namespace smddp::daemon::internode
