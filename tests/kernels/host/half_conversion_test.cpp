// The float32 <-> binary16 / bfloat16 conversions: decoding checked against an independent
// ldexp formula, encoding checked for round-to-nearest-even at every midpoint, and the
// vectorized block conversions of every kernel set checked against the scalar ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/host/host_reduce.hpp"
#include "kernels/host/host_reduce_impl.hpp"

namespace smddp::host_kernels {
namespace {

using detail::HostIsa;

bool half_is_nan(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }
bool bf16_is_nan(std::uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x007f) != 0; }

double half_value_by_formula(std::uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) v = std::ldexp(mant, -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = std::ldexp(1024 + mant, exp - 25);
  return sign ? -v : v;
}

TEST(HalfConversion, DecodesEveryPattern) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const double want = half_value_by_formula(static_cast<std::uint16_t>(h));
    const float got = half_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << std::hex << h;
      EXPECT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;  // -0 stays -0
    }
  }
}

TEST(HalfConversion, RoundTripsEveryPattern) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const std::uint16_t back = float_to_half(half_to_float(bits));
    if (half_is_nan(bits)) EXPECT_TRUE(half_is_nan(back)) << std::hex << h;
    else EXPECT_EQ(back, bits) << std::hex << h;
  }
}

// Between consecutive positive halves a < b (b may be +inf for a = 65504, where IEEE places
// the overflow threshold at 65520): the midpoint rounds to the even one, just below to a, just
// above to b. Midpoints of halves are exact in float.
TEST(HalfConversion, RoundsToNearestEvenAtEveryMidpoint) {
  for (std::uint16_t a = 0; a < 0x7c00; ++a) {
    const std::uint16_t b = a + 1;
    const float fa = half_to_float(a);
    const float fb = b == 0x7c00 ? 65536.0f : half_to_float(b);
    const float mid = (fa + fb) / 2;
    const std::uint16_t even = (a & 1) ? b : a;
    for (int sign : {1, -1}) {
      const std::uint16_t s = sign < 0 ? 0x8000 : 0;
      EXPECT_EQ(float_to_half(sign * mid), even | s) << std::hex << a;
      EXPECT_EQ(float_to_half(sign * std::nextafter(mid, 0.0f)), a | s) << std::hex << a;
      EXPECT_EQ(float_to_half(sign * std::nextafter(mid, INFINITY)), b | s) << std::hex << a;
    }
  }
  EXPECT_EQ(float_to_half(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half(-INFINITY), 0xfc00);
  EXPECT_EQ(float_to_half(1e-10f), 0x0000);  // below half the smallest subnormal
  EXPECT_EQ(float_to_half(-1e-10f), 0x8000);
  EXPECT_TRUE(half_is_nan(float_to_half(NAN)));
}

TEST(BFloat16Conversion, RoundTripsEveryPattern) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = bf16_to_float(bits);
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    EXPECT_EQ(u, h << 16);  // decoding is exact by definition
    const std::uint16_t back = float_to_bf16(f);
    if (bf16_is_nan(bits)) EXPECT_TRUE(bf16_is_nan(back)) << std::hex << h;
    else EXPECT_EQ(back, bits) << std::hex << h;
  }
}

TEST(BFloat16Conversion, RoundsToNearestEvenAtEveryMidpoint) {
  for (std::uint16_t a = 0; a < 0x7f80; ++a) {
    const std::uint16_t b = a + 1;  // 0x7f80 is +inf: the overflow threshold is the midpoint
    const std::uint32_t mid_bits = (static_cast<std::uint32_t>(a) << 16) | 0x8000u;
    float mid;
    std::memcpy(&mid, &mid_bits, 4);
    const std::uint16_t even = (a & 1) ? b : a;
    for (int sign : {1, -1}) {
      const std::uint16_t s = sign < 0 ? 0x8000 : 0;
      EXPECT_EQ(float_to_bf16(sign * mid), even | s) << std::hex << a;
      EXPECT_EQ(float_to_bf16(sign * std::nextafter(mid, 0.0f)), a | s) << std::hex << a;
      EXPECT_EQ(float_to_bf16(sign * std::nextafter(mid, INFINITY)), b | s) << std::hex << a;
    }
  }
  EXPECT_TRUE(bf16_is_nan(float_to_bf16(NAN)));
  EXPECT_TRUE(bf16_is_nan(float_to_bf16(-NAN)));
}

// The kernels' block conversions (F16C instructions in the AVX2 set, the scalar code vectorized
// by the compiler in the generic set) must agree bit for bit with the scalar conversions on
// every input pattern, including overflow to inf and rounding into subnormals.
TEST(HalfConversion, KernelConversionsMatchScalar) {
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t h = 0; h <= 0xffff; ++h) all[h] = static_cast<std::uint16_t>(h);
  struct Type {
    ipc::DType dtype;
    float (*to_float)(std::uint16_t);
    std::uint16_t (*from_float)(float);
    bool (*is_nan)(std::uint16_t);
  };
  const Type types[] = {{ipc::DType::Float16, half_to_float, float_to_half, half_is_nan},
                        {ipc::DType::BFloat16, bf16_to_float, float_to_bf16, bf16_is_nan}};
  for (const Type& type : types) {
    for (double scale : {1.0, 1.0 / 3.0, 3.7, 1e-3, 1e3, 1e-6, 1e30}) {
      for (HostIsa isa : {HostIsa::Generic, HostIsa::Avx2}) {
        if (!detail::host_isa_available(isa)) continue;
        SCOPED_TRACE(std::string(ipc::to_string(type.dtype)) + " scale=" + std::to_string(scale) +
                     (isa == HostIsa::Avx2 ? " avx2" : " generic"));
        std::vector<std::uint16_t> out(all.size());
        const std::vector<const void*> in{all.data()};
        detail::host_reduce_on(isa, type.dtype, ipc::ReduceOp::PremulSum, in, out.data(), all.size(),
                               ReduceParams{scale, 0});
        std::size_t bad = 0;
        for (std::size_t i = 0; i < all.size(); ++i) {
          const std::uint16_t want = type.from_float(static_cast<float>(scale) * type.to_float(all[i]));
          const bool ok = type.is_nan(want) ? type.is_nan(out[i]) : out[i] == want;
          if (!ok && ++bad <= 5) ADD_FAILURE() << std::hex << "input " << all[i] << ": got " << out[i] << " want " << want;
        }
        EXPECT_EQ(bad, 0u);
      }
    }
  }
}

}  // namespace
}  // namespace smddp::host_kernels
