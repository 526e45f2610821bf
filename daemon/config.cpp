#include "daemon/config.hpp"

#include <boost/program_options.hpp>
#include <fstream>
#include <stdexcept>

namespace po = boost::program_options;

namespace smddp::daemon {
namespace {

struct Raw {
  std::uint64_t arena_mib, chunk_kib;
  int worker_threads;
  std::int64_t spin_us, stall_warning_s, collective_timeout_s, exit_grace_s;
  std::string log_level, provider, interface;
};

po::options_description describe(Raw& r, const DaemonConfig& d) {
  po::options_description o("smddp-daemon configuration");
  o.add_options()
      ("daemon.arena_mib", po::value(&r.arena_mib)->default_value(d.arena_bytes >> 20), "staging arena per rank (MiB)")
      ("daemon.chunk_kib", po::value(&r.chunk_kib)->default_value(d.chunk_bytes >> 10), "pipeline chunk (KiB)")
      ("daemon.worker_threads", po::value(&r.worker_threads)->default_value(d.worker_threads), "reduction threads")
      ("daemon.spin_us", po::value(&r.spin_us)->default_value(d.spin.count()), "spin before sleeping (us)")
      ("daemon.stall_warning_s", po::value(&r.stall_warning_s)->default_value(d.stall_warning.count()), "stall warning (s)")
      ("daemon.collective_timeout_s", po::value(&r.collective_timeout_s)->default_value(d.collective_timeout.count()),
       "default collective timeout (s)")
      ("daemon.exit_grace_s", po::value(&r.exit_grace_s)->default_value(d.exit_grace.count()), "exit grace (s)")
      ("daemon.log_level", po::value(&r.log_level)->default_value(d.log_level), "log level")
      ("fabric.provider", po::value(&r.provider)->default_value(d.fabric_provider), "libfabric provider")
      ("fabric.interface", po::value(&r.interface)->default_value(d.fabric_interface), "network interface");
  return o;
}

}  // namespace

DaemonConfig DaemonConfig::load(const std::string& path, const std::vector<std::string>& overrides) {
  DaemonConfig c;
  Raw r{};
  auto desc = describe(r, c);
  po::variables_map vm;
  try {
    // Command-line overrides are stored first: program_options keeps the first value it sees.
    std::vector<std::string> args;
    for (const auto& o : overrides) {
      auto eq = o.find('=');
      if (eq == std::string::npos || eq == 0)
        throw std::invalid_argument("override '" + o + "' is not SECTION.KEY=VALUE");
      args.push_back("--" + o.substr(0, eq));
      args.push_back(o.substr(eq + 1));
    }
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    if (!path.empty()) {
      std::ifstream in(path);
      if (!in) throw std::invalid_argument("cannot read config file " + path);
      po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), vm);
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw std::invalid_argument(std::string("bad configuration") + (path.empty() ? "" : " in " + path) + ": " + e.what());
  }
  auto positive = [](std::int64_t v, const char* key) {
    if (v < 0) throw std::invalid_argument(std::string(key) + " must not be negative");
    return v;
  };
  if (r.arena_mib < 1 || r.arena_mib > (1u << 16)) throw std::invalid_argument("daemon.arena_mib must be 1..65536");
  if (r.chunk_kib < 4 || r.chunk_kib > (1u << 20)) throw std::invalid_argument("daemon.chunk_kib must be 4..1048576");
  if (r.worker_threads < 0 || r.worker_threads > 64) throw std::invalid_argument("daemon.worker_threads must be 0..64");
  c.config_path = path;
  c.arena_bytes = r.arena_mib << 20;
  c.chunk_bytes = r.chunk_kib << 10;
  c.worker_threads = r.worker_threads;
  c.spin = std::chrono::microseconds(positive(r.spin_us, "daemon.spin_us"));
  c.stall_warning = std::chrono::seconds(positive(r.stall_warning_s, "daemon.stall_warning_s"));
  c.collective_timeout = std::chrono::seconds(positive(r.collective_timeout_s, "daemon.collective_timeout_s"));
  c.exit_grace = std::chrono::seconds(positive(r.exit_grace_s, "daemon.exit_grace_s"));
  c.log_level = r.log_level;
  c.fabric_provider = r.provider;
  c.fabric_interface = r.interface;
  return c;
}

}  // namespace smddp::daemon
