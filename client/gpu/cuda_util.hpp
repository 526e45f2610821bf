// Small CUDA runtime helpers shared by the rank side of the GPU path.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace smddp::client::gpu {

inline void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it so the next call is judged on its own
    throw std::runtime_error(what + ": " + cudaGetErrorString(e));
  }
}

// A driver API function through the runtime's entry points (no libcuda link), or null where
// the driver lacks it. `Fn` is its pointer type.
template <class Fn>
Fn driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  const bool ok = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
                  q == cudaDriverEntryPointSuccess;
  cudaGetLastError();  // a missing entry point must not linger as the last error
  return ok ? reinterpret_cast<Fn>(fn) : nullptr;
}

// Makes `dev` current for the scope and restores the caller's device (torch tracks its own).
class DeviceScope {
 public:
  explicit DeviceScope(int dev) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != dev) check(cudaSetDevice(dev), "cudaSetDevice");
  }
  ~DeviceScope() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != prev_) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace smddp::client::gpu
