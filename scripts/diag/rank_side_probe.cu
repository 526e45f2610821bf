// Measures the building blocks of a rank-side GPU data path before it is built: two
// processes, one per GPU, each with its own context (as two training ranks), exchange CUDA
// IPC handles once and then run collectives on their own streams against peer-mapped
// memory, ordered by stream memory operations on flags in GPU memory. Optionally a third
// process holds an idle context on every GPU (as the daemon would).
//
//   nvcc -O2 -arch=sm_90 -o rank_side_probe scripts/diag/rank_side_probe.cu -lcuda
//   ./rank_side_probe [--idle-daemon | --forms | --fused | --pushred]
//
// Prints per-iteration times for: the two-GPU barrier alone, one-shot AllReduce, two-shot
// AllReduce (kernel, then copy-engine pull) and copy-engine AllGather, 8 B to 1 GiB.
// --forms compares, at 64 MiB to 1 GiB, the ways bytes can cross NVLink: copy-engine pulls
// (reads of the peer) against pushes (writes into the peer), on one stream or split over
// several, and AllReduce two-shot forms built from them.
// --fused compares the two-shot AllReduce (kernel reading the peer, then copy-engine push)
// with one kernel per rank that moves every byte by SM stores: its producer blocks write this
// rank's input part for the peer into the peer's scratch, piece by piece, counting each piece
// in the peer's flag; its consumer blocks wait for each piece, reduce it with local reads only
// and write the result into both outputs. NVLink then carries only writes, pipelined, with no
// stream operation per piece. Also the bare SM-store push (an AllGather by SMs).
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
// U packs per thread per round, every load issued before the first add: more reads in flight
// per thread, for reads of a peer's memory (NVLink latency is microseconds).
template <int U>
__global__ void reduce2u(const float4* a, const float4* b, float4* o, size_t n4) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + (U - 1) * stride < n4; i += U * stride) {
    float4 x[U], y[U];
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = a[i + u * stride];
#pragma unroll
    for (int u = 0; u < U; ++u) y[u] = b[i + u * stride];
#pragma unroll
    for (int u = 0; u < U; ++u)
      o[i + u * stride] = make_float4(x[u].x + y[u].x, x[u].y + y[u].y, x[u].z + y[u].z, x[u].w + y[u].w);
  }
  for (; i < n4; i += stride) {
    float4 x = a[i], y = b[i];
    o[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}
__global__ void reduce2_tail(const float* a, const float* b, float* o, size_t n) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) o[i] = a[i] + b[i];
}

// --pushred, "tma": the reduce-scatter phase's remote reads as bulk asynchronous copies (the
// SM's tensor memory accelerator, cp.async.bulk) of `tile` bytes of the peer's chunk into shared
// memory, `stages` of them in flight per block, instead of 16-byte loads by every thread. The
// local operand is read with plain loads. If the kernel's reads (300-330 GB/s whatever their
// shape) are bound by their small requests rather than the link, bulk reads move more.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void tma_fetch(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n W_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W_%=;\n}" ::"r"(
          smem_u32(bar)),
      "r"(parity)
      : "memory");
}
// o = a + b over n4 float4s (n4 a multiple of tile4); b is the peer's.
__global__ void reduce2_tma(const float4* a, const float4* b, float4* o, size_t n4, unsigned tile4, int stages) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned long long bars[16];
  float4* buf = reinterpret_cast<float4*>(smem);
  const size_t tiles = n4 / tile4;
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) mbar_init(&bars[i]);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  // Tile t of this block's k-th: blockIdx.x + k * gridDim.x, in stage k % stages.
  if (threadIdx.x == 0)
    for (int k = 0; k < stages; ++k) {
      const size_t t = blockIdx.x + size_t(k) * gridDim.x;
      if (t < tiles) tma_fetch(buf + size_t(k) * tile4, b + t * tile4, tile4 * 16, &bars[k]);
    }
  for (size_t k = 0;; ++k) {
    const size_t t = blockIdx.x + k * gridDim.x;
    if (t >= tiles) break;
    const int st = static_cast<int>(k % stages);
    mbar_wait(&bars[st], static_cast<unsigned>((k / stages) & 1));
    const float4* sb = buf + size_t(st) * tile4;
    for (unsigned i = threadIdx.x; i < tile4; i += blockDim.x) {
      const float4 x = a[t * tile4 + i], y = sb[i];
      o[t * tile4 + i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
    __syncthreads();  // every thread is done with this stage before it is refilled
    if (threadIdx.x == 0) {
      const size_t tn = t + size_t(stages) * gridDim.x;
      if (tn < tiles) tma_fetch(buf + size_t(st) * tile4, b + tn * tile4, tile4 * 16, &bars[st]);
    }
  }
}

// --fused. Flag word 2 of a rank's flag block counts the pieces its peer's producers delivered.
__device__ unsigned long long ld_acquire_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ void red_release_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Blocks [0, producers): copy `theirs` (this rank's input, the peer's chunk) into the peer's
// scratch, piece by piece, then add 1 to the peer's arrival counter. The others: wait until
// every producer of the peer delivered piece p (arrived >= base + (p+1) * producers), then
// out = pout = mine + scratch for that piece.
__global__ void fused_ar(const float4* mine, const float4* theirs, float4* pscratch, const float4* scratch,
                         float4* out, float4* pout, size_t n4, size_t piece4, int producers,
                         unsigned long long* peer_arrived, const unsigned long long* arrived,
                         unsigned long long base) {
  const size_t pieces = (n4 + piece4 - 1) / piece4;
  if (static_cast<int>(blockIdx.x) < producers) {
    const size_t stride = size_t(producers) * blockDim.x;
    for (size_t p = 0; p < pieces; ++p) {
      const size_t hi = min(n4, (p + 1) * piece4);
      for (size_t i = p * piece4 + blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < hi; i += stride)
        pscratch[i] = theirs[i];
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence_system();
        red_release_sys(peer_arrived, 1);
      }
    }
    return;
  }
  const int consumers = gridDim.x - producers;
  const size_t c = blockIdx.x - producers, stride = size_t(consumers) * blockDim.x;
  for (size_t p = 0; p < pieces; ++p) {
    if (threadIdx.x == 0)
      while (ld_acquire_sys(arrived) < base + (p + 1) * producers) {
      }
    __syncthreads();
    const size_t hi = min(n4, (p + 1) * piece4);
    for (size_t i = p * piece4 + c * blockDim.x + threadIdx.x; i < hi; i += stride) {
      const float4 x = mine[i], y = __ldcg(scratch + i);
      const float4 r = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
      out[i] = r;
      pout[i] = r;
    }
  }
}
// --fused, "ar stream": one-shot AllReduce whose only NVLink traffic is copy-engine writes.
// Piece a (numbered over every op) of this rank's input goes, on copy stream a % 2, into
// slot a % R of the peer's scratch ring once the peer credited that slot (word 24 + slot >=
// a-R+1: per slot, since the pieces of one slot finish in order but those of two may not),
// then the stream writes a+1 into the peer's arrival word for a's parity (8 or 11: two
// streams, each word written in order). One kernel per op waits for each piece in its own
// memory (and, in place, for this rank's own push of it: local words 10/12), reduces it from
// local memory, and its last block to finish a piece (words 16 + slot count the blocks done)
// credits the slot back (peer's word 24 + slot).
// No barrier: nothing of the peer's is read, and the credits order the reuse of the ring.
struct SlotBases {
  unsigned long long v[8];
};
__global__ void stream_reduce(const float4* in, const float4* ring, float4* out, size_t n4, size_t piece4,
                              int slots, unsigned long long base, const unsigned long long* arrived_even,
                              const unsigned long long* arrived_odd, const unsigned long long* pushed_even,
                              const unsigned long long* pushed_odd, unsigned long long* slot_done,
                              SlotBases done_base, unsigned long long* peer_credit) {
  const size_t pieces = (n4 + piece4 - 1) / piece4;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t p = 0; p < pieces; ++p) {
    const unsigned long long a = base + p;
    if (threadIdx.x == 0) {
      const unsigned long long* arr = (a & 1) ? arrived_odd : arrived_even;
      while (ld_acquire_sys(arr) < a + 1) {
      }
      if (pushed_even) {
        const unsigned long long* pu = (a & 1) ? pushed_odd : pushed_even;
        while (ld_acquire_sys(pu) < a + 1) {
        }
      }
    }
    __syncthreads();
    const size_t lo = p * piece4, hi = min(n4, lo + piece4);
    const float4* slot = ring + (a % slots) * piece4;
    for (size_t i = lo + blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < hi; i += stride) {
      const float4 x = in[i], y = __ldcg(slot + (i - lo));
      out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // Blocks finished with this slot so far: every block of each earlier piece in it (a
      // piece R later can only start once this one is credited, so counts never interleave).
      const int k = static_cast<int>(a % slots);
      __threadfence();
      const unsigned long long before = atomicAdd(slot_done + k, 1ull);
      if (before == done_base.v[k] + (p / slots + 1) * gridDim.x - 1) {
        __threadfence_system();
        asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(peer_credit + k), "l"(a + 1) : "memory");
      }
    }
  }
}
__global__ void sm_copy(const float4* src, float4* dst, size_t n4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}
__global__ void fill_rank(float* p, size_t n, int me) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = float((me + 1) * (i % 7));
}
__global__ void count_wrong(const float* p, size_t n, unsigned long long* wrong) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (p[i] != float(3 * (i % 7))) atomicAdd(wrong, 1ull);
}

// A reusable two-process barrier: the k-th call returns once both processes made it.
static void host_barrier(Shared* sh) {
  static int calls = 0;
  ++calls;
  sh->arrived.fetch_add(1);
  while (sh->arrived.load() < 2 * calls) {
  }
}


// --forms: every variant starts and ends with a barrier, as the real path's ops do. The
// rank's own AllGather block goes on a side stream, as in the real path.
template <class Barrier, class TimeLoop, class Reduce>
static void run_forms(int me, float* in, float* out, float* pin, float* pout, unsigned long long* flags,
                      unsigned long long* pflags, cudaStream_t s, unsigned long long& seq, Barrier& barrier,
                      TimeLoop& time_loop, Reduce& launch_reduce, bool fused_only, bool pushred_only) {
  const int peer = 1 - me;
  constexpr int kSide = 4;
  cudaStream_t side[kSide];
  cudaEvent_t fork, join[kSide];
  for (int i = 0; i < kSide; ++i) {
    CK(cudaStreamCreateWithFlags(&side[i], cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&join[i], cudaEventDisableTiming));
  }
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  cudaEvent_t piece_done[64];
  for (auto& e : piece_done) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  // Scratch for the push-reduce-push AllReduce: the peer pushes its input's half for me here.
  float* scratch = nullptr;
  CK(cudaMalloc(&scratch, kMax));  // the one-shot copy-engine form (--fused) takes a whole input
  CK(cudaMemset(scratch, 0, kMax));
  cudaIpcMemHandle_t h;
  CK(cudaIpcGetMemHandle(&h, scratch));
  // The peer's scratch handle travels through a file named by rank (the Shared block has no slot).
  char path[64];
  std::snprintf(path, sizeof path, "/tmp/rank_side_probe.%d.%d", static_cast<int>(getppid()), me);
  FILE* f = std::fopen(path, "wb");
  std::fwrite(&h, sizeof h, 1, f);
  std::fclose(f);
  char ppath[64];
  std::snprintf(ppath, sizeof ppath, "/tmp/rank_side_probe.%d.%d", static_cast<int>(getppid()), peer);
  cudaIpcMemHandle_t ph{};
  for (;;) {
    FILE* g = std::fopen(ppath, "rb");
    if (g && std::fread(&ph, sizeof ph, 1, g) == 1) {
      std::fclose(g);
      break;
    }
    if (g) std::fclose(g);
    usleep(1000);
  }
  void* pscratch_v = nullptr;
  CK(cudaIpcOpenMemHandle(&pscratch_v, ph, cudaIpcMemLazyEnablePeerAccess));
  auto* pscratch = static_cast<float*>(pscratch_v);
  // Piece flags: word 1 of each flag block counts the pieces the peer has pushed.
  auto own_piece = reinterpret_cast<CUdeviceptr>(flags + 1);
  auto peer_piece = reinterpret_cast<CUdeviceptr>(pflags + 1);
  unsigned long long pieces_done = 0;

  // Copies `bytes` from src to dst split evenly over k streams (k == 1: on s itself).
  auto split_copy = [&](void* dst, const void* src, size_t bytes, int k) {
    if (k == 1) {
      CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
      return;
    }
    CK(cudaEventRecord(fork, s));
    size_t per = (bytes / k + 255) & ~size_t(255);
    for (int i = 0; i < k; ++i) {
      size_t off = per * i;
      if (off >= bytes) break;
      size_t len = std::min(per, bytes - off);
      CK(cudaStreamWaitEvent(side[i], fork, 0));
      CK(cudaMemcpyAsync(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, len,
                         cudaMemcpyDeviceToDevice, side[i]));
      CK(cudaEventRecord(join[i], side[i]));
      CK(cudaStreamWaitEvent(s, join[i], 0));
    }
  };
  auto own_block = [&](size_t half) {  // the rank's own AllGather block, beside the peer copy
    CK(cudaEventRecord(fork, s));
    CK(cudaStreamWaitEvent(side[kSide - 1], fork, 0));
    CK(cudaMemcpyAsync(reinterpret_cast<char*>(out) + me * half, in, half, cudaMemcpyDeviceToDevice, side[kSide - 1]));
    CK(cudaEventRecord(join[kSide - 1], side[kSide - 1]));
  };
  auto own_join = [&] { CK(cudaStreamWaitEvent(s, join[kSide - 1], 0)); };
  // This rank's part [off, off + len) reduced from its input and `other` (indexed from the
  // part's start) into dst on s, in `pieces`; each piece pushed into pdst from side[0] once
  // reduced, beside the next reduction. s then waits for the last push.
  auto reduce_and_push_pieces = [&](const float* other, float* dst, float* pdst, size_t off, size_t len,
                                    int pieces) {
    const size_t per = ((len + pieces - 1) / pieces + 3) / 4 * 4;
    for (int p = 0; p < pieces; ++p) {
      const size_t o = per * p;
      if (o >= len) break;
      const size_t l = std::min(per, len - o);
      launch_reduce(in + off + o, other + o, dst + off + o, l);
      CK(cudaEventRecord(piece_done[p], s));
      CK(cudaStreamWaitEvent(side[0], piece_done[p], 0));
      CK(cudaMemcpyAsync(pdst + off + o, dst + off + o, l * 4, cudaMemcpyDeviceToDevice, side[0]));
    }
    CK(cudaEventRecord(join[0], side[0]));
    CK(cudaStreamWaitEvent(s, join[0], 0));
  };

  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, me));
  if (pushred_only) {
    // --pushred: the two-shot AllReduce with both NVLink phases as copy-engine writes.
    // Phase 1 pushes this rank's input part for the peer into the peer's scratch as ONE copy,
    // then a barrier (no per-piece flags: those cost a copy stream 6-12 us each). Phase 2
    // reduces piece p locally (own input + scratch, no NVLink) on s while side[0] pushes the
    // reduced piece p-1 into the peer's output: only this rank's own events order them.
    // Against "ar read+push" (the kernel reads the peer at 300-330 GB/s, then one push).
    unsigned long long* wrong = nullptr;
    CK(cudaMallocManaged(&wrong, sizeof *wrong));
    for (size_t bytes : {size_t(16) << 20, size_t(64) << 20, size_t(128) << 20, size_t(256) << 20,
                         size_t(512) << 20, kMax}) {
      const int iters = bytes <= (size_t(64) << 20) ? 60 : bytes <= (size_t(256) << 20) ? 25 : 10;
      const size_t n = bytes / 4, nh = n / 2, off = me * nh, poff = peer * nh;
      if (me == 0) std::printf("-- %zu MiB (AllReduce busbw = algbw)\n", bytes >> 20);
      for (bool in_place : {false, true}) {
        float* dst = in_place ? in : out;
        float* pdst = in_place ? pin : pout;
        auto check = [&](const char* what, auto&& body) {
          fill_rank<<<264, 512, 0, s>>>(in, n, me);
          CK(cudaStreamSynchronize(s));
          barrier();
          body();
          if (in_place) CK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, s));
          *wrong = 0;
          count_wrong<<<264, 512, 0, s>>>(out, n, wrong);
          CK(cudaStreamSynchronize(s));
          if (*wrong) std::printf("rank %d: %s: %llu wrong elements\n", me, what, *wrong);
          CK(cudaMemsetAsync(out, 0, bytes, s));
          fill_rank<<<264, 512, 0, s>>>(in, n, me);
          CK(cudaStreamSynchronize(s));
          barrier();
        };
        auto variant = [&](const char* what, auto&& body) {
          char name[64];
          std::snprintf(name, sizeof name, "%s%s", what, in_place ? " inpl" : "");
          time_loop(name, bytes, iters, body);
          check(name, body);
        };
        variant("ar read+push", [&] {
          barrier();  // in place too: the peer's kernel reads only its own part of this input
          launch_reduce(in + off, pin + off, dst + off, nh);
          CK(cudaMemcpyAsync(pdst + off, dst + off, nh * 4, cudaMemcpyDeviceToDevice, s));
          barrier();
        });
        // "tma": the kernel's reads of the peer as bulk copies (see reduce2_tma), then the
        // usual push. Rounds through a bounded scratch (two slots by turns, a barrier each)
        // were tried before it and measured 10-35% slower than read+push at every size.
        for (unsigned tile : {8192u, 16384u, 32768u}) {
          for (int stages : {4, 8}) {
            for (int per_sm : {1, 2}) {
              const size_t smem = size_t(tile) * stages;
              if (smem * per_sm > 200 * 1024) continue;
              const size_t tile4 = tile / 16;
              if ((nh / 4) % tile4) continue;
              char what[48];
              std::snprintf(what, sizeof what, "ar tma t%uK s%d x%d", tile >> 10, stages, per_sm);
              CK(cudaFuncSetAttribute(reduce2_tma, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
              variant(what, [&] {
                barrier();
                reduce2_tma<<<sms * per_sm, 256, smem, s>>>(reinterpret_cast<const float4*>(in + off),
                                                              reinterpret_cast<const float4*>(pin + off),
                                                              reinterpret_cast<float4*>(dst + off), nh / 4,
                                                              static_cast<unsigned>(tile4), stages);
                CK(cudaGetLastError());
                CK(cudaMemcpyAsync(pdst + off, dst + off, nh * 4, cudaMemcpyDeviceToDevice, s));
                barrier();
              });
            }
          }
        }
        for (int pieces : {8}) {
          char what[40];
          std::snprintf(what, sizeof what, "ar push+pipe p%d", pieces);
          variant(what, [&] {
            barrier();
            CK(cudaMemcpyAsync(pscratch, in + poff, nh * 4, cudaMemcpyDeviceToDevice, s));
            barrier();
            reduce_and_push_pieces(scratch, dst, pdst, off, nh, pieces);
            barrier();
          });
        }
      }
    }
    CK(cudaFree(wrong));
    CK(cudaIpcCloseMemHandle(pscratch_v));
    CK(cudaFree(scratch));
    std::remove(path);
    return;
  }
  if (fused_only) {
    unsigned long long* wrong = nullptr;
    CK(cudaMallocManaged(&wrong, sizeof *wrong));
    unsigned long long arrived = 0;  // what this rank's word 2 has counted so far
    unsigned long long pushed = 0;  // what this rank's word 3 has counted so far
    unsigned long long mixed_seq = 0;      // "ar mixed": the peer's pushes so far (word 5)
    unsigned long long stream_pieces = 0;  // "ar stream": pieces so far
    SlotBases slot_done{};                 // and, by ring slot (word 16 + slot), blocks done
    for (size_t bytes : {size_t(8) << 20, size_t(16) << 20, size_t(32) << 20, size_t(64) << 20, size_t(256) << 20, kMax}) {
      const int iters = bytes <= (size_t(64) << 20) ? 60 : bytes <= (size_t(256) << 20) ? 25 : 10;
      const size_t n = bytes / 4, nh = n / 2, off = me * nh, poff = peer * nh;  // even halves
      fill_rank<<<264, 512, 0, s>>>(in, n, me);
      CK(cudaStreamSynchronize(s));
      barrier();
      if (me == 0) std::printf("-- %zu MiB (AllReduce busbw = algbw)\n", bytes >> 20);
      auto check = [&](const char* what) {
        *wrong = 0;
        count_wrong<<<264, 512, 0, s>>>(out, n, wrong);
        CK(cudaStreamSynchronize(s));
        if (*wrong) std::printf("rank %d: %s: %llu wrong elements\n", me, what, *wrong);
        CK(cudaMemsetAsync(out, 0, bytes, s));
        barrier();
      };
      time_loop("ar read+push", bytes, iters, [&] {
        barrier();
        launch_reduce(in + off, pin + off, out + off, nh);
        CK(cudaMemcpyAsync(pout + off, out + off, nh * 4, cudaMemcpyDeviceToDevice, s));
        barrier();
      });
      check("ar read+push");
      // "ar mixed": the reduce-scatter phase's inbound bytes arrive two ways at once: the kernel
      // reads part X of the peer's chunk data, and the peer's copy engine writes the rest (Y,
      // the chunk's tail) into this rank's scratch (counted in word 5), reduced locally after.
      // Reads alone reach 300-330 GB/s; if that is their request rate rather than the link, the
      // writes fill the rest. Then the usual push of the reduced chunk.
      for (int tenth : {1, 2, 3, 4}) {
        char name[40];
        std::snprintf(name, sizeof name, "ar mixed y%d/10", tenth);
        const size_t ylen = (nh * tenth / 10) / 4 * 4;
        time_loop(name, bytes, iters, [&] {
          barrier();
          ++mixed_seq;
          CK(cudaEventRecord(fork, s));
          CK(cudaStreamWaitEvent(side[0], fork, 0));
          CK(cudaMemcpyAsync(pscratch, in + poff + nh - ylen, ylen * 4, cudaMemcpyDeviceToDevice, side[0]));
          CU(cuStreamWriteValue64(reinterpret_cast<CUstream>(side[0]), reinterpret_cast<CUdeviceptr>(pflags + 5),
                                  mixed_seq, CU_STREAM_WRITE_VALUE_DEFAULT));
          CK(cudaEventRecord(join[0], side[0]));
          launch_reduce(in + off, pin + off, out + off, nh - ylen);
          CU(cuStreamWaitValue64(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flags + 5), mixed_seq,
                                 CU_STREAM_WAIT_VALUE_GEQ));
          launch_reduce(in + off + nh - ylen, scratch, out + off + nh - ylen, ylen);
          CK(cudaMemcpyAsync(pout + off, out + off, nh * 4, cudaMemcpyDeviceToDevice, s));
          CK(cudaStreamWaitEvent(s, join[0], 0));
          barrier();
        });
        check(name);
      }
      time_loop("ar 1shot read", bytes, iters, [&] {
        barrier();
        launch_reduce(in, pin, out, n);
        barrier();
      });
      check("ar 1shot read");
      // One-shot by copy engines: side[0] writes this rank's whole input into the peer's
      // scratch in pieces, each counted in the peer's word 3; s reduces piece p (local reads
      // only) once the peer's piece p arrived and, for in place, once this rank's own piece p
      // left. No closing barrier: nothing of this rank's is read or written by the peer
      // after its last piece arrived, and the next op's opening barrier frees the scratch.
      for (bool in_place : {false, true}) {
        for (int pieces : {1, 4, 8, 16, 32}) {
          char name[48];
          std::snprintf(name, sizeof name, "ar 1shot ce p%d%s", pieces, in_place ? " inpl" : "");
          float* dst = in_place ? in : out;
          const size_t per = ((n + pieces - 1) / pieces + 3) / 4 * 4;
          const auto body = [&] {
            barrier();
            CK(cudaEventRecord(fork, s));
            CK(cudaStreamWaitEvent(side[0], fork, 0));
            for (int p = 0; p < pieces; ++p) {
              const size_t o = per * p;
              if (o >= n) break;
              CK(cudaMemcpyAsync(pscratch + o, in + o, std::min(per, n - o) * 4, cudaMemcpyDeviceToDevice, side[0]));
              CU(cuStreamWriteValue64(reinterpret_cast<CUstream>(side[0]), reinterpret_cast<CUdeviceptr>(pflags + 3),
                                      pushed + p + 1, CU_STREAM_WRITE_VALUE_DEFAULT));
              if (in_place) CK(cudaEventRecord(piece_done[p], side[0]));
            }
            CK(cudaEventRecord(join[0], side[0]));
            for (int p = 0; p < pieces; ++p) {
              const size_t o = per * p;
              if (o >= n) break;
              CU(cuStreamWaitValue64(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flags + 3),
                                     pushed + p + 1, CU_STREAM_WAIT_VALUE_GEQ));
              if (in_place) CK(cudaStreamWaitEvent(s, piece_done[p], 0));
              launch_reduce(in + o, scratch + o, dst + o, std::min(per, n - o));
            }
            pushed += pieces;
            CK(cudaStreamWaitEvent(s, join[0], 0));
          };
          // In place the input grows every run (no overflow in 65 doublings); the check
          // runs once more on a fresh input.
          time_loop(name, bytes, iters, body);
          if (in_place) {
            fill_rank<<<264, 512, 0, s>>>(in, n, me);
            body();
            CK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, s));
            fill_rank<<<264, 512, 0, s>>>(in, n, me);
          }
          check(name);
          barrier();
        }
      }
      // "ar stream" (see stream_reduce): words 8/11 arrivals, 10/12 own pushes, 16-23 blocks
      // done by slot, 24-31 credits by slot.
      for (bool in_place : {false, true}) {
        for (size_t piece : {size_t(2) << 20, size_t(4) << 20, size_t(8) << 20}) {
          for (int slots : {4}) {
            for (int blocks : {32, 132}) {
              if (piece * slots > kMax) continue;
              char name[56];
              std::snprintf(name, sizeof name, "ar stream p%zuK r%d b%d%s", piece >> 10, slots, blocks,
                            in_place ? " inpl" : "");
              float* dst = in_place ? in : out;
              const size_t piece4 = piece / 16, n4 = n / 4, pieces = (n4 + piece4 - 1) / piece4;
              const unsigned long long variant_start = stream_pieces;
              const auto body = [&] {
                // The kernel first: a copy stream blocked on a credit may share a hardware queue
                // with s, and the kernel behind it there would never start (an earlier run hung so).
                CK(cudaEventRecord(fork, s));
                stream_reduce<<<blocks, 512, 0, s>>>(
                    reinterpret_cast<const float4*>(in), reinterpret_cast<const float4*>(scratch),
                    reinterpret_cast<float4*>(dst), n4, piece4, slots, stream_pieces, flags + 8, flags + 11,
                    in_place ? flags + 10 : nullptr, in_place ? flags + 12 : nullptr, flags + 16, slot_done,
                    pflags + 24);
                CK(cudaGetLastError());
                for (int j = 0; j < 2; ++j) CK(cudaStreamWaitEvent(side[j], fork, 0));
                for (size_t p = 0; p < pieces; ++p) {
                  const unsigned long long a = stream_pieces + p;
                  cudaStream_t cs = side[a & 1];
                  CUstream cu = reinterpret_cast<CUstream>(cs);
                  // Pieces before this variant's first are all consumed (its runs start drained).
                  if (a >= variant_start + static_cast<unsigned long long>(slots))
                    CU(cuStreamWaitValue64(cu, reinterpret_cast<CUdeviceptr>(flags + 24 + a % slots), a - slots + 1,
                                           CU_STREAM_WAIT_VALUE_GEQ));
                  const size_t len = std::min(piece4, n4 - p * piece4) * 16;
                  CK(cudaMemcpyAsync(reinterpret_cast<char*>(pscratch) + (a % slots) * piece,
                                     reinterpret_cast<const char*>(in) + p * piece, len, cudaMemcpyDeviceToDevice, cs));
                  CU(cuStreamWriteValue64(cu, reinterpret_cast<CUdeviceptr>(pflags + ((a & 1) ? 11 : 8)), a + 1,
                                          CU_STREAM_WRITE_VALUE_DEFAULT));
                  if (in_place)
                    CU(cuStreamWriteValue64(cu, reinterpret_cast<CUdeviceptr>(flags + ((a & 1) ? 12 : 10)), a + 1,
                                            CU_STREAM_WRITE_VALUE_DEFAULT));
                }
                for (size_t p = 0; p < pieces; ++p) slot_done.v[(stream_pieces + p) % slots] += blocks;
                stream_pieces += pieces;
                for (int j = 0; j < 2; ++j) {
                  CK(cudaEventRecord(join[j], side[j]));
                  CK(cudaStreamWaitEvent(s, join[j], 0));
                }
              };
              time_loop(name, bytes, iters, body);
              if (in_place) {
                fill_rank<<<264, 512, 0, s>>>(in, n, me);
                barrier();  // the peer's input is fresh too
                body();
                CK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, s));
                fill_rank<<<264, 512, 0, s>>>(in, n, me);
              }
              check(name);
            }
          }
        }
      }
      for (int blocks : {132}) {
        char name[40];
        std::snprintf(name, sizeof name, "sm push b%d", blocks);
        time_loop(name, bytes / 2, iters, [&] {  // bytes/2 each way: compare with AllGather busbw
          barrier();
          sm_copy<<<blocks, 512, 0, s>>>(reinterpret_cast<const float4*>(in + off), reinterpret_cast<float4*>(pout + off),
                                          nh / 4);
          barrier();
        });
      }
      for (int blocks : {132}) {
        for (size_t piece : {size_t(4) << 20}) {
          for (int prod_share : {2}) {  // producers: blocks / prod_share
            char name[48];
            const int producers = blocks / prod_share;
            std::snprintf(name, sizeof name, "ar fused b%d/%d p%zuK", producers, blocks - producers, piece >> 10);
            const size_t piece4 = piece / 16, n4 = nh / 4;
            const unsigned long long per_op = (n4 + piece4 - 1) / piece4 * producers;
            time_loop(name, bytes, iters, [&] {
              barrier();
              fused_ar<<<blocks, 512, 0, s>>>(
                  reinterpret_cast<const float4*>(in + off), reinterpret_cast<const float4*>(in + poff),
                  reinterpret_cast<float4*>(pscratch), reinterpret_cast<const float4*>(scratch),
                  reinterpret_cast<float4*>(out + off), reinterpret_cast<float4*>(pout + off), n4, piece4, producers,
                  pflags + 2, flags + 2, arrived);
              CK(cudaGetLastError());
              arrived += per_op;
              barrier();
            });
            check(name);
          }
        }
      }
    }
    CK(cudaFree(wrong));
    CK(cudaIpcCloseMemHandle(pscratch_v));
    CK(cudaFree(scratch));
    std::remove(path);
    return;
  }
  // The reduce-scatter half of a two-shot AllReduce alone (the kernel reads the peer's half
  // over NVLink): how the kernel's shape moves it.
  for (size_t bytes : {size_t(64) << 20, size_t(256) << 20}) {
    const size_t n = bytes / 4, nh = n / 2, off = me * nh, len = me ? n - nh : nh;
    const size_t n4 = len / 4;
    const float4* a4 = reinterpret_cast<const float4*>(in + off);
    const float4* b4 = reinterpret_cast<const float4*>(pin + off);
    float4* o4 = reinterpret_cast<float4*>(out + off);
    for (int mult : {1, 2, 4, 8}) {
      for (int u : {1, 2, 4}) {
        char name[40];
        std::snprintf(name, sizeof name, "rs read b%dx u%d", mult, u);
        const int blocks = sms * mult;
        time_loop(name, bytes, bytes <= (size_t(64) << 20) ? 60 : 25, [&] {
          barrier();
          if (u == 1) reduce2u<1><<<blocks, 512, 0, s>>>(a4, b4, o4, n4);
          if (u == 2) reduce2u<2><<<blocks, 512, 0, s>>>(a4, b4, o4, n4);
          if (u == 4) reduce2u<4><<<blocks, 512, 0, s>>>(a4, b4, o4, n4);
          CK(cudaGetLastError());
          barrier();
        });
      }
    }
  }
  for (size_t bytes = size_t(64) << 20; bytes <= kMax; bytes *= 4) {
    const int iters = bytes <= (size_t(64) << 20) ? 60 : bytes <= (size_t(256) << 20) ? 25 : 10;
    const size_t half = bytes / 2;
    if (me == 0) std::printf("-- %zu MiB (AllGather busbw = algbw / 2, AllReduce busbw = algbw)\n", bytes >> 20);
    for (int k : {1, 2, 3}) {
      char name[40];
      std::snprintf(name, sizeof name, "ag pull x%d", k);
      time_loop(name, bytes, iters, [&] {
        barrier();
        own_block(half);
        split_copy(reinterpret_cast<char*>(out) + peer * half, pin, half, k);
        own_join();
        barrier();
      });
      std::snprintf(name, sizeof name, "ag push x%d", k);
      time_loop(name, bytes, iters, [&] {
        barrier();
        own_block(half);
        split_copy(reinterpret_cast<char*>(pout) + me * half, in, half, k);
        own_join();
        barrier();
      });
    }
    const size_t n = bytes / 4, nh = n / 2;
    const size_t off = me * nh, len = me ? n - nh : nh, poff = peer * nh, plen = peer ? n - nh : nh;
    time_loop("ar read+pull", bytes, iters, [&] {
      barrier();
      launch_reduce(in + off, pin + off, out + off, len);
      barrier();
      CK(cudaMemcpyAsync(out + poff, pout + poff, plen * 4, cudaMemcpyDeviceToDevice, s));
      barrier();
    });
    for (int k : {1, 2}) {
      char name[40];
      std::snprintf(name, sizeof name, "ar read+push x%d", k);
      time_loop(name, bytes, iters, [&] {
        barrier();
        launch_reduce(in + off, pin + off, out + off, len);
        split_copy(pout + off, out + off, len * 4, k);
        barrier();
      });
    }
    // The push of piece j (this GPU's link out) beside the reduction of piece j+1 (its reads
    // come in): no flags, only this rank's own events between its streams.
    for (int pieces : {2, 4, 8, 16}) {
      char name[40];
      std::snprintf(name, sizeof name, "ar read+push p%d", pieces);
      time_loop(name, bytes, iters, [&] {
        barrier();
        reduce_and_push_pieces(pin + off, out, pout, off, len, pieces);
        barrier();
      });
    }
    time_loop("ar push+local+push", bytes, iters, [&] {
      barrier();
      CK(cudaMemcpyAsync(pscratch, in + poff, plen * 4, cudaMemcpyDeviceToDevice, s));
      barrier();
      launch_reduce(in + off, scratch, out + off, len);
      CK(cudaMemcpyAsync(pout + off, out + off, len * 4, cudaMemcpyDeviceToDevice, s));
      barrier();
    });
    // Both phases as copy-engine pushes, pipelined: side[0] pushes my input's part for the
    // peer into its scratch piece by piece (counted in its piece flag); s reduces each piece
    // once the peer's arrived (local reads only); the reduced piece goes into the peer's
    // output from s itself ("2-stream") or from side[1] ("3-stream", beside the next reduction).
    for (bool third : {false, true}) {
      for (int pieces : {2, 4, 8, 16}) {
        char name[40];
        std::snprintf(name, sizeof name, "ar %s push p%d", third ? "3-stream" : "2-stream", pieces);
        cudaStream_t out_stream = third ? side[1] : s;
        time_loop(name, bytes, iters, [&] {
          barrier();
          CK(cudaEventRecord(fork, s));
          CK(cudaStreamWaitEvent(side[0], fork, 0));
          const size_t pin_len = ((plen + pieces - 1) / pieces + 3) / 4 * 4;
          const size_t my_len = ((len + pieces - 1) / pieces + 3) / 4 * 4;
          for (int p = 0; p < pieces; ++p) {
            const size_t o = pin_len * p;
            if (o < plen)
              CK(cudaMemcpyAsync(pscratch + o, in + poff + o, std::min(pin_len, plen - o) * 4,
                                 cudaMemcpyDeviceToDevice, side[0]));
            CU(cuStreamWriteValue64(reinterpret_cast<CUstream>(side[0]), peer_piece, pieces_done + p + 1,
                                    CU_STREAM_WRITE_VALUE_DEFAULT));
          }
          CK(cudaEventRecord(join[0], side[0]));
          for (int p = 0; p < pieces; ++p) {
            CU(cuStreamWaitValue64(reinterpret_cast<CUstream>(s), own_piece, pieces_done + p + 1,
                                   CU_STREAM_WAIT_VALUE_GEQ));
            const size_t o = my_len * p;
            if (o >= len) continue;
            const size_t l = std::min(my_len, len - o);
            launch_reduce(in + off + o, scratch + o, out + off + o, l);
            if (third) {
              CK(cudaEventRecord(piece_done[p], s));
              CK(cudaStreamWaitEvent(side[1], piece_done[p], 0));
            }
            CK(cudaMemcpyAsync(pout + off + o, out + off + o, l * 4, cudaMemcpyDeviceToDevice, out_stream));
          }
          pieces_done += pieces;
          CK(cudaStreamWaitEvent(s, join[0], 0));
          if (third) {
            CK(cudaEventRecord(join[1], side[1]));
            CK(cudaStreamWaitEvent(s, join[1], 0));
          }
          barrier();
        });
      }
    }
  }
  (void)seq;
  CK(cudaIpcCloseMemHandle(pscratch_v));
  CK(cudaFree(scratch));
  std::remove(path);
}

static int child(int me, Shared* sh, bool forms, bool fused, bool pushred) {
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
  if (forms || fused || pushred) {
    run_forms(me, in, out, static_cast<float*>(pin), static_cast<float*>(pout), flags,
              static_cast<unsigned long long*>(pflags), s, seq, barrier, time_loop, launch_reduce, fused, pushred);
    host_barrier(sh);
    return 0;
  }
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
  bool forms = argc > 1 && std::strcmp(argv[1], "--forms") == 0;
  bool fused = argc > 1 && std::strcmp(argv[1], "--fused") == 0;
  bool pushred = argc > 1 && std::strcmp(argv[1], "--pushred") == 0;
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
    if (kids[r] == 0) return child(r, sh, forms, fused, pushred);
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
