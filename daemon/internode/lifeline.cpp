#include "daemon/internode/lifeline.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace smddp::daemon::internode {
namespace {

std::string errno_text() { return std::strerror(errno); }

bool parse(const std::string& address, sockaddr_in& out) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  out = {};
  out.sin_family = AF_INET;
  if (::inet_pton(AF_INET, address.substr(0, colon).c_str(), &out.sin_addr) != 1) return false;
  try {
    const int port = std::stoi(address.substr(colon + 1));
    if (port <= 0 || port > 65535) return false;
    out.sin_port = htons(static_cast<std::uint16_t>(port));
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// A non-blocking connect that waits at most `timeout`; "" on success, else why not.
std::string connect_within(int fd, const sockaddr_in& to, std::chrono::milliseconds timeout) {
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0) return {};
  if (errno != EINPROGRESS) return errno_text();
  pollfd p{fd, POLLOUT, 0};
  const int ready = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (ready == 0) return "no answer within " + std::to_string(timeout.count()) + " ms";
  if (ready < 0) return errno_text();
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  return err == 0 ? std::string() : std::string(std::strerror(err));
}

}  // namespace

Lifelines::Lifelines(const std::string& ipv4) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (::inet_pton(AF_INET, ipv4.c_str(), &addr.sin_addr) != 1)
    throw std::runtime_error("lifeline: '" + ipv4 + "' is not an IPv4 address");
  listener_ = ipc::UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!listener_) throw std::runtime_error("lifeline: socket: " + errno_text());
  if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    throw std::runtime_error("lifeline: cannot listen on " + ipv4 + ": " + errno_text());
  if (::listen(listener_.get(), 128) != 0) throw std::runtime_error("lifeline: listen on " + ipv4 + ": " + errno_text());
  socklen_t len = sizeof addr;
  ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  address_ = ipv4 + ":" + std::to_string(ntohs(addr.sin_port));
}

std::string Lifelines::address() const { return address_; }

std::vector<std::string> Lifelines::connect(const std::vector<std::string>& addresses, int my_node,
                                            std::chrono::milliseconds timeout) {
  std::vector<std::string> missing;
  for (int n = 0; n < static_cast<int>(addresses.size()); ++n) {
    const auto& a = addresses[static_cast<std::size_t>(n)];
    if (n == my_node || a.empty()) continue;
    sockaddr_in to{};
    if (!parse(a, to)) {
      missing.push_back("node " + std::to_string(n) + ": '" + a + "' is not IP:PORT");
      continue;
    }
    ipc::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    const std::string why = fd ? connect_within(fd.get(), to, timeout) : errno_text();
    if (!why.empty()) {
      missing.push_back("node " + std::to_string(n) + " at " + a + ": " + why);
      continue;
    }
    outgoing_.push_back({n, std::move(fd)});
    closed();  // accept what has come meanwhile, so that the backlog never fills
  }
  return missing;
}

std::vector<int> Lifelines::closed() {
  for (;;) {
    ipc::UniqueFd in(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!in) break;
    accepted_.push_back(std::move(in));
  }
  std::vector<int> ended;
  if (outgoing_.empty()) return ended;
  std::vector<pollfd> fds;
  for (const auto& w : outgoing_) fds.push_back({w.fd.get(), POLLIN, 0});
  if (::poll(fds.data(), fds.size(), 0) <= 0) return ended;
  for (std::size_t i = fds.size(); i-- > 0;) {
    if (fds[i].revents == 0) continue;
    // Nothing is ever sent on a lifeline: readable means the end of the stream or an error.
    char byte = 0;
    const auto n = ::recv(fds[i].fd, &byte, 1, MSG_DONTWAIT);
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR))) continue;
    ended.push_back(outgoing_[i].node);
    outgoing_.erase(outgoing_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return ended;
}

}  // namespace smddp::daemon::internode
