// Validation and run-time choice of the kernel set; the kernels are in host_reduce_kernels.inc.
#include "kernels/host/host_reduce.hpp"

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kernels/host/half.hpp"
#include "kernels/host/host_reduce_impl.hpp"

namespace smddp::host_kernels {
namespace detail {
namespace {

bool cpu_has_avx2_f16c() noexcept {
#if defined(__x86_64__) && defined(__GNUC__)
  // libgcc's checks include the OS having enabled the YMM state.
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

HostIsa choose_isa() noexcept {
  const char* forced = std::getenv("SMDDP_HOST_REDUCE_ISA");
  if (forced != nullptr && std::string_view(forced) == "generic") return HostIsa::Generic;
  return host_isa_available(HostIsa::Avx2) ? HostIsa::Avx2 : HostIsa::Generic;
}

ReduceKernel find_reduce_kernel(HostIsa isa, ipc::DType dtype, ipc::ReduceOp op) noexcept {
  return isa == HostIsa::Avx2 ? avx2::reduce_kernel(dtype, op) : generic::reduce_kernel(dtype, op);
}

ScaleKernel find_scale_kernel(HostIsa isa, ipc::DType dtype) noexcept {
  return isa == HostIsa::Avx2 ? avx2::scale_kernel(dtype) : generic::scale_kernel(dtype);
}

[[noreturn]] void throw_invalid(const std::string& what) { throw std::invalid_argument("host_reduce: " + what); }

}  // namespace

bool host_isa_available(HostIsa isa) noexcept {
  if (isa == HostIsa::Generic) return true;
  // The stub set (non-x86 builds) has no kernels.
  static const bool available =
      cpu_has_avx2_f16c() && avx2::reduce_kernel(ipc::DType::Float32, ipc::ReduceOp::Sum) != nullptr;
  return available;
}

HostIsa host_isa_selected() noexcept {
  static const HostIsa selected = choose_isa();
  return selected;
}

void host_reduce_on(HostIsa isa, ipc::DType dtype, ipc::ReduceOp op, std::span<const void* const> inputs,
                    void* out, std::size_t count, const ReduceParams& params) {
  if (inputs.empty() || inputs.size() > kMaxReduceInputs)
    throw_invalid(std::to_string(inputs.size()) + " inputs (1.." + std::to_string(kMaxReduceInputs) + " allowed)");
  const ReduceKernel kernel = ipc::reduce_op_supported(op, dtype) ? find_reduce_kernel(isa, dtype, op) : nullptr;
  if (kernel == nullptr)
    throw_invalid("reduce op " + std::string(ipc::to_string(op)) + " is not defined for " +
                  std::string(ipc::to_string(dtype)));
  if (count == 0) return;
  if (out == nullptr) throw_invalid("null output");
  for (const void* in : inputs)
    if (in == nullptr) throw_invalid("null input");
  kernel(inputs.data(), inputs.size(), out, count, params);
}

void host_scale_on(HostIsa isa, ipc::DType dtype, void* buf, std::size_t count, double factor) {
  const ScaleKernel kernel = find_scale_kernel(isa, dtype);
  if (kernel == nullptr) throw_invalid("scale is not defined for " + std::string(ipc::to_string(dtype)));
  if (count == 0) return;
  if (buf == nullptr) throw_invalid("null buffer");
  kernel(buf, count, factor);
}

}  // namespace detail

void host_reduce(ipc::DType dtype, ipc::ReduceOp op, std::span<const void* const> inputs, void* out,
                 std::size_t count, const ReduceParams& params) {
  detail::host_reduce_on(detail::host_isa_selected(), dtype, op, inputs, out, count, params);
}

void host_scale(ipc::DType dtype, void* buf, std::size_t count, double factor) {
  detail::host_scale_on(detail::host_isa_selected(), dtype, buf, count, factor);
}

const char* host_reduce_isa_name() noexcept {
  return detail::host_isa_selected() == detail::HostIsa::Avx2 ? "avx2" : "generic";
}

float half_to_float(std::uint16_t h) noexcept { return half_bits::half_to_float(h); }
std::uint16_t float_to_half(float f) noexcept { return half_bits::float_to_half(f); }
float bf16_to_float(std::uint16_t h) noexcept { return half_bits::bf16_to_float(h); }
std::uint16_t float_to_bf16(float f) noexcept { return half_bits::float_to_bf16(f); }

}  // namespace smddp::host_kernels
