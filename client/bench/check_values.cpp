#include "client/bench/check_values.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace smddp::bench {
namespace {

using ipc::DType;
using ipc::ReduceOp;

// IEEE binary16 <-> binary32, round to nearest even (what CPUs and GPUs do).
std::uint16_t float_to_half(float f) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t exp = (x >> 23) & 0xffu;
  std::uint32_t mant = x & 0x7fffffu;
  if (exp == 0xffu) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {  // half subnormal (or zero)
    if (e < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry correctly bumps the exponent
  return static_cast<std::uint16_t>(sign | h);
}

float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

std::uint16_t float_to_bf16(float f) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float bf16_to_float(std::uint16_t b) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

template <class T>
T read_at(const void* base, std::uint64_t i) noexcept {
  T v;
  std::memcpy(&v, static_cast<const std::byte*>(base) + i * sizeof(T), sizeof(T));
  return v;
}
template <class T>
void write_at(void* base, std::uint64_t i, T v) noexcept {
  std::memcpy(static_cast<std::byte*>(base) + i * sizeof(T), &v, sizeof(T));
}

bool is_unsigned(DType t) noexcept { return t == DType::UInt8 || t == DType::Bool; }

double combine(ReduceOp op, double a, double b) noexcept {
  const auto ia = static_cast<std::int64_t>(a);
  const auto ib = static_cast<std::int64_t>(b);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
    case ReduceOp::PremulSum:
      return a + b;
    case ReduceOp::Product: return a * b;
    case ReduceOp::Min: return std::min(a, b);
    case ReduceOp::Max: return std::max(a, b);
    case ReduceOp::BAnd: return static_cast<double>(ia & ib);
    case ReduceOp::BOr: return static_cast<double>(ia | ib);
    case ReduceOp::BXor: return static_cast<double>(ia ^ ib);
  }
  return a;
}

// The reduction over ranks of input element `index`, in double.
double reduced_input(Collective c, DType t, ReduceOp op, int nranks, std::uint64_t index) noexcept {
  double acc = input_value(c, t, op, 0, index);
  for (int r = 1; r < nranks; ++r) acc = combine(op, acc, input_value(c, t, op, r, index));
  if (op == ReduceOp::Avg) acc /= nranks;
  if (op == ReduceOp::PremulSum) acc *= kPremulScale;
  return acc;
}

// Tolerance for AVG's division, relative to the result: a couple of units in the last place.
double tolerance(DType t) noexcept {
  switch (t) {
    case DType::Float32: return 2e-6;
    case DType::Float64: return 1e-12;
    case DType::Float16: return 2e-3;
    case DType::BFloat16: return 1.6e-2;
    default: return 0.0;
  }
}

}  // namespace

double load_value(DType t, const void* base, std::uint64_t i) noexcept {
  switch (t) {
    case DType::Float32: return read_at<float>(base, i);
    case DType::Float64: return read_at<double>(base, i);
    case DType::Float16: return half_to_float(read_at<std::uint16_t>(base, i));
    case DType::BFloat16: return bf16_to_float(read_at<std::uint16_t>(base, i));
    case DType::Int8: return read_at<std::int8_t>(base, i);
    case DType::UInt8: return read_at<std::uint8_t>(base, i);
    case DType::Int32: return read_at<std::int32_t>(base, i);
    case DType::Int64: return static_cast<double>(read_at<std::int64_t>(base, i));
    case DType::Bool: return read_at<std::uint8_t>(base, i);  // raw byte: anything but 0/1 is wrong
  }
  return 0.0;
}

void store_value(DType t, void* base, std::uint64_t i, double v) noexcept {
  // Integers wrap as the hardware would; values here stay far inside every range anyway.
  const auto as_int = static_cast<std::int64_t>(v);
  switch (t) {
    case DType::Float32: write_at<float>(base, i, static_cast<float>(v)); return;
    case DType::Float64: write_at<double>(base, i, v); return;
    case DType::Float16: write_at<std::uint16_t>(base, i, float_to_half(static_cast<float>(v))); return;
    case DType::BFloat16: write_at<std::uint16_t>(base, i, float_to_bf16(static_cast<float>(v))); return;
    case DType::Int8: write_at<std::int8_t>(base, i, static_cast<std::int8_t>(as_int)); return;
    case DType::UInt8: write_at<std::uint8_t>(base, i, static_cast<std::uint8_t>(as_int)); return;
    case DType::Int32: write_at<std::int32_t>(base, i, static_cast<std::int32_t>(as_int)); return;
    case DType::Int64: write_at<std::int64_t>(base, i, as_int); return;
    case DType::Bool: write_at<std::uint8_t>(base, i, v != 0.0 ? 1 : 0); return;  // SUM of bools is OR
  }
}

double input_value(Collective c, DType t, ReduceOp op, int rank, std::uint64_t index) noexcept {
  // Depends on index mod a prime, so a block landing at a wrong offset rarely matches.
  const std::uint64_t h = (index % 97) * 5 + static_cast<std::uint64_t>(rank) * 3;
  if (t == DType::Bool) return h % 3 == 0 ? 1.0 : 0.0;
  if (!is_reduction(c)) {
    const auto v = static_cast<double>(((index % 97) + 13 * static_cast<std::uint64_t>(rank)) % 97);
    return is_unsigned(t) ? v : v - 48.0;
  }
  if (op == ReduceOp::Product) {
    constexpr double kSigned[3] = {1.0, 2.0, -1.0};
    constexpr double kUnsigned[3] = {1.0, 2.0, 1.0};
    return (is_unsigned(t) ? kUnsigned : kSigned)[h % 3];
  }
  const auto v = static_cast<double>(h % 7);
  return is_unsigned(t) ? v : v - 3.0;
}

void fill_input(Collective c, DType t, ReduceOp op, int rank, void* in, std::uint64_t in_elems) noexcept {
  for (std::uint64_t i = 0; i < in_elems; ++i) store_value(t, in, i, input_value(c, t, op, rank, i));
}

void poison(void* out, std::uint64_t bytes) noexcept { std::memset(out, 0xa5, bytes); }

CheckResult check_output(Collective c, DType t, ReduceOp op, const Layout& layout, int rank, int nranks,
                         int root, const void* out) {
  constexpr std::uint64_t kReported = 4;
  const double tol = tolerance(t);
  CheckResult result;
  for (std::uint64_t j = 0; j < layout.out_elems; ++j) {
    const auto src = source_of(c, layout, rank, nranks, root, j);
    if (!src) break;  // nothing defined on this rank
    const double raw = src->from_rank < 0 ? reduced_input(c, t, op, nranks, src->in_index)
                                          : input_value(c, t, op, src->from_rank, src->in_index);
    // Round the expectation through the dtype, as the collective's result was.
    std::byte slot[8];
    store_value(t, slot, 0, raw);
    const double expected = load_value(t, slot, 0);
    const double got = load_value(t, out, j);
    if (std::fabs(got - expected) <= tol * std::max(1.0, std::fabs(expected))) continue;
    if (result.wrong++ < kReported) {
      char line[128];
      std::snprintf(line, sizeof line, "%selement %llu of %llu: expected %g, got %g", result.first_wrong.empty() ? "" : "; ",
                    static_cast<unsigned long long>(j), static_cast<unsigned long long>(layout.out_elems), expected, got);
      result.first_wrong += line;
    }
  }
  return result;
}

}  // namespace smddp::bench
