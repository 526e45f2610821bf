// host_reduce against references computed independently in float64 / exact integer arithmetic,
// on every kernel set this CPU can run (generic, and AVX2+F16C where available).
#include "kernels/host/host_reduce.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/host/host_reduce_impl.hpp"

namespace smddp::host_kernels {
namespace {

using detail::HostIsa;
using ipc::DType;
using ipc::ReduceOp;

constexpr DType kAllDTypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int8,
                                DType::UInt8,   DType::Int32,   DType::Int64,   DType::Bool};
constexpr ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Avg,  ReduceOp::Product, ReduceOp::Min,      ReduceOp::Max,
                                ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor,    ReduceOp::PremulSum};
constexpr std::size_t kCounts[] = {0, 1, 7, 4099, 100003};
constexpr std::size_t kInputCounts[] = {1, 2, 3, 8};
constexpr std::size_t kMaxInputs = 8;
constexpr std::size_t kGuardBytes = 64;
constexpr unsigned char kGuardByte = 0xAB;
constexpr double kPremulScale = 0.37;

std::vector<HostIsa> isas() {
  std::vector<HostIsa> v{HostIsa::Generic};
  if (detail::host_isa_available(HostIsa::Avx2)) v.push_back(HostIsa::Avx2);
  return v;
}
const char* isa_name(HostIsa isa) { return isa == HostIsa::Avx2 ? "avx2" : "generic"; }

// A byte buffer whose data starts `misalign` elements past a 64-byte boundary (kernels must not
// assume vector alignment), followed by guard bytes that must survive every call.
class Buffer {
 public:
  Buffer(std::size_t bytes, std::size_t misalign_bytes)
      : bytes_(bytes), offset_(misalign_bytes), words_((bytes + misalign_bytes + kGuardBytes) / 8 + 16) {
    // Start the data at a 64-byte boundary of the word array plus the offset.
    const auto base = reinterpret_cast<std::uintptr_t>(words_.data());
    offset_ += (64 - base % 64) % 64;
    std::memset(words_.data(), kGuardByte, words_.size() * 8);
  }
  unsigned char* data() { return reinterpret_cast<unsigned char*>(words_.data()) + offset_; }
  const unsigned char* data() const { return reinterpret_cast<const unsigned char*>(words_.data()) + offset_; }
  std::size_t bytes() const { return bytes_; }
  bool guard_intact() const {
    const unsigned char* g = data() + bytes_;
    return std::all_of(g, g + kGuardBytes, [](unsigned char c) { return c == kGuardByte; });
  }

 private:
  std::size_t bytes_;
  std::size_t offset_;
  std::vector<std::uint64_t> words_;
};

// ---- element access -----------------------------------------------------------------------

double load_floating(DType t, const unsigned char* p, std::size_t i) {
  switch (t) {
    case DType::Float32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
    case DType::Float64: { double d; std::memcpy(&d, p + 8 * i, 8); return d; }
    case DType::Float16: { std::uint16_t h; std::memcpy(&h, p + 2 * i, 2); return half_to_float(h); }
    case DType::BFloat16: { std::uint16_t h; std::memcpy(&h, p + 2 * i, 2); return bf16_to_float(h); }
    default: ADD_FAILURE() << "not floating"; return 0;
  }
}

void store_floating(DType t, unsigned char* p, std::size_t i, double v) {
  switch (t) {
    case DType::Float32: { const float f = static_cast<float>(v); std::memcpy(p + 4 * i, &f, 4); break; }
    case DType::Float64: std::memcpy(p + 8 * i, &v, 8); break;
    case DType::Float16: { const auto h = float_to_half(static_cast<float>(v)); std::memcpy(p + 2 * i, &h, 2); break; }
    case DType::BFloat16: { const auto h = float_to_bf16(static_cast<float>(v)); std::memcpy(p + 2 * i, &h, 2); break; }
    default: ADD_FAILURE() << "not floating";
  }
}

// v rounded to the type (ties to even), via float for the 16-bit types (as the kernel).
double round_to(DType t, double v) {
  switch (t) {
    case DType::Float32: return static_cast<float>(v);
    case DType::Float64: return v;
    case DType::Float16: return half_to_float(float_to_half(static_cast<float>(v)));
    case DType::BFloat16: return bf16_to_float(float_to_bf16(static_cast<float>(v)));
    default: ADD_FAILURE() << "not floating"; return 0;
  }
}

// One unit in the last place of the type at magnitude |v|.
double ulp_of(DType t, double v) {
  int mant_bits = 0, min_exp = 0;
  switch (t) {
    case DType::Float32: mant_bits = 23; min_exp = -126; break;
    case DType::Float64: mant_bits = 52; min_exp = -1022; break;
    case DType::Float16: mant_bits = 10; min_exp = -14; break;
    case DType::BFloat16: mant_bits = 7; min_exp = -126; break;
    default: ADD_FAILURE() << "not floating";
  }
  const int e = (v == 0 || !std::isfinite(v)) ? min_exp : std::max(std::ilogb(v), min_exp);
  return std::ldexp(1.0, e - mant_bits);
}

// Unit roundoff of the accumulation type (float32 for all but Float64).
double acc_roundoff(DType t) { return t == DType::Float64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24); }

std::int64_t load_integer(DType t, const unsigned char* p, std::size_t i) {
  switch (t) {
    case DType::Int8: return static_cast<std::int8_t>(p[i]);
    case DType::UInt8: return p[i];
    case DType::Bool: return p[i];
    case DType::Int32: { std::int32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::Int64: { std::int64_t v; std::memcpy(&v, p + 8 * i, 8); return v; }
    default: ADD_FAILURE() << "not integer"; return 0;
  }
}

// Two's complement truncation to the type's width.
std::int64_t wrap_to(DType t, std::uint64_t v) {
  switch (t) {
    case DType::Int8: return static_cast<std::int8_t>(static_cast<std::uint8_t>(v));
    case DType::UInt8: return static_cast<std::uint8_t>(v);
    case DType::Int32: return static_cast<std::int32_t>(static_cast<std::uint32_t>(v));
    case DType::Int64: return static_cast<std::int64_t>(v);
    default: ADD_FAILURE() << "not integer"; return 0;
  }
}

// ---- input generation -------------------------------------------------------------------

void fill_random(DType t, ReduceOp op, Buffer& b, std::size_t count, std::mt19937_64& rng) {
  unsigned char* p = b.data();
  if (ipc::is_floating(t)) {
    // Products of up to 8 factors in [0.5, 2] stay far from overflow and subnormals.
    std::uniform_real_distribution<double> any(-8.0, 8.0), mag(0.5, 2.0);
    for (std::size_t i = 0; i < count; ++i) {
      const double v = op == ReduceOp::Product ? ((rng() & 1) ? -1 : 1) * mag(rng) : any(rng);
      store_floating(t, p, i, v);
    }
  } else if (t == DType::Bool) {
    // Mostly 0/1, sometimes other non-zero bytes (which count as true).
    for (std::size_t i = 0; i < count; ++i) {
      const auto r = rng() % 16;
      p[i] = r < 7 ? 0 : r < 14 ? 1 : r == 14 ? 2 : 0xff;
    }
  } else {
    // Full-range bit patterns exercise wrap-around.
    const std::size_t bytes = count * ipc::dtype_size(t);
    for (std::size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(rng());
  }
}

struct Inputs {
  std::vector<Buffer> buffers;
  std::vector<const void*> pointers;
};

Inputs make_inputs(DType t, ReduceOp op, std::size_t n, std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  const std::size_t esize = ipc::dtype_size(t);
  for (std::size_t k = 0; k < n; ++k) {
    in.buffers.emplace_back(count * esize, (k % 2) * esize);  // odd inputs misaligned by one element
    fill_random(t, op, in.buffers.back(), count, rng);
  }
  for (auto& b : in.buffers) in.pointers.push_back(b.data());
  return in;
}

// ---- verification -----------------------------------------------------------------------

struct FloatingRef {
  double value;
  double abs_sum;  // scale of the accumulated rounding error; 0 for exact ops
};

FloatingRef floating_reference(DType t, ReduceOp op, const std::vector<const void*>& in, std::size_t i,
                               const ReduceParams& params) {
  const std::size_t n = in.size();
  std::vector<double> x(n);
  for (std::size_t k = 0; k < n; ++k) x[k] = load_floating(t, static_cast<const unsigned char*>(in[k]), i);
  double sum = 0, abs_sum = 0;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
    case ReduceOp::PremulSum: {
      const double s = op == ReduceOp::PremulSum ? params.premul_scale : 1.0;
      for (double v : x) { sum += s * v; abs_sum += std::fabs(s * v); }
      if (op == ReduceOp::Avg) {
        const double d = params.avg_divisor == 0 ? static_cast<double>(n) : params.avg_divisor;
        sum /= d;
        abs_sum /= d;
      }
      return {sum, abs_sum};
    }
    case ReduceOp::Product: {
      double prod = 1;
      for (double v : x) prod *= v;
      return {prod, std::fabs(prod)};
    }
    case ReduceOp::Min:
    case ReduceOp::Max: {
      double r = x[0];
      for (double v : x) {
        if (std::isnan(v) || std::isnan(r)) r = std::numeric_limits<double>::quiet_NaN();
        else r = op == ReduceOp::Min ? std::min(r, v) : std::max(r, v);
      }
      return {r, 0};
    }
    default: ADD_FAILURE() << "not a floating op"; return {0, 0};
  }
}

// Returns the number of mismatching elements (reports the first few).
std::size_t check_floating(DType t, ReduceOp op, const std::vector<const void*>& in, const unsigned char* out,
                           std::size_t count, const ReduceParams& params) {
  std::size_t bad = 0;
  const double u = acc_roundoff(t);
  for (std::size_t i = 0; i < count; ++i) {
    const FloatingRef ref = floating_reference(t, op, in, i, params);
    const double got = load_floating(t, out, i);
    const double want = round_to(t, ref.value);
    bool ok;
    if (std::isnan(ref.value)) ok = std::isnan(got);
    else if (std::isinf(want)) ok = got == want;
    else {
      // One ulp of the type for the final rounding plus float32/64 accumulation error
      // (n additions/multiplications, the premultiplication and the AVG division).
      const double tol = ulp_of(t, want) + static_cast<double>(in.size() + 2) * u * ref.abs_sum;
      ok = std::fabs(got - want) <= tol;
    }
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << "element " << i << ": got " << got << ", want " << want << " (exact " << ref.value << ")";
  }
  return bad;
}

std::size_t check_integer(DType t, ReduceOp op, const std::vector<const void*>& in, const unsigned char* out,
                          std::size_t count) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    std::int64_t want = 0;
    if (t == DType::Bool) {
      bool any = false, all = true, parity = false;
      for (const void* p : in) {
        const bool v = static_cast<const unsigned char*>(p)[i] != 0;
        any = any || v;
        all = all && v;
        parity = parity != v;
      }
      switch (op) {
        case ReduceOp::Sum: case ReduceOp::Max: case ReduceOp::BOr: want = any; break;
        case ReduceOp::Product: case ReduceOp::Min: case ReduceOp::BAnd: want = all; break;
        case ReduceOp::BXor: want = parity; break;
        default: ADD_FAILURE() << "bad op"; return 1;
      }
    } else {
      std::int64_t first = load_integer(t, static_cast<const unsigned char*>(in[0]), i);
      std::uint64_t acc = static_cast<std::uint64_t>(first);
      std::int64_t mn = first, mx = first;
      for (std::size_t k = 1; k < in.size(); ++k) {
        const std::int64_t v = load_integer(t, static_cast<const unsigned char*>(in[k]), i);
        const auto uv = static_cast<std::uint64_t>(v);
        switch (op) {
          case ReduceOp::Sum: acc += uv; break;
          case ReduceOp::Product: acc *= uv; break;
          case ReduceOp::BAnd: acc &= uv; break;
          case ReduceOp::BOr: acc |= uv; break;
          case ReduceOp::BXor: acc ^= uv; break;
          default: break;
        }
        mn = std::min(mn, v);
        mx = std::max(mx, v);
      }
      want = op == ReduceOp::Min ? mn : op == ReduceOp::Max ? mx : wrap_to(t, acc);
    }
    const std::int64_t got = load_integer(t, out, i);
    if (got != want && ++bad <= 5) ADD_FAILURE() << "element " << i << ": got " << got << ", want " << want;
  }
  return bad;
}

std::size_t check(DType t, ReduceOp op, const std::vector<const void*>& in, const unsigned char* out,
                  std::size_t count, const ReduceParams& params) {
  return ipc::is_floating(t) ? check_floating(t, op, in, out, count, params) : check_integer(t, op, in, out, count);
}

ReduceParams params_for(ReduceOp op) {
  ReduceParams p;
  if (op == ReduceOp::PremulSum) p.premul_scale = kPremulScale;
  return p;
}

// ---- the dtype x op matrix ----------------------------------------------------------------

class HostReduceMatrix : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {};

TEST_P(HostReduceMatrix, MatchesReference) {
  const auto [t, op] = GetParam();
  const std::size_t esize = ipc::dtype_size(t);
  if (!ipc::reduce_op_supported(op, t)) {
    Inputs in = make_inputs(t, op, 2, 7, 1);
    Buffer out(7 * esize, 0);
    for (HostIsa isa : isas())
      EXPECT_THROW(detail::host_reduce_on(isa, t, op, in.pointers, out.data(), 7), std::invalid_argument);
    EXPECT_THROW(host_reduce(t, op, in.pointers, out.data(), 0), std::invalid_argument);
    return;
  }
  for (std::size_t count : kCounts) {
    Inputs in = make_inputs(t, op, kMaxInputs, count, 1000 + count);
    for (std::size_t n : kInputCounts) {
      const std::vector<const void*> used(in.pointers.begin(), in.pointers.begin() + static_cast<std::ptrdiff_t>(n));
      for (HostIsa isa : isas()) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " count=" + std::to_string(count) + " n=" + std::to_string(n));
        std::vector<ReduceParams> variants{params_for(op)};
        if (op == ReduceOp::Avg) variants.push_back(ReduceParams{1.0, 3.0});  // explicit divisor
        for (const ReduceParams& params : variants) {
          Buffer out(count * esize, esize);
          detail::host_reduce_on(isa, t, op, used, out.data(), count, params);
          EXPECT_EQ(check(t, op, used, out.data(), count, params), 0u);
          EXPECT_TRUE(out.guard_intact());
          for (const Buffer& b : in.buffers) ASSERT_TRUE(b.guard_intact());
        }
      }
    }
  }
}

std::string matrix_name(const ::testing::TestParamInfo<std::tuple<DType, ReduceOp>>& info) {
  return std::string(ipc::to_string(std::get<0>(info.param))) + "_" +
         std::string(ipc::to_string(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAllOps, HostReduceMatrix,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes), ::testing::ValuesIn(kAllOps)),
                         [](const auto& info) {
                           std::string name = matrix_name(info);
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// ---- in-place ----------------------------------------------------------------------------

TEST(HostReduce, InPlaceMatchesOutOfPlace) {
  constexpr std::size_t kCount = 100003;
  for (DType t : kAllDTypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
      if (!ipc::reduce_op_supported(op, t)) continue;
      for (HostIsa isa : isas()) {
        for (std::size_t n : {std::size_t{1}, std::size_t{3}}) {
          for (std::size_t alias = 0; alias < n; ++alias) {
            SCOPED_TRACE(std::string(ipc::to_string(t)) + " " + std::string(ipc::to_string(op)) + " " +
                         isa_name(isa) + " n=" + std::to_string(n) + " out=inputs[" + std::to_string(alias) + "]");
            Inputs in = make_inputs(t, op, n, kCount, 7 + n);
            const std::size_t bytes = kCount * ipc::dtype_size(t);
            Buffer expected(bytes, 0);
            detail::host_reduce_on(isa, t, op, in.pointers, expected.data(), kCount);
            void* out = in.buffers[alias].data();
            detail::host_reduce_on(isa, t, op, in.pointers, out, kCount);
            EXPECT_EQ(std::memcmp(out, expected.data(), bytes), 0);
            EXPECT_TRUE(in.buffers[alias].guard_intact());
          }
        }
      }
    }
  }
}

TEST(HostReduce, SameBufferAsEveryInputAndOutput) {
  constexpr std::size_t kCount = 4099;
  for (HostIsa isa : isas()) {
    std::vector<float> x(kCount);
    for (std::size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(i) * 0.5f;
    const std::vector<const void*> in{x.data(), x.data(), x.data()};
    detail::host_reduce_on(isa, DType::Float32, ReduceOp::Sum, in, x.data(), kCount);
    for (std::size_t i = 0; i < kCount; ++i) ASSERT_EQ(x[i], static_cast<float>(i) * 1.5f) << i;
  }
}

// ---- special values ------------------------------------------------------------------------

TEST(HostReduce, NanAndInfPropagateLikeFloatMath) {
  constexpr std::size_t kCount = 37;  // vector body plus a scalar tail
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max,
                        ReduceOp::PremulSum}) {
      for (std::size_t n : {std::size_t{2}, std::size_t{3}}) {
        Inputs in = make_inputs(t, op, n, kCount, 99);
        // Plant specials at different positions in different inputs, including pairs that meet
        // (inf + -inf, inf * 0, NaN vs inf under MIN/MAX).
        const double specials[] = {nan, inf, -inf, 0.0};
        for (std::size_t k = 0; k < n; ++k)
          for (std::size_t i = k; i < kCount; i += 3)
            store_floating(t, in.buffers[k].data(), i, specials[(i / 3 + k) % 4]);
        for (HostIsa isa : isas()) {
          SCOPED_TRACE(std::string(ipc::to_string(t)) + " " + std::string(ipc::to_string(op)) + " " + isa_name(isa) +
                       " n=" + std::to_string(n));
          Buffer out(kCount * ipc::dtype_size(t), 0);
          const ReduceParams params = params_for(op);
          detail::host_reduce_on(isa, t, op, in.pointers, out.data(), kCount, params);
          EXPECT_EQ(check_floating(t, op, in.pointers, out.data(), kCount, params), 0u);
        }
      }
    }
  }
}

// ---- argument checking ---------------------------------------------------------------------

TEST(HostReduce, RejectsBadArguments) {
  float a[4] = {}, out[4] = {};
  const std::vector<const void*> none;
  EXPECT_THROW(host_reduce(DType::Float32, ReduceOp::Sum, none, out, 4), std::invalid_argument);
  const std::vector<const void*> too_many(kMaxReduceInputs + 1, a);
  EXPECT_THROW(host_reduce(DType::Float32, ReduceOp::Sum, too_many, out, 4), std::invalid_argument);
  const std::vector<const void*> max_inputs(kMaxReduceInputs, a);
  EXPECT_NO_THROW(host_reduce(DType::Float32, ReduceOp::Sum, max_inputs, out, 4));
  const std::vector<const void*> with_null{a, nullptr};
  EXPECT_THROW(host_reduce(DType::Float32, ReduceOp::Sum, with_null, out, 4), std::invalid_argument);
  for (DType t : {DType::Int8, DType::UInt8, DType::Int32, DType::Int64, DType::Bool})
    EXPECT_THROW(host_scale(t, a, 1, 2.0), std::invalid_argument);
}

TEST(HostReduce, CountZeroTouchesNothing) {
  float a[2] = {1, 2}, out[2] = {7, 7};
  const std::vector<const void*> in{a, a};
  host_reduce(DType::Float32, ReduceOp::Sum, in, out, 0);
  EXPECT_EQ(out[0], 7);
  host_scale(DType::Float32, out, 0, 2.0);
  EXPECT_EQ(out[0], 7);
}

TEST(HostReduce, SixtyFourInputs) {
  constexpr std::size_t kCount = 4099;
  std::vector<std::vector<std::int32_t>> bufs(kMaxReduceInputs, std::vector<std::int32_t>(kCount));
  std::vector<const void*> in;
  for (std::size_t k = 0; k < bufs.size(); ++k) {
    for (std::size_t i = 0; i < kCount; ++i) bufs[k][i] = static_cast<std::int32_t>(k * i);
    in.push_back(bufs[k].data());
  }
  std::vector<std::int32_t> out(kCount);
  host_reduce(DType::Int32, ReduceOp::Sum, in, out.data(), kCount);
  for (std::size_t i = 0; i < kCount; ++i) ASSERT_EQ(out[i], static_cast<std::int32_t>(i * 64 * 63 / 2));
}

// ---- threads -------------------------------------------------------------------------------

TEST(HostReduce, DisjointRangesFromThreadsMatchOneCall) {
  constexpr std::size_t kCount = 1 << 20, kThreads = 4;
  Inputs in = make_inputs(DType::BFloat16, ReduceOp::Sum, 4, kCount, 5);
  Buffer whole(kCount * 2, 0), parts(kCount * 2, 0);
  host_reduce(DType::BFloat16, ReduceOp::Sum, in.pointers, whole.data(), kCount);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::size_t begin = kCount * t / kThreads, end = kCount * (t + 1) / kThreads;
      std::vector<const void*> ptrs;
      for (const void* p : in.pointers) ptrs.push_back(static_cast<const unsigned char*>(p) + 2 * begin);
      host_reduce(DType::BFloat16, ReduceOp::Sum, ptrs, parts.data() + 2 * begin, end - begin);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(std::memcmp(whole.data(), parts.data(), kCount * 2), 0);
}

// ---- host_scale ----------------------------------------------------------------------------

TEST(HostScale, MatchesReference) {
  constexpr std::size_t kCount = 4099;
  for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    for (double factor : {0.25, 1.0 / 3.0, 7.5}) {
      for (HostIsa isa : isas()) {
        SCOPED_TRACE(std::string(ipc::to_string(t)) + " " + isa_name(isa) + " factor=" + std::to_string(factor));
        Inputs in = make_inputs(t, ReduceOp::Sum, 1, kCount, 3);
        Buffer buf(kCount * ipc::dtype_size(t), 0);
        std::memcpy(buf.data(), in.buffers[0].data(), kCount * ipc::dtype_size(t));
        detail::host_scale_on(isa, t, buf.data(), kCount, factor);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < kCount; ++i) {
          const double exact = load_floating(t, in.buffers[0].data(), i) * factor;
          const double want = round_to(t, exact);
          const double got = load_floating(t, buf.data(), i);
          if (std::fabs(got - want) > ulp_of(t, want) + 2 * acc_roundoff(t) * std::fabs(exact) && ++bad <= 5)
            ADD_FAILURE() << i << ": got " << got << " want " << want;
        }
        EXPECT_EQ(bad, 0u);
        EXPECT_TRUE(buf.guard_intact());
      }
    }
  }
}

TEST(HostScale, AvgAsSumThenScaleMatchesAvg) {
  constexpr std::size_t kCount = 4099;
  Inputs in = make_inputs(DType::Float32, ReduceOp::Sum, 4, kCount, 11);
  std::vector<float> avg(kCount), sum(kCount);
  host_reduce(DType::Float32, ReduceOp::Avg, in.pointers, avg.data(), kCount);
  host_reduce(DType::Float32, ReduceOp::Sum, in.pointers, sum.data(), kCount);
  host_scale(DType::Float32, sum.data(), kCount, 0.25);  // exact for a power of two
  EXPECT_EQ(std::memcmp(avg.data(), sum.data(), kCount * 4), 0);
}

}  // namespace
}  // namespace smddp::host_kernels
