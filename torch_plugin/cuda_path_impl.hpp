// Internals of the plugin's GPU path (cuda_support.hpp), shared by its files:
// cuda_support.cpp (exports, events, completion, staging buffers), cuda_fast_path.cpp (the
// fast path), cuda_across_nodes.cpp (CUDA tensors in groups that span nodes). Only in builds
// whose torch has CUDA (SMDDP_PLUGIN_CUDA).
#pragma once

#if SMDDP_PLUGIN_CUDA

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <torch/version.h>

#include "client/gpu/arena_copier.hpp"
#include "client/gpu/cuda_util.hpp"
#include "client/gpu/peer_executor.hpp"
#include "ipc/segment.hpp"
#include "torch_plugin/cuda_support.hpp"
#include "torch_plugin/errors.hpp"

namespace smddp::torch_plugin::gpu {

// A device current for the scope (torch's guard), and meanwhile other threads' CUDA graph
// captures ignored by our calls (client/gpu/cuda_util.hpp): completions also run on the
// client's progress thread, beside a model that may be capturing on its own thread.
struct OnDevice {
  explicit OnDevice(c10::Device d) : guard(d) {}
  c10::cuda::CUDAGuard guard;
  client::gpu::CaptureModeScope capture;
};

inline void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw SmddpException(ErrorKind::Internal, "smddp: " + what + ": " + cudaGetErrorString(e));
  }
}

// Driver entry points reached through the runtime (no link against libcuda).
struct Driver {
  using GetAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  using GetRange = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);
  GetAttribute get_attribute = nullptr;
  GetRange get_range = nullptr;
};

inline const Driver& driver() {
  static const Driver d = [] {
    Driver x;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      x.get_attribute = reinterpret_cast<Driver::GetAttribute>(fn);
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      x.get_range = reinterpret_cast<Driver::GetRange>(fn);
    cudaGetLastError();
    return x;
  }();
  return d;
}

inline std::string bus_id_of(int dev) {
  char bus[64] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return bus;
}

// torch's allocator calls its trace trackers when it frees a segment (torch >= 2.1); ranks
// that mapped one of ours must then close the mapping, or its memory stays held on our GPU.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define SMDDP_SEGMENT_TRACE 1
#else
#define SMDDP_SEGMENT_TRACE 0
#endif

// Buffer ids of exported allocations torch has freed since a CudaPath last looked: its export
// cache drops them (ids are never reused, so an entry for a freed one would only take room).
struct FreedIds {
  std::mutex mu;  // taken under torch's allocator lock: nothing else is taken under it
  std::vector<std::uint64_t> ids;
  std::vector<std::uint64_t> take() {
    std::lock_guard lk(mu);
    return std::exchange(ids, {});
  }
};

// The allocations this process exported, by base address: process-wide, because a tracker

struct DoneEventPool {
  std::mutex mu;
  std::map<int, std::vector<cudaEvent_t>> free;  // by device
  cudaEvent_t take(int device) {
    {
      std::lock_guard lk(mu);
      auto& f = free[device];
      if (!f.empty()) {
        cudaEvent_t ev = f.back();
        f.pop_back();
        return ev;
      }
    }
    cudaEvent_t ev = nullptr;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    return ev;
  }
  void give(int device, cudaEvent_t ev) {
    std::lock_guard lk(mu);
    free[device].push_back(ev);
  }
  ~DoneEventPool() {
    for (auto& [dev, evs] : free)
      for (auto ev : evs) cudaEventDestroy(ev);
  }
};

struct CudaPath::Done {
  cudaEvent_t event = nullptr;
  int device = 0;
  std::shared_ptr<DoneEventPool> pool;
  ~Done() {
    if (event && pool) pool->give(device, event);
    else if (event) cudaEventDestroy(event);
  }
};

struct CudaPath::Staging {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  int device = 0;
  std::shared_ptr<Done> last_done;
};

struct CudaPath::FastMark {
  cudaStream_t stream = nullptr;  // what the kernel ran on
  cudaEvent_t event = nullptr;    // after it; null when it ran on its caller's stream
  std::weak_ptr<client::gpu::PeerExecutor> exec;  // its event pool
  ~FastMark() {
    if (auto x = exec.lock()) x->release_event(event);
  }
  // Makes `waiter` wait for the op.
  void order(cudaStream_t waiter) const {
    if (waiter == stream) return;
    if (auto x = exec.lock()) {
      try {
        x->order_after(waiter, stream, event);
      } catch (const std::exception& e) {
        throw SmddpException(ErrorKind::Internal, std::string("smddp: ") + e.what());
      }
      return;
    }
    throw SmddpException(ErrorKind::Internal, "smddp: the GPU path is gone");
  }
};


struct CudaPath::Impl {
  std::multimap<std::size_t, std::shared_ptr<Staging>> staging_free;  // by size
  std::vector<std::shared_ptr<Staging>> staging_all;
  std::weak_ptr<client::Client> client;  // the process group owns it
  std::mutex mu;
  std::shared_ptr<client::Client> locked() {
    auto c = client.lock();
    if (!c) throw SmddpException(ErrorKind::Shutdown, "smddp: the process group was destroyed");
    return c;
  }
  struct Export {
    bool ok = false;
    std::array<std::uint8_t, 64> handle{};
    std::uintptr_t base = 0;
    std::uint64_t bytes = 0;
    std::string why;
  };
  std::unordered_map<std::uint64_t, Export> exports;  // by buffer id
  std::shared_ptr<FreedIds> freed_ids = std::make_shared<FreedIds>();
  struct Event {
    cudaEvent_t ev = nullptr;
    int device = 0;
  };
  std::vector<Event> events;                 // by table index
  std::map<int, std::vector<int>> free_events;  // device -> indices
  std::vector<cudaEvent_t> daemon_events;    // by index, opened lazily
  std::map<int, c10::cuda::CUDAStream> completion;  // device -> pool stream
  std::shared_ptr<DoneEventPool> done_events = std::make_shared<DoneEventPool>();
  std::mutex fast_mu;  // numbering, posting and enqueuing a fast op, as one step
  std::map<int, std::string> bus_ids;        // device -> PCI bus id
  std::string my_bus;
  // Stream-flag modes: flags in a GPU block we allocate and export (default: the GPU re-polls
  // its own memory at once), or in our slot of the segment registered with CUDA ("host":
  // polled every few ms). Interprocess events ("events") are polled as slowly.
  // "cpu": host flags, and the daemon waits for them on its CPU (kFlagDaemonCpuWait), so its
  // GPU streams never block on our context (see ipc/protocol.hpp).
  enum class Mode { DeviceFlags, HostFlags, CpuWait, Events };
  Mode mode = Mode::DeviceFlags;
  bool use_flags = true;
  // Rank-side execution (the default): the executor of this rank's GPU, and the tokens
  // that tie a submitted call to the plan the daemon answers with.
  bool rank_exec = true;
  std::shared_ptr<client::gpu::PeerExecutor> exec;
  // Across nodes: the arena, registered with CUDA, and the copy streams (first use).
  std::shared_ptr<client::gpu::ArenaCopyLanes> arena_lanes;
  std::atomic<std::uint64_t> next_token{1};
  client::gpu::PeerExecutor& executor(int device) {
    if (exec) {
      if (exec->device() != device)
        throw SmddpException(ErrorKind::InvalidArgument, "smddp: this rank already runs GPU collectives on cuda:" +
                                                             std::to_string(exec->device()) + ", not cuda:" +
                                                             std::to_string(device) + " (one GPU per rank)");
      return *exec;
    }
    auto c = locked();
    try {
      exec = std::make_shared<client::gpu::PeerExecutor>(c, device, completion_stream(device).stream());
    } catch (const std::exception& e) {
      throw SmddpException(ErrorKind::Internal, std::string("smddp: cannot start the rank-side GPU path: ") + e.what());
    }
    std::weak_ptr<client::gpu::PeerExecutor> weak = exec;
    c->set_exec_handler([weak](std::uint64_t token, const ipc::CompletionDesc& done) {
      if (auto x = weak.lock()) x->on_completion(token, done);
    });
    // A peer that died may leave this rank's GPU work waiting for its flags.
    c->set_failure_handler([weak] {
      if (auto x = weak.lock()) x->release_all();
    });
    return *exec;
  }
  void* flag_block = nullptr;
  bool flags_ready = false;
  std::uint64_t* flags_host = nullptr;  // stream_flags[]
  std::uintptr_t flags_dev = 0;
  std::uint64_t* done_host = nullptr;
  std::uintptr_t done_dev = 0;
  void* registered = nullptr;
  int flag_count = 0;
  std::unordered_map<cudaStream_t, int> stream_slot;  // stream -> flag index
  std::vector<std::uint64_t> flag_values;             // last value written per flag
  using StreamValue = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  StreamValue wait_value = nullptr, write_value = nullptr;

  void setup_flags(int device) {
    if (flags_ready) return;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      wait_value = reinterpret_cast<StreamValue>(fn);
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      write_value = reinterpret_cast<StreamValue>(fn);
    cudaGetLastError();
    if (!wait_value || !write_value)
      throw SmddpException(ErrorKind::Unsupported, "smddp: the CUDA driver lacks stream memory operations; set SMDDP_GPU_SYNC=events");
    if (mode == Mode::DeviceFlags) {
      OnDevice g(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
      // Outside torch's allocator: exportable whatever PYTORCH_CUDA_ALLOC_CONF says.
      check(cudaMalloc(&flag_block, ipc::kFlagBlockBytes), "cudaMalloc of the smddp flag block");
      check(cudaMemset(flag_block, 0, ipc::kFlagBlockBytes), "cudaMemset");
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      cudaIpcMemHandle_t h{};
      check(cudaIpcGetMemHandle(&h, flag_block), "cudaIpcGetMemHandle of the smddp flag block");
      std::array<std::uint8_t, 64> bytes{};
      std::memcpy(bytes.data(), &h, sizeof h);
      locked()->publish_flag_block(bytes);
      flags_dev = reinterpret_cast<std::uintptr_t>(flag_block);
      done_dev = flags_dev + static_cast<std::uintptr_t>(ipc::kMaxEvents) * sizeof(std::uint64_t);
      flag_count = ipc::kMaxEvents;
      flag_values.assign(static_cast<std::size_t>(flag_count), 0);
      flags_ready = true;
      return;
    }
    auto area = locked()->gpu_sync_area();
    if (!area) throw SmddpException(ErrorKind::Unsupported, "smddp: the client has no GPU sync area");
    check(cudaHostRegister(area->region, area->bytes, cudaHostRegisterMapped | cudaHostRegisterPortable),
          "cudaHostRegister of the smddp segment (set SMDDP_GPU_SYNC=events to avoid it)");
    registered = area->region;
    void* dev = nullptr;
    check(cudaHostGetDevicePointer(&dev, area->region, 0), "cudaHostGetDevicePointer");
    const auto base = reinterpret_cast<std::uintptr_t>(area->region);
    const auto dbase = reinterpret_cast<std::uintptr_t>(dev);
    flags_host = area->stream_flags;
    flags_dev = dbase + (reinterpret_cast<std::uintptr_t>(area->stream_flags) - base);
    done_host = area->done_flag;
    done_dev = dbase + (reinterpret_cast<std::uintptr_t>(area->done_flag) - base);
    flag_count = area->stream_flag_count;
    flag_values.assign(static_cast<std::size_t>(flag_count), 0);
    flags_ready = true;
  }

  Export& lookup(const at::Tensor& t) { return lookup_ptr(t.data_ptr(), t.device()); }
  Export& lookup_ptr(void* data, c10::Device device);  // cuda_support.cpp

  cudaEvent_t daemon_event(int index, int device) {
    if (static_cast<std::size_t>(index) >= daemon_events.size()) daemon_events.resize(static_cast<std::size_t>(index) + 1, nullptr);
    auto& ev = daemon_events[static_cast<std::size_t>(index)];
    if (!ev) {
      auto h = locked()->daemon_event_handle(index);
      if (!h) throw SmddpException(ErrorKind::Internal, "smddp: the daemon named event " + std::to_string(index) + " but never published it");
      cudaIpcEventHandle_t eh{};
      std::memcpy(&eh, h->data(), sizeof eh);
      OnDevice g(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
      check(cudaIpcOpenEventHandle(&ev, eh), "cannot open the daemon's CUDA event");
    }
    return ev;
  }

  c10::cuda::CUDAStream completion_stream(int device) {
    auto it = completion.find(device);
    // High priority, as NCCL's: collectives should not queue behind the model's kernels.
    if (it == completion.end())
      it = completion.emplace(device, c10::cuda::getStreamFromPool(true, static_cast<c10::DeviceIndex>(device))).first;
    return it->second;
  }
};

}  // namespace smddp::torch_plugin::gpu

#endif  // SMDDP_PLUGIN_CUDA
