// smddp-daemon's command line. A small parser of our own: Boost.Program_options is a
// compiled library the GPU machine lacks, and the daemon has a dozen flags.
#pragma once

#include <string>
#include <vector>

namespace smddp::daemon {

struct DaemonArgs {
  bool help = false;
  bool version = false;
  bool attach_mode = false;
  std::string job_id;
  std::string config_path;
  std::string log_level;
  std::string cleanup_job;
  bool cleanup_stale = false;
  int nproc_per_node = 1;
  int simulate_nodes = 0;
  int node_id = 0;
  int num_nodes = 1;
  int attach_timeout_s = 120;
  std::vector<std::string> overrides;  // --set SECTION.KEY=VALUE
  std::vector<std::string> command;    // after "--" (or from the first non-option word)
};

// Accepts "--flag value" and "--flag=value". Throws std::invalid_argument naming the
// offending flag or value.
DaemonArgs parse_daemon_args(const std::vector<std::string>& args);
std::string daemon_usage();

}  // namespace smddp::daemon
