// What the transport tests share: driving transports until something completes, data
// patterns, completion records.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "daemon/transport/transport.hpp"

namespace smddp::daemon::transport {

inline constexpr auto kHangLimit = std::chrono::seconds(20);
inline constexpr std::size_t MiB = std::size_t{1} << 20;
inline constexpr Rail kFirst{0, 0};  // endpoint 0 on both sides

// Progresses every transport until `done()` or the hang limit; false on the limit.
inline bool drive(std::initializer_list<Transport*> transports, const std::function<bool()>& done) {
  auto deadline = std::chrono::steady_clock::now() + kHangLimit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    for (Transport* t : transports) t->progress();
  }
  return true;
}

inline std::vector<std::uint8_t> pattern(std::size_t bytes, std::uint32_t seed) {
  std::vector<std::uint8_t> v(bytes);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::uint8_t>(x >> 24);
  }
  return v;
}

// Records one completion.
struct Done {
  std::optional<Status> status;
  Completion callback() {
    return [this](Status s) { status = std::move(s); };
  }
  bool ready() const { return status.has_value(); }
};

inline std::unique_ptr<Transport> make_or_explain(const TransportConfig& config, std::string& why) {
  try {
    return make_fabric_transport(config);
  } catch (const std::runtime_error& e) {
    why = e.what();
    return nullptr;
  }
}

}  // namespace smddp::daemon::transport
