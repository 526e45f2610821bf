#include "daemon/cuda/gpu_executor.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <cstring>
#include <spdlog/spdlog.h>
#include <stdexcept>

#include "daemon/alltoall_splits.hpp"
#include "kernels/device_kernels.hpp"

namespace smddp::daemon::cuda {

using kernels::CopyArgs;
using kernels::kMaxKernelInputs;
using kernels::launch_copy;
using kernels::launch_reduce;
using kernels::ReduceArgs;

using ipc::BufferKind;
using ipc::OpType;

bool is_device_request(const ipc::RequestDesc& d) noexcept {
  return d.input.kind == BufferKind::CudaIpc || d.output.kind == BufferKind::CudaIpc;
}

namespace {

// Daemon events per rank, used round robin. Re-recording one a rank has not waited on yet
// only makes that wait later (same stream, later point), never wrong.
constexpr int kDaemonEventsPerRank = 32;
// AllReduce up to this size per rank runs one-shot (one kernel on one GPU).
constexpr std::uint64_t kOneShotBytes = 256 << 10;
static_assert(kDaemonEventsPerRank <= ipc::kMaxDaemonEvents);

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so the next call is judged on its own
    throw std::runtime_error(what + ": " + cudaGetErrorString(e));
  }
}

std::string op_key(OpType op) { return std::string(ipc::to_string(op)); }

class GpuExecutorImpl final : public GpuExecutor {
 public:
  explicit GpuExecutorImpl(const ipc::Segment& seg) : seg_(seg) {}
  ~GpuExecutorImpl() override;

  void init();
  std::optional<std::string> run(const Match& m, std::vector<DoneMark>& done, std::uint64_t& bytes) override;
  std::optional<std::string> defer(const Match& m, std::vector<DoneMark>& done) override;
  bool progress(std::string& error, std::uint64_t& bytes) override;
  bool pending() const override { return !deferred_.empty(); }
  void abort_pending() override;
  GpuStats stats() const override { return stats_; }
  void release_allocation(int slot, std::uint64_t alloc_id) override {
    auto it = maps_.find({slot, alloc_id});
    if (it == maps_.end()) return;
    close(it->second);
    maps_.erase(it);
  }
  std::string describe() const override { return description_; }

 private:
  struct Gpu {
    cudaStream_t stream = nullptr;
    cudaEvent_t join = nullptr;
    int sms = 132;
  };
  struct Rank {
    bool ready = false;
    int dev = -1;
    std::vector<cudaEvent_t> rank_events;  // opened lazily by index
    std::vector<cudaEvent_t> daemon_events;
    int next = 0;
    std::uint64_t done_seq = 0;  // last value written to the rank's done flag
    std::uint64_t* flag_block = nullptr;  // the rank's GPU flag block, mapped on its GPU
  };
  std::uint64_t* flag_block(int slot);
  // Where request i's stream flag / the done flag of its rank lives (device address).
  std::uint64_t* wait_flag(const Posted& p) {
    if (p.desc.flags & ipc::kFlagDeviceFlags) return flag_block(p.slot) + p.desc.wait_event;
    return dev_ptr(&seg_.slot(p.slot).stream_flags[p.desc.wait_event]);
  }
  std::uint64_t* done_flag(const Posted& p) {
    if (p.desc.flags & ipc::kFlagDeviceFlags) return flag_block(p.slot) + ipc::kMaxEvents;
    return dev_ptr(&seg_.slot(p.slot).done_flag);
  }
  struct Mapping {
    std::array<std::uint8_t, ipc::kCudaIpcHandleBytes> handle{};
    std::uint64_t alloc_bytes = 0;
    std::vector<void*> by_dev;  // nullptr until opened in that device's context
  };

  void set_device(int dev) {
    if (dev != current_) {
      check(cudaSetDevice(dev), "cudaSetDevice");
      current_ = dev;
    }
  }
  Rank& rank(int slot);
  cudaEvent_t rank_event(int slot, int index);
  std::byte* map(const Posted& p, const ipc::BufferRef& b, int dev);
  void close(Mapping& m);
  void join(const std::vector<int>& devs);
  void copy(void* dst, const void* src, std::uint64_t bytes, int dev);
  void reduce(std::vector<const void*> inputs, void* out, std::uint64_t count, const ipc::RequestDesc& d,
              int dev, int group_size);

  struct DeferredOp {
    Match m;
    std::vector<std::uint64_t> values;  // promised done values, by member
  };
  std::deque<DeferredOp> deferred_;
  const std::vector<std::uint64_t>* preset_ = nullptr;  // done values run() must use

  const ipc::Segment& seg_;
  std::vector<Gpu> gpus_;
  std::vector<Rank> ranks_;
  std::map<std::pair<int, std::uint64_t>, Mapping> maps_;  // (slot, alloc id)
  GpuStats stats_;
  std::uint64_t op_kernels_ = 0;
  std::string description_;
  int current_ = -1;
  using GetRange = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);
  GetRange get_range_ = nullptr;
  using StreamValue = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  StreamValue wait_value_ = nullptr, write_value_ = nullptr;
  std::byte* flags_host_ = nullptr;  // the segment's rank slots, registered with CUDA
  std::uintptr_t flags_dev_ = 0;     // their device address
  std::uint64_t* dev_ptr(std::uint64_t* host) const {
    return reinterpret_cast<std::uint64_t*>(flags_dev_ + (reinterpret_cast<std::uintptr_t>(host) -
                                                          reinterpret_cast<std::uintptr_t>(flags_host_)));
  }
};

GpuExecutorImpl::~GpuExecutorImpl() {
  for (auto& [key, m] : maps_) close(m);
  if (flags_host_) cudaHostUnregister(flags_host_);
  for (auto& r : ranks_) {
    if (r.flag_block) {
      cudaSetDevice(r.dev);
      cudaIpcCloseMemHandle(r.flag_block);
    }
    for (auto ev : r.rank_events)
      if (ev) cudaEventDestroy(ev);
    for (auto ev : r.daemon_events) cudaEventDestroy(ev);
  }
  for (std::size_t d = 0; d < gpus_.size(); ++d) {
    cudaSetDevice(static_cast<int>(d));
    if (gpus_[d].join) cudaEventDestroy(gpus_[d].join);
    if (gpus_[d].stream) cudaStreamDestroy(gpus_[d].stream);
  }
}

void GpuExecutorImpl::init() {
  int n = 0;
  check(cudaGetDeviceCount(&n), "no usable CUDA device");
  if (n < 1) throw std::runtime_error("no CUDA device is visible");
  gpus_.resize(static_cast<std::size_t>(n));
  std::string names;
  for (int d = 0; d < n; ++d) {
    set_device(d);
    check(cudaFree(nullptr), "cannot create a context on GPU " + std::to_string(d));
    int lo = 0, hi = 0;
    check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
    // Highest priority: the daemon's copies and reductions should not queue behind compute.
    check(cudaStreamCreateWithPriority(&gpus_[static_cast<std::size_t>(d)].stream, cudaStreamNonBlocking, hi),
          "cudaStreamCreateWithPriority");
    check(cudaEventCreateWithFlags(&gpus_[static_cast<std::size_t>(d)].join, cudaEventDisableTiming), "cudaEventCreate");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, d), "cudaGetDeviceProperties");
    gpus_[static_cast<std::size_t>(d)].sms = prop.multiProcessorCount;
    if (d == 0) names = prop.name;
  }
  int peers = 0, pairs = 0;
  for (int d = 0; d < n; ++d) {
    set_device(d);
    for (int e = 0; e < n; ++e) {
      if (e == d) continue;
      ++pairs;
      int can = 0;
      check(cudaDeviceCanAccessPeer(&can, d, e), "cudaDeviceCanAccessPeer");
      if (!can) continue;
      const auto err = cudaDeviceEnablePeerAccess(e, 0);
      if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled) check(err, "cudaDeviceEnablePeerAccess");
      cudaGetLastError();
      ++peers;
    }
  }
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};  // reused below for the stream memory operations
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    get_range_ = reinterpret_cast<GetRange>(fn);
  cudaGetLastError();
  ranks_.resize(static_cast<std::size_t>(seg_.header().local_world_size));
  // Stream-flag synchronization: the rank slots (where the flags live) pinned and mapped
  // for every GPU; the GPUs poll and write them with stream memory operations.
  if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    wait_value_ = reinterpret_cast<StreamValue>(fn);
  if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    write_value_ = reinterpret_cast<StreamValue>(fn);
  cudaGetLastError();
  std::string flags_note = "stream flags off";
  if (wait_value_ && write_value_) {
    flags_note = "stream flags on (GPU memory)";
    stats_.stream_values = true;
    auto* first = reinterpret_cast<std::byte*>(&seg_.slot(0));
    const std::size_t bytes = seg_.header().slot_bytes * static_cast<std::size_t>(seg_.header().local_world_size);
    void* dev = nullptr;
    if (cudaHostRegister(first, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable) == cudaSuccess &&
        cudaHostGetDevicePointer(&dev, first, 0) == cudaSuccess) {
      flags_host_ = first;
      flags_dev_ = reinterpret_cast<std::uintptr_t>(dev);
      stats_.stream_values = true;
      flags_note = "stream flags on (GPU and host memory)";
    } else {
      flags_note = std::string("stream flags off (") + cudaGetErrorString(cudaGetLastError()) + ")";
    }
  }
  cudaGetLastError();
  description_ = std::to_string(n) + " GPU(s) (" + names + "), peer access " + std::to_string(peers) + "/" +
                 std::to_string(pairs) + " pairs, " + flags_note;
}

GpuExecutorImpl::Rank& GpuExecutorImpl::rank(int slot) {
  auto& r = ranks_.at(static_cast<std::size_t>(slot));
  if (r.ready) return r;
  auto& s = seg_.slot(slot);
  const std::string bus(s.device_bus_id, ::strnlen(s.device_bus_id, ipc::kBusIdBytes));
  if (bus.empty())
    throw std::runtime_error("rank " + std::to_string(s.rank) +
                             " passed CUDA tensors but registered without a GPU (no device bus id)");
  int dev = -1;
  check(cudaDeviceGetByPCIBusId(&dev, bus.c_str()), "rank " + std::to_string(s.rank) + "'s GPU " + bus + " is not visible to the daemon");
  set_device(dev);
  r.dev = dev;
  r.daemon_events.reserve(kDaemonEventsPerRank);
  for (int i = 0; i < kDaemonEventsPerRank; ++i) {
    cudaEvent_t ev = nullptr;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess), "cudaEventCreate (interprocess)");
    r.daemon_events.push_back(ev);
    cudaIpcEventHandle_t h{};
    check(cudaIpcGetEventHandle(&h, ev), "cudaIpcGetEventHandle");
    static_assert(sizeof h == ipc::kCudaIpcHandleBytes);
    std::memcpy(s.daemon_event_handles[i], &h, sizeof h);
  }
  // Publishes the handles: the rank reads the count (acquire) before a handle.
  s.daemon_event_count.store(kDaemonEventsPerRank, std::memory_order_release);
  r.ready = true;
  spdlog::info("GPU path: rank {} uses GPU {} ({})", s.rank, dev, bus);
  return r;
}

std::uint64_t* GpuExecutorImpl::flag_block(int slot) {
  auto& r = rank(slot);
  if (r.flag_block) return r.flag_block;
  auto& s = seg_.slot(slot);
  if (!s.flag_block_published.load(std::memory_order_acquire))
    throw std::runtime_error("rank " + std::to_string(s.rank) + " asked for GPU flags but never published its flag block");
  cudaIpcMemHandle_t h{};
  std::memcpy(&h, s.flag_block_handle, sizeof h);
  set_device(r.dev);
  void* p = nullptr;
  check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cannot map the GPU flag block of rank " + std::to_string(s.rank));
  if (get_range_) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    if (get_range_(&base, &size, reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS && size < ipc::kFlagBlockBytes) {
      cudaIpcCloseMemHandle(p);
      throw std::runtime_error("rank " + std::to_string(s.rank) + "'s GPU flag block is too small");
    }
  }
  r.flag_block = static_cast<std::uint64_t*>(p);
  return r.flag_block;
}

cudaEvent_t GpuExecutorImpl::rank_event(int slot, int index) {
  auto& r = rank(slot);
  if (static_cast<std::size_t>(index) >= r.rank_events.size()) r.rank_events.resize(static_cast<std::size_t>(index) + 1, nullptr);
  auto& ev = r.rank_events[static_cast<std::size_t>(index)];
  if (!ev) {
    // Interprocess events may be waited on only from their own GPU (see DESIGN §4).
    set_device(r.dev);
    cudaIpcEventHandle_t h{};
    std::memcpy(&h, seg_.slot(slot).event_handles[index], sizeof h);
    check(cudaIpcOpenEventHandle(&ev, h), "cannot open CUDA event " + std::to_string(index) + " of rank " +
                                              std::to_string(seg_.slot(slot).rank));
  }
  return ev;
}

void GpuExecutorImpl::close(Mapping& m) {
  for (std::size_t d = 0; d < m.by_dev.size(); ++d)
    if (m.by_dev[d]) {
      set_device(static_cast<int>(d));
      cudaIpcCloseMemHandle(m.by_dev[d]);
      cudaGetLastError();
      m.by_dev[d] = nullptr;
    }
}

std::byte* GpuExecutorImpl::map(const Posted& p, const ipc::BufferRef& b, int dev) {
  if (b.kind != BufferKind::CudaIpc)
    throw std::runtime_error("rank " + std::to_string(seg_.slot(p.slot).rank) +
                             " passed host tensors to a collective the others run on CUDA tensors");
  auto& m = maps_[{p.slot, b.alloc_id}];
  if (m.by_dev.empty() || std::memcmp(m.handle.data(), b.ipc_handle, m.handle.size()) != 0 ||
      m.alloc_bytes != b.alloc_bytes) {
    // New allocation, or the id now names another one: the old mappings are stale.
    close(m);
    m.by_dev.assign(gpus_.size(), nullptr);
    std::memcpy(m.handle.data(), b.ipc_handle, m.handle.size());
    m.alloc_bytes = b.alloc_bytes;
  }
  auto& ptr = m.by_dev.at(static_cast<std::size_t>(dev));
  if (!ptr) {
    set_device(dev);
    cudaIpcMemHandle_t h{};
    std::memcpy(&h, b.ipc_handle, sizeof h);
    check(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess),
          "cannot map CUDA allocation " + std::to_string(b.alloc_id) + " of rank " +
              std::to_string(seg_.slot(p.slot).rank) + " into GPU " + std::to_string(dev));
    if (get_range_) {
      // Trust nothing: the allocation must be as large as the rank says.
      CUdeviceptr base = 0;
      std::size_t size = 0;
      if (get_range_(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS &&
          (size < b.alloc_bytes || reinterpret_cast<CUdeviceptr>(ptr) != base)) {
        cudaIpcCloseMemHandle(ptr);
        ptr = nullptr;
        throw std::runtime_error("rank " + std::to_string(seg_.slot(p.slot).rank) + " claims a CUDA allocation of " +
                                 std::to_string(b.alloc_bytes) + " bytes but it has " + std::to_string(size));
      }
    }
  }
  return static_cast<std::byte*>(ptr) + b.offset;
}

void GpuExecutorImpl::join(const std::vector<int>& devs) {
  if (devs.size() < 2) return;
  for (int d : devs) {
    set_device(d);
    check(cudaEventRecord(gpus_[static_cast<std::size_t>(d)].join, gpus_[static_cast<std::size_t>(d)].stream), "cudaEventRecord");
  }
  for (int d : devs) {
    set_device(d);
    for (int e : devs)
      if (e != d)
        check(cudaStreamWaitEvent(gpus_[static_cast<std::size_t>(d)].stream, gpus_[static_cast<std::size_t>(e)].join, 0),
              "cudaStreamWaitEvent");
  }
}

void GpuExecutorImpl::copy(void* dst, const void* src, std::uint64_t bytes, int dev) {
  if (bytes == 0 || dst == src) return;
  set_device(dev);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, gpus_[static_cast<std::size_t>(dev)].stream),
        "cudaMemcpyAsync");
  ++stats_.copies;
}

void GpuExecutorImpl::reduce(std::vector<const void*> inputs, void* out, std::uint64_t count,
                             const ipc::RequestDesc& d, int dev, int group_size) {
  if (count == 0) return;
  ReduceArgs a;
  a.n = static_cast<int>(inputs.size());
  if (a.n > kMaxKernelInputs) throw std::runtime_error("too many ranks for one reduction kernel");
  for (int i = 0; i < a.n; ++i) a.inputs[i] = inputs[static_cast<std::size_t>(i)];
  a.out = out;
  a.count = count;
  a.dtype = d.dtype;
  a.op = d.reduce_op;
  a.scale = d.scale;
  (void)group_size;
  set_device(dev);
  check(launch_reduce(a, gpus_[static_cast<std::size_t>(dev)].stream, gpus_[static_cast<std::size_t>(dev)].sms),
        "reduction kernel (" + std::string(ipc::to_string(d.dtype)) + ", " + std::string(ipc::to_string(d.reduce_op)) + ")");
  ++op_kernels_;
}

std::optional<std::string> GpuExecutorImpl::run(const Match& m, std::vector<DoneMark>& done, std::uint64_t& bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto& ps = m.posted;
  const auto& d0 = ps.front().desc;
  const std::size_t n = ps.size();
  const std::uint64_t e = ipc::dtype_size(d0.dtype);
  const std::uint64_t c = d0.chunk_count;
  const std::uint64_t cb = c * e;
  const int root = d0.root;
  bytes = 0;
  op_kernels_ = 0;
  done.assign(n, DoneMark{});
  for (std::size_t i = 0; i < n; ++i)
    if ((ps[i].desc.flags & ipc::kFlagStreamValue) && !(ps[i].desc.flags & ipc::kFlagDeviceFlags) && !flags_host_)
      return "this daemon cannot use CUDA stream flags here (" + description_ + "); set SMDDP_GPU_SYNC=events";

  std::vector<int> dev(n);
  std::vector<int> devs;
  for (std::size_t i = 0; i < n; ++i) {
    dev[i] = rank(ps[i].slot).dev;
    if (std::find(devs.begin(), devs.end(), dev[i]) == devs.end()) devs.push_back(dev[i]);
  }
  const auto in = [&](std::size_t i, int d) { return map(ps[i], ps[i].desc.input, d); };
  const auto out = [&](std::size_t i, int d) { return map(ps[i], ps[i].desc.output, d); };

  // Mapping first (it may fail on bad input): nothing is enqueued for a request that fails here.
  // 1. Each rank's inputs are ready once its event fired, waited on from its own GPU.
  for (std::size_t i = 0; i < n; ++i)
    if (ps[i].desc.flags & ipc::kFlagDaemonCpuWait) {
      // progress() saw the flag reached on the CPU: nothing to wait for on the GPU.
    } else if (ps[i].desc.wait_event >= 0 && (ps[i].desc.flags & ipc::kFlagStreamValue)) {
      auto* flag = wait_flag(ps[i]);
      set_device(dev[i]);
      if (!wait_value_) throw std::runtime_error("the CUDA driver lacks stream memory operations");
      if (const auto r = wait_value_(reinterpret_cast<CUstream>(gpus_[static_cast<std::size_t>(dev[i])].stream),
                                     reinterpret_cast<CUdeviceptr>(flag), ps[i].desc.wait_value,
                                     CU_STREAM_WAIT_VALUE_GEQ);
          r != CUDA_SUCCESS)
        throw std::runtime_error("cuStreamWaitValue64 failed (" + std::to_string(static_cast<int>(r)) + ")");
    } else if (ps[i].desc.wait_event >= 0) {
      auto ev = rank_event(ps[i].slot, ps[i].desc.wait_event);
      set_device(dev[i]);
      check(cudaStreamWaitEvent(gpus_[static_cast<std::size_t>(dev[i])].stream, ev, 0), "cudaStreamWaitEvent (rank event)");
    }
  // Inputs checked ready on the CPU (deferred form) need no cross-GPU join first; the join
  // at the end still orders this operation before the next on every GPU.
  if (!preset_) join(devs);

  const auto ur = static_cast<std::size_t>(root);
  switch (d0.op) {
    case OpType::AllReduce: {
      if (cb <= kOneShotBytes && n <= static_cast<std::size_t>(kMaxKernelInputs)) {
        // One-shot: one kernel on the first rank's GPU reads every input and writes every
        // output over NVLink; fewest launches for latency-bound sizes.
        if (c == 0) break;
        const int d = dev[0];
        ReduceArgs a;
        a.n = static_cast<int>(n);
        a.nout = static_cast<int>(n);
        for (std::size_t q = 0; q < n; ++q) {
          a.inputs[q] = in(q, d);
          a.outs[q] = out(q, d);
        }
        a.count = c;
        a.dtype = d0.dtype;
        a.op = d0.reduce_op;
        a.scale = d0.scale;
        // Small work: a few blocks suffice and launch fastest.
        const int blocks = static_cast<int>(std::min<std::uint64_t>(16, (c + 4095) / 4096 + 1));
        set_device(d);
        check(launch_reduce(a, gpus_[static_cast<std::size_t>(d)].stream, blocks), "one-shot reduction kernel");
        ++op_kernels_;
        bytes = cb * n;
        break;
      }
      // Two-shot: GPU of rank s reduces shard s by peer reads, then pushes it to every other
      // rank with the copy engines. Shards are 256-byte aligned to keep 16-byte loads whole.
      const std::uint64_t align = std::max<std::uint64_t>(1, 256 / e);
      std::uint64_t per = (c + n - 1) / n;
      per = (per + align - 1) / align * align;
      for (std::size_t s = 0; s < n; ++s) {
        const std::uint64_t lo = std::min(c, per * s), hi = std::min(c, lo + per);
        if (lo >= hi) continue;
        const int d = dev[s];
        std::vector<const void*> ins(n);
        for (std::size_t q = 0; q < n; ++q) ins[q] = in(q, d) + lo * e;
        std::byte* dst = out(s, d) + lo * e;
        reduce(ins, dst, hi - lo, d0, d, static_cast<int>(n));
        for (std::size_t q = 0; q < n; ++q)
          if (q != s) copy(out(q, d) + lo * e, dst, (hi - lo) * e, d);
      }
      bytes = cb * n;
      break;
    }
    case OpType::ReduceScatter: {
      for (std::size_t r = 0; r < n; ++r) {
        if (c == 0) break;
        std::vector<const void*> ins(n);
        for (std::size_t q = 0; q < n; ++q) ins[q] = in(q, dev[r]) + r * cb;
        reduce(ins, out(r, dev[r]), c, d0, dev[r], static_cast<int>(n));
      }
      bytes = cb * n;
      break;
    }
    case OpType::Reduce: {
      if (c == 0) break;
      std::vector<const void*> ins(n);
      for (std::size_t q = 0; q < n; ++q) ins[q] = in(q, dev[ur]);
      reduce(ins, out(ur, dev[ur]), c, d0, dev[ur], static_cast<int>(n));
      bytes = cb;
      break;
    }
    case OpType::Broadcast: {
      if (c == 0) break;
      const int d = dev[ur];
      const std::byte* src = in(ur, d);
      for (std::size_t r = 0; r < n; ++r) copy(out(r, d), src, cb, d);
      bytes = cb * (n - 1);
      break;
    }
    case OpType::AllGather: {
      if (c == 0) break;
      if (d0.flags & ipc::kFlagSdp) {
        // Sharded-data-parallel path: copy engines only, no SM taken from the model.
        for (std::size_t q = 0; q < n; ++q)
          for (std::size_t r = 0; r < n; ++r) copy(out(r, dev[q]) + q * cb, in(q, dev[q]), cb, dev[q]);
      } else {
        for (std::size_t r = 0; r < n; ++r) {
          CopyArgs a;
          for (std::size_t q = 0; q < n; ++q) {
            const std::byte* src = in(q, dev[r]);
            std::byte* dst = out(r, dev[r]) + q * cb;
            if (src == dst) continue;  // in place: rank r's input is its slot of the output
            a.src[a.n] = src;
            a.dst[a.n] = dst;
            ++a.n;
          }
          a.bytes = cb;
          if (a.n == 0) continue;
          set_device(dev[r]);
          check(launch_copy(a, gpus_[static_cast<std::size_t>(dev[r])].stream, gpus_[static_cast<std::size_t>(dev[r])].sms),
                "allgather copy kernel");
          ++op_kernels_;
        }
      }
      bytes = cb * n * n;
      break;
    }
    case OpType::Gather: {
      if (c == 0) break;
      for (std::size_t q = 0; q < n; ++q) copy(out(ur, dev[q]) + q * cb, in(q, dev[q]), cb, dev[q]);
      bytes = cb * n;
      break;
    }
    case OpType::Scatter: {
      if (c == 0) break;
      const int d = dev[ur];
      for (std::size_t r = 0; r < n; ++r) copy(out(r, d), in(ur, d) + r * cb, cb, d);
      bytes = cb * n;
      break;
    }
    case OpType::AllToAll: {
      if (!(d0.flags & ipc::kFlagSplits)) {
        if (c == 0) break;
        for (std::size_t q = 0; q < n; ++q)
          for (std::size_t r = 0; r < n; ++r) copy(out(r, dev[q]) + q * cb, in(q, dev[q]) + r * cb, cb, dev[q]);
        bytes = cb * n * n;
        break;
      }
      // Split tables (validated bounds, in the arena): n send counts then n receive counts.
      SplitTables tab(n, std::vector<std::int64_t>(2 * n));
      std::vector<std::uint64_t> in_bytes, out_bytes;
      for (std::size_t r = 0; r < n; ++r) {
        std::memcpy(tab[r].data(), seg_.arena(ps[r].slot).data() + ps[r].desc.aux.offset, 2 * n * sizeof(std::int64_t));
        in_bytes.push_back(ps[r].desc.input.bytes);
        out_bytes.push_back(ps[r].desc.output.bytes);
      }
      if (auto bad = check_split_tables(tab, e, in_bytes, out_bytes)) return *bad;
      for (std::size_t q = 0; q < n; ++q)
        for (std::size_t r = 0; r < n; ++r) {
          const auto len = static_cast<std::uint64_t>(tab[q][r]) * e;
          if (len) copy(out(r, dev[q]) + recv_offset(tab, r, q) * e, in(q, dev[q]) + send_offset(tab, q, r) * e, len, dev[q]);
          bytes += len;
        }
      break;
    }
    case OpType::Send:
    case OpType::Recv: {
      // posted = {send, recv}: the sender's GPU pushes.
      if (cb) copy(out(1, dev[0]), in(0, dev[0]), cb, dev[0]);
      bytes = cb;
      break;
    }
    case OpType::Barrier:
    case OpType::CommCreate:
      break;
  }

  // 4. Every rank's outputs are final once every GPU finished its part.
  join(devs);
  for (std::size_t i = 0; i < n; ++i) {
    auto& r = rank(ps[i].slot);
    if (ps[i].desc.flags & ipc::kFlagStreamValue) {
      // One increasing done flag per rank: every write for this rank is on its GPU's one
      // stream, so a value reached means every earlier one was too.
      if (!write_value_) throw std::runtime_error("the CUDA driver lacks stream memory operations");
      const std::uint64_t v = preset_ ? (*preset_)[i] : ++r.done_seq;
      set_device(r.dev);
      if (const auto w = write_value_(reinterpret_cast<CUstream>(gpus_[static_cast<std::size_t>(r.dev)].stream),
                                      reinterpret_cast<CUdeviceptr>(done_flag(ps[i])), v, 0);
          w != CUDA_SUCCESS)
        throw std::runtime_error("cuStreamWriteValue64 failed (" + std::to_string(static_cast<int>(w)) + ")");
      done[i].value = v;
      continue;
    }
    const int idx = r.next;
    r.next = (r.next + 1) % kDaemonEventsPerRank;
    set_device(r.dev);
    check(cudaEventRecord(r.daemon_events[static_cast<std::size_t>(idx)], gpus_[static_cast<std::size_t>(r.dev)].stream),
          "cudaEventRecord (daemon event)");
    done[i].event = idx;
  }
  stats_.enqueue_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  const auto key = op_key(d0.op);
  stats_.kernel_launches += op_kernels_;
  stats_.kernels_by_op[key] += op_kernels_;
  stats_.ops_by_op[key] += 1;
  return std::nullopt;
}

std::optional<std::string> GpuExecutorImpl::defer(const Match& m, std::vector<DoneMark>& done) {
  const auto& ps = m.posted;
  const std::size_t n = ps.size();
  if (!flags_host_) return "this daemon cannot use CUDA stream flags in host memory (" + description_ + ")";
  std::vector<int> devs;
  for (const auto& p : ps) {
    if (!(p.desc.flags & ipc::kFlagDaemonCpuWait))
      return "rank " + std::to_string(seg_.slot(p.slot).rank) + " mixes GPU synchronization modes in one collective";
    const int d = rank(p.slot).dev;
    if (std::find(devs.begin(), devs.end(), d) == devs.end()) devs.push_back(d);
  }
  // Map now: a bad buffer fails the request before anything is promised.
  for (const auto& p : ps)
    for (int d : devs) {
      if (p.desc.input.kind == BufferKind::CudaIpc && p.desc.input.bytes) map(p, p.desc.input, d);
      if (p.desc.output.kind == BufferKind::CudaIpc && p.desc.output.bytes) map(p, p.desc.output, d);
    }
  DeferredOp op{m, std::vector<std::uint64_t>(n)};
  done.assign(n, DoneMark{});
  for (std::size_t i = 0; i < n; ++i) {
    op.values[i] = ++rank(ps[i].slot).done_seq;  // in match order: increasing per rank
    done[i].value = op.values[i];
  }
  deferred_.push_back(std::move(op));
  return std::nullopt;
}

bool GpuExecutorImpl::progress(std::string& error, std::uint64_t& bytes) {
  bool did = false;
  while (!deferred_.empty()) {
    auto& head = deferred_.front();
    for (const auto& p : head.m.posted) {
      if (p.desc.wait_event < 0) continue;
      auto& flag = seg_.slot(p.slot).stream_flags[p.desc.wait_event];
      if (std::atomic_ref<std::uint64_t>(flag).load(std::memory_order_acquire) < p.desc.wait_value) return did;
    }
    std::vector<DoneMark> done;
    std::uint64_t b = 0;
    preset_ = &head.values;
    std::optional<std::string> err;
    try {
      err = run(head.m, done, b);
    } catch (const std::exception& e) {
      err = e.what();
    }
    preset_ = nullptr;
    if (err) {
      error = *err;
      return did;
    }
    bytes += b;
    deferred_.pop_front();
    did = true;
  }
  return did;
}

void GpuExecutorImpl::abort_pending() {
  for (auto& op : deferred_)
    for (std::size_t i = 0; i < op.m.posted.size(); ++i)
      std::atomic_ref<std::uint64_t>(seg_.slot(op.m.posted[i].slot).done_flag).store(op.values[i], std::memory_order_release);
  deferred_.clear();
}

}  // namespace

std::unique_ptr<GpuExecutor> GpuExecutor::create(const ipc::Segment& segment, std::string& why_not) {
  auto g = std::make_unique<GpuExecutorImpl>(segment);
  try {
    g->init();
  } catch (const std::exception& e) {
    why_not = e.what();
    return nullptr;
  }
  return g;
}

}  // namespace smddp::daemon::cuda
