// The daemon's control socket: answers `smddp-ctl` with a JSON snapshot of the daemon's state.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>

#include <nlohmann/json.hpp>

namespace smddp::daemon {

// Protocol: a client connects to the Unix stream socket, sends one line ("status\n"), and the server
// replies with one JSON document and closes. Peers whose uid is not the daemon's euid get nothing.
// An unknown request gets {"error": "..."}; so does a request whose snapshot threw.
class ControlServer {
 public:
  // Binds a Unix stream socket at `path` (mode 0600; the directory is made by ipc::ensure_socket_dir()
  // when `path` lies in ipc::socket_dir()), replacing a stale socket file nobody listens on. Throws
  // std::runtime_error if a live server already listens there or `path` is not a socket. Serves on its
  // own thread until destroyed; `snapshot` runs on that thread for each request and must be thread-safe.
  ControlServer(std::filesystem::path path, std::function<nlohmann::json()> snapshot);
  ~ControlServer();  // wakes and joins the thread, closes every socket, unlinks the socket file

  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  const std::filesystem::path& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// How long one client may take to send its request line before it is dropped.
inline constexpr int kControlRequestTimeoutMs = 1000;
// How long one client may take to read the reply before it is dropped.
inline constexpr int kControlReplyTimeoutMs = 2000;

}  // namespace smddp::daemon
