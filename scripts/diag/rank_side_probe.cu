// Measures the building blocks of a rank-side GPU data path before it is built: two
// processes, one per GPU, each with its own context (as two training ranks), exchange CUDA
// IPC handles once and then run collectives on their own streams against peer-mapped
// memory, ordered by stream memory operations on flags in GPU memory. Optionally a third
// process holds an idle context on every GPU (as the daemon would).
//
//   nvcc -O2 -arch=sm_90 -o rank_side_probe scripts/diag/rank_side_probe.cu -lcuda
//   ./rank_side_probe [--idle-daemon]
//
// Prints per-iteration times for: the two-GPU barrier alone, one-shot AllReduce, two-shot
// AllReduce (kernel, then copy-engine pull) and copy-engine AllGather, 8 B to 1 GiB.
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)
#define CU(x)                                                                                   \
  do {                                                                                          \
    CUresult r_ = (x);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                   \
      const char* s_ = nullptr;                                                                 \
      cuGetErrorString(r_, &s_);                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?");          \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

constexpr size_t kMax = size_t(1) << 30;
struct Shared {
  std::atomic<int> arrived;
  cudaIpcMemHandle_t in[2], out[2], flags[2];
};

__global__ void reduce2(const float4* a, const float4* b, float4* o, size_t n4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    float4 x = a[i], y = b[i];
    o[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}
__global__ void reduce2_tail(const float* a, const float* b, float* o, size_t n) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) o[i] = a[i] + b[i];
}

// A reusable two-process barrier: the k-th call returns once both processes made it.
static void host_barrier(Shared* sh) {
  static int calls = 0;
  ++calls;
  sh->arrived.fetch_add(1);
  while (sh->arrived.load() < 2 * calls) {
  }
}

static int child(int me, Shared* sh) {
  const int peer = 1 - me;
  CK(cudaSetDevice(me));
  float *in, *out;
  unsigned long long* flags;  // [0..7]: written by the peer (barrier sequence per phase)
  CK(cudaMalloc(&in, kMax));
  CK(cudaMalloc(&out, kMax));
  CK(cudaMalloc(&flags, 4096));
  CK(cudaMemset(flags, 0, 4096));
  CK(cudaMemset(in, 0, kMax));
  CK(cudaDeviceSynchronize());
  CK(cudaIpcGetMemHandle(&sh->in[me], in));
  CK(cudaIpcGetMemHandle(&sh->out[me], out));
  CK(cudaIpcGetMemHandle(&sh->flags[me], flags));
  host_barrier(sh);
  void *pin, *pout, *pflags;
  auto t0 = std::chrono::steady_clock::now();
  CK(cudaIpcOpenMemHandle(&pin, sh->in[peer], cudaIpcMemLazyEnablePeerAccess));
  CK(cudaIpcOpenMemHandle(&pout, sh->out[peer], cudaIpcMemLazyEnablePeerAccess));
  CK(cudaIpcOpenMemHandle(&pflags, sh->flags[peer], cudaIpcMemLazyEnablePeerAccess));
  auto t1 = std::chrono::steady_clock::now();
  if (me == 0)
    std::printf("3 IPC opens: %.1f ms\n", std::chrono::duration<double, std::milli>(t1 - t0).count());
  cudaStream_t s;
  int lo, hi;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi));
  CUstream cs = reinterpret_cast<CUstream>(s);
  auto peer_flag = reinterpret_cast<CUdeviceptr>(pflags);
  auto own_flag = reinterpret_cast<CUdeviceptr>(flags);
  unsigned long long seq = 0;
  auto barrier = [&] {
    ++seq;
    CU(cuStreamWriteValue64(cs, peer_flag, seq, CU_STREAM_WRITE_VALUE_DEFAULT));
    CU(cuStreamWaitValue64(cs, own_flag, seq, CU_STREAM_WAIT_VALUE_GEQ));
  };
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, me));
  auto time_loop = [&](const char* what, size_t bytes, int iters, auto&& body) {
    for (int i = 0; i < 5; ++i) body();
    CK(cudaStreamSynchronize(s));
    host_barrier(sh);  // coarse alignment of the two processes
    auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) body();
    CK(cudaStreamSynchronize(s));
    auto b = std::chrono::steady_clock::now();
    double us = std::chrono::duration<double, std::micro>(b - a).count() / iters;
    if (me == 0) std::printf("%-22s %12zu B  %10.2f us  algbw %8.2f GB/s\n", what, bytes, us, bytes / us / 1e3);
    std::fflush(stdout);
  };
  auto launch_reduce = [&](const float* a, const float* b, float* o, size_t n) {
    size_t n4 = n / 4;
    if (n4) {
      int blocks = int(std::min<size_t>((n4 + 511) / 512, size_t(sms) * 2));
      reduce2<<<blocks, 512, 0, s>>>(reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b),
                                     reinterpret_cast<float4*>(o), n4);
    }
    if (n % 4) reduce2_tail<<<1, 4, 0, s>>>(a + n4 * 4, b + n4 * 4, o + n4 * 4, n % 4);
  };
  time_loop("barrier", 0, 2000, [&] { barrier(); });
  for (size_t bytes = 8; bytes <= kMax; bytes *= 4) {
    size_t n = bytes / 4;
    int iters = bytes <= (1 << 20) ? 1000 : bytes <= (64 << 20) ? 100 : 20;
    if (bytes <= (4 << 20))
      time_loop("allreduce one-shot", bytes, iters, [&] {
        barrier();
        launch_reduce(in, static_cast<const float*>(pin), out, n);
        barrier();
      });
    if (bytes >= 1024)
      time_loop("allreduce two-shot", bytes, iters, [&] {
        size_t half = n / 2, off = me * half, len = me ? n - half : half;
        size_t poff = peer * half, plen = peer ? n - half : half;
        barrier();
        launch_reduce(in + off, static_cast<const float*>(pin) + off, out + off, len);
        barrier();
        CK(cudaMemcpyAsync(out + poff, static_cast<const float*>(pout) + poff, plen * 4, cudaMemcpyDeviceToDevice, s));
        barrier();
      });
    time_loop("allgather CE pull", bytes, iters, [&] {
      // output = [rank0's bytes/2 | rank1's bytes/2]: pull the peer's half from its input
      size_t half = bytes / 2;
      barrier();
      CK(cudaMemcpyAsync(reinterpret_cast<char*>(out) + peer * half, pin, half, cudaMemcpyDeviceToDevice, s));
      barrier();
    });
  }
  host_barrier(sh);
  return 0;
}

int main(int argc, char** argv) {
  bool idle_daemon = argc > 1 && std::strcmp(argv[1], "--idle-daemon") == 0;
  auto* sh = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (sh) Shared{};
  pid_t idle = -1;
  if (idle_daemon) {
    idle = fork();
    if (idle == 0) {
      int n = 0;
      cudaGetDeviceCount(&n);
      for (int d = 0; d < n; ++d) {
        cudaSetDevice(d);
        cudaFree(nullptr);
      }
      pause();
      return 0;
    }
  }
  pid_t kids[2];
  for (int r = 0; r < 2; ++r) {
    kids[r] = fork();
    if (kids[r] == 0) return child(r, sh);
  }
  int rc = 0;
  for (pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  if (idle > 0) {
    kill(idle, SIGTERM);
    waitpid(idle, nullptr, 0);
  }
  return rc;
}
