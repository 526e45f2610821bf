// Everything that differs between the PyTorch versions the plugin builds against, in one
// place: Debian's 1.13 (the backend is a c10d::ProcessGroup) and 2.x (a c10d::Backend that
// the Python ProcessGroup routes to per device type).
#pragma once

#include <torch/version.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define SMDDP_TORCH_2 1
#else
#define SMDDP_TORCH_2 0
#endif

#include <optional>
#include <vector>

namespace smddp::torch_plugin {

#if SMDDP_TORCH_2
// What the creator hands back to torch.distributed.
using BackendBase = c10d::Backend;
inline constexpr std::chrono::milliseconds kDefaultPgTimeout = kBackendDefaultTimeout;
#else
using BackendBase = c10d::ProcessGroup;
inline constexpr std::chrono::milliseconds kDefaultPgTimeout = kProcessGroupDefaultTimeout;
#endif

// The PREMUL_SUM factor: a double, or a (one-element) tensor read on the host. nullopt when
// the op carries no factor.
inline std::optional<double> premul_factor(const c10d::ReduceOp& op) {
  if (!op.supplement_) {
    return std::nullopt;
  }
  // Every PREMUL_SUM is built by makeNCCLPreMulSum (the only supplement type torch defines).
  const auto* s = static_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
#if SMDDP_TORCH_2
  // 2.x: one tensor (`tensor_factor`).
  if (s->tensor_factor.defined()) {
    return s->tensor_factor.to(at::kCPU).to(at::kDouble).template item<double>();
  }
#else
  // 1.13: one tensor per device of the call (`tensor_factors`).
  if (!s->tensor_factors.empty()) {
    return s->tensor_factors.front().to(at::kCPU).to(at::kDouble).template item<double>();
  }
#endif
  return s->double_factor;
}

}  // namespace smddp::torch_plugin
