#include "daemon/reserved_port.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace smddp::daemon {

ReservedPort::ReservedPort() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error(std::string("rendezvous port: socket: ") + std::strerror(errno));
  const int on = 1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  if (::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
      ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    throw std::runtime_error("rendezvous port: cannot bind a TCP port on 0.0.0.0: " + why);
  }
  port_ = ntohs(a.sin_port);
}

ReservedPort::ReservedPort(ReservedPort&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), port_(std::exchange(o.port_, 0)) {}

ReservedPort& ReservedPort::operator=(ReservedPort&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    port_ = std::exchange(o.port_, 0);
  }
  return *this;
}

ReservedPort::~ReservedPort() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace smddp::daemon
