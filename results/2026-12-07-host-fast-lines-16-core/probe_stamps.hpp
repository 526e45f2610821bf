#pragma once
// PROBE (temporary): cycle stamps of one op's stages, summed; printed at exit.
#include <x86intrin.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
namespace probe {
struct Stamps {
  std::uint64_t last = 0;
  std::uint64_t sum[12] = {};
  std::uint64_t n[12] = {};
  ~Stamps() {
    if (!std::getenv("SMDDP_PROBE_PRINT")) return;
    for (int i = 0; i < 12; ++i)
      if (n[i]) std::fprintf(stderr, "probe stage %2d: %8.1f cycles avg over %lu\n", i, double(sum[i]) / n[i], (unsigned long)n[i]);
  }
};
inline Stamps g;
inline void stamp(int i) {
  const auto t = __rdtsc();
  if (g.last) { g.sum[i] += t - g.last; ++g.n[i]; }
  g.last = t;
}
}  // namespace probe
