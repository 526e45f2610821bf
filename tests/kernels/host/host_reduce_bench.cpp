// Throughput of host_reduce (not a test): float32 and bfloat16 SUM of 2 and 4 inputs of 16 MiB
// each, out of place and in place, next to memcpy of the same size. Usage:
//   host_reduce_bench [threads]   (disjoint ranges per thread, as the daemon splits work)
// GB/s columns: "data" = input bytes per input / time (the algorithm's bandwidth, as algbw),
// "memory" = all bytes read and written / time (compare with memcpy's read+write figure).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "kernels/host/host_reduce.hpp"

namespace {

using smddp::ipc::DType;
using smddp::ipc::ReduceOp;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kBytes = std::size_t{16} << 20;

// Best of several runs of `work` split over `threads` threads: `work(begin, end)` on bytes.
double best_seconds(std::size_t threads, std::size_t granule, const std::function<void(std::size_t, std::size_t)>& work) {
  double best = 1e30;
  for (int rep = 0; rep < 15; ++rep) {
    const auto start = Clock::now();
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < threads; ++t)
      pool.emplace_back([&, t] { work(kBytes / granule * t / threads * granule, kBytes / granule * (t + 1) / threads * granule); });
    work(0, kBytes / granule / threads * granule);
    for (auto& th : pool) th.join();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t threads = argc > 1 ? std::max(1, std::atoi(argv[1])) : 1;
  std::printf("host_reduce kernels: %s, %zu thread(s), 16 MiB per buffer\n",
              smddp::host_kernels::host_reduce_isa_name(), threads);
  std::vector<std::vector<unsigned char>> bufs(5, std::vector<unsigned char>(kBytes));
  for (auto& b : bufs)
    for (std::size_t i = 0; i < kBytes; ++i) b[i] = static_cast<unsigned char>((i * 7 + 3) & 0x3f);  // finite values

  const double memcpy_s = best_seconds(threads, 64, [&](std::size_t b, std::size_t e) {
    std::memcpy(bufs[4].data() + b, bufs[0].data() + b, e - b);
  });
  std::printf("%-28s %8.2f GB/s data %8.2f GB/s memory\n", "memcpy", kBytes / memcpy_s / 1e9, 2 * kBytes / memcpy_s / 1e9);

  for (DType t : {DType::Float32, DType::BFloat16}) {
    const std::size_t esize = smddp::ipc::dtype_size(t);
    for (std::size_t n : {std::size_t{2}, std::size_t{4}}) {
      for (bool in_place : {false, true}) {
        const double s = best_seconds(threads, 64, [&](std::size_t b, std::size_t e) {
          std::vector<const void*> in;
          for (std::size_t k = 0; k < n; ++k) in.push_back(bufs[k].data() + b);
          void* out = in_place ? bufs[0].data() + b : bufs[4].data() + b;
          smddp::host_kernels::host_reduce(t, ReduceOp::Sum, in, out, (e - b) / esize);
        });
        char name[64];
        std::snprintf(name, sizeof name, "%s sum of %zu%s", t == DType::Float32 ? "float32" : "bfloat16", n,
                      in_place ? " (in place)" : "");
        std::printf("%-28s %8.2f GB/s data %8.2f GB/s memory\n", name, kBytes / s / 1e9, (n + 1) * kBytes / s / 1e9);
      }
    }
  }
  return 0;
}
