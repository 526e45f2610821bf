#include "client/ctl/control_client.hpp"
#include "ipc/unique_fd.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include "client/ctl/status_format.hpp"

namespace smddp::ctl {
namespace {

using Clock = std::chrono::steady_clock;

// A reply larger than this is not a status document.
constexpr std::size_t kMaxReplyBytes = 64u << 20;

using ipc::UniqueFd;

std::string errno_text() { return std::strerror(errno); }

// Waits for `events` on `fd` until `deadline`: true when ready, false on timeout; throws on poll errors.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, static_cast<int>(left));
    if (n > 0) return true;  // readiness or hang-up/error: the next read or write tells which
    if (n < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
  }
}

}  // namespace

std::vector<DaemonSocket> find_daemon_sockets(const std::filesystem::path& dir) {
  std::vector<DaemonSocket> found;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    auto name = parse_socket_name(it->path().filename().string());
    if (!name) continue;
    std::error_code type_ec;
    if (!it->is_socket(type_ec)) continue;
    found.push_back({name->job_id, name->node_id, it->path()});
  }
  std::sort(found.begin(), found.end(), [](const DaemonSocket& a, const DaemonSocket& b) {
    return std::tie(a.job_id, a.node_id) < std::tie(b.job_id, b.node_id);
  });
  return found;
}

QueryResult query_daemon(const std::filesystem::path& path, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const std::string where = path.string();
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", std::chrono::duration<double>(timeout).count());

  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (where.empty() || where.size() >= sizeof(addr.sun_path)) return {std::nullopt, "socket path too long: " + where};
  std::memcpy(addr.sun_path, where.data(), where.size());

  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return {std::nullopt, "cannot create a socket: " + errno_text()};
  // A blocking connect to a Unix socket honours SO_SNDTIMEO when the server's backlog is full.
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EAGAIN || errno == EINPROGRESS) return {std::nullopt, "connecting to " + where + " timed out"};
    return {std::nullopt, "cannot connect to " + where + ": " + errno_text()};
  }
  if (::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK) != 0)
    return {std::nullopt, "cannot make the socket non-blocking: " + errno_text()};

  try {
    constexpr std::string_view kRequest = "status\n";
    std::size_t sent = 0;
    while (sent < kRequest.size()) {
      ssize_t n = ::send(fd.get(), kRequest.data() + sent, kRequest.size() - sent, MSG_NOSIGNAL);
      if (n >= 0) {
        sent += static_cast<std::size_t>(n);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_for(fd.get(), POLLOUT, deadline)) return {std::nullopt, "sending to " + where + " timed out"};
      } else if (errno != EINTR) {
        return {std::nullopt, "cannot send to " + where + ": " + errno_text()};
      }
    }

    std::string reply;
    char buf[65536];
    for (;;) {
      ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
      if (n > 0) {
        reply.append(buf, static_cast<std::size_t>(n));
        if (reply.size() > kMaxReplyBytes) return {std::nullopt, "the reply from " + where + " is too large"};
      } else if (n == 0 || (errno == ECONNRESET && !reply.empty())) {
        break;  // a reset after the reply: the server closed with bytes of ours unread
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_for(fd.get(), POLLIN, deadline))
          return {std::nullopt, "no reply from " + where + " within " + seconds + " s"};
      } else if (errno != EINTR) {
        return {std::nullopt, "cannot read from " + where + ": " + errno_text()};
      }
    }
    if (reply.empty()) return {std::nullopt, where + " closed the connection without a reply"};
    auto doc = nlohmann::json::parse(reply, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) return {std::nullopt, "the reply from " + where + " is not valid JSON"};
    if (!doc.is_object()) return {std::nullopt, "the reply from " + where + " is not a JSON object"};
    return {std::move(doc), ""};
  } catch (const std::exception& e) {
    return {std::nullopt, "querying " + where + " failed: " + e.what()};
  }
}

std::optional<nlohmann::json> query_status(const std::filesystem::path& path, std::chrono::milliseconds timeout) {
  return query_daemon(path, timeout).status;
}

}  // namespace smddp::ctl
