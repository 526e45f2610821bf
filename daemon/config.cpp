#include "daemon/config.hpp"

#include <boost/property_tree/ini_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <charconv>
#include <functional>
#include <map>
#include <stdexcept>

namespace smddp::daemon {
namespace {

// Parses a whole decimal integer within [lo, hi], or throws naming the key.
std::int64_t parse_int(const std::string& key, const std::string& value, std::int64_t lo, std::int64_t hi) {
  std::int64_t v = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  if (ec != std::errc() || p != end)
    throw std::invalid_argument(key + " = '" + value + "' is not a whole number");
  if (v < lo || v > hi)
    throw std::invalid_argument(key + " = " + value + " is out of range (" + std::to_string(lo) + ".." +
                                std::to_string(hi) + ")");
  return v;
}

using Setter = std::function<void(DaemonConfig&, const std::string& key, const std::string& value)>;

// Every key the configuration knows, with how it is parsed and checked.
const std::map<std::string, Setter>& keys() {
  using namespace std::chrono;
  static const std::map<std::string, Setter> k = {
      {"daemon.arena_mib",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         c.arena_bytes = static_cast<std::uint64_t>(parse_int(key, v, 1, 1 << 16)) << 20;
       }},
      {"daemon.chunk_kib",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         c.chunk_bytes = static_cast<std::uint64_t>(parse_int(key, v, 4, 1 << 20)) << 10;
       }},
      {"daemon.worker_threads",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         c.worker_threads = static_cast<int>(parse_int(key, v, 0, 64));
       }},
      {"daemon.spin_us",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         c.spin = microseconds(parse_int(key, v, 0, 1'000'000));
       }},
      {"daemon.direct_read_min_kib",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         if (v == "off") c.direct_read_min_bytes = std::nullopt;
         else c.direct_read_min_bytes = static_cast<std::uint64_t>(parse_int(key, v, 0, 1 << 22)) << 10;
       }},
      {"daemon.split_reduce_min_kib",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         if (v == "auto") c.split_reduce_min = SplitReduceMin{};
         else if (v == "off") c.split_reduce_min = SplitReduceMin::fixed(std::nullopt);
         else c.split_reduce_min = SplitReduceMin::fixed(static_cast<std::uint64_t>(parse_int(key, v, 0, 1 << 22)) << 10);
       }},
      {"daemon.host_fast_kib",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         c.host_fast_bytes = static_cast<std::uint64_t>(parse_int(key, v, 0, 1024)) << 10;
       }},
      {"daemon.host_fast_read_kib",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         if (v == "auto") c.host_fast_read = HostFastRead{};
         else c.host_fast_read = HostFastRead::fixed(static_cast<std::uint64_t>(parse_int(key, v, 0, 1 << 16)) << 10);
       }},
      {"daemon.host_fast_reduce_kib",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         if (v == "auto") c.host_fast_reduce = HostFastReduce{};
         else c.host_fast_reduce = HostFastReduce::fixed(static_cast<std::uint64_t>(parse_int(key, v, 0, 1 << 16)) << 10);
       }},
      {"daemon.host_single_copy_kib",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         if (v == "off") c.host_single_copy_min_bytes = std::nullopt;
         else c.host_single_copy_min_bytes = static_cast<std::uint64_t>(parse_int(key, v, 1, 1 << 22)) << 10;
       }},
      {"daemon.host_single_copy_reduce_kib",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         if (v == "auto") c.host_single_copy_reduce = SingleCopyReduce{};
         else if (v == "off") c.host_single_copy_reduce = SingleCopyReduce::fixed(std::nullopt);
         else c.host_single_copy_reduce = SingleCopyReduce::fixed(static_cast<std::uint64_t>(parse_int(key, v, 1, 1 << 22)) << 10);
       }},
      {"daemon.stall_warning_s",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         c.stall_warning = seconds(parse_int(key, v, 0, 86400 * 7));
       }},
      {"daemon.collective_timeout_s",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         c.collective_timeout = seconds(parse_int(key, v, 0, 86400 * 7));
       }},
      {"daemon.exit_grace_s",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         c.exit_grace = seconds(parse_int(key, v, 0, 3600));
       }},
      {"daemon.orphan_grace_s",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         c.orphan_grace = seconds(parse_int(key, v, 1, 86400));
       }},
      {"daemon.log_level", [](DaemonConfig& c, const std::string&, const std::string& v) { c.log_level = v; }},
      {"fabric.provider", [](DaemonConfig& c, const std::string&, const std::string& v) { c.fabric_provider = v; }},
      {"fabric.interface", [](DaemonConfig& c, const std::string&, const std::string& v) { c.fabric_interface = v; }},
      {"fabric.endpoints",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         c.fabric_endpoints = static_cast<int>(parse_int(key, v, 1, 64));  // Transport::kMaxEndpoints
       }},
      {"fabric.max_inflight",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         c.fabric_max_inflight = static_cast<std::size_t>(parse_int(key, v, 1, 1 << 16));
       }},
      {"fabric.algorithm",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         const auto a = internode::parse_algorithm(v);
         if (!a) throw std::invalid_argument(key + " = '" + v + "' is not one of auto, direct, ring, halving");
         c.fabric_algorithm = *a;
       }},
      {"fabric.max_message_kib",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         c.fabric_max_message = static_cast<std::size_t>(parse_int(key, v, 0, 1 << 22)) << 10;
       }},
      {"fabric.fault",
       [](DaemonConfig& c, const std::string& key, const std::string& v) {
         try {
           c.fabric_fault = transport::FaultPlan::parse(v);
         } catch (const std::invalid_argument& e) {
           throw std::invalid_argument(key + ": " + e.what());
         }
       }},
      {"fabric.fault_trigger", [](DaemonConfig& c, const std::string&, const std::string& v) { c.fabric_fault_trigger = v; }},
  };
  return k;
}

void apply(DaemonConfig& c, const std::string& key, const std::string& value) {
  auto it = keys().find(key);
  if (it == keys().end()) throw std::invalid_argument("unknown configuration key '" + key + "'");
  it->second(c, key, value);
}

}  // namespace

DaemonConfig DaemonConfig::load(const std::string& path, const std::vector<std::string>& overrides) {
  DaemonConfig c;
  if (!path.empty()) {
    // Boost.PropertyTree's ini parser: header-only, so it builds where Boost's compiled
    // libraries are absent (the GPU machine has Boost headers only).
    boost::property_tree::ptree tree;
    try {
      boost::property_tree::ini_parser::read_ini(path, tree);
    } catch (const boost::property_tree::ini_parser_error& e) {
      throw std::invalid_argument("cannot read config file " + path + ": " + e.message());
    }
    for (const auto& [section, entries] : tree) {
      if (entries.empty())
        throw std::invalid_argument("config file " + path + ": '" + section + "' is outside any [section]");
      for (const auto& [name, value] : entries) {
        try {
          apply(c, section + "." + name, value.get_value<std::string>());
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument(std::string(e.what()) + " in config file " + path);
        }
      }
    }
    c.config_path = path;
  }
  // Command-line overrides come last and win.
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      throw std::invalid_argument("override '" + o + "' is not SECTION.KEY=VALUE");
    apply(c, o.substr(0, eq), o.substr(eq + 1));
  }
  return c;
}

}  // namespace smddp::daemon
