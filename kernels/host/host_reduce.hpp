// Host (CPU) reduction kernels of the daemon: used for every reducing collective on CPU
// tensors and for the host stages of hierarchical algorithms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ipc/types.hpp"

namespace smddp::host_kernels {

struct ReduceParams {
  double premul_scale = 1.0;  // PREMUL_SUM: out = sum_k(scale * in_k)
  double avg_divisor = 0.0;   // AVG: out = sum_k(in_k) / divisor; 0 means inputs.size()
};

// out[i] = op over k of inputs[k][i] for i in [0, count), inputs combined in order 0, 1, ...
// out may be any of the inputs (in-place); partial overlap is not allowed.
// - Float16/BFloat16 accumulate in float32 across all inputs, then round once (nearest even).
//   Float32 accumulates in float32, Float64 in float64.
// - MIN/MAX on floating types propagate NaN (as torch.minimum/maximum).
// - Bool: Sum/Max/BOr = logical or, Product/Min/BAnd = logical and, BXor = xor; any non-zero
//   input byte counts as true; the result is 0 or 1.
// - Integer Sum/Product wrap (two's complement); Min/Max are exact.
// - AVG/PREMUL_SUM only for floating types, bitwise ops only for integers and bool
//   (ipc::reduce_op_supported); throws std::invalid_argument otherwise, or for 0 or more
//   than kMaxReduceInputs inputs.
// Pure and thread-safe: callers may run it from several threads on disjoint ranges.
inline constexpr std::size_t kMaxReduceInputs = 64;
void host_reduce(ipc::DType dtype, ipc::ReduceOp op, std::span<const void* const> inputs, void* out,
                 std::size_t count, const ReduceParams& params = {});

// buf[i] *= factor, computed in the accumulation type (used after a hierarchical sum for AVG).
// Floating types only: throws std::invalid_argument otherwise.
void host_scale(ipc::DType dtype, void* buf, std::size_t count, double factor);

// Scalar conversions (round to nearest even; NaN stays NaN).
float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_half(float f) noexcept;
float bf16_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_bf16(float f) noexcept;

// Name of the kernel set host_reduce uses on this CPU ("avx2" or "generic"). The environment
// variable SMDDP_HOST_REDUCE_ISA=generic forces the portable kernels.
const char* host_reduce_isa_name() noexcept;

}  // namespace smddp::host_kernels
