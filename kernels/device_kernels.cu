// Reduction and copy kernels of the GPU path. Each thread handles 16-byte packs (one uint4
// load per input per pack) when every pointer is 16-byte aligned, then a scalar tail.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/device_kernels.hpp"

namespace smddp::kernels {
namespace {

constexpr int kThreads = 512;

enum class K { Sum, Prod, Min, Max, And, Or, Xor, Avg, Premul, BoolOr, BoolAnd, BoolXor };

// Accumulation type: float32 for half types, the type itself otherwise.
template <class T> struct AccOf { using type = T; };
template <> struct AccOf<__half> { using type = float; };
template <> struct AccOf<__nv_bfloat16> { using type = float; };

template <class T> __device__ __forceinline__ typename AccOf<T>::type to_acc(T v) { return v; }
template <> __device__ __forceinline__ float to_acc<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_acc<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T from_acc(typename AccOf<T>::type v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <class T, K k>
struct Op {
  using A = typename AccOf<T>::type;
  __device__ __forceinline__ static A pre(T v, A scale) {
    if constexpr (k == K::Premul) return to_acc<T>(v) * scale;
    else if constexpr (k == K::BoolOr || k == K::BoolAnd || k == K::BoolXor) return static_cast<A>(v != T(0));
    else return to_acc<T>(v);
  }
  __device__ __forceinline__ static A combine(A a, A b) {
    if constexpr (k == K::Sum || k == K::Avg || k == K::Premul) return a + b;
    else if constexpr (k == K::Prod) return a * b;
    else if constexpr (k == K::Min) return b < a ? b : a;
    else if constexpr (k == K::Max) return b > a ? b : a;
    else if constexpr (k == K::And || k == K::BoolAnd) return a & b;
    else if constexpr (k == K::Or || k == K::BoolOr) return a | b;
    else return a ^ b;
  }
  __device__ __forceinline__ static T post(A a, int n) {
    if constexpr (k == K::Avg) return from_acc<T>(a / static_cast<A>(n));
    else return from_acc<T>(a);
  }
};

// NaN propagates through min/max as in torch and NCCL.
template <class A> __device__ __forceinline__ bool is_nan(A v) { return v != v; }

template <class T, K k>
__device__ __forceinline__ typename AccOf<T>::type combine_nan(typename AccOf<T>::type a, typename AccOf<T>::type b) {
  if constexpr ((k == K::Min || k == K::Max) && !std::is_integral_v<typename AccOf<T>::type>) {
    if (is_nan(a)) return a;
    if (is_nan(b)) return b;
  }
  return Op<T, k>::combine(a, b);
}

template <class T, K k>
__global__ void __launch_bounds__(kThreads) reduce_kernel(const ReduceArgs a, bool vec) {
  using A = typename AccOf<T>::type;
  using O = Op<T, k>;
  constexpr int V = 16 / sizeof(T);
  const A scale = static_cast<A>(a.scale);
  const std::uint64_t tid = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t packs = vec ? a.count / V : 0;
  for (std::uint64_t i = tid; i < packs; i += stride) {
    A acc[V];
    {
      const uint4 v = reinterpret_cast<const uint4*>(a.inputs[0])[i];
      const T* t = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = O::pre(t[j], scale);
    }
    for (int r = 1; r < a.n; ++r) {
      const uint4 v = reinterpret_cast<const uint4*>(a.inputs[r])[i];
      const T* t = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = combine_nan<T, k>(acc[j], O::pre(t[j], scale));
    }
    uint4 o;
    T* ot = reinterpret_cast<T*>(&o);
#pragma unroll
    for (int j = 0; j < V; ++j) ot[j] = O::post(acc[j], a.n);
    if (a.nout == 0) {
      reinterpret_cast<uint4*>(a.out)[i] = o;
    } else {
      for (int r = 0; r < a.nout; ++r) reinterpret_cast<uint4*>(a.outs[r])[i] = o;
    }
  }
  for (std::uint64_t i = packs * V + tid; i < a.count; i += stride) {
    A acc = O::pre(static_cast<const T*>(a.inputs[0])[i], scale);
    for (int r = 1; r < a.n; ++r) acc = combine_nan<T, k>(acc, O::pre(static_cast<const T*>(a.inputs[r])[i], scale));
    const T v = O::post(acc, a.n);
    if (a.nout == 0) {
      static_cast<T*>(a.out)[i] = v;
    } else {
      for (int r = 0; r < a.nout; ++r) static_cast<T*>(a.outs[r])[i] = v;
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

template <class T, K k>
cudaError_t go(const ReduceArgs& a, cudaStream_t s, int max_blocks) {
  constexpr std::uint64_t V = 16 / sizeof(T);
  bool vec = a.nout == 0 ? aligned16(a.out) : true;
  for (int r = 0; r < a.nout; ++r) vec = vec && aligned16(a.outs[r]);
  for (int r = 0; r < a.n; ++r) vec = vec && aligned16(a.inputs[r]);
  const std::uint64_t work = vec ? (a.count + V - 1) / V : a.count;
  const std::uint64_t want = (work + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(want < static_cast<std::uint64_t>(max_blocks) ? (want ? want : 1) : max_blocks);
  reduce_kernel<T, k><<<blocks, kThreads, 0, s>>>(a, vec);
  return cudaGetLastError();
}

__global__ void __launch_bounds__(kThreads) copy_kernel(const CopyArgs a, bool vec) {
  // blockIdx.y picks the pair; x-blocks stride over its bytes.
  const int p = static_cast<int>(blockIdx.y);
  const std::uint64_t tid = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const auto* src = static_cast<const unsigned char*>(a.src[p]);
  auto* dst = static_cast<unsigned char*>(a.dst[p]);
  const std::uint64_t packs = vec ? a.bytes / 16 : 0;
  for (std::uint64_t i = tid; i < packs; i += stride)
    reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  for (std::uint64_t i = packs * 16 + tid; i < a.bytes; i += stride) dst[i] = src[i];
}


// --- fast path ------------------------------------------------------------------------------

__device__ __forceinline__ void store_release_sys(std::uint64_t* p, std::uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ std::uint64_t load_acquire_sys(const std::uint64_t* p) {
  std::uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Elements per block: a multiple of the 16-byte pack, so every block's slice is aligned
// (the slicing must not depend on alignment: every member computes the same one).
__host__ __device__ __forceinline__ std::uint64_t fast_slice(std::uint64_t count, int blocks, std::uint64_t v) {
  const std::uint64_t per = (count + static_cast<std::uint64_t>(blocks) - 1) / static_cast<std::uint64_t>(blocks);
  return (per + v - 1) / v * v;
}

template <class T>
__device__ __forceinline__ void copy_slice(T* dst, const T* src, std::uint64_t lo, std::uint64_t hi, bool vec) {
  constexpr std::uint64_t V = 16 / sizeof(T);
  if (vec) {
    for (std::uint64_t i = lo / V + threadIdx.x; i < hi / V; i += blockDim.x)
      reinterpret_cast<uint4*>(dst)[i] = __ldcg(reinterpret_cast<const uint4*>(src) + i);
    for (std::uint64_t i = hi / V * V + threadIdx.x; i < hi; i += blockDim.x) dst[i] = src[i];
  } else {
    for (std::uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) dst[i] = src[i];
  }
}

template <class T, K k>
__global__ void __launch_bounds__(kThreads) fast_kernel(const FastArgs a, bool vec) {
  using A = typename AccOf<T>::type;
  using O = Op<T, k>;
  constexpr std::uint64_t V = 16 / sizeof(T);
  const A scale = static_cast<A>(a.scale);
  const int b = static_cast<int>(blockIdx.x);
  const std::uint64_t E = a.count;
  const std::uint64_t per = fast_slice(E, static_cast<int>(gridDim.x), V);
  std::uint64_t lo = min(E, static_cast<std::uint64_t>(b) * per);
  const std::uint64_t hi = min(E, lo + per);
  const bool rs = a.op == ipc::OpType::ReduceScatter;
  const int parts = rs ? a.n : 1;
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  T* mine = static_cast<T*>(a.stage[a.me]);

  // 1. This block's slice of the input into this rank's staging buffer.
  for (int p = 0; p < parts; ++p) copy_slice(mine + static_cast<std::uint64_t>(p) * E, in + static_cast<std::uint64_t>(p) * E, lo, hi, vec);
  // 2. Tell every peer this slice is there; wait until theirs are.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int r = 0; r < a.n; ++r)
      if (r != a.me) store_release_sys(a.signal[r] + b, a.seq);
    for (int r = 0; r < a.n; ++r)
      if (r != a.me)
        while (load_acquire_sys(a.wait[r] + b) < a.seq) {
        }
  }
  __syncthreads();
  // 3. Read the others' slices (over NVLink) into the output.
  if (a.op == ipc::OpType::AllGather) {
    for (int r = 0; r < a.n; ++r)
      copy_slice(out + static_cast<std::uint64_t>(r) * E, r == a.me ? in : static_cast<const T*>(a.stage[r]), lo, hi, vec);
    return;
  }
  // Members are combined in the same order everywhere, so every rank gets the same bits.
  const std::uint64_t base = rs ? static_cast<std::uint64_t>(a.me) * E : 0;
  const auto src = [&](int r) { return r == a.me ? in + base : static_cast<const T*>(a.stage[r]) + base; };
  if (vec) {
    for (std::uint64_t i = lo / V + threadIdx.x; i < hi / V; i += blockDim.x) {
      A acc[V];
      {
        const uint4 v = __ldcg(reinterpret_cast<const uint4*>(src(0)) + i);
        const T* t = reinterpret_cast<const T*>(&v);
#pragma unroll
        for (std::uint64_t j = 0; j < V; ++j) acc[j] = O::pre(t[j], scale);
      }
      for (int r = 1; r < a.n; ++r) {
        const uint4 v = __ldcg(reinterpret_cast<const uint4*>(src(r)) + i);
        const T* t = reinterpret_cast<const T*>(&v);
#pragma unroll
        for (std::uint64_t j = 0; j < V; ++j) acc[j] = combine_nan<T, k>(acc[j], O::pre(t[j], scale));
      }
      uint4 o;
      T* ot = reinterpret_cast<T*>(&o);
#pragma unroll
      for (std::uint64_t j = 0; j < V; ++j) ot[j] = O::post(acc[j], a.n);
      reinterpret_cast<uint4*>(out)[i] = o;
    }
    lo = hi / V * V;  // the scalar tail below
  }
  for (std::uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    A acc = O::pre(src(0)[i], scale);
    for (int r = 1; r < a.n; ++r) acc = combine_nan<T, k>(acc, O::pre(src(r)[i], scale));
    out[i] = O::post(acc, a.n);
  }
}

// Calls F<T, k>::run(args...) for the kernel that a (dtype, reduce op) pair uses: every
// launcher of this file (reduce, fast path, preload, support check) dispatches through it.
template <template <class, K> class F, class T, class... Args>
cudaError_t with_arith(ipc::ReduceOp op, Args&&... args) {
  switch (op) {
    case ipc::ReduceOp::Sum: return F<T, K::Sum>::run(args...);
    case ipc::ReduceOp::Product: return F<T, K::Prod>::run(args...);
    case ipc::ReduceOp::Min: return F<T, K::Min>::run(args...);
    case ipc::ReduceOp::Max: return F<T, K::Max>::run(args...);
    case ipc::ReduceOp::Avg:
      if constexpr (std::is_integral_v<T>) return cudaErrorInvalidValue;
      else return F<T, K::Avg>::run(args...);
    case ipc::ReduceOp::PremulSum:
      if constexpr (std::is_integral_v<T>) return cudaErrorInvalidValue;
      else return F<T, K::Premul>::run(args...);
    case ipc::ReduceOp::BAnd:
      if constexpr (std::is_integral_v<T>) return F<T, K::And>::run(args...);
      else return cudaErrorInvalidValue;
    case ipc::ReduceOp::BOr:
      if constexpr (std::is_integral_v<T>) return F<T, K::Or>::run(args...);
      else return cudaErrorInvalidValue;
    case ipc::ReduceOp::BXor:
      if constexpr (std::is_integral_v<T>) return F<T, K::Xor>::run(args...);
      else return cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

template <template <class, K> class F, class... Args>
cudaError_t with_kernel(ipc::DType dtype, ipc::ReduceOp op, Args&&... args) {
  switch (dtype) {
    case ipc::DType::Float32: return with_arith<F, float>(op, args...);
    case ipc::DType::Float64: return with_arith<F, double>(op, args...);
    case ipc::DType::Float16: return with_arith<F, __half>(op, args...);
    case ipc::DType::BFloat16: return with_arith<F, __nv_bfloat16>(op, args...);
    case ipc::DType::Int8: return with_arith<F, std::int8_t>(op, args...);
    case ipc::DType::UInt8: return with_arith<F, std::uint8_t>(op, args...);
    case ipc::DType::Int32: return with_arith<F, std::int32_t>(op, args...);
    case ipc::DType::Int64: return with_arith<F, std::int64_t>(op, args...);
    case ipc::DType::Bool:
      // Any non-zero byte is true; SUM/MAX are OR, PRODUCT/MIN are AND (as torch's NCCL path).
      switch (op) {
        case ipc::ReduceOp::Sum:
        case ipc::ReduceOp::Max:
        case ipc::ReduceOp::BOr: return F<std::uint8_t, K::BoolOr>::run(args...);
        case ipc::ReduceOp::Product:
        case ipc::ReduceOp::Min:
        case ipc::ReduceOp::BAnd: return F<std::uint8_t, K::BoolAnd>::run(args...);
        case ipc::ReduceOp::BXor: return F<std::uint8_t, K::BoolXor>::run(args...);
        default: return cudaErrorInvalidValue;
      }
  }
  return cudaErrorInvalidValue;
}

template <class T, K k>
struct ReduceLaunch {
  static cudaError_t run(const ReduceArgs& a, cudaStream_t s, int max_blocks) { return go<T, k>(a, s, max_blocks); }
};

template <class T, K k>
struct FastLaunch {
  static cudaError_t run(const FastArgs& a, cudaStream_t s, int blocks, bool vec) {
    fast_kernel<T, k><<<blocks, kThreads, 0, s>>>(a, vec);
    return cudaGetLastError();
  }
};

template <class T, K k>
struct Supported {
  static cudaError_t run() { return cudaSuccess; }
};

template <class T, K k>
struct Preload {
  static cudaError_t run() {
    cudaFuncAttributes attr{};
    if (const auto e = cudaFuncGetAttributes(&attr, reduce_kernel<T, k>); e != cudaSuccess) return e;
    return cudaFuncGetAttributes(&attr, fast_kernel<T, k>);
  }
};
}  // namespace

cudaError_t launch_reduce(const ReduceArgs& a, cudaStream_t s, int max_blocks) {
  if (a.n < 1 || a.n > kMaxKernelInputs) return cudaErrorInvalidValue;
  if (a.count == 0) return cudaSuccess;
  return with_kernel<ReduceLaunch>(a.dtype, a.op, a, s, max_blocks);
}

cudaError_t launch_copy(const CopyArgs& a, cudaStream_t s, int max_blocks) {
  if (a.n < 1 || a.n > kMaxKernelInputs) return cudaErrorInvalidValue;
  if (a.bytes == 0) return cudaSuccess;
  bool vec = true;
  for (int i = 0; i < a.n; ++i) vec = vec && aligned16(a.src[i]) && aligned16(a.dst[i]);
  const std::uint64_t work = vec ? (a.bytes + 15) / 16 : a.bytes;
  const std::uint64_t want = (work + kThreads - 1) / kThreads;
  const int per = max_blocks / a.n > 0 ? max_blocks / a.n : 1;
  const unsigned x = static_cast<unsigned>(want < static_cast<std::uint64_t>(per) ? want : per);
  copy_kernel<<<dim3(x, static_cast<unsigned>(a.n)), kThreads, 0, s>>>(a, vec);
  return cudaGetLastError();
}

}  // namespace smddp::kernels

namespace smddp::kernels {

bool fast_supported(ipc::OpType op, ipc::DType dtype, ipc::ReduceOp reduce_op) {
  if (op == ipc::OpType::AllGather) return true;
  if (op != ipc::OpType::AllReduce && op != ipc::OpType::ReduceScatter) return false;
  return with_kernel<Supported>(dtype, reduce_op) == cudaSuccess;
}

std::uint64_t fast_stage_bytes(const FastArgs& a) {
  const std::uint64_t parts = a.op == ipc::OpType::ReduceScatter ? static_cast<std::uint64_t>(a.n) : 1;
  return (parts * a.count * ipc::dtype_size(a.dtype) + 255) / 256 * 256;
}

int fast_blocks(const FastArgs& a) {
  const std::uint64_t v = 16 / ipc::dtype_size(a.dtype);
  const std::uint64_t packs = (a.count + v - 1) / v;
  const std::uint64_t want = (packs + kThreads - 1) / kThreads;
  return static_cast<int>(want < 1 ? 1 : (want > kFastMaxBlocks ? kFastMaxBlocks : want));
}

cudaError_t launch_fast(const FastArgs& a, cudaStream_t s) {
  if (a.n < 1 || a.n > kFastMaxRanks || a.me < 0 || a.me >= a.n) return cudaErrorInvalidValue;
  if (a.count == 0) return cudaSuccess;
  const std::uint64_t e = ipc::dtype_size(a.dtype);
  // Every slice start is a multiple of the pack; the whole buffers and each member's part
  // (AllGather output, ReduceScatter input) must be 16-byte aligned as well.
  bool vec = aligned16(a.in) && aligned16(a.out) && (a.count * e) % 16 == 0;
  for (int r = 0; r < a.n; ++r) vec = vec && aligned16(a.stage[r]);
  const int blocks = fast_blocks(a);
  // AllGather moves bytes only: any 1-, 2-, 4- or 8-byte type does, whatever the reduce op.
  if (a.op == ipc::OpType::AllGather) {
    switch (e) {
      case 1: return FastLaunch<std::uint8_t, K::Sum>::run(a, s, blocks, vec);
      case 2: return FastLaunch<__half, K::Sum>::run(a, s, blocks, vec);
      case 4: return FastLaunch<float, K::Sum>::run(a, s, blocks, vec);
      case 8: return FastLaunch<double, K::Sum>::run(a, s, blocks, vec);
      default: return cudaErrorInvalidValue;
    }
  }
  if (a.op != ipc::OpType::AllReduce && a.op != ipc::OpType::ReduceScatter) return cudaErrorInvalidValue;
  return with_kernel<FastLaunch>(a.dtype, a.reduce_op, a, s, blocks, vec);
}

namespace {
// One thread spins until each flag reached its value (see WaitArgs).
__global__ void wait_flags_kernel(const WaitArgs a) {
  for (int i = 0; i < a.n; ++i) {
    const volatile unsigned long long* f = reinterpret_cast<const volatile unsigned long long*>(a.flags[i]);
    while (*f < a.values[i]) __nanosleep(200);
  }
}
}  // namespace

cudaError_t launch_wait_flags(const WaitArgs& args, cudaStream_t stream) {
  if (args.n < 0 || args.n > kMaxKernelInputs) return cudaErrorInvalidValue;
  if (args.n == 0) return cudaSuccess;
  wait_flags_kernel<<<1, 1, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t preload_kernels() {
  cudaFuncAttributes attr{};
  if (const auto e = cudaFuncGetAttributes(&attr, copy_kernel); e != cudaSuccess) return e;
  if (const auto e = cudaFuncGetAttributes(&attr, wait_flags_kernel); e != cudaSuccess) return e;
  constexpr ipc::DType kTypes[] = {ipc::DType::Float32, ipc::DType::Float64, ipc::DType::Float16, ipc::DType::BFloat16,
                                   ipc::DType::Int8,    ipc::DType::UInt8,   ipc::DType::Int32,   ipc::DType::Int64,
                                   ipc::DType::Bool};
  constexpr ipc::ReduceOp kOps[] = {ipc::ReduceOp::Sum, ipc::ReduceOp::Product, ipc::ReduceOp::Min,
                                    ipc::ReduceOp::Max, ipc::ReduceOp::Avg,     ipc::ReduceOp::PremulSum,
                                    ipc::ReduceOp::BAnd, ipc::ReduceOp::BOr,    ipc::ReduceOp::BXor};
  for (auto t : kTypes)
    for (auto op : kOps)
      if (const auto e = with_kernel<Preload>(t, op); e != cudaSuccess && e != cudaErrorInvalidValue) return e;
  return cudaSuccess;
}

}  // namespace smddp::kernels
