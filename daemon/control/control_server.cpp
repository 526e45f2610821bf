#include "daemon/control/control_server.hpp"
#include "ipc/unique_fd.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "ipc/names.hpp"

namespace smddp::daemon {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Longest request line we read; anything longer is not a request of ours.
constexpr std::size_t kMaxRequestBytes = 256;
// Clients served at once; further ones wait in the listen backlog.
constexpr std::size_t kMaxConnections = 64;
constexpr int kListenBacklog = 64;

using ipc::UniqueFd;

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

sockaddr_un unix_address(const fs::path& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string& s = path.native();
  if (s.empty() || s.size() >= sizeof(addr.sun_path))
    throw std::runtime_error("control socket path '" + s + "' must be 1 to " +
                             std::to_string(sizeof(addr.sun_path) - 1) + " bytes long");
  std::memcpy(addr.sun_path, s.data(), s.size());
  return addr;
}

// Removes a socket file left by a dead daemon. A live listener, or a file that is not a socket, is an error:
// we never take over another daemon's socket nor delete someone's file.
void remove_stale_socket(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw_errno("cannot stat control socket " + path.string());
  }
  if (!S_ISSOCK(st.st_mode))
    throw std::runtime_error("control socket path " + path.string() + " exists and is not a socket; not removing it");

  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!probe) throw_errno("cannot create a socket");
  sockaddr_un addr = unix_address(path);
  // Non-blocking so a live but busy server (full backlog: EAGAIN) cannot stall us.
  if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 || errno == EAGAIN)
    throw std::runtime_error("a live smddp daemon already listens on control socket " + path.string());
  if (errno != ECONNREFUSED) throw_errno("cannot probe control socket " + path.string());
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_errno("cannot remove stale control socket " + path.string());
  spdlog::info("removed stale control socket {}", path.string());
}

struct Connection {
  UniqueFd fd;
  std::string request;
  std::string reply;
  std::size_t sent = 0;
  bool replying = false;
  bool done = false;
  Clock::time_point deadline;
};

}  // namespace

struct ControlServer::Impl {
  fs::path path;
  std::function<nlohmann::json()> snapshot;
  UniqueFd listen_fd;
  UniqueFd wake_fd;  // eventfd: the destructor writes it to stop the thread
  dev_t socket_dev = 0;
  ino_t socket_ino = 0;
  std::thread thread;

  void serve();
  void accept_clients(std::vector<Connection>& conns, Clock::time_point now, Clock::time_point& paused_until);
  void on_readable(Connection& c, Clock::time_point now);
  void on_writable(Connection& c);
  std::string reply_for(std::string_view request);
  void unlink_if_ours() const;
};

ControlServer::ControlServer(fs::path path, std::function<nlohmann::json()> snapshot) : impl_(std::make_unique<Impl>()) {
  if (!snapshot) throw std::invalid_argument("ControlServer needs a snapshot function");
  impl_->path = std::move(path);
  impl_->snapshot = std::move(snapshot);
  const fs::path& p = impl_->path;

  if (p.parent_path() == ipc::socket_dir()) ipc::ensure_socket_dir();
  sockaddr_un addr = unix_address(p);
  remove_stale_socket(p);

  impl_->listen_fd.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!impl_->listen_fd) throw_errno("cannot create the control socket");
  if (::bind(impl_->listen_fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EADDRINUSE)  // another daemon bound it between our probe and now
      throw std::runtime_error("a live smddp daemon already listens on control socket " + p.string());
    throw_errno("cannot bind control socket " + p.string());
  }
  try {
    // The directory is 0700 already; 0600 on the file keeps it private if the socket is ever moved.
    if (::chmod(p.c_str(), 0600) != 0) throw_errno("cannot make control socket " + p.string() + " mode 0600");
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) throw_errno("cannot stat control socket " + p.string());
    impl_->socket_dev = st.st_dev;
    impl_->socket_ino = st.st_ino;
    if (::listen(impl_->listen_fd.get(), kListenBacklog) != 0) throw_errno("cannot listen on " + p.string());
    impl_->wake_fd.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!impl_->wake_fd) throw_errno("cannot create an eventfd");
    // Logged before the thread starts, so spdlog's registry exists before the thread can touch it.
    spdlog::debug("control socket listening on {}", p.string());
    impl_->thread = std::thread([impl = impl_.get()] { impl->serve(); });
  } catch (...) {
    ::unlink(p.c_str());
    throw;
  }
}

ControlServer::~ControlServer() {
  const std::uint64_t one = 1;
  if (::write(impl_->wake_fd.get(), &one, sizeof(one)) != static_cast<ssize_t>(sizeof(one)))
    spdlog::error("control socket: cannot wake the server thread: {}", std::strerror(errno));
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->listen_fd.reset();
  impl_->unlink_if_ours();
}

const fs::path& ControlServer::path() const { return impl_->path; }

void ControlServer::Impl::unlink_if_ours() const {
  // Only our own file: if it was replaced meanwhile, the new one belongs to someone else.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && st.st_dev == socket_dev && st.st_ino == socket_ino) ::unlink(path.c_str());
}

void ControlServer::Impl::serve() {
  std::vector<Connection> conns;
  std::vector<pollfd> pfds;
  // Set when accept() fails for lack of descriptors, so a pending connection cannot make poll() spin.
  Clock::time_point accept_paused_until{};
  try {
    for (;;) {
      Clock::time_point now = Clock::now();
      const bool accepting = conns.size() < kMaxConnections && now >= accept_paused_until;
      pfds.clear();
      pfds.push_back({wake_fd.get(), POLLIN, 0});
      pfds.push_back({accepting ? listen_fd.get() : -1, POLLIN, 0});  // poll() skips negative fds
      for (const Connection& c : conns) pfds.push_back({c.fd.get(), static_cast<short>(c.replying ? POLLOUT : POLLIN), 0});

      // Sleep until an event or the nearest client deadline; forever when idle.
      int timeout_ms = -1;
      auto next = Clock::time_point::max();
      for (const Connection& c : conns) next = std::min(next, c.deadline);
      if (!accepting && accept_paused_until > now) next = std::min(next, accept_paused_until);
      if (next != Clock::time_point::max()) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
        timeout_ms = static_cast<int>(std::clamp<long long>(left, 0, 60'000));
      }
      if (::poll(pfds.data(), pfds.size(), timeout_ms) < 0) {
        if (errno == EINTR) continue;
        throw_errno("poll on the control socket");
      }
      if (pfds[0].revents != 0) return;  // the destructor asks us to stop

      now = Clock::now();
      for (std::size_t i = 0; i < conns.size(); ++i) {
        Connection& c = conns[i];
        const short ev = pfds[i + 2].revents;
        if (ev != 0) {
          if (c.replying)
            on_writable(c);
          else
            on_readable(c, now);
        }
        if (!c.done && now >= c.deadline) {
          spdlog::debug("control socket: dropped a client that {} in time",
                        c.replying ? "did not read its reply" : "sent no request");
          c.done = true;
        }
      }
      std::erase_if(conns, [](const Connection& c) { return c.done; });
      if ((pfds[1].revents & POLLIN) != 0) accept_clients(conns, now, accept_paused_until);
    }
  } catch (const std::exception& e) {
    spdlog::error("control socket {} stopped serving: {}", path.string(), e.what());
  }
}

void ControlServer::Impl::accept_clients(std::vector<Connection>& conns, Clock::time_point now,
                                         Clock::time_point& paused_until) {
  while (conns.size() < kMaxConnections) {
    UniqueFd fd(::accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        spdlog::warn("control socket: cannot accept a client: {}; retrying shortly", std::strerror(errno));
        paused_until = now + std::chrono::milliseconds(100);
        return;
      }
      throw_errno("accept on the control socket");
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      spdlog::warn("control socket: cannot read a client's credentials ({}); refusing it", std::strerror(errno));
      continue;
    }
    if (cred.uid != ::geteuid()) {
      spdlog::warn("control socket: refused a client of uid {} (pid {}); only uid {} may connect", cred.uid, cred.pid,
                   ::geteuid());
      continue;  // fd closes here, unanswered
    }
    Connection c;
    c.fd = std::move(fd);
    c.deadline = now + std::chrono::milliseconds(kControlRequestTimeoutMs);
    conns.push_back(std::move(c));
  }
}

void ControlServer::Impl::on_readable(Connection& c, Clock::time_point now) {
  char buf[kMaxRequestBytes];
  for (;;) {
    ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) c.done = true;
      return;
    }
    const bool eof = n == 0;
    c.request.append(buf, static_cast<std::size_t>(n));
    std::size_t newline = c.request.find('\n');
    if (newline == std::string::npos && !eof) {
      if (c.request.size() > kMaxRequestBytes) {
        spdlog::warn("control socket: dropped a client whose request exceeds {} bytes", kMaxRequestBytes);
        c.done = true;
        return;
      }
      continue;
    }
    if (newline == std::string::npos && c.request.empty()) {  // connected and left without asking
      c.done = true;
      return;
    }
    std::string_view line(c.request);
    line = line.substr(0, std::min(newline, line.size()));
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    c.reply = reply_for(line);
    c.replying = true;
    c.deadline = now + std::chrono::milliseconds(kControlReplyTimeoutMs);
    on_writable(c);  // usually the whole reply fits in the socket buffer at once
    return;
  }
}

void ControlServer::Impl::on_writable(Connection& c) {
  while (c.sent < c.reply.size()) {
    ssize_t n = ::send(c.fd.get(), c.reply.data() + c.sent, c.reply.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) c.done = true;  // the client went away
      return;
    }
    c.sent += static_cast<std::size_t>(n);
  }
  c.done = true;  // closing the connection ends the reply
}

std::string ControlServer::Impl::reply_for(std::string_view request) {
  nlohmann::json doc;
  if (request == "status") {
    try {
      doc = snapshot();
    } catch (const std::exception& e) {
      spdlog::error("control socket: building the status failed: {}", e.what());
      doc = {{"error", std::string("the daemon could not build its status: ") + e.what()}};
    }
  } else {
    doc = {{"error", "unknown request '" + std::string(request) + "'; the only request is 'status'"}};
  }
  // Replace, not throw, on invalid UTF-8 in strings that came from ranks or the request.
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace smddp::daemon
