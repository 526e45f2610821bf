// Reduction and copy kernels of the GPU path. Each thread handles 16-byte packs (one uint4
// load per input per pack) when every pointer is 16-byte aligned, then a scalar tail.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "daemon/cuda/device_kernels.hpp"

namespace smddp::daemon::cuda {
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

template <class T>
cudaError_t arith(const ReduceArgs& a, cudaStream_t s, int b) {
  switch (a.op) {
    case ipc::ReduceOp::Sum: return go<T, K::Sum>(a, s, b);
    case ipc::ReduceOp::Product: return go<T, K::Prod>(a, s, b);
    case ipc::ReduceOp::Min: return go<T, K::Min>(a, s, b);
    case ipc::ReduceOp::Max: return go<T, K::Max>(a, s, b);
    case ipc::ReduceOp::Avg:
      if constexpr (std::is_integral_v<T>) return cudaErrorInvalidValue;
      else return go<T, K::Avg>(a, s, b);
    case ipc::ReduceOp::PremulSum:
      if constexpr (std::is_integral_v<T>) return cudaErrorInvalidValue;
      else return go<T, K::Premul>(a, s, b);
    case ipc::ReduceOp::BAnd:
      if constexpr (std::is_integral_v<T>) return go<T, K::And>(a, s, b);
      else return cudaErrorInvalidValue;
    case ipc::ReduceOp::BOr:
      if constexpr (std::is_integral_v<T>) return go<T, K::Or>(a, s, b);
      else return cudaErrorInvalidValue;
    case ipc::ReduceOp::BXor:
      if constexpr (std::is_integral_v<T>) return go<T, K::Xor>(a, s, b);
      else return cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

// bool: any non-zero byte is true; SUM/MAX are OR, PRODUCT/MIN are AND (as torch's NCCL path).
cudaError_t boolean(const ReduceArgs& a, cudaStream_t s, int b) {
  switch (a.op) {
    case ipc::ReduceOp::Sum:
    case ipc::ReduceOp::Max:
    case ipc::ReduceOp::BOr: return go<std::uint8_t, K::BoolOr>(a, s, b);
    case ipc::ReduceOp::Product:
    case ipc::ReduceOp::Min:
    case ipc::ReduceOp::BAnd: return go<std::uint8_t, K::BoolAnd>(a, s, b);
    case ipc::ReduceOp::BXor: return go<std::uint8_t, K::BoolXor>(a, s, b);
    default: return cudaErrorInvalidValue;
  }
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

}  // namespace

cudaError_t launch_reduce(const ReduceArgs& a, cudaStream_t s, int max_blocks) {
  if (a.n < 1 || a.n > kMaxKernelInputs) return cudaErrorInvalidValue;
  if (a.count == 0) return cudaSuccess;
  switch (a.dtype) {
    case ipc::DType::Float32: return arith<float>(a, s, max_blocks);
    case ipc::DType::Float64: return arith<double>(a, s, max_blocks);
    case ipc::DType::Float16: return arith<__half>(a, s, max_blocks);
    case ipc::DType::BFloat16: return arith<__nv_bfloat16>(a, s, max_blocks);
    case ipc::DType::Int8: return arith<std::int8_t>(a, s, max_blocks);
    case ipc::DType::UInt8: return arith<std::uint8_t>(a, s, max_blocks);
    case ipc::DType::Int32: return arith<std::int32_t>(a, s, max_blocks);
    case ipc::DType::Int64: return arith<std::int64_t>(a, s, max_blocks);
    case ipc::DType::Bool: return boolean(a, s, max_blocks);
  }
  return cudaErrorInvalidValue;
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

}  // namespace smddp::daemon::cuda
