// The client side of the daemon's control socket, shared by smddp-ctl and the tests.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace smddp::ctl {

inline constexpr std::chrono::milliseconds kDefaultQueryTimeout{2000};

// A control socket found in the socket directory.
struct DaemonSocket {
  std::string job_id;
  int node_id = 0;
  std::filesystem::path path;
};

// The sockets named "<job>.n<node>.sock" in `dir`, sorted by job then node. A missing or unreadable
// directory has none.
std::vector<DaemonSocket> find_daemon_sockets(const std::filesystem::path& dir);

struct QueryResult {
  std::optional<nlohmann::json> status;  // the reply, a JSON object
  std::string error;                     // why there is none: connect failed, timed out, not JSON
};

// Connects to the socket at `path`, sends "status\n" and parses the reply, all within `timeout`.
QueryResult query_daemon(const std::filesystem::path& path, std::chrono::milliseconds timeout = kDefaultQueryTimeout);

// query_daemon without the reason.
std::optional<nlohmann::json> query_status(const std::filesystem::path& path,
                                           std::chrono::milliseconds timeout = kDefaultQueryTimeout);

}  // namespace smddp::ctl
