// TEMPORARY diagnosis aid (session 12): timestamps of the steps of ops staged through the
// arena, written to $SMDDP_DIAG_TRACE_DIR/trace.<pid>.txt at exit. Not for commit.
#pragma once
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace smddp::diag {
struct Trace {
  struct Ev {
    std::int64_t ns;
    const char* what;
    const void* key;
  };
  std::mutex mu;
  std::vector<Ev> evs;
  bool on = std::getenv("SMDDP_DIAG_TRACE_DIR") != nullptr;
  Trace() { evs.reserve(1 << 20); }
  ~Trace() {
    if (!on) return;
    std::string p = std::string(std::getenv("SMDDP_DIAG_TRACE_DIR")) + "/trace." + std::to_string(::getpid()) + ".txt";
    if (FILE* f = std::fopen(p.c_str(), "w")) {
      for (const auto& e : evs) std::fprintf(f, "%lld %s %p\n", static_cast<long long>(e.ns), e.what, e.key);
      std::fclose(f);
    }
  }
};
inline Trace& trace() {
  static Trace t;
  return t;
}
inline void mark(const char* what, const void* key) {
  auto& t = trace();
  if (!t.on) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::lock_guard lk(t.mu);
  if (t.evs.size() < (1u << 20)) t.evs.push_back({ns, what, key});
}
}  // namespace smddp::diag
