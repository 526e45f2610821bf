#include "client/ctl/status_format.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "ipc/names.hpp"

namespace smddp::ctl {
namespace {

using nlohmann::json;

// The value of `key` if `j` is an object that holds it with a non-null value.
const json* field(const json& j, std::string_view key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> number(const json& j, std::string_view key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_number()) return v->get<double>();
  if (v->is_boolean()) return v->get<bool>() ? 1.0 : 0.0;
  return std::nullopt;
}

std::optional<bool> boolean(const json& j, std::string_view key) {
  const json* v = field(j, key);
  if (v == nullptr || !v->is_boolean()) return std::nullopt;
  return v->get<bool>();
}

// A scalar shown as text: strings as they are, numbers and booleans as JSON writes them.
std::string text(const json& j, std::string_view key, std::string_view missing = "-") {
  const json* v = field(j, key);
  if (v == nullptr) return std::string(missing);
  if (v->is_string()) return v->get<std::string>();
  return v->dump(-1, ' ', false, json::error_handler_t::replace);
}

const json& array(const json& j, std::string_view key) {
  static const json kEmpty = json::array();
  const json* v = field(j, key);
  return (v != nullptr && v->is_array()) ? *v : kEmpty;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string join_ranks(const json& ranks) {
  std::string out;
  for (const json& r : ranks) {
    if (!out.empty()) out += ", ";
    out += r.is_string() ? r.get<std::string>() : r.dump();
  }
  return out;
}

std::string describe_stall(const json& s) {
  std::string out = text(s, "op", "collective") + " seq " + text(s, "seq") + " on comm " + text(s, "comm_id");
  if (auto w = number(s, "waiting_s")) out += " waiting " + fixed(*w, 1) + " s";
  const json& missing = array(s, "missing_ranks");
  if (!missing.empty()) out += " for rank" + std::string(missing.size() > 1 ? "s " : " ") + join_ranks(missing);
  return out;
}

std::string rank_name(const json& r) {
  std::string out = "rank " + text(r, "rank", "?");
  if (field(r, "pid") != nullptr) out += " (pid " + text(r, "pid") + ")";
  return out;
}

// A table whose columns are as wide as their widest cell.
std::string format_table(const std::vector<std::vector<std::string>>& rows, std::string_view indent) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows)
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (widths.size() <= i) widths.push_back(0);
      widths[i] = std::max(widths[i], row[i].size());
    }
  std::string out;
  for (const auto& row : rows) {
    std::string line(indent);
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  if (seconds < 60) return fixed(seconds, 1) + " s";
  auto total = static_cast<long long>(seconds);
  long long d = total / 86400, h = (total / 3600) % 24, m = (total / 60) % 60, s = total % 60;
  char buf[64];
  if (d > 0)
    std::snprintf(buf, sizeof(buf), "%lldd %02lldh %02lldm", d, h, m);
  else if (h > 0)
    std::snprintf(buf, sizeof(buf), "%lldh %02lldm %02llds", h, m, s);
  else
    std::snprintf(buf, sizeof(buf), "%lldm %02llds", m, s);
  return buf;
}

std::string format_bytes(double bytes) {
  if (!std::isfinite(bytes) || bytes < 0) return "-";
  char exact[64];
  std::snprintf(exact, sizeof(exact), "%.0f B", bytes);
  if (bytes < 1024) return exact;
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = bytes / 1024;
  std::size_t unit = 0;
  while (v >= 1024 && unit + 1 < std::size(kUnits)) {
    v /= 1024;
    ++unit;
  }
  return fixed(v, 1) + " " + kUnits[unit] + " (" + exact + ")";
}

HealthVerdict evaluate_health(const json& status) {
  if (!status.is_object()) return {Health::kUnreachable, "the daemon's reply is not a JSON object"};
  std::vector<std::string> problems;
  if (const json* err = field(status, "error")) problems.push_back(err->is_string() ? err->get<std::string>() : err->dump());

  std::string state = text(status, "state", "");
  if (state.empty())
    problems.push_back("daemon state unknown");
  else if (state != "ready")
    problems.push_back("daemon state is " + state);

  std::string job_error = text(status, "job_error", "");
  if (!job_error.empty()) problems.push_back("job error: " + job_error);

  const json& ranks = array(status, "ranks");
  std::size_t alive = 0;
  for (const json& r : ranks) {
    const bool failed = text(r, "state", "") == "failed";
    const auto is_alive = boolean(r, "alive");
    if (failed) {
      std::string why = rank_name(r) + " failed";
      if (field(r, "exit_status") != nullptr) why += " (exit status " + text(r, "exit_status") + ")";
      problems.push_back(why);
    } else if (is_alive == false) {
      std::string why = rank_name(r) + " is not alive";
      if (field(r, "exit_status") != nullptr) why += " (exit status " + text(r, "exit_status") + ")";
      problems.push_back(why);
    }
    if (boolean(r, "stopped") == true) problems.push_back(rank_name(r) + " is stopped (a signal or a debugger)");
    if (is_alive != false && !failed) ++alive;
  }

  for (const json& s : array(status, "stalls")) problems.push_back("stalled: " + describe_stall(s));

  if (!problems.empty()) {
    std::string reason;
    for (const auto& p : problems) reason += (reason.empty() ? "" : "; ") + p;
    return {Health::kDegraded, reason};
  }
  std::string summary = "ready";
  if (field(status, "ranks") != nullptr)
    summary += ", " + std::to_string(alive) + " of " + std::to_string(ranks.size()) + " local ranks alive";
  if (auto up = number(status, "uptime_s")) summary += ", up " + format_duration(*up);
  return {Health::kHealthy, summary};
}

namespace {
// The fabric endpoints of a daemon across nodes: count, provider, each one's device and bytes.
void format_fabric(std::ostringstream& out, const json& internode) {
  const json* fabric = field(internode, "fabric");
  if (fabric == nullptr || !fabric->is_object()) return;
  out << "  fabric:        " << text(*fabric, "endpoint_count") << " endpoint(s), provider " << text(*fabric, "provider");
  const json& slots = array(*fabric, "endpoint_of_slot");
  if (!slots.empty()) {
    out << "; endpoint of each local slot:";
    for (const json& e : slots) out << " " << (e.is_number() ? e.dump() : "?");
  }
  out << "\n";
  std::vector<std::vector<std::string>> rows{{"ENDPOINT", "DEVICE", "PCI", "SENT", "RECEIVED"}};
  for (const json& e : array(*fabric, "endpoints")) {
    auto bytes = [&](std::string_view key) {
      auto b = number(e, key);
      return b ? format_bytes(*b) : std::string("-");
    };
    const std::string pci = text(e, "pci", "");
    rows.push_back({text(e, "index"), text(e, "device"), pci.empty() ? "-" : pci, bytes("bytes_sent"), bytes("bytes_received")});
  }
  if (rows.size() > 1) out << format_table(rows, "    ");
}
// Where the bytes went, by operation type: copies between the ranks' GPUs and arenas, the
// daemon's CPU reductions and its fabric sends; then each rank's copies.
void format_traffic(std::ostringstream& out, const json& traffic) {
  const json* by_op = field(traffic, "by_op");
  if (by_op == nullptr || !by_op->is_object() || by_op->empty()) return;
  auto bytes = [](const json& o, std::string_view key) {
    auto b = number(o, key);
    return b ? format_bytes(*b) : std::string("-");
  };
  out << "  traffic:\n";
  std::vector<std::vector<std::string>> rows{{"OP", "GPU->ARENA", "ARENA->GPU", "REDUCED BY DAEMON", "FABRIC SENT"}};
  for (auto it = by_op->begin(); it != by_op->end(); ++it)
    rows.push_back({it.key(), bytes(it.value(), "to_host_bytes"), bytes(it.value(), "to_device_bytes"),
                    bytes(it.value(), "daemon_reduced_bytes"), bytes(it.value(), "fabric_sent_bytes")});
  out << format_table(rows, "    ");
  std::vector<std::vector<std::string>> ranks{{"RANK", "GPU->ARENA", "ARENA->GPU"}};
  for (const json& r : array(traffic, "by_rank")) {
    if (number(r, "to_host_bytes").value_or(0) == 0 && number(r, "to_device_bytes").value_or(0) == 0) continue;
    ranks.push_back({text(r, "rank"), bytes(r, "to_host_bytes"), bytes(r, "to_device_bytes")});
  }
  if (ranks.size() > 1) out << format_table(ranks, "    ");
}
}  // namespace

std::string format_status_text(const json& status) {
  std::ostringstream out;
  if (!status.is_object()) {
    out << "the daemon's reply is not a JSON object\n";
    return out.str();
  }
  out << "job " << text(status, "job_id") << ", node " << text(status, "node_id");
  if (field(status, "num_nodes") != nullptr) out << " of " << text(status, "num_nodes");
  out << " (host " << text(status, "hostname") << ", daemon pid " << text(status, "pid") << ")\n";

  if (const json* err = field(status, "error"))
    out << "  daemon error:  " << (err->is_string() ? err->get<std::string>() : err->dump()) << "\n";

  const HealthVerdict verdict = evaluate_health(status);
  out << "  state:         " << text(status, "state");
  if (auto up = number(status, "uptime_s")) out << ", up " << format_duration(*up);
  out << " (" << (verdict.health == Health::kHealthy ? "healthy" : "degraded") << ")\n";
  out << "  version:       " << text(status, "version") << ", config " << text(status, "config") << ", transport "
      << text(status, "transport") << "\n";
  out << "  world:         " << text(status, "world_size") << " ranks, " << text(status, "local_world_size")
      << " on this node\n";
  out << "  collectives:   " << text(status, "collectives_done") << " done, " << text(status, "kernel_launches")
      << " kernel launches\n";
  // GPU path: kernel launches per operation type (SDP AllGather shows copies only).
  if (const json* gpu = field(status, "gpu"); gpu && gpu->is_object()) {
    if (gpu->value("enabled", false)) {
      out << "  gpu:           " << gpu->value("devices", std::string("?")) << "\n";
      if (gpu->contains("fast_path_operations"))
        out << "    rank-side operations: " << text(*gpu, "rank_side_operations") << ", of which fast path "
            << text(*gpu, "fast_path_operations") << " (one kernel each, no plan awaited)\n";
      if (gpu->contains("peer_mappings"))
        out << "    peer mappings: " << text(*gpu, "peer_mappings") << " (other ranks' allocations sent to a rank; "
            << text(*gpu, "freed_allocations") << " freed by their owners and released)\n";
      const json& by_op = gpu->contains("operations_by_op") ? (*gpu)["operations_by_op"] : json::object();
      const json& kernels = gpu->contains("kernel_launches_by_op") ? (*gpu)["kernel_launches_by_op"] : json::object();
      for (auto it = by_op.begin(); it != by_op.end(); ++it) {
        const auto ops = it.value().is_number() ? it.value().get<double>() : 0.0;
        const auto k = kernels.contains(it.key()) && kernels[it.key()].is_number() ? kernels[it.key()].get<double>() : 0.0;
        out << "    " << it.key() << ": " << ops << " ops, " << k << " kernel launches ("
            << fixed(ops > 0 ? k / ops : 0.0, 2) << " per op)\n";
      }
    } else {
      out << "  gpu:           off (" << gpu->value("why", std::string("?")) << ")\n";
    }
  }
  if (const json* inter = field(status, "internode"); inter && inter->is_object() && inter->value("enabled", false)) {
    out << "  across nodes:  " << text(*inter, "operations_in_flight") << " operations in flight; staging "
        << text(*inter, "staging_buffers_made") << " buffers made, ";
    if (auto kept = number(*inter, "staging_bytes_kept"))
      out << format_bytes(*kept);
    else
      out << "-";
    out << " kept for reuse\n";
    format_fabric(out, *inter);
  }
  if (const json* traffic = field(status, "traffic"); traffic && traffic->is_object()) format_traffic(out, *traffic);
  if (const json* dr = field(status, "direct_reads"); dr && dr->is_object() && number(*dr, "chunks").value_or(0) > 0)
    out << "  direct reads:  " << text(*dr, "chunks") << " host chunks copied by the ranks from the members' arenas, "
        << text(*dr, "copies_behind") << " copies behind\n";
  if (const json* sr = field(status, "split_reductions");
      sr && sr->is_object() && number(*sr, "chunks").value_or(0) > 0) {
    out << "  split reductions: " << text(*sr, "chunks")
        << " host chunks reduced by the ranks, a share each, from the members' arenas";
    if (const auto min = number(*sr, "min_bytes"))
      out << " (allreduce and reduce from " << static_cast<std::uint64_t>(*min) / 1024 << " KiB a chunk)";
    out << "; " << text(*sr, "shares_behind") << " shares behind\n";
  }
  if (const json* hf = field(status, "host_fast_path"); hf && hf->is_object() && number(*hf, "operations").value_or(0) > 0)
    out << "  host fast path: " << text(*hf, "operations") << " host collectives run by the ranks among themselves ("
        << text(*hf, "single_copy_operations") << " by single copy; " << text(*hf, "communicators")
        << " communicators with a lane)\n";
  out << "  bytes moved:   ";
  if (auto b = number(status, "bytes_moved"))
    out << format_bytes(*b);
  else
    out << "-";
  out << ", recent bandwidth ";
  if (auto bw = number(status, "recent_bandwidth_gbps"))
    out << fixed(*bw, 2) << " GB/s\n";
  else
    out << "-\n";

  const json& ranks = array(status, "ranks");
  if (ranks.empty()) {
    out << "  ranks:         none registered\n";
  } else {
    out << "  ranks:\n";
    std::vector<std::vector<std::string>> rows{
        {"RANK", "LOCAL", "PID", "DEVICE", "STATE", "ALIVE", "LAST SEQ", "PENDING", "EXIT"}};
    for (const json& r : ranks) {
      auto alive = boolean(r, "alive");
      rows.push_back({text(r, "rank"), text(r, "local_rank"), text(r, "pid"), text(r, "device"), text(r, "state"),
                      boolean(r, "stopped") == true ? "STOPPED" : alive ? (*alive ? "yes" : "NO") : "-",
                      text(r, "last_seq_posted"), text(r, "pending"),
                      text(r, "exit_status")});
    }
    out << format_table(rows, "    ");
  }

  const json& stalls = array(status, "stalls");
  if (stalls.empty()) {
    out << "  stalls:        none\n";
  } else {
    out << "  stalls (" << stalls.size() << "):\n";
    for (const json& s : stalls) out << "    " << describe_stall(s) << "\n";
  }

  const json& errors = array(status, "errors");
  if (errors.empty()) {
    out << "  recent errors: none\n";
  } else {
    out << "  recent errors (" << errors.size() << "):\n";
    for (const json& e : errors) {
      if (e.is_string())
        out << "    " << e.get<std::string>() << "\n";
      else
        out << "    " << text(e, "time") << "  " << text(e, "message") << "\n";
    }
  }

  std::string job_error = text(status, "job_error", "");
  if (!job_error.empty()) out << "  job error:     " << job_error << "\n";
  if (verdict.health != Health::kHealthy) out << "  degraded:      " << verdict.reason << "\n";
  return out.str();
}

std::string prometheus_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);  // shortest text that reads back exactly
  if (ec != std::errc()) return "NaN";
  return std::string(buf, end);
}

std::string prometheus_escape(std::string_view label_value) {
  std::string out;
  out.reserve(label_value.size());
  for (char c : label_value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_prometheus(const std::vector<NodeStatus>& nodes) {
  std::ostringstream out;
  auto labels = [](const NodeStatus& n, std::string_view extra = {}) {
    std::string l = "{job=\"" + prometheus_escape(n.job_id) + "\",node=\"" + std::to_string(n.node_id) + "\"";
    if (!extra.empty()) l += "," + std::string(extra);
    return l + "}";
  };
  // Each family once, then its samples for every node: Prometheus wants a family's samples together.
  auto family = [&](std::string_view name, std::string_view type, std::string_view help,
                    const std::function<void(const NodeStatus&, const json&)>& samples) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
    for (const NodeStatus& n : nodes)
      if (n.status && n.status->is_object()) samples(n, *n.status);
  };
  auto scalar = [&](std::string_view name, std::string_view type, std::string_view help,
                    const std::function<std::optional<double>(const json&)>& value) {
    family(name, type, help, [&](const NodeStatus& n, const json& s) {
      if (auto v = value(s)) out << name << labels(n) << " " << prometheus_value(*v) << "\n";
    });
  };
  auto from = [](std::string_view key) {
    return [key](const json& s) { return number(s, key); };
  };

  out << "# HELP smddp_up Whether the daemon answered on its control socket.\n# TYPE smddp_up gauge\n";
  for (const NodeStatus& n : nodes) out << "smddp_up" << labels(n) << " " << (n.status ? 1 : 0) << "\n";

  scalar("smddp_healthy", "gauge", "Whether smddp-ctl health would report healthy (1) or degraded (0).",
         [](const json& s) -> std::optional<double> { return evaluate_health(s).health == Health::kHealthy ? 1 : 0; });
  family("smddp_info", "gauge", "Daemon facts as labels; the value is always 1.", [&](const NodeStatus& n, const json& s) {
    std::string extra;
    for (const char* key : {"version", "state", "transport", "hostname"})
      extra += (extra.empty() ? "" : ",") + std::string(key) + "=\"" + prometheus_escape(text(s, key, "")) + "\"";
    out << "smddp_info" << labels(n, extra) << " 1\n";
  });
  scalar("smddp_uptime_seconds", "gauge", "Seconds since the daemon started.", from("uptime_s"));
  scalar("smddp_collectives_total", "counter", "Collectives the daemon completed.", from("collectives_done"));
  scalar("smddp_bytes_moved_total", "counter", "Bytes the daemon moved for collectives.", from("bytes_moved"));
  scalar("smddp_kernel_launches_total", "counter", "GPU kernels the daemon launched.", from("kernel_launches"));
  scalar("smddp_recent_bandwidth_gbps", "gauge", "Recent collective bandwidth in GB/s.", from("recent_bandwidth_gbps"));
  const auto nested = [](const char* section, const char* key) {
    return [section, key](const json& s) -> std::optional<double> {
      const json* sub = field(s, section);
      if (sub == nullptr || !sub->is_object()) return std::nullopt;
      return number(*sub, key);
    };
  };
  scalar("smddp_direct_read_chunks_total", "counter",
         "Host chunks whose ranks copied their outputs straight from the members' arenas.",
         nested("direct_reads", "chunks"));
  scalar("smddp_host_fast_operations_total", "counter",
         "Small host collectives the ranks ran among themselves (the host fast path); the daemon only checked them.",
         nested("host_fast_path", "operations"));
  scalar("smddp_host_single_copy_operations_total", "counter",
         "Host collectives of the fast path whose ranks read each other's inputs where they are (process_vm_readv).",
         nested("host_fast_path", "single_copy_operations"));
  scalar("smddp_direct_read_copies_behind", "gauge",
         "Copies from the members' arenas the ranks were sent and have not made yet.",
         nested("direct_reads", "copies_behind"));
  scalar("smddp_split_reduce_chunks_total", "counter",
         "Host reduction chunks whose ranks each reduced a share straight from the members' arenas.",
         nested("split_reductions", "chunks"));
  scalar("smddp_split_reduce_shares_behind", "gauge",
         "Shares of host reductions the ranks were sent and have not reduced yet.",
         nested("split_reductions", "shares_behind"));
  scalar("smddp_internode_operations_in_flight", "gauge", "Operations across nodes in flight on this node.",
         nested("internode", "operations_in_flight"));
  scalar("smddp_internode_staging_bytes_kept", "gauge",
         "Bytes of staging buffers for operations across nodes kept for reuse.",
         nested("internode", "staging_bytes_kept"));
  scalar("smddp_fabric_endpoints", "gauge", "Fabric endpoints the daemon opened for traffic across nodes.",
         [](const json& s) -> std::optional<double> {
           const json* inter = field(s, "internode");
           const json* fabric = inter && inter->is_object() ? field(*inter, "fabric") : nullptr;
           return fabric && fabric->is_object() ? number(*fabric, "endpoint_count") : std::nullopt;
         });
  auto per_endpoint = [&](std::string_view name, std::string_view help, std::string_view key) {
    family(name, "counter", help, [&](const NodeStatus& n, const json& s) {
      const json* inter = field(s, "internode");
      const json* fabric = inter && inter->is_object() ? field(*inter, "fabric") : nullptr;
      if (fabric == nullptr || !fabric->is_object()) return;
      for (const json& e : array(*fabric, "endpoints")) {
        auto v = number(e, key);
        if (!v) continue;
        out << name
            << labels(n, "endpoint=\"" + prometheus_escape(text(e, "index")) + "\",device=\"" +
                             prometheus_escape(text(e, "device", "")) + "\"")
            << " " << prometheus_value(*v) << "\n";
      }
    });
  };
  per_endpoint("smddp_fabric_endpoint_bytes_sent_total", "Message bytes sent through each fabric endpoint.", "bytes_sent");
  per_endpoint("smddp_fabric_endpoint_bytes_received_total", "Message bytes received through each fabric endpoint.",
               "bytes_received");
  scalar("smddp_ranks", "gauge", "Local ranks the daemon knows.", [](const json& s) -> std::optional<double> {
    if (field(s, "ranks") != nullptr) return static_cast<double>(array(s, "ranks").size());
    return number(s, "local_world_size");
  });
  scalar("smddp_ranks_alive", "gauge", "Local ranks that are alive.", [](const json& s) -> std::optional<double> {
    if (field(s, "ranks") == nullptr) return std::nullopt;
    const json& ranks = array(s, "ranks");
    return static_cast<double>(
        std::count_if(ranks.begin(), ranks.end(), [](const json& r) { return boolean(r, "alive") == true; }));
  });
  scalar("smddp_stalls", "gauge", "Collectives some local ranks posted and others have not.",
         [](const json& s) -> std::optional<double> {
           if (field(s, "stalls") == nullptr) return std::nullopt;
           return static_cast<double>(array(s, "stalls").size());
         });
  // The status lists only recent errors; a daemon that counts them all reports errors_total.
  scalar("smddp_errors_total", "counter", "Errors the daemon reported.", [](const json& s) -> std::optional<double> {
    if (auto total = number(s, "errors_total")) return total;
    if (field(s, "errors") == nullptr) return std::nullopt;
    return static_cast<double>(array(s, "errors").size());
  });
  auto per_rank = [&](std::string_view name, std::string_view help, std::string_view key) {
    family(name, "gauge", help, [&](const NodeStatus& n, const json& s) {
      for (const json& r : array(s, "ranks")) {
        auto v = number(r, key);
        if (!v || field(r, "rank") == nullptr) continue;
        out << name << labels(n, "rank=\"" + prometheus_escape(text(r, "rank")) + "\"") << " " << prometheus_value(*v)
            << "\n";
      }
    });
  };
  // Where the bytes go, by operation type (and rank, for the copies between GPU and arena).
  auto per_op = [&](std::string_view name, std::string_view help, std::string_view key) {
    family(name, "counter", help, [&](const NodeStatus& n, const json& s) {
      const json* traffic = field(s, "traffic");
      const json* by_op = traffic && traffic->is_object() ? field(*traffic, "by_op") : nullptr;
      if (by_op == nullptr || !by_op->is_object()) return;
      for (auto it = by_op->begin(); it != by_op->end(); ++it)
        if (auto v = number(it.value(), key))
          out << name << labels(n, "op=\"" + prometheus_escape(it.key()) + "\"") << " " << prometheus_value(*v) << "\n";
    });
  };
  auto per_rank_op = [&](std::string_view name, std::string_view help, std::string_view key) {
    family(name, "counter", help, [&](const NodeStatus& n, const json& s) {
      const json* traffic = field(s, "traffic");
      if (traffic == nullptr || !traffic->is_object()) return;
      for (const json& r : array(*traffic, "by_rank")) {
        const json* by_op = field(r, "by_op");
        if (by_op == nullptr || !by_op->is_object() || field(r, "rank") == nullptr) continue;
        for (auto it = by_op->begin(); it != by_op->end(); ++it)
          if (auto v = number(it.value(), key))
            out << name
                << labels(n, "rank=\"" + prometheus_escape(text(r, "rank")) + "\",op=\"" + prometheus_escape(it.key()) + "\"")
                << " " << prometheus_value(*v) << "\n";
      }
    });
  };
  per_rank_op("smddp_staged_to_host_bytes_total", "Bytes a rank copied from its GPU to its arena, by operation type.",
              "to_host_bytes");
  per_rank_op("smddp_staged_to_device_bytes_total", "Bytes a rank copied from its arena to its GPU, by operation type.",
              "to_device_bytes");
  per_op("smddp_daemon_reduced_bytes_total", "Bytes the daemon's CPU reductions wrote, by operation type.",
         "daemon_reduced_bytes");
  per_op("smddp_fabric_sent_bytes_total", "Bytes the daemon sent on the fabric (descriptors and data), by operation type.",
         "fabric_sent_bytes");
  per_rank("smddp_rank_pending", "Requests a rank posted that are not complete yet.", "pending");
  per_rank("smddp_rank_last_seq", "The last sequence number a rank posted.", "last_seq_posted");
  return out.str();
}

std::optional<SocketName> parse_socket_name(std::string_view name) {
  constexpr std::string_view kSuffix = ".sock";
  if (name.size() <= kSuffix.size() || !name.ends_with(kSuffix)) return std::nullopt;
  name.remove_suffix(kSuffix.size());
  std::size_t dot_n = name.rfind(".n");
  if (dot_n == std::string_view::npos || dot_n == 0) return std::nullopt;
  std::string_view digits = name.substr(dot_n + 2);
  if (digits.empty() || digits.size() > 9) return std::nullopt;
  int node = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), node);
  if (ec != std::errc() || end != digits.data() + digits.size() || node < 0) return std::nullopt;
  std::string job(name.substr(0, dot_n));
  try {
    ipc::check_job_id(job);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  return SocketName{job, node};
}

}  // namespace smddp::ctl
