#include "daemon/cli.hpp"

#include <charconv>
#include <stdexcept>

namespace smddp::daemon {
namespace {

int to_int(const std::string& flag, const std::string& v, int lo, int hi) {
  int x = 0;
  const char* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(v.data(), end, x);
  if (ec != std::errc() || p != end || x < lo || x > hi)
    throw std::invalid_argument(flag + " wants a whole number in " + std::to_string(lo) + ".." + std::to_string(hi) +
                                ", got '" + v + "'");
  return x;
}

}  // namespace

std::string daemon_usage() {
  return "usage: smddp-daemon [options] -- COMMAND [ARGS...]     (usually started by smddprun)\n"
         "       smddp-daemon --attach-mode [options]             (started by the plugin under mpirun/torchrun)\n"
         "       smddp-daemon --cleanup-job ID | --cleanup-stale\n"
         "options:\n"
         "  --job-id ID            job id (default: $SMDDP_JOB_ID)\n"
         "  --nproc-per-node G     training ranks on this node (default 1)\n"
         "  --config FILE          configuration file (ini), e.g. configs/local.ini\n"
         "  --set SECTION.KEY=VAL  override one configuration value (repeatable)\n"
         "  --log-level L          trace, debug, info, warn, error (SMDDP_LOG_LEVEL wins)\n"
         "  --simulate-nodes K     act as one of K simulated nodes on this machine\n"
         "  --attach-mode          ranks start on their own and attach; nothing is spawned\n"
         "  --node-id N            attach mode: this node's id (default 0)\n"
         "  --num-nodes K          attach mode: number of nodes (default 1)\n"
         "  --attach-timeout S     attach mode: seconds to wait for the first rank (default 120)\n"
         "  --cleanup-job ID       remove this machine's leftover segments and sockets of a job\n"
         "                         (waits up to 10 s for its daemons to be gone)\n"
         "  --cleanup-stale        remove this user's leftover segments of any job whose daemon has\n"
         "                         exited (every daemon does this as it starts)\n"
         "  --version, -h/--help\n";
}

DaemonArgs parse_daemon_args(const std::vector<std::string>& args) {
  DaemonArgs a;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    if (flag == "--") {
      a.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (flag.rfind("-", 0) != 0) {  // the rank command starts here
      a.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    std::string value;
    bool has_value = false;
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    auto take = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= args.size()) throw std::invalid_argument(flag + " needs a value");
      return args[++i];
    };
    auto no_value = [&] {
      if (has_value) throw std::invalid_argument(flag + " takes no value");
    };
    if (flag == "-h" || flag == "--help") no_value(), a.help = true;
    else if (flag == "--version") no_value(), a.version = true;
    else if (flag == "--attach-mode") no_value(), a.attach_mode = true;
    else if (flag == "--cleanup-stale") no_value(), a.cleanup_stale = true;
    else if (flag == "--job-id") a.job_id = take();
    else if (flag == "--config") a.config_path = take();
    else if (flag == "--log-level") a.log_level = take();
    else if (flag == "--cleanup-job") a.cleanup_job = take();
    else if (flag == "--set") a.overrides.push_back(take());
    else if (flag == "--nproc-per-node") a.nproc_per_node = to_int(flag, take(), 1, 1 << 16);
    else if (flag == "--simulate-nodes") a.simulate_nodes = to_int(flag, take(), 0, 1 << 16);
    else if (flag == "--node-id") a.node_id = to_int(flag, take(), 0, 1 << 20);
    else if (flag == "--num-nodes") a.num_nodes = to_int(flag, take(), 1, 1 << 20);
    else if (flag == "--attach-timeout") a.attach_timeout_s = to_int(flag, take(), 1, 86400);
    else throw std::invalid_argument("unknown option " + flag);
  }
  if (a.node_id >= a.num_nodes)
    throw std::invalid_argument("--node-id " + std::to_string(a.node_id) + " is not below --num-nodes " +
                                std::to_string(a.num_nodes) + " (node ids count from 0)");
  return a;
}

}  // namespace smddp::daemon
