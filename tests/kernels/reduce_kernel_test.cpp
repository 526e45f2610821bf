// The GPU reduction kernel (kernels::launch_reduce) for every dtype x reduce op, against a
// reference computed here on the host in float64 or exact integer arithmetic, as
// tests/kernels/host/host_reduce_test.cpp does for the host kernels: 1 to 8 inputs, counts
// that leave vector tails, inputs off 16-byte alignment, one output and the one-shot form
// (several outputs, one aliasing an input), bytes past the output left alone. Skips, saying
// so, without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/host/host_reduce.hpp"
#include "kernels/device_kernels.hpp"

namespace smddp::kernels {
namespace {

using ipc::DType;
using ipc::ReduceOp;

constexpr DType kAllDTypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int8,
                                DType::UInt8,   DType::Int32,   DType::Int64,   DType::Bool};
constexpr ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Avg,  ReduceOp::Product, ReduceOp::Min,      ReduceOp::Max,
                                ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor,    ReduceOp::PremulSum};
constexpr std::size_t kCounts[] = {1, 7, 4099, 100003};
constexpr int kInputCounts[] = {1, 2, 3, 8};
constexpr double kScale = 0.37;
constexpr std::size_t kGuard = 64;  // bytes after each output that must stay as they were
constexpr unsigned char kGuardByte = 0xAB;

// ---- host values --------------------------------------------------------------------------

double load_floating(DType t, const unsigned char* p, std::size_t i) {
  switch (t) {
    case DType::Float32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
    case DType::Float64: { double d; std::memcpy(&d, p + 8 * i, 8); return d; }
    case DType::Float16: { std::uint16_t h; std::memcpy(&h, p + 2 * i, 2); return host_kernels::half_to_float(h); }
    case DType::BFloat16: { std::uint16_t h; std::memcpy(&h, p + 2 * i, 2); return host_kernels::bf16_to_float(h); }
    default: return 0;
  }
}

void store_floating(DType t, unsigned char* p, std::size_t i, double v) {
  switch (t) {
    case DType::Float32: { const auto f = static_cast<float>(v); std::memcpy(p + 4 * i, &f, 4); break; }
    case DType::Float64: std::memcpy(p + 8 * i, &v, 8); break;
    case DType::Float16: { const auto h = host_kernels::float_to_half(static_cast<float>(v)); std::memcpy(p + 2 * i, &h, 2); break; }
    case DType::BFloat16: { const auto h = host_kernels::float_to_bf16(static_cast<float>(v)); std::memcpy(p + 2 * i, &h, 2); break; }
    default: break;
  }
}

double round_to(DType t, double v) {
  switch (t) {
    case DType::Float32: return static_cast<float>(v);
    case DType::Float16: return host_kernels::half_to_float(host_kernels::float_to_half(static_cast<float>(v)));
    case DType::BFloat16: return host_kernels::bf16_to_float(host_kernels::float_to_bf16(static_cast<float>(v)));
    default: return v;
  }
}

double ulp_of(DType t, double v) {
  const int mant = t == DType::Float64 ? 52 : t == DType::Float32 ? 23 : t == DType::Float16 ? 10 : 7;
  const int min_exp = t == DType::Float64 ? -1022 : t == DType::Float16 ? -14 : -126;
  const int e = v == 0 ? min_exp : std::max(std::ilogb(v), min_exp);
  return std::ldexp(1.0, e - mant);
}

std::int64_t load_integer(DType t, const unsigned char* p, std::size_t i) {
  switch (t) {
    case DType::Int8: return static_cast<std::int8_t>(p[i]);
    case DType::UInt8: case DType::Bool: return p[i];
    case DType::Int32: { std::int32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::Int64: { std::int64_t v; std::memcpy(&v, p + 8 * i, 8); return v; }
    default: return 0;
  }
}

std::int64_t wrap_to(DType t, std::uint64_t v) {
  switch (t) {
    case DType::Int8: return static_cast<std::int8_t>(static_cast<std::uint8_t>(v));
    case DType::UInt8: return static_cast<std::uint8_t>(v);
    case DType::Int32: return static_cast<std::int32_t>(static_cast<std::uint32_t>(v));
    default: return static_cast<std::int64_t>(v);
  }
}

// Random inputs: floats in [-8, 8] (products: magnitudes in [0.5, 2]); bools mostly 0/1 with
// other non-zero bytes, which count as true; integers over their whole range (wrap-around).
std::vector<unsigned char> random_input(DType t, ReduceOp op, std::size_t count, std::mt19937_64& rng) {
  std::vector<unsigned char> b(count * ipc::dtype_size(t));
  if (ipc::is_floating(t)) {
    std::uniform_real_distribution<double> any(-8.0, 8.0), mag(0.5, 2.0);
    for (std::size_t i = 0; i < count; ++i)
      store_floating(t, b.data(), i, op == ReduceOp::Product ? ((rng() & 1) ? -1 : 1) * mag(rng) : any(rng));
  } else if (t == DType::Bool) {
    for (auto& c : b) {
      const auto r = rng() % 16;
      c = r < 7 ? 0 : r < 14 ? 1 : r == 14 ? 2 : 0xff;
    }
  } else {
    for (auto& c : b) c = static_cast<unsigned char>(rng());
  }
  return b;
}

// Mismatching elements of `out` against the reference over `in` (the first few reported).
std::size_t check(DType t, ReduceOp op, const std::vector<std::vector<unsigned char>>& in, const unsigned char* out,
                  std::size_t count) {
  std::size_t bad = 0;
  const auto n = in.size();
  for (std::size_t i = 0; i < count; ++i) {
    bool ok = true;
    std::string got_s, want_s;
    if (ipc::is_floating(t)) {
      double acc = 0, abs_sum = 0;
      double mn = load_floating(t, in[0].data(), i), mx = mn;
      double prod = 1;
      for (const auto& b : in) {
        const double v = load_floating(t, b.data(), i);
        const double s = op == ReduceOp::PremulSum ? kScale : 1.0;
        acc += s * v;
        abs_sum += std::fabs(s * v);
        prod *= v;
        mn = std::min(mn, v);
        mx = std::max(mx, v);
      }
      double exact = acc;
      if (op == ReduceOp::Avg) { exact = acc / static_cast<double>(n); abs_sum /= static_cast<double>(n); }
      if (op == ReduceOp::Product) { exact = prod; abs_sum = std::fabs(prod); }
      if (op == ReduceOp::Min || op == ReduceOp::Max) { exact = op == ReduceOp::Min ? mn : mx; abs_sum = 0; }
      const double want = round_to(t, exact);
      const double got = load_floating(t, out, i);
      // One ulp for the final rounding plus the float32 (float64) accumulation's error.
      const double u = t == DType::Float64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
      ok = std::fabs(got - want) <= ulp_of(t, want) + static_cast<double>(n + 2) * u * abs_sum;
      got_s = std::to_string(got);
      want_s = std::to_string(want);
    } else {
      std::int64_t want = 0;
      if (t == DType::Bool) {
        bool any = false, all = true, parity = false;
        for (const auto& b : in) {
          const bool v = b[i] != 0;
          any = any || v;
          all = all && v;
          parity = parity != v;
        }
        want = op == ReduceOp::Sum || op == ReduceOp::Max || op == ReduceOp::BOr ? any
               : op == ReduceOp::BXor                                          ? parity
                                                                               : all;
      } else {
        const std::int64_t first = load_integer(t, in[0].data(), i);
        std::uint64_t acc = static_cast<std::uint64_t>(first);
        std::int64_t mn = first, mx = first;
        for (std::size_t k = 1; k < n; ++k) {
          const std::int64_t v = load_integer(t, in[k].data(), i);
          const auto uv = static_cast<std::uint64_t>(v);
          if (op == ReduceOp::Sum) acc += uv;
          if (op == ReduceOp::Product) acc *= uv;
          if (op == ReduceOp::BAnd) acc &= uv;
          if (op == ReduceOp::BOr) acc |= uv;
          if (op == ReduceOp::BXor) acc ^= uv;
          mn = std::min(mn, v);
          mx = std::max(mx, v);
        }
        want = op == ReduceOp::Min ? mn : op == ReduceOp::Max ? mx : wrap_to(t, acc);
      }
      const std::int64_t got = load_integer(t, out, i);
      ok = got == want;
      got_s = std::to_string(got);
      want_s = std::to_string(want);
    }
    if (!ok && ++bad <= 5) ADD_FAILURE() << "element " << i << ": got " << got_s << ", want " << want_s;
  }
  return bad;
}

// ---- device buffers -----------------------------------------------------------------------

// Device memory holding `bytes` at `offset` bytes past a 256-byte boundary, then guard bytes.
class DeviceBuffer {
 public:
  DeviceBuffer(std::size_t bytes, std::size_t offset) : bytes_(bytes), offset_(offset) {
    if (cudaMalloc(&base_, offset + bytes + kGuard) != cudaSuccess) base_ = nullptr;
    if (base_) cudaMemset(base_, kGuardByte, offset + bytes + kGuard);
  }
  ~DeviceBuffer() {
    if (base_) cudaFree(base_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  bool ok() const { return base_ != nullptr; }
  void* data() const { return static_cast<unsigned char*>(base_) + offset_; }
  void upload(const std::vector<unsigned char>& b) { ASSERT_EQ(cudaMemcpy(data(), b.data(), b.size(), cudaMemcpyHostToDevice), cudaSuccess); }
  // The data bytes and the guard after them.
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> b(bytes_ + kGuard);
    EXPECT_EQ(cudaMemcpy(b.data(), data(), b.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return b;
  }

 private:
  void* base_ = nullptr;
  std::size_t bytes_, offset_;
};

bool guard_intact(const std::vector<unsigned char>& b, std::size_t bytes) {
  return std::all_of(b.begin() + static_cast<std::ptrdiff_t>(bytes), b.end(), [](unsigned char c) { return c == kGuardByte; });
}

class GpuReduceMatrix : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "needs a CUDA GPU (GPU tests skip on CPU machines)";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
};

TEST_P(GpuReduceMatrix, MatchesHostReference) {
  const auto [t, op] = GetParam();
  const std::size_t esize = ipc::dtype_size(t);
  if (!ipc::reduce_op_supported(op, t)) {
    ReduceArgs a;
    DeviceBuffer in(7 * esize, 0), out(7 * esize, 0);
    ASSERT_TRUE(in.ok() && out.ok());
    a.inputs[0] = a.inputs[1] = in.data();
    a.n = 2;
    a.out = out.data();
    a.count = 7;
    a.dtype = t;
    a.op = op;
    EXPECT_EQ(launch_reduce(a, nullptr, 4), cudaErrorInvalidValue);
    return;
  }
  std::mt19937_64 rng(static_cast<std::uint64_t>(t) * 131 + static_cast<std::uint64_t>(op));
  for (std::size_t count : kCounts) {
    for (int n : kInputCounts) {
      for (int max_blocks : {1, 1024}) {  // one block looping over everything, and many
        SCOPED_TRACE("count=" + std::to_string(count) + " n=" + std::to_string(n) + " blocks=" + std::to_string(max_blocks));
        const std::size_t bytes = count * esize;
        std::vector<std::vector<unsigned char>> host;
        std::vector<std::unique_ptr<DeviceBuffer>> dev;
        for (int k = 0; k < n; ++k) {
          host.push_back(random_input(t, op, count, rng));
          // Odd inputs sit one element past 16-byte alignment (the kernel's scalar path).
          dev.push_back(std::make_unique<DeviceBuffer>(bytes, (k % 2) * esize));
          ASSERT_TRUE(dev.back()->ok());
          dev.back()->upload(host.back());
        }
        // One output.
        DeviceBuffer out(bytes, 0);
        ASSERT_TRUE(out.ok());
        ReduceArgs a;
        for (int k = 0; k < n; ++k) a.inputs[k] = dev[static_cast<std::size_t>(k)]->data();
        a.n = n;
        a.out = out.data();
        a.count = count;
        a.dtype = t;
        a.op = op;
        a.scale = op == ReduceOp::PremulSum ? kScale : 1.0;
        ASSERT_EQ(launch_reduce(a, nullptr, max_blocks), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        auto got = out.download();
        EXPECT_EQ(check(t, op, host, got.data(), count), 0u);
        EXPECT_TRUE(guard_intact(got, bytes)) << "the kernel wrote past the output";
        // The one-shot form: the result into every output, the last one being input 0.
        DeviceBuffer out2(bytes, esize);
        ASSERT_TRUE(out2.ok());
        a.out = nullptr;
        a.outs[0] = out2.data();
        a.outs[1] = dev[0]->data();
        a.nout = 2;
        ASSERT_EQ(launch_reduce(a, nullptr, max_blocks), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        for (const auto* o : {&out2, dev[0].get()}) {
          const auto b = o->download();
          EXPECT_EQ(check(t, op, host, b.data(), count), 0u) << (o == &out2 ? "outs[0]" : "outs[1] (input 0)");
          EXPECT_TRUE(guard_intact(b, bytes)) << "the kernel wrote past an output";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAllOps, GpuReduceMatrix,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes), ::testing::ValuesIn(kAllOps)),
                         [](const auto& info) {
                           std::string name = std::string(ipc::to_string(std::get<0>(info.param))) + "_" +
                                              std::string(ipc::to_string(std::get<1>(info.param)));
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

}  // namespace
}  // namespace smddp::kernels
