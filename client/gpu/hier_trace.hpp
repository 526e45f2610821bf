// SMDDP_TRACE_HIER=1: one line on stderr per step of each hierarchical operation across nodes
// (issued, planned, released, rail done, tail, done), with the time and the process: where a
// slow or stuck one is.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace smddp::client::gpu {

inline bool hier_trace_on() {
  static const bool on = [] {
    const char* e = std::getenv("SMDDP_TRACE_HIER");
    return e && *e && *e != '0';
  }();
  return on;
}

template <class... A>
void hier_trace(const char* fmt, A... a) {
  if (!hier_trace_on()) return;
  char line[512];
  std::snprintf(line, sizeof line, fmt, a...);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
  std::fprintf(stderr, "smddp-hier pid %d t=%lld us: %s\n", static_cast<int>(::getpid()), static_cast<long long>(us), line);
}

}  // namespace smddp::client::gpu
