// What fabric.fault asks the daemon's transport to do wrong (daemon/transport/fault_injection.hpp):
// parsed with the configuration, so it depends on nothing else.
#pragma once

#include <chrono>
#include <string>

namespace smddp::daemon::transport {

struct FaultPlan {
  enum class Kind { None, Silence, Delay };
  Kind kind = Kind::None;
  std::chrono::milliseconds delay{0};
  // The fault starts once this file exists ("": at once).
  std::string trigger;

  // "none", "silence", "delay:MS" (MS 1..600000); throws std::invalid_argument saying what is
  // accepted.
  static FaultPlan parse(const std::string& spec);
  std::string describe() const;
};

}  // namespace smddp::daemon::transport
