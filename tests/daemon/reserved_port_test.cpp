#include "daemon/reserved_port.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

using smddp::daemon::ReservedPort;

namespace {

// Binds a fresh TCP socket to 127.0.0.1:port, with or without SO_REUSEADDR; returns the fd
// (-1 and errno on failure).
int bind_to(int port, bool reuse) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int on = 1;
  if (reuse) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

}  // namespace

// While held, the port is nobody's but an SO_REUSEADDR listener's: a plain bind (what an
// ephemeral port search amounts to) is refused, and a TCPStore-like listener gets it.
TEST(ReservedPort, IsHeldFromPlainBindsButOpenToAReuseListener) {
  ReservedPort held;
  ASSERT_GT(held.port(), 0);
  errno = 0;
  EXPECT_EQ(bind_to(held.port(), false), -1) << "a plain bind must not get the held port";
  EXPECT_EQ(errno, EADDRINUSE);
  const int store = bind_to(held.port(), true);
  ASSERT_GE(store, 0) << "the rendezvous listener must still bind it";
  EXPECT_EQ(::listen(store, 8), 0);
  ::close(store);
}

// Once the reservation ends (the daemon exits), the port is free again.
TEST(ReservedPort, IsReleasedWhenDestroyedAndMovesWithItsOwner) {
  int port = 0;
  {
    ReservedPort first;
    port = first.port();
    ReservedPort moved = std::move(first);
    EXPECT_EQ(moved.port(), port);
    EXPECT_EQ(bind_to(port, false), -1) << "the moved-to reservation still holds it";
  }
  const int fd = bind_to(port, false);
  EXPECT_GE(fd, 0);
  if (fd >= 0) ::close(fd);
}
