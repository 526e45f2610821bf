// Pure functions behind `smddp-ctl`: turn a daemon's status document into a text report, a health
// verdict or Prometheus metrics. No I/O here, so each is tested on plain JSON. Every field of the
// document may be missing or of the wrong type: what is missing is shown as "-" or left out.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace smddp::ctl {

// Exit codes of `smddp-ctl health`, for liveness probes.
enum class Health : int { kHealthy = 0, kDegraded = 1, kUnreachable = 2 };

struct HealthVerdict {
  Health health = Health::kUnreachable;
  std::string reason;  // one line: what is wrong, or a short summary when healthy
};

// Healthy: state "ready", every rank alive and not failed, no stalls, empty job_error, no "error".
// Anything else reachable is degraded, with every reason joined by "; ".
HealthVerdict evaluate_health(const nlohmann::json& status);

// A readable multi-line report of one daemon (one node of one job), ending in a newline.
std::string format_status_text(const nlohmann::json& status);

// One daemon's status for the metrics page; no status means it was unreachable.
struct NodeStatus {
  std::string job_id;
  int node_id = 0;
  std::optional<nlohmann::json> status;
};

// Prometheus text exposition format 0.0.4: each family's HELP and TYPE once, then its samples,
// labelled job and node (and rank for the per-rank families).
std::string format_prometheus(const std::vector<NodeStatus>& nodes);

// "<job>.n<node>.sock" (ipc::socket_path) → job and node; nullopt for any other name.
struct SocketName {
  std::string job_id;
  int node_id = 0;
  bool operator==(const SocketName&) const = default;
};
std::optional<SocketName> parse_socket_name(std::string_view file_name);

// Small helpers, exposed for tests: "12.3 s", "5m 03s", "2h 05m 03s", "3d 02h 05m"; "512 B",
// "120.6 KiB (123456 B)"; a Prometheus sample value; a label value escaped for Prometheus.
std::string format_duration(double seconds);
std::string format_bytes(double bytes);
std::string prometheus_value(double value);
std::string prometheus_escape(std::string_view label_value);

}  // namespace smddp::ctl
