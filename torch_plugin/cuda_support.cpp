#include "torch_plugin/cuda_support.hpp"

#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <optional>
#include <map>
#include <unordered_map>
#include <atomic>
#include <chrono>
#include <thread>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "ipc/segment.hpp"
#include "torch_plugin/errors.hpp"

#if SMDDP_PLUGIN_CUDA
#include "client/gpu/arena_copier.hpp"
#include "client/gpu/cuda_util.hpp"
#include "client/gpu/peer_executor.hpp"
#endif

#if SMDDP_PLUGIN_CUDA
#include <torch/version.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

namespace smddp::torch_plugin::gpu {

#if SMDDP_PLUGIN_CUDA

namespace {

// A device current for the scope (torch's guard), and meanwhile other threads' CUDA graph
// captures ignored by our calls (client/gpu/cuda_util.hpp): completions also run on the
// client's progress thread, beside a model that may be capturing on its own thread.
struct OnDevice {
  explicit OnDevice(c10::Device d) : guard(d) {}
  c10::cuda::CUDAGuard guard;
  client::gpu::CaptureModeScope capture;
};

void check(cudaError_t e, const std::string& what) {
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

const Driver& driver() {
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

std::string bus_id_of(int dev) {
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
// cannot be detached from torch's allocator and outlives every process group.
class ExportedSegments {
 public:
  static ExportedSegments& get() {
    static ExportedSegments s;
    return s;
  }
  void add(std::uintptr_t base, std::uint64_t alloc_id, std::weak_ptr<client::Client> client,
           std::weak_ptr<FreedIds> freed_ids) {
    // Attached outside mu_: attaching takes the allocator's locks, under which freed() runs.
    std::call_once(attached_, [] { attach(); });
    std::lock_guard lk(mu_);
    by_base_[base].push_back({alloc_id, std::move(client), std::move(freed_ids)});
  }
  // Runs with torch's allocator lock held: posts to the client's lock-free release list only.
  void freed(std::uintptr_t base) {
    std::vector<Entry> gone;
    {
      std::lock_guard lk(mu_);
      auto it = by_base_.find(base);
      if (it == by_base_.end()) return;
      gone.swap(it->second);
      by_base_.erase(it);
    }
    for (const auto& e : gone) {
      if (auto c = e.client.lock()) c->release_allocation(e.alloc_id);
      if (auto f = e.freed_ids.lock()) {
        std::lock_guard lk(f->mu);
        f->ids.push_back(e.alloc_id);
      }
    }
  }

 private:
  struct Entry {
    std::uint64_t alloc_id = 0;
    std::weak_ptr<client::Client> client;
    std::weak_ptr<FreedIds> freed_ids;  // the exporting CudaPath's
  };
  static void attach() {
#if SMDDP_SEGMENT_TRACE
    namespace alloc = c10::cuda::CUDACachingAllocator;
    alloc::attachAllocatorTraceTracker([](const alloc::TraceEntry& te) {
      if (te.action_ == alloc::TraceEntry::Action::SEGMENT_FREE)
        ExportedSegments::get().freed(static_cast<std::uintptr_t>(te.addr_));
    });
#endif
  }
  std::once_flag attached_;
  std::mutex mu_;
  std::map<std::uintptr_t, std::vector<Entry>> by_base_;
};

}  // namespace

bool compiled() noexcept { return true; }

std::optional<std::string> capture_refusal(c10::Device device) {
  c10::cuda::CUDAGuard g(device);  // the legacy stream is the current device's
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(stream, &status);
  if (e == cudaSuccess && status == cudaStreamCaptureStatusNone) return std::nullopt;  // every call: keep it short
  if (e != cudaSuccess) cudaGetLastError();
  if (e != cudaSuccess && e != cudaErrorStreamCaptureImplicit) return std::nullopt;  // reported where it matters
  const std::string where = "cuda:" + std::to_string(device.index()) + "'s current stream";
  const std::string after =
      ". smddp collectives cannot be captured: the smddp daemon matches and numbers each call when it is "
      "issued, which a replay of the graph would skip. Issue collectives outside the captured region "
      "(torch.compile: a mode without CUDA graphs); nothing was sent, and the group goes on as before";
  if (e == cudaErrorStreamCaptureImplicit)
    return where + " is the legacy default stream, which no call may use while another thread captures a "
                   "CUDA graph" + after;
  return where + (status == cudaStreamCaptureStatusActive ? " is capturing a CUDA graph"
                                                          : " is in a CUDA graph capture that was invalidated") +
         after;
}

std::optional<std::string> current_capture_refusal() {
  if (c10::cuda::device_count() < 1) return std::nullopt;
  const int dev = static_cast<int>(c10::cuda::current_device());
  if (client::gpu::primary_context_inactive(dev)) return std::nullopt;  // nothing of it can be capturing
  return capture_refusal(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(dev)));
}

std::string local_bus_id() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    cudaGetLastError();
    return {};
  }
  // The GPU the rank chose (torch.cuda.set_device to anything but 0), else LOCAL_RANK's, else
  // the current one. Simulated nodes on one machine need the first: every node's local rank 0
  // would otherwise name GPU 0.
  int dev = -1;
  const int chosen = static_cast<int>(c10::cuda::current_device());
  if (chosen > 0 && chosen < n) dev = chosen;
  if (const char* lr = std::getenv("LOCAL_RANK"); dev < 0 && lr && *lr) {
    const int v = std::atoi(lr);
    if (v >= 0 && v < n) dev = v;
  }
  if (dev < 0) dev = chosen;
  return bus_id_of(dev);
}

// Events for Done marks, reused: creating and destroying one per operation costs more than
// the rest of a small collective's completion.
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
    // A peer that died may leave this rank's fast kernels waiting for its flags.
    c->set_failure_handler([weak] {
      if (auto x = weak.lock()) x->release_fast();
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
  Export& lookup_ptr(void* data, c10::Device device) {
    const auto& d = driver();
    if (!d.get_attribute || !d.get_range)
      throw SmddpException(ErrorKind::Unsupported, "smddp: the CUDA driver lacks cuPointerGetAttribute/cuMemGetAddressRange");
    const auto ptr = reinterpret_cast<CUdeviceptr>(data);
    unsigned long long id = 0;
    if (d.get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) != CUDA_SUCCESS) {
      static Export unknown;  // not exportable; the caller stages it
      unknown.why = "cuPointerGetAttribute(BUFFER_ID) failed";
      return unknown;
    }
    for (const auto gone : freed_ids->take()) exports.erase(gone);
    auto it = exports.find(id);
    if (it != exports.end()) return it->second;
    Export x;
    CUdeviceptr base = 0;
    std::size_t size = 0;
    if (d.get_range(&base, &size, ptr) != CUDA_SUCCESS) {
      x.why = "cuMemGetAddressRange failed";
    } else {
      cudaIpcMemHandle_t h{};
      OnDevice g(device);
      const auto e = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base));
      if (e != cudaSuccess) {
        cudaGetLastError();
        x.why = std::string("cudaIpcGetMemHandle: ") + cudaGetErrorString(e) +
                " (memory from PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or a cudaMallocAsync pool cannot be "
                "exported)";
      } else {
        static_assert(sizeof h == 64);
        std::memcpy(x.handle.data(), &h, sizeof h);
        x.ok = true;
        x.base = static_cast<std::uintptr_t>(base);
        x.bytes = size;
        ExportedSegments::get().add(x.base, id, client, freed_ids);
      }
    }
    return exports.emplace(id, std::move(x)).first->second;
  }

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

CudaPath::CudaPath(std::shared_ptr<client::Client> client) : impl_(std::make_unique<Impl>()) {
  impl_->client = client;
  const std::string mode = std::getenv("SMDDP_GPU_SYNC") ? std::getenv("SMDDP_GPU_SYNC") : "";
  impl_->mode = mode == "events" ? Impl::Mode::Events
                 : mode == "host" ? Impl::Mode::HostFlags
                 : mode == "cpu"  ? Impl::Mode::CpuWait
                                  : Impl::Mode::DeviceFlags;
  impl_->use_flags = impl_->mode != Impl::Mode::Events;
  const std::string exec = std::getenv("SMDDP_GPU_EXEC") ? std::getenv("SMDDP_GPU_EXEC") : "";
  if (!exec.empty() && exec != "rank" && exec != "daemon")
    throw SmddpException(ErrorKind::InvalidArgument,
                         "smddp: SMDDP_GPU_EXEC=" + exec + " is not one of rank (the default) or daemon");
  impl_->rank_exec = exec != "daemon";
}

CudaPath::~CudaPath() {
  if (impl_->exec) {
    if (auto c = impl_->client.lock()) {
      c->set_exec_handler(nullptr);
      c->set_failure_handler(nullptr);
    }
    impl_->exec.reset();
  }
  for (auto& e : impl_->events)
    if (e.ev) cudaEventDestroy(e.ev);
  for (auto ev : impl_->daemon_events)
    if (ev) cudaEventDestroy(ev);
  if (impl_->registered) cudaHostUnregister(impl_->registered);
  if (impl_->flag_block) cudaFree(impl_->flag_block);
  for (auto& s : impl_->staging_all) cudaFree(s->ptr);
}

bool CudaPath::exportable(const at::Tensor& t) {
  if (t.numel() == 0) return true;
  std::lock_guard lk(impl_->mu);
  return impl_->lookup(t).ok;
}

client::DeviceBuffer CudaPath::buffer(const at::Tensor& t, const char* op) {
  std::lock_guard lk(impl_->mu);
  const int dev = t.device().index();
  auto bus = impl_->bus_ids.find(dev);
  if (bus == impl_->bus_ids.end()) bus = impl_->bus_ids.emplace(dev, bus_id_of(dev)).first;
  if (impl_->my_bus.empty()) impl_->my_bus = local_bus_id();
  if (bus->second != impl_->my_bus)
    throw_invalid(op, "tensor is on cuda:" + std::to_string(dev) + " (" + bus->second + ") but this rank's GPU is " +
                          impl_->my_bus + " (device LOCAL_RANK); smddp ranks use one GPU each");
  const auto& x = impl_->lookup(t);
  if (!x.ok) throw_unsupported(op, "this tensor's CUDA memory cannot be shared with the smddp daemon: " + x.why);
  client::DeviceBuffer b;
  b.ipc_handle = x.handle;
  b.alloc_bytes = x.bytes;
  b.offset = reinterpret_cast<std::uintptr_t>(t.data_ptr()) - x.base;
  b.bytes = static_cast<std::uint64_t>(t.numel()) * t.element_size();
  unsigned long long id = 0;
  driver().get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, reinterpret_cast<CUdeviceptr>(t.data_ptr()));
  b.alloc_id = id;
  return b;
}

void CudaPath::mark_inputs(c10::Device device, client::DeviceCall& call) {
  const int dev = device.index();
  OnDevice g(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  if (impl_->use_flags) {
    int index = -1;
    std::uint64_t value = 0;
    {
      std::lock_guard lk(impl_->mu);
      impl_->setup_flags(dev);
      auto it = impl_->stream_slot.find(stream);
      if (it == impl_->stream_slot.end()) {
        const int next = static_cast<int>(impl_->stream_slot.size());
        if (next >= impl_->flag_count)
          throw SmddpException(ErrorKind::Unsupported, "smddp: more than " + std::to_string(impl_->flag_count) +
                                                           " CUDA streams issued collectives in this process");
        it = impl_->stream_slot.emplace(stream, next).first;
      }
      index = it->second;
      // One flag per stream, values increasing: a value reached means every earlier write on
      // that stream (and the work before it) is done.
      value = ++impl_->flag_values[static_cast<std::size_t>(index)];
      const auto addr = impl_->flags_dev + static_cast<std::uintptr_t>(index) * sizeof(std::uint64_t);
      if (impl_->write_value(reinterpret_cast<CUstream>(stream), static_cast<CUdeviceptr>(addr), value, 0) != CUDA_SUCCESS)
        throw SmddpException(ErrorKind::Internal, "smddp: cuStreamWriteValue64 failed");
    }
    call.stream_value = true;
    call.device_flags = impl_->mode == Impl::Mode::DeviceFlags;
    call.daemon_cpu_wait = impl_->mode == Impl::Mode::CpuWait;
    call.wait_event = index;
    call.wait_value = value;
    return;
  }
  (void)dev;
  call.wait_event = record_input_event(device, stream);
}

bool CudaPath::rank_exec() const noexcept { return impl_->rank_exec; }

void CudaPath::prepare_rank_exec(c10::Device device, client::DeviceCall& call, void* local_in, void* local_out,
                                 double scale) {
  OnDevice g(device);
  client::gpu::PeerExecutor* x = nullptr;
  {
    std::lock_guard lk(impl_->mu);
    x = &impl_->executor(device.index());
  }
  client::gpu::LocalOp l;
  l.op = call.op;
  l.dtype = call.dtype;
  l.reduce_op = call.reduce_op;
  l.scale = scale;
  l.root = call.root;
  l.count = call.count;
  l.in = local_in;
  l.out = local_out;
  try {
    l.ready = x->record_ready(c10::cuda::getCurrentCUDAStream(device.index()).stream());
  } catch (const std::exception& e) {
    throw SmddpException(ErrorKind::Internal, std::string("smddp: ") + e.what());
  }
  call.rank_exec = true;
  call.exec_token = impl_->next_token.fetch_add(1);
  call.wait_value = client::gpu::PeerExecutor::schedule_key();  // the daemon compares the members
  x->expect(call.exec_token, l);
}

void CudaPath::forget_rank_exec(std::uint64_t token) {
  if (impl_->exec) impl_->exec->forget(token);
}

std::optional<std::string> CudaPath::run_rank_exec(std::uint64_t token) {
  if (!impl_->exec) return std::string("smddp: no rank-side GPU executor");
  impl_->exec->drain();
  return impl_->exec->take_error(token);
}

void* CudaPath::staging_ptr(const std::shared_ptr<Staging>& s) { return s ? s->ptr : nullptr; }

int CudaPath::record_input_event(c10::Device device, void* stream_ptr) {
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  const int dev = device.index();
  int index = -1;
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard lk(impl_->mu);
    auto& fl = impl_->free_events[dev];
    if (!fl.empty()) {
      index = fl.back();
      fl.pop_back();
      ev = impl_->events[static_cast<std::size_t>(index)].ev;
    } else {
      check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess), "cudaEventCreate");
      cudaIpcEventHandle_t h{};
      check(cudaIpcGetEventHandle(&h, ev), "cudaIpcGetEventHandle");
      std::array<std::uint8_t, 64> bytes{};
      std::memcpy(bytes.data(), &h, sizeof h);
      try {
        index = impl_->locked()->export_event(bytes);
      } catch (const client::Error& e) {
        cudaEventDestroy(ev);
        throw from_client_error("collective", e.status(), e.what());
      }
      if (static_cast<std::size_t>(index) >= impl_->events.size()) impl_->events.resize(static_cast<std::size_t>(index) + 1);
      impl_->events[static_cast<std::size_t>(index)] = {ev, dev};
    }
  }
  check(cudaEventRecord(ev, stream), "cudaEventRecord");
  return index;
}

void CudaPath::release_event(int index) {
  std::lock_guard lk(impl_->mu);
  if (index < 0 || static_cast<std::size_t>(index) >= impl_->events.size()) return;
  impl_->free_events[impl_->events[static_cast<std::size_t>(index)].device].push_back(index);
}

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

namespace {
// The executor's view of a fast-path call (members filled in by the caller).
client::gpu::FastOp fast_op_of(const client::DeviceCall& call, const at::Tensor& in, const at::Tensor& out,
                               double scale) {
  client::gpu::FastOp f;
  f.op = call.op;
  f.dtype = call.dtype;
  f.reduce_op = call.reduce_op;
  f.scale = scale;
  f.count = call.count;
  f.in = in.data_ptr();
  f.out = out.data_ptr();
  return f;
}
}  // namespace

bool CudaPath::fast_eligible(const client::DeviceCall& call, const at::Tensor& in, const at::Tensor& out,
                             double scale, int group_size) const {
  if (!impl_->rank_exec || group_size < 2) return false;
  auto f = fast_op_of(call, in, out, scale);
  f.slots.assign(static_cast<std::size_t>(group_size), 0);
  return client::gpu::PeerExecutor::fast_eligible(f);
}

std::pair<client::WorkPtr, std::shared_ptr<CudaPath::FastMark>> CudaPath::run_fast(
    c10::Device device, const client::DeviceCall& call, const at::Tensor& in, const at::Tensor& out, double scale,
    const std::vector<int>& slots, int me, bool on_caller_stream, bool copy_engines,
    const std::function<client::WorkPtr(std::uint64_t fast_seq)>& post) {
  OnDevice g(device);
  std::shared_ptr<client::gpu::PeerExecutor> x;
  {
    std::lock_guard lk(impl_->mu);
    impl_->executor(device.index());
    x = impl_->exec;
  }
  auto f = fast_op_of(call, in, out, scale);
  f.slots = slots;
  f.me = me;
  f.copy_engines = copy_engines;
  const auto fail = [&](const std::string& why) {
    throw SmddpException(ErrorKind::Internal, "smddp " + std::string(ipc::to_string(call.op)) + ": " + why);
  };
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  std::lock_guard order(impl_->fast_mu);
  f.seq = x->reserve_fast_seq();
  client::WorkPtr op;
  try {
    // A rank whose path is off says so, and the daemon's error stops the others as well.
    op = post(x->fast_off() ? ipc::kFastSeqOff : f.seq);
  } catch (...) {
    // The peers posted theirs and their kernels wait for this rank's flags.
    try {
      x->run_fast(f, stream, on_caller_stream, /*dry_only=*/true);
    } catch (const std::exception&) {
      // It always throws; the request's own error is the one to report.
    }
    throw;
  }
  try {
    // Only before the first fast op of a member that has not started its GPU path yet.
    for (int spin = 0; !x->fast_off() && !x->fast_ready(slots); ++spin) {
      if (op->done() && op->status() != client::Status::Ok) {
        x->release_fast();  // the others got the same answer and release theirs
        fail(op->error());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(spin < 100 ? 10 : 1000));
    }
    auto mark = std::make_shared<FastMark>();
    const auto launched = x->run_fast(f, stream, on_caller_stream);
    mark->stream = launched.stream;
    mark->event = launched.done;
    mark->exec = x;
    if (!on_caller_stream) {
      // Another stream uses the tensors: their blocks must not go to new owners on the
      // caller's stream before it passed this op (as ProcessGroupNCCL records its stream).
      const auto side = c10::cuda::getStreamFromExternal(launched.stream, device.index());
      for (const at::Tensor* t : {&in, &out})
        c10::cuda::CUDACachingAllocator::recordStream(t->storage().data_ptr(), side);
    }
    return {std::move(op), std::move(mark)};
  } catch (const SmddpException&) {
    throw;
  } catch (const std::exception& e) {
    x->release_fast();  // whatever failed here, this rank stops taking the path
    fail(e.what());
  }
  return {};  // not reached: fail() throws
}

void CudaPath::block_current_stream(const std::shared_ptr<FastMark>& mark, c10::Device device) {
  if (!mark) return;
  OnDevice g(device);
  mark->order(c10::cuda::getCurrentCUDAStream(device.index()).stream());
}

void CudaPath::on_stream_of(const std::shared_ptr<FastMark>& mark, c10::Device device,
                            const std::function<void()>& body) {
  OnDevice g(device);
  c10::cuda::CUDAStreamGuard sg(c10::cuda::getStreamFromExternal(mark->stream, device.index()));
  body();
}

void CudaPath::release_fast() {
  std::shared_ptr<client::gpu::PeerExecutor> x;
  {
    std::lock_guard lk(impl_->mu);
    x = impl_->exec;
  }
  if (x) x->release_fast();
}

std::shared_ptr<CudaPath::Done> CudaPath::complete(c10::Device device, const std::vector<DoneMark>& daemon_done,
                                                   const std::vector<at::Tensor>& used,
                                                   const std::function<void()>& body,
                                                   const std::shared_ptr<FastMark>& after) {
  OnDevice g(device);
  std::optional<c10::cuda::CUDAStream> stream;
  {
    std::lock_guard lk(impl_->mu);
    stream = impl_->completion_stream(device.index());
    if (after) after->order(stream->stream());
    for (const auto& d : daemon_done) {
      if (d.value > 0) {
        // The daemon's GPU writes the done flag after the work; wait for it on our GPU.
        impl_->setup_flags(device.index());
        if (impl_->wait_value(reinterpret_cast<CUstream>(stream->stream()), static_cast<CUdeviceptr>(impl_->done_dev),
                              d.value, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS)
          throw SmddpException(ErrorKind::Internal, "smddp: cuStreamWaitValue64 failed");
      } else if (d.event >= 0) {
        check(cudaStreamWaitEvent(stream->stream(), impl_->daemon_event(d.event, device.index()), 0),
              "cudaStreamWaitEvent");
      }
    }
  }
  // The daemon used these until its event: the allocator must not hand them out to another
  // stream before the completion stream passed that point.
  for (const auto& t : used)
    if (t.defined() && t.is_cuda() && t.has_storage())
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), *stream);
  {
    c10::cuda::CUDAStreamGuard sg(*stream);
    body();
  }
  auto done = std::make_shared<Done>();
  done->device = device.index();
  done->pool = impl_->done_events;
  done->event = done->pool->take(done->device);
  check(cudaEventRecord(done->event, stream->stream()), "cudaEventRecord");
  return done;
}

std::shared_ptr<CudaPath::Staging> CudaPath::stage_in(c10::Device device, std::size_t bytes, const at::Tensor* copy_from) {
  OnDevice g(device);
  std::shared_ptr<Staging> s;
  {
    std::lock_guard lk(impl_->mu);
    for (auto it = impl_->staging_free.lower_bound(bytes); it != impl_->staging_free.end(); ++it) {
      if (it->second->device == device.index()) {
        s = it->second;
        impl_->staging_free.erase(it);
        break;
      }
    }
    if (!s) {
      s = std::make_shared<Staging>();
      s->device = device.index();
      s->bytes = std::max<std::size_t>(bytes, 1 << 20);
      s->bytes = (s->bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
      check(cudaMalloc(&s->ptr, s->bytes), "cudaMalloc of a staging buffer (" + std::to_string(s->bytes) + " bytes)");
      impl_->staging_all.push_back(s);
    }
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  if (s->last_done) check(cudaStreamWaitEvent(stream, s->last_done->event, 0), "cudaStreamWaitEvent");
  s->last_done.reset();
  if (copy_from) check(cudaMemcpyAsync(s->ptr, copy_from->data_ptr(), bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
  return s;
}

client::DeviceBuffer CudaPath::staging_buffer(const std::shared_ptr<Staging>& s, std::size_t bytes) {
  std::lock_guard lk(impl_->mu);
  const auto& x = impl_->lookup_ptr(s->ptr, c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(s->device)));
  if (!x.ok) throw SmddpException(ErrorKind::Internal, "smddp: a staging buffer cannot be exported: " + x.why);
  client::DeviceBuffer b;
  b.ipc_handle = x.handle;
  b.alloc_bytes = x.bytes;
  b.offset = reinterpret_cast<std::uintptr_t>(s->ptr) - x.base;
  b.bytes = bytes;
  unsigned long long id = 0;
  driver().get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, reinterpret_cast<CUdeviceptr>(s->ptr));
  b.alloc_id = id;
  return b;
}

void CudaPath::copy_out(const std::shared_ptr<Staging>& s, const at::Tensor& to) {
  const auto bytes = static_cast<std::size_t>(to.numel()) * to.element_size();
  if (bytes == 0) return;
  check(cudaMemcpyAsync(to.data_ptr(), s->ptr, bytes, cudaMemcpyDeviceToDevice,
                        c10::cuda::getCurrentCUDAStream(to.device().index()).stream()),
        "cudaMemcpyAsync");
}

void CudaPath::release_staging(std::shared_ptr<Staging> s, std::shared_ptr<Done> done) {
  std::lock_guard lk(impl_->mu);
  s->last_done = std::move(done);
  impl_->staging_free.emplace(s->bytes, std::move(s));
}

void CudaPath::block_current_stream(const std::shared_ptr<Done>& done, c10::Device device) {
  if (!done) return;
  OnDevice g(device);
  check(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(device.index()).stream(), done->event, 0), "cudaStreamWaitEvent");
}

std::shared_ptr<client::StagingCopier> CudaPath::arena_copier(c10::Device device, const void* in, void* out) {
  std::shared_ptr<client::gpu::ArenaCopyLanes> lanes;
  {
    std::lock_guard lk(impl_->mu);
    const auto client = impl_->locked();
    auto [arena, bytes] = client->arena_region();
    auto& l = impl_->arena_lanes;
    if (l && (l->device() != device.index() || !l->covers(arena, bytes)))
      throw SmddpException(ErrorKind::InvalidArgument, "smddp: this rank already stages CUDA tensors across nodes from cuda:" +
                                                           std::to_string(l->device()) + ", not cuda:" +
                                                           std::to_string(device.index()) + " (one GPU per rank)");
    try {
      if (!l) {
        l = std::make_shared<client::gpu::ArenaCopyLanes>(device.index(), arena, bytes);
        // The registration must go before the client unmaps the arena.
        std::weak_ptr<client::gpu::ArenaCopyLanes> weak = l;
        client->set_arena_release([weak] {
          if (auto x = weak.lock()) x->release_arena();
        });
      }
    } catch (const std::exception& e) {
      throw SmddpException(ErrorKind::Internal, std::string("smddp: cannot stage CUDA tensors across nodes: ") + e.what());
    }
    lanes = l;
  }
  OnDevice g(device);
  try {
    return lanes->copier(in, out, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  } catch (const std::exception& e) {
    throw SmddpException(ErrorKind::Internal, std::string("smddp: ") + e.what());
  }
}

void CudaPath::after_arena_copies(client::StagingCopier& copier, c10::Device device) {
  OnDevice g(device);
  try {
    client::gpu::ArenaCopyLanes::order_after(copier, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  } catch (const std::exception& e) {
    throw SmddpException(ErrorKind::Internal, std::string("smddp: ") + e.what());
  }
}

std::shared_ptr<CudaPath::Done> CudaPath::complete_after_copies(c10::Device device, client::StagingCopier& copier,
                                                                const std::vector<at::Tensor>& used,
                                                                const std::function<void()>& body) {
  OnDevice g(device);
  const auto lane = c10::cuda::getStreamFromExternal(client::gpu::ArenaCopyLanes::out_stream(copier), device.index());
  // The copies out write the outputs there: their blocks must not go to new owners before.
  for (const auto& t : used)
    if (t.defined() && t.is_cuda() && t.has_storage())
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), lane);
  {
    c10::cuda::CUDAStreamGuard sg(lane);
    body();
  }
  auto done = std::make_shared<Done>();
  done->device = device.index();
  done->pool = impl_->done_events;
  done->event = done->pool->take(done->device);
  check(cudaEventRecord(done->event, lane.stream()), "cudaEventRecord");
  return done;
}

#else  // no CUDA in this torch

bool compiled() noexcept { return false; }
std::optional<std::string> capture_refusal(c10::Device) { return std::nullopt; }
std::optional<std::string> current_capture_refusal() { return std::nullopt; }
std::string local_bus_id() { return {}; }
struct CudaPath::Impl {};
struct CudaPath::Done {};
CudaPath::CudaPath(std::shared_ptr<client::Client>) {}
CudaPath::~CudaPath() = default;
bool CudaPath::exportable(const at::Tensor&) { return false; }
client::DeviceBuffer CudaPath::buffer(const at::Tensor&, const char* op) {
  throw_unsupported(op, "this smddp build has no GPU path (torch without CUDA)");
}
void CudaPath::mark_inputs(c10::Device, client::DeviceCall&) {}
bool CudaPath::rank_exec() const noexcept { return false; }
void CudaPath::prepare_rank_exec(c10::Device, client::DeviceCall&, void*, void*, double) {}
void CudaPath::forget_rank_exec(std::uint64_t) {}
std::optional<std::string> CudaPath::run_rank_exec(std::uint64_t) { return std::nullopt; }
void* CudaPath::staging_ptr(const std::shared_ptr<Staging>&) { return nullptr; }
void CudaPath::release_event(int) {}
std::shared_ptr<CudaPath::Done> CudaPath::complete(c10::Device, const std::vector<DoneMark>&, const std::vector<at::Tensor>&,
                                                   const std::function<void()>& body, const std::shared_ptr<FastMark>&) {
  body();
  return nullptr;
}
struct CudaPath::FastMark {};
bool CudaPath::fast_eligible(const client::DeviceCall&, const at::Tensor&, const at::Tensor&, double, int) const {
  return false;
}
std::pair<client::WorkPtr, std::shared_ptr<CudaPath::FastMark>> CudaPath::run_fast(
    c10::Device, const client::DeviceCall&, const at::Tensor&, const at::Tensor&, double, const std::vector<int>&, int,
    bool, bool, const std::function<client::WorkPtr(std::uint64_t)>&) {
  return {};
}
void CudaPath::block_current_stream(const std::shared_ptr<FastMark>&, c10::Device) {}
void CudaPath::on_stream_of(const std::shared_ptr<FastMark>&, c10::Device, const std::function<void()>& body) { body(); }
void CudaPath::release_fast() {}
void CudaPath::block_current_stream(const std::shared_ptr<Done>&, c10::Device) {}
struct CudaPath::Staging {};
std::shared_ptr<CudaPath::Staging> CudaPath::stage_in(c10::Device, std::size_t, const at::Tensor*) { return nullptr; }
client::DeviceBuffer CudaPath::staging_buffer(const std::shared_ptr<Staging>&, std::size_t) { return {}; }
void CudaPath::copy_out(const std::shared_ptr<Staging>&, const at::Tensor&) {}
void CudaPath::release_staging(std::shared_ptr<Staging>, std::shared_ptr<Done>) {}
std::shared_ptr<client::StagingCopier> CudaPath::arena_copier(c10::Device, const void*, void*) {
  throw SmddpException(ErrorKind::Unsupported, "smddp: this smddp build has no GPU path (torch without CUDA)");
}
void CudaPath::after_arena_copies(client::StagingCopier&, c10::Device) {}
std::shared_ptr<CudaPath::Done> CudaPath::complete_after_copies(c10::Device, client::StagingCopier&,
                                                                const std::vector<at::Tensor>&,
                                                                const std::function<void()>& body) {
  body();
  return nullptr;
}

#endif

std::shared_ptr<CudaPath> path_for(const std::shared_ptr<client::Client>& client) {
  static std::mutex mu;
  static std::weak_ptr<client::Client> owner;
  static std::shared_ptr<CudaPath> path;
  std::lock_guard lk(mu);
  if (!path || owner.lock() != client) {
    path = std::make_shared<CudaPath>(client);
    owner = client;
  }
  return path;
}

}  // namespace smddp::torch_plugin::gpu
