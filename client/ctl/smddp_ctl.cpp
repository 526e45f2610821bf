// smddp-ctl: the operator's view of the smddp daemons on this machine, through their control sockets.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/ctl/control_client.hpp"
#include "client/ctl/status_format.hpp"
#include "ipc/names.hpp"

#ifndef SMDDP_VERSION
#define SMDDP_VERSION "unknown"
#endif

namespace {

using smddp::ctl::DaemonSocket;
using smddp::ctl::Health;

constexpr int kUsageError = 2;

constexpr const char* kUsage = R"(usage: smddp-ctl COMMAND [OPTIONS]

Shows the smddp daemons running on this machine, through their control sockets
(<job>.n<node>.sock in $SMDDP_SOCKET_DIR, else $XDG_RUNTIME_DIR/smddp, else /tmp/smddp-<uid>).

Commands:
  status    A readable report of each daemon: state, uptime, nodes, every local rank (pid,
            device, alive, last sequence posted, pending requests), collectives done, bytes
            moved, recent bandwidth, recent errors, and stalled collectives with the missing
            ranks named. Exit 0 when every daemon answered, 1 when one did not or none runs.
  health    One line per daemon. Exit 0 healthy (state ready, every rank alive and not failed,
            no stalls, no job error), 1 degraded (the line says why), 2 unreachable (no daemon,
            connect failed, no reply within the timeout, or a reply that is not JSON).
            With several daemons the exit code is the worst of them.
  metrics   Prometheus text exposition format (smddp_up, smddp_collectives_total, ...), each
            sample labelled job and node. Exit 0, or 1 when no daemon runs.

Options:
  --job ID        Only job ID. Default: the only job with sockets here; with several jobs,
                  status and metrics show all of them and health checks all of them.
  --node N        Only node N's daemon. Default: every node of the job on this machine.
  --json          (status only) Print the daemon's JSON as received, pretty-printed. With
                  several daemons: a JSON array of those documents; an unreachable daemon
                  appears as {"job_id": ..., "node_id": ..., "unreachable": "why"}.
  --timeout SEC   Seconds to wait for each daemon's reply (default 2).
  -h, --help      Show this help.
  --version       Print the version.
Wrong usage exits 2.
)";

struct Options {
  std::string command;
  std::optional<std::string> job;
  std::optional<int> node;
  bool json = false;
  std::chrono::milliseconds timeout = smddp::ctl::kDefaultQueryTimeout;
};

struct UsageError {
  std::string message;
};

// Parses "--name value" and "--name=value". Throws UsageError.
Options parse_args(int argc, char** argv, bool& help, bool& version) {
  Options opts;
  std::vector<std::string_view> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    std::string_view name = arg, value;
    bool has_value = false;
    if (arg.starts_with("--")) {
      if (auto eq = arg.find('='); eq != std::string_view::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        has_value = true;
      }
    }
    auto take_value = [&]() -> std::string_view {
      if (has_value) return value;
      if (i + 1 >= args.size()) throw UsageError{std::string(name) + " needs a value"};
      return args[++i];
    };
    auto no_value = [&] {
      if (has_value) throw UsageError{std::string(name) + " takes no value"};
    };

    if (name == "-h" || name == "--help") {
      no_value();
      help = true;
    } else if (name == "--version") {
      no_value();
      version = true;
    } else if (name == "--json") {
      no_value();
      opts.json = true;
    } else if (name == "--job") {
      std::string job(take_value());
      try {
        smddp::ipc::check_job_id(job);
      } catch (const std::invalid_argument& e) {
        throw UsageError{std::string("--job: ") + e.what()};
      }
      opts.job = job;
    } else if (name == "--node") {
      std::string_view v = take_value();
      int node = -1;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), node);
      if (v.empty() || ec != std::errc() || end != v.data() + v.size() || node < 0)
        throw UsageError{"--node needs a node number (0, 1, ...), got '" + std::string(v) + "'"};
      opts.node = node;
    } else if (name == "--timeout") {
      std::string v(take_value());
      double seconds = 0;
      try {
        std::size_t used = 0;
        seconds = std::stod(v, &used);
        if (used != v.size()) seconds = -1;
      } catch (const std::exception&) {
        seconds = -1;
      }
      if (!(seconds > 0 && seconds <= 3600 && std::isfinite(seconds)))
        throw UsageError{"--timeout needs a number of seconds between 0 and 3600, got '" + v + "'"};
      opts.timeout = std::chrono::milliseconds(static_cast<long long>(std::ceil(seconds * 1000)));
    } else if (arg.starts_with("-")) {
      throw UsageError{"unknown option '" + std::string(arg) + "'"};
    } else if (opts.command.empty()) {
      if (arg != "status" && arg != "health" && arg != "metrics")
        throw UsageError{"unknown command '" + std::string(arg) + "'"};
      opts.command = arg;
    } else {
      throw UsageError{"unexpected argument '" + std::string(arg) + "'"};
    }
  }
  if (help || version) return opts;
  if (opts.command.empty()) throw UsageError{"no command given"};
  if (opts.json && opts.command != "status") throw UsageError{"--json applies to status only"};
  return opts;
}

std::string describe(const DaemonSocket& s) { return "job " + s.job_id + " node " + std::to_string(s.node_id); }

int run(const Options& opts) {
  const auto dir = smddp::ipc::socket_dir();
  std::vector<DaemonSocket> targets = smddp::ctl::find_daemon_sockets(dir);
  std::erase_if(targets, [&](const DaemonSocket& s) {
    return (opts.job && s.job_id != *opts.job) || (opts.node && s.node_id != *opts.node);
  });
  if (targets.empty()) {
    std::string what = "smddp daemon";
    if (opts.job) what += " for job " + *opts.job;
    if (opts.node) what += " on node " + std::to_string(*opts.node);
    std::cerr << "no " << what << " is running (looked in " << dir.string() << ")\n";
    return opts.command == "health" ? static_cast<int>(Health::kUnreachable) : 1;
  }

  std::vector<smddp::ctl::NodeStatus> results;
  std::vector<std::string> errors;
  for (const DaemonSocket& s : targets) {
    auto reply = smddp::ctl::query_daemon(s.path, opts.timeout);
    results.push_back({s.job_id, s.node_id, std::move(reply.status)});
    errors.push_back(std::move(reply.error));
  }

  if (opts.command == "metrics") {
    std::cout << smddp::ctl::format_prometheus(results);
    return 0;
  }

  if (opts.command == "health") {
    int worst = 0;
    for (std::size_t i = 0; i < targets.size(); ++i) {
      smddp::ctl::HealthVerdict v;
      if (results[i].status)
        v = smddp::ctl::evaluate_health(*results[i].status);
      else
        v = {Health::kUnreachable, errors[i]};
      static constexpr const char* kWords[] = {"healthy", "degraded", "unreachable"};
      std::cout << kWords[static_cast<int>(v.health)] << ": " << describe(targets[i]) << ": " << v.reason << "\n";
      worst = std::max(worst, static_cast<int>(v.health));
    }
    return worst;
  }

  // status
  int rc = 0;
  if (opts.json) {
    nlohmann::json all = nlohmann::json::array();
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (results[i].status) {
        all.push_back(*results[i].status);
      } else {
        all.push_back({{"job_id", targets[i].job_id}, {"node_id", targets[i].node_id}, {"unreachable", errors[i]}});
        rc = 1;
      }
    }
    const auto& doc = all.size() == 1 ? all[0] : all;
    std::cout << doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return rc;
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (i > 0) std::cout << "\n";
    if (results[i].status) {
      std::cout << smddp::ctl::format_status_text(*results[i].status);
    } else {
      std::cout << describe(targets[i]) << ": unreachable: " << errors[i] << "\n";
      rc = 1;
    }
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  bool help = false, version = false;
  Options opts;
  try {
    opts = parse_args(argc, argv, help, version);
  } catch (const UsageError& e) {
    std::cerr << "smddp-ctl: " << e.message << "\n\n" << kUsage;
    return kUsageError;
  }
  if (help) {
    std::cout << kUsage;
    return 0;
  }
  if (version) {
    std::cout << "smddp-ctl " << SMDDP_VERSION << "\n";
    return 0;
  }
  try {
    return run(opts);
  } catch (const std::exception& e) {
    std::cerr << "smddp-ctl: " << e.what() << "\n";
    return opts.command == "health" ? static_cast<int>(Health::kUnreachable) : 1;
  }
}
