// Probe: the host fast path's exchange alone (no client), its parts added one at a time, for N
// processes spinning in a blocking loop of 8 B all-reduces. ns per call, median of 5 runs.
//   A  cells only: publish tag+header+8 B in the own cell (two per rank), poll the members' tags, sum
//   B  A + each member's done mark: written after the read, checked (k-2) before the publish
//   C  B + two bell rings (lock xadd on each member's bell line), after the publish and the read
//   D  C, the done check read from the member's previous cell (its mark carried there)
//   E  D, one bell ring (after the read)
//   F  C + 3 uncontended mutex lock/unlock pairs and 8 atomic increments on private lines
//   G  D, each ring a seq_cst fence and a look at each member's sleeper count (nobody sleeps)
//   H  G, one such ring (after the read)
//   M  mailbox (Open MPI's fastbox): each rank writes 8 B + flag into each member's inbox for it
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>
using C = std::chrono::steady_clock;
constexpr int kMax = 8;
struct alignas(64) Cell { std::atomic<uint64_t> tag{0}; uint64_t hdr[6]; uint64_t carried_done; double data[8]; };
struct alignas(64) Line { std::atomic<uint64_t> v{0}; };
struct alignas(64) Bell { std::atomic<uint32_t> seq{0}; std::atomic<uint32_t> sleepers{0}; };
struct alignas(64) Box { std::atomic<uint64_t> flag{0}; double data; };
struct Shared {
  std::atomic<int> go{0};
  Cell cell[kMax][2];
  Line done[kMax];
  Bell bell[kMax];
  Box box[kMax][kMax];  // box[to][from]
};
static inline void relax() { __builtin_ia32_pause(); }
int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2;
  const long iters = argc > 2 ? std::atol(argv[2]) : 200000;
  auto* sh = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  const char* variants = "ABCDEFGHM";
  const int nv = (int)strlen(variants);
  for (int r = 0; r < n; ++r) {
    if (fork() != 0) continue;
    std::mutex mus[3];
    Line priv[8];
    uint64_t k = 0;         // fast-op number, across variants
    int barrier = 0;
    auto sync = [&] { ++barrier; sh->go.fetch_add(1); while (sh->go.load() < n * barrier) relax(); };
    std::vector<double> res[16];
    for (int rep = 0; rep < 5; ++rep) {
      for (int vi = 0; vi < nv; ++vi) {
        const char v = variants[vi];
        // Start each variant from a clean state.
        sync();
        if (r == 0) { std::memset(static_cast<void*>(sh->cell), 0, sizeof sh->cell); for (auto& d : sh->done) d.v = 0; for (auto& row : sh->box) for (auto& b : row) b.flag = 0; }
        sync();
        k = 0;
        volatile double sink = 0;
        const auto t0 = C::now();
        for (long i = 0; i < iters; ++i) {
          ++k;
          if (v == 'M') {
            for (int s = 0; s < n; ++s) if (s != r) { sh->box[s][r].data = 1.0 * r; sh->box[s][r].flag.store(k, std::memory_order_release); }
            double sum = r;
            for (int s = 0; s < n; ++s) if (s != r) { while (sh->box[r][s].flag.load(std::memory_order_acquire) < k) relax(); sum += sh->box[r][s].data; }
            sink = sum;
            continue;  // a real one needs the reader's ack before the next write: ignored (a floor)
          }
          if (v == 'F') { for (auto& m : mus) { m.lock(); m.unlock(); } for (auto& p : priv) p.v.fetch_add(1); }
          if (v != 'A' && k > 2) {
            for (int s = 0; s < n; ++s) {
              if ((v == 'D' || v == 'E' || v == 'G' || v == 'H') && sh->cell[s][(k - 1) % 2].tag.load(std::memory_order_acquire) == k - 1 &&
                  sh->cell[s][(k - 1) % 2].carried_done >= k - 2) continue;
              while (sh->done[s].v.load(std::memory_order_acquire) < k - 2) relax();
            }
          }
          Cell& c = sh->cell[r][k % 2];
          for (auto& h : c.hdr) h = k;
          c.carried_done = sh->done[r].v.load(std::memory_order_relaxed);
          c.data[0] = 1.0 * r;
          c.tag.store(k, std::memory_order_release);
          if (v == 'G') { std::atomic_thread_fence(std::memory_order_seq_cst); for (int s = 0; s < n; ++s) if (s != r && sh->bell[s].sleepers.load(std::memory_order_relaxed)) sh->bell[s].seq.fetch_add(1); }
          if (v == 'C' || v == 'D' || v == 'F')
            for (int s = 0; s < n; ++s) if (s != r) { sh->bell[s].seq.fetch_add(1); (void)sh->bell[s].sleepers.load(); }
          double sum = 0;
          for (int s = 0; s < n; ++s) {
            const Cell& o = sh->cell[s][k % 2];
            while (o.tag.load(std::memory_order_acquire) != k) relax();
            bool same = true;
            for (auto h : o.hdr) same &= h == k;
            if (!same) { std::fprintf(stderr, "mismatch\n"); _exit(1); }
            sum += o.data[0];
          }
          sink = sum;
          if (v != 'A') sh->done[r].v.store(k, std::memory_order_release);
          if (v == 'G' || v == 'H') { std::atomic_thread_fence(std::memory_order_seq_cst); for (int s = 0; s < n; ++s) if (s != r && sh->bell[s].sleepers.load(std::memory_order_relaxed)) sh->bell[s].seq.fetch_add(1); }
          if (v == 'C' || v == 'D' || v == 'E' || v == 'F')
            for (int s = 0; s < n; ++s) if (s != r) { sh->bell[s].seq.fetch_add(1); (void)sh->bell[s].sleepers.load(); }
        }
        const double ns = std::chrono::duration<double, std::nano>(C::now() - t0).count() / iters;
        res[vi].push_back(ns);
        (void)sink;
      }
    }
    if (r == 0) {
      for (int vi = 0; vi < nv; ++vi) {
        std::sort(res[vi].begin(), res[vi].end());
        std::printf("%d ranks  %c  %7.1f ns per call (runs %.1f-%.1f)\n", n, variants[vi], res[vi][2], res[vi].front(), res[vi].back());
      }
    }
    std::fflush(stdout);
    _exit(0);
  }
  for (int r = 0; r < n; ++r) { int st; wait(&st); }
  return 0;
}
