// Bit-exact scalar conversions between float32 and the 16-bit float types (IEEE binary16 and
// bfloat16), round-to-nearest-even, branch-free; usable on scalars and on GCC vectors.
//
// Every function here is `static inline` on purpose: the reduction kernels are compiled twice
// with different instruction sets (host_reduce_generic.cpp, host_reduce_avx2.cpp), and an
// external-linkage inline function compiled with AVX2 could be the copy the linker keeps for
// the generic code. Internal linkage gives each translation unit its own copy.
#pragma once

#include <cstdint>
#include <cstring>

namespace smddp::host_kernels::half_bits {

// The conversions are written once as templates over either scalars (U = std::uint32_t,
// F = float) or GCC vectors of them (the kernels' SIMD code): only arithmetic, comparisons and
// selects, which mean the same lane-wise.

template <class To, class From> static inline To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

// binary16 bits (in the low 16 bits of each U lane) -> float32, exact. Subnormal halves are
// renormalized with one float subtraction whose operands and result are normal floats, so
// FTZ/DAZ modes do not affect it.
template <class F, class U> static inline F half_to_float_t(U h) noexcept {
  constexpr std::uint32_t kShiftedExp = 0x7c00u << 13;
  const U sign = (h & 0x8000u) << 16;
  const U magnitude = (h & 0x7fffu) << 13;
  const U exp = magnitude & kShiftedExp;
  const U normal = magnitude + (112u << 23);   // rebias 15 -> 127
  const U inf_nan = normal + (112u << 23);     // exponent all ones
  const F subnormal = bit_cast<F>(U(normal + (1u << 23))) - bit_cast<float>(113u << 23);
  U u = exp == kShiftedExp ? inf_nan : normal;
  u = exp == 0u ? bit_cast<U>(subnormal) : u;
  return bit_cast<F>(U(u | sign));
}

// float32 -> binary16 bits (low 16 bits of each U lane), round to nearest even; overflow gives
// inf, NaN gives a quiet NaN.
template <class U, class F> static inline U float_to_half_t(F f) noexcept {
  const U bits = bit_cast<U>(f);
  const U sign = bits & 0x80000000u;
  const U u = bits ^ sign;
  const U zero = U{};
  const U inf_nan = u > 0x7f800000u ? zero + 0x7e00u : zero + 0x7c00u;
  // Results below 2^-14 are subnormal halves: adding 0.5 aligns the 10 mantissa bits at the
  // bottom of the float, and the FPU's own round-to-nearest-even does the rounding.
  constexpr std::uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  const U subnormal = bit_cast<U>(F(bit_cast<F>(u) + bit_cast<float>(kDenormMagic))) - kDenormMagic;
  // Normal: rebias the exponent and round the 13 dropped bits to nearest even. A carry out of
  // the mantissa correctly bumps the exponent (up to inf).
  const U mant_odd = (u >> 13) & 1u;
  const U normal = (u - (112u << 23) + 0xfffu + mant_odd) >> 13;
  U o = u < (113u << 23) ? subnormal : normal;
  o = u >= (143u << 23) ? inf_nan : o;  // >= 65536.0f: beyond every rounding to a finite half
  return o | (sign >> 16);
}

template <class F, class U> static inline F bf16_to_float_t(U h) noexcept { return bit_cast<F>(U(h << 16)); }

// float32 -> bfloat16 bits (low 16 bits of each U lane), round to nearest even; NaN stays NaN
// (forced quiet).
template <class U, class F> static inline U float_to_bf16_t(F f) noexcept {
  const U u = bit_cast<U>(f);
  const U rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U nan = (u >> 16) | 0x40u;
  return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

static inline float half_to_float(std::uint16_t h) noexcept { return half_to_float_t<float>(std::uint32_t{h}); }
static inline std::uint16_t float_to_half(float f) noexcept {
  return static_cast<std::uint16_t>(float_to_half_t<std::uint32_t>(f));
}
static inline float bf16_to_float(std::uint16_t h) noexcept { return bf16_to_float_t<float>(std::uint32_t{h}); }
static inline std::uint16_t float_to_bf16(float f) noexcept {
  return static_cast<std::uint16_t>(float_to_bf16_t<std::uint32_t>(f));
}

}  // namespace smddp::host_kernels::half_bits
