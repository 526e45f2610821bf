#pragma once
// Which network interface the daemons' fabric endpoints use when the provider binds to one (tcp,
// sockets). `fabric.interface = auto` (the default) picks, as NCCL's and Open MPI's socket code
// do, the interface the route to the other hosts leaves through: loopback when every node is on
// this host (simulated nodes), else never loopback and never a container bridge. A job that
// spans hosts is refused, with the reason, before it would advertise a loopback address to them.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace smddp::daemon::internode {

// One IPv4 address of this host's interfaces that are up.
struct HostAddress {
  std::string interface;    // "eth0"
  std::uint32_t ipv4 = 0;   // in host byte order
  int prefix_length = 0;    // 24 for a /24
  bool loopback = false;    // on an IFF_LOOPBACK interface
  friend bool operator==(const HostAddress&, const HostAddress&) = default;
};

// This host's IPv4 addresses on interfaces that are up (getifaddrs), in the kernel's order.
std::vector<HostAddress> local_ipv4_addresses();

// The ones worth telling other hosts: not loopback, not link-local (169.254/16), not on a
// container or VM bridge (docker*, br-*, virbr*, cni*, podman*), which every host may number alike.
std::vector<HostAddress> reachable_from_elsewhere(const std::vector<HostAddress>& all);

std::string format_ipv4(std::uint32_t ipv4);
// "a.b.c.d" -> host-order address; false if `text` is not one.
bool parse_ipv4(const std::string& text, std::uint32_t& ipv4);

// The local interface the kernel would send to `ipv4` through ("" when there is no route). The
// real one connects a UDP socket, which sends nothing, and reads the source address it got.
using RouteLookup = std::function<std::string(std::uint32_t ipv4)>;
RouteLookup kernel_route_lookup(const std::vector<HostAddress>& mine);

// One other node, as the bootstrap describes it.
struct PeerHost {
  int node = 0;
  std::string hostname;
  std::vector<std::uint32_t> addresses;  // its reachable_from_elsewhere() addresses
};

struct InterfaceChoice {
  std::string interface;  // what the transport gets
  std::string why;        // one clause for the log
};

// `configured`: fabric.interface. `peers`: the nodes on other hosts (empty: every node is on this
// one). Throws std::runtime_error naming the interface and the hosts when a loopback interface
// is configured for a job that spans hosts, or when `auto` finds no interface that reaches every
// other host.
InterfaceChoice choose_interface(const std::string& configured, const std::vector<HostAddress>& mine,
                                 const std::vector<PeerHost>& peers, const RouteLookup& route);

// Launch path 2 across nodes knows no peer addresses before its endpoints open, only the
// rendezvous host (MASTER_ADDR): `auto` takes loopback when that is this host's loopback, the
// interface that holds it when it is this host's address, else the one the route to it takes.
// `resolved`: MASTER_ADDR's IPv4 address (0 when it did not resolve).
InterfaceChoice choose_interface_for_rendezvous(const std::string& configured, const std::string& master_addr,
                                                std::uint32_t resolved, const std::vector<HostAddress>& mine,
                                                const RouteLookup& route);

// The first IPv4 address of `interface` among `mine`, dotted ("" when it has none).
std::string address_of(const std::vector<HostAddress>& mine, const std::string& interface);

// MASTER_ADDR (a name or an address) -> IPv4 in host order, 0 when it does not resolve.
std::uint32_t resolve_ipv4(const std::string& host);

}  // namespace smddp::daemon::internode
