// The plugin's GPU path: exports of tensors' memory, the marks that order the daemon's and
// the ranks' work after the caller's stream, completion, and staging buffers for memory that
// cannot be exported. The fast path and the path across nodes have files of their own.
#include "torch_plugin/cuda_support.hpp"

#include <cstdlib>
#include <mutex>

#if SMDDP_PLUGIN_CUDA
#include "torch_plugin/cuda_path_impl.hpp"
#endif

namespace smddp::torch_plugin::gpu {

#if SMDDP_PLUGIN_CUDA

namespace {

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

CudaPath::Impl::Export& CudaPath::Impl::lookup_ptr(void* data, c10::Device device) {
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
                                 double scale, std::shared_ptr<client::gpu::HierOp> hier) {
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
  l.hier = std::move(hier);
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
  // Held behind a hierarchical operation across nodes (client/gpu/peer_executor.hpp): the
  // Work's end is marked on the stream right after, so the plan must be there first.
  if (!impl_->exec->planned(token)) impl_->exec->wait_planned(token);
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

#endif  // SMDDP_PLUGIN_CUDA

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
