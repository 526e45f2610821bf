// Measures how soon the host learns that a copy on a stream has finished, the step that
// carries every chunk of a CUDA tensor across nodes (client/gpu/arena_copier.cpp): the chunk
// is copied device-to-host into the pinned arena, and only once that copy is over may the
// client post it to the daemon. One GPU, one process.
//
//   nvcc -O2 -arch=sm_90 -o fence_probe scripts/diag/fence_probe.cu -lcuda -lpthread
//   ./fence_probe [iterations]
//
// For each size (8 B, 64 KiB, 1 MiB) and each way of learning it, the time from enqueuing the
// copy to the host seeing it finished, median and 90th percentile over the iterations:
//   sync       cudaStreamSynchronize (the floor: the calling thread itself waits)
//   hostfn+cv  a host function (cudaLaunchHostFunc) notifies a condition variable the
//              measuring thread sleeps on: the copier's fence today, whose host function wakes
//              the client's progress thread through a futex
//   hostfn+sp  the same host function, the measuring thread spinning on its flag
//   event+sp   an event after the copy, the measuring thread spinning on cudaEventQuery
//   write+sp   a stream memory operation (cuStreamWriteValue32) after the copy writes a word
//              of pinned host memory, the measuring thread spinning on it
// and the round trip: copy in, fence, (host sees it) copy out, fence, (host sees it).
//
// Then a pipeline, as a large operation's chunks go: 16 chunks copied device-to-host back to
// back, each followed by a fence, timed until the last copy is over (stream synchronize) and
// until the last fence's host function ran:
//   none        copies only (the floor)
//   on-lane     event + host function on the copies' stream (an earlier form of the copier):
//               each host function holds back the next copy until CUDA's callback thread ran it
//   signal      event on the copies' stream, host function on a second stream that waits for
//               the event (the copier's form today)
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(CUresult e, const char* what) {
  if (e != CUDA_SUCCESS) {
    const char* s = nullptr;
    cuGetErrorName(e, &s);
    std::fprintf(stderr, "%s: %s\n", what, s ? s : "?");
    std::exit(1);
  }
}

struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<std::uint32_t> count{0};
};

void CUDART_CB on_done(void* arg) {
  auto* w = static_cast<Waiter*>(arg);
  {
    std::lock_guard lk(w->mu);
    w->count.fetch_add(1, std::memory_order_release);
  }
  w->cv.notify_one();
}

struct Stats {
  double med, p90;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[v.size() * 9 / 10]};
}

enum class Way { Sync, HostFnCv, HostFnSpin, EventSpin, WriteSpin };
const char* name(Way w) {
  switch (w) {
    case Way::Sync: return "sync";
    case Way::HostFnCv: return "hostfn+cv";
    case Way::HostFnSpin: return "hostfn+sp";
    case Way::EventSpin: return "event+sp";
    case Way::WriteSpin: return "write+sp";
  }
  return "?";
}

struct Rig {
  cudaStream_t in = nullptr, out = nullptr;
  cudaEvent_t ev = nullptr;
  Waiter waiter;
  volatile std::uint32_t* word = nullptr;  // pinned host word the stream writes
  CUdeviceptr word_dev = 0;
  std::uint32_t seq = 0;
};

// Enqueues a fence of kind `w` on `s` and waits for it the way `w` says.
void fence_and_wait(Rig& r, cudaStream_t s, Way w) {
  switch (w) {
    case Way::Sync:
      check(cudaStreamSynchronize(s), "sync");
      return;
    case Way::HostFnCv: {
      const auto before = r.waiter.count.load();
      check(cudaLaunchHostFunc(s, on_done, &r.waiter), "hostfn");
      std::unique_lock lk(r.waiter.mu);
      r.waiter.cv.wait(lk, [&] { return r.waiter.count.load() != before; });
      return;
    }
    case Way::HostFnSpin: {
      const auto before = r.waiter.count.load();
      check(cudaLaunchHostFunc(s, on_done, &r.waiter), "hostfn");
      while (r.waiter.count.load(std::memory_order_acquire) == before) {
      }
      return;
    }
    case Way::EventSpin:
      check(cudaEventRecord(r.ev, s), "record");
      while (cudaEventQuery(r.ev) == cudaErrorNotReady) {
      }
      return;
    case Way::WriteSpin: {
      const std::uint32_t v = ++r.seq;
      check(cuStreamWriteValue32(reinterpret_cast<CUstream>(s), r.word_dev, v, CU_STREAM_WRITE_VALUE_DEFAULT),
            "cuStreamWriteValue32");
      while (*r.word != v) {
      }
      return;
    }
  }
}
}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 2000;
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "props");
  std::printf("# %s, %d iterations per row; us from enqueuing the copy to the host seeing it done\n", prop.name, iters);

  constexpr std::size_t kMax = 1 << 20;
  void* dev = nullptr;
  check(cudaMalloc(&dev, kMax), "cudaMalloc");
  check(cudaMemset(dev, 1, kMax), "memset");
  // Pinned like the arena: plain memory registered with CUDA.
  std::vector<std::byte> arena(kMax + 4096);
  check(cudaHostRegister(arena.data(), arena.size(), cudaHostRegisterPortable | cudaHostRegisterMapped), "register");

  Rig r;
  check(cudaStreamCreateWithFlags(&r.in, cudaStreamNonBlocking), "stream");
  check(cudaStreamCreateWithFlags(&r.out, cudaStreamNonBlocking), "stream");
  check(cudaEventCreateWithFlags(&r.ev, cudaEventDisableTiming), "event");
  r.word = reinterpret_cast<volatile std::uint32_t*>(arena.data() + kMax);
  *r.word = 0;
  void* wd = nullptr;
  check(cudaHostGetDevicePointer(&wd, const_cast<std::uint32_t*>(r.word), 0), "device pointer of the word");
  r.word_dev = reinterpret_cast<CUdeviceptr>(wd);

  const Way ways[] = {Way::Sync, Way::HostFnCv, Way::HostFnSpin, Way::EventSpin, Way::WriteSpin};
  std::printf("%-10s %8s %12s %12s %12s %12s\n", "way", "bytes", "in med", "in p90", "trip med", "trip p90");
  for (std::size_t bytes : {std::size_t{8}, std::size_t{64} << 10, std::size_t{1} << 20}) {
    for (Way w : ways) {
      std::vector<double> in_us, trip_us;
      for (int i = 0; i < iters + 50; ++i) {
        const auto t0 = Clock::now();
        check(cudaMemcpyAsync(arena.data(), dev, bytes, cudaMemcpyDeviceToHost, r.in), "copy in");
        fence_and_wait(r, r.in, w);
        const auto t1 = Clock::now();
        check(cudaMemcpyAsync(dev, arena.data(), bytes, cudaMemcpyHostToDevice, r.out), "copy out");
        fence_and_wait(r, r.out, w);
        const auto t2 = Clock::now();
        if (i < 50) continue;  // warm-up
        in_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        trip_us.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count());
      }
      const auto a = stats(in_us), b = stats(trip_us);
      std::printf("%-10s %8zu %12.1f %12.1f %12.1f %12.1f\n", name(w), bytes, a.med, a.p90, b.med, b.p90);
    }
  }
  check(cudaHostUnregister(arena.data()), "unregister");

  // The pipeline.
  constexpr int kChunks = 16;
  constexpr std::size_t kBig = std::size_t{4} << 20;
  void* src = nullptr;
  check(cudaMalloc(&src, kBig * kChunks), "cudaMalloc");
  check(cudaMemset(src, 1, kBig * kChunks), "memset");
  std::vector<std::byte> pinned(kBig * kChunks);
  check(cudaHostRegister(pinned.data(), pinned.size(), cudaHostRegisterPortable), "register");
  cudaStream_t lane = nullptr, signal = nullptr;
  check(cudaStreamCreateWithFlags(&lane, cudaStreamNonBlocking), "stream");
  check(cudaStreamCreateWithFlags(&signal, cudaStreamNonBlocking), "stream");
  const int reps = std::max(20, iters / 20);
  std::printf("\n# pipeline: %d chunks back to back, each copied device-to-host then fenced; us, median of %d\n",
              kChunks, reps);
  std::printf("%-10s %8s %14s %14s %12s\n", "fence", "chunk", "copies done", "last fence", "GB/s");
  for (std::size_t chunk : {std::size_t{256} << 10, std::size_t{1} << 20, kBig}) {
    for (const char* how : {"none", "on-lane", "signal"}) {
      const std::string h = how;
      std::vector<double> copies_us, fence_us;
      Waiter w;  // outlives every host function that notifies it
      for (int i = 0; i < reps + 3; ++i) {
        const auto base = w.count.load();
        const auto t0 = Clock::now();
        for (int k = 0; k < kChunks; ++k) {
          check(cudaMemcpyAsync(pinned.data() + k * chunk, static_cast<std::byte*>(src) + k * chunk, chunk,
                                cudaMemcpyDeviceToHost, lane),
                "copy");
          if (h == "none") continue;
          check(cudaEventRecord(r.ev, lane), "record");
          if (h == "on-lane") {
            check(cudaLaunchHostFunc(lane, on_done, &w), "hostfn");
          } else {
            check(cudaStreamWaitEvent(signal, r.ev, 0), "wait");
            check(cudaLaunchHostFunc(signal, on_done, &w), "hostfn");
          }
        }
        check(cudaStreamSynchronize(lane), "sync");
        const auto t1 = Clock::now();
        while (h != "none" && w.count.load(std::memory_order_acquire) != base + kChunks) {
        }
        const auto t2 = Clock::now();
        if (i < 3) continue;  // warm-up
        copies_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        fence_us.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count());
      }
      // The host functions' streams are over only once each returned: `w` may go then.
      check(cudaStreamSynchronize(lane), "sync");
      check(cudaStreamSynchronize(signal), "sync");
      const auto c = stats(copies_us), f = stats(fence_us);
      std::printf("%-10s %8zu %14.1f %14.1f %12.1f\n", how, chunk, c.med, f.med,
                  static_cast<double>(chunk * kChunks) / f.med / 1e3);
    }
  }
  check(cudaDeviceSynchronize(), "sync");
  check(cudaHostUnregister(pinned.data()), "unregister");
  return 0;
}
