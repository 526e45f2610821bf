// Small CUDA runtime helpers shared by the rank side of the GPU path.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <optional>
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

// Whether this process holds no primary context on device `dev`, by the driver (false where
// the driver cannot say). cudaSetDevice creates one (since CUDA 12.0): about 0.5 GiB of that
// GPU and 100 ms or more.
inline bool primary_context_inactive(int dev) {
  using Get = CUresult (*)(CUdevice*, int);
  using State = CUresult (*)(CUdevice, unsigned int*, int*);
  static const Get get = driver_entry<Get>("cuDeviceGet");
  static const State state = driver_entry<State>("cuDevicePrimaryCtxGetState");
  CUdevice d{};
  unsigned int flags = 0;
  int active = 1;
  if (!get || !state || get(&d, dev) != CUDA_SUCCESS || state(d, &flags, &active) != CUDA_SUCCESS) return false;
  return active == 0;
}

// Makes `prev` the thread's device again after it moved to another one, unless this process
// holds no context on `prev` (a thread that never chose a device reports 0): setting it would
// create GPU `prev`'s context in this rank's process. Such a thread keeps the device it has.
inline void restore_device(int prev) noexcept {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != prev && !primary_context_inactive(prev)) cudaSetDevice(prev);
}

// For its scope, this thread's CUDA calls ignore stream captures that other threads run
// (cudaStreamCaptureModeThreadLocal), as ProcessGroupNCCL's watchdog does. In the default
// (global) mode, while any thread captures a CUDA graph in global mode (torch.cuda.graph's
// default), a "potentially unsafe" call here (cudaEventQuery, cudaIpcOpenMemHandle, ...) fails
// and breaks that capture, although our streams take no part in it. A capture on this thread
// itself still forbids them. Make the thread's device current first: the call needs its context.
class CaptureModeScope {
 public:
  CaptureModeScope() noexcept {
    if (cudaThreadExchangeStreamCaptureMode(&prev_) != cudaSuccess) {
      cudaGetLastError();
      swapped_ = false;
    }
  }
  ~CaptureModeScope() {
    if (swapped_) cudaThreadExchangeStreamCaptureMode(&prev_);
  }
  CaptureModeScope(const CaptureModeScope&) = delete;
  CaptureModeScope& operator=(const CaptureModeScope&) = delete;

 private:
  cudaStreamCaptureMode prev_ = cudaStreamCaptureModeThreadLocal;  // swapped in; then the caller's
  bool swapped_ = true;
};

// Makes `dev` current for the scope and restores the caller's device (torch tracks its own;
// see restore_device for threads that never chose one, such as our progress thread). Our
// CUDA work runs on streams of its own, so the scope also ignores other threads' captures.
class DeviceScope {
 public:
  explicit DeviceScope(int dev) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != dev) check(cudaSetDevice(dev), "cudaSetDevice");
    capture_.emplace();
  }
  ~DeviceScope() {
    capture_.reset();  // before the device changes back: it belongs to this one
    restore_device(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  std::optional<CaptureModeScope> capture_;
  int prev_ = 0;
};

}  // namespace smddp::client::gpu
