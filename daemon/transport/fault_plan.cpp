#include "daemon/transport/fault_plan.hpp"

#include <charconv>
#include <stdexcept>
#include <string_view>

namespace smddp::daemon::transport {

FaultPlan FaultPlan::parse(const std::string& spec) {
  FaultPlan p;
  if (spec == "none") return p;
  if (spec == "silence") {
    p.kind = Kind::Silence;
    return p;
  }
  constexpr std::string_view kDelay = "delay:";
  if (spec.starts_with(kDelay)) {
    long ms = 0;
    const char* first = spec.data() + kDelay.size();
    const char* last = spec.data() + spec.size();
    const auto [end, ec] = std::from_chars(first, last, ms);
    if (ec == std::errc() && end == last && first != last && ms >= 1 && ms <= 600000) {
      p.kind = Kind::Delay;
      p.delay = std::chrono::milliseconds(ms);
      return p;
    }
  }
  throw std::invalid_argument("'" + spec + "' is not a fault: use none, silence or delay:MS (MS from 1 to 600000)");
}

std::string FaultPlan::describe() const {
  std::string what = kind == Kind::None      ? "none"
                     : kind == Kind::Silence ? "silence"
                                             : "delay of " + std::to_string(delay.count()) + " ms";
  return what + (trigger.empty() ? std::string(", from the start") : ", once " + trigger + " exists");
}

}  // namespace smddp::daemon::transport
