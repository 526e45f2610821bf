#include "client/gpu/peer_executor.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "client/gpu/arena_copier.hpp"
#include "client/gpu/cuda_util.hpp"
#include "client/gpu/hier_trace.hpp"
#include "client/gpu/schedule.hpp"
#include "kernels/device_kernels.hpp"
#include "ipc/segment.hpp"
#include "client/gpu/peer_executor_impl.hpp"

namespace smddp::client::gpu {

using namespace detail;

namespace {

// The index of the form a setting names (unset or empty: the first); anything else is an
// error, not a silent default (the ranks' schedules must agree, and a typo would otherwise
// run or measure the wrong form).
std::size_t env_form(const char* name, std::initializer_list<const char*> forms) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  std::string names;
  std::size_t i = 0;
  for (const char* f : forms) {
    if (std::string(v) == f) return i;
    names += (i == 0 ? "" : i + 1 == forms.size() ? " or " : ", ") + std::string(f);
    ++i;
  }
  throw std::runtime_error(std::string(name) + "='" + v + "' is not valid: use " + names);
}
}  // namespace

std::uint64_t PeerExecutor::oneshot_max_bytes(int group_size) {
  if (const char* v = std::getenv("SMDDP_ONESHOT_MAX_BYTES"); v && *v) return std::strtoull(v, nullptr, 10);
  // One-shot moves (n-1)/n more bytes per GPU than two-shot but saves a barrier and a copy;
  // with two GPUs both move the same bytes (2xH200, rank_side_probe: one-shot 2 MiB 22 us,
  // two-shot 39 us).
  return group_size <= 2 ? (4ull << 20) : (256ull << 10);
}

std::uint64_t PeerExecutor::schedule_key() {
  static const std::uint64_t key = [] {
    std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
    const auto mix = [&h](const std::string& text) {
      for (const char ch : text) {
        h ^= static_cast<unsigned char>(ch);
        h *= 1099511628211ULL;
      }
    };
    const char* oneshot = std::getenv("SMDDP_ONESHOT_MAX_BYTES");
    mix(std::string("oneshot=") + (oneshot && *oneshot ? oneshot : "default"));
    mix(";twoshot=" + std::to_string(static_cast<int>(twoshot_form())));
    mix(std::string(";copy_push=") + (copy_push() ? "1" : "0"));
    mix(";piece=" + std::to_string(twoshot_piece_bytes()));
    return h == 0 ? 1 : h;
  }();
  return key;
}

std::uint64_t PeerExecutor::twoshot_piece_bytes() {
  static const std::uint64_t v = [] {
    const char* e = std::getenv("SMDDP_TWOSHOT_PIECE_BYTES");
    // Off by default: on 2xH200 pieces of 4 MiB made 64 MiB 11% slower (292 -> 260 GB/s
    // busbw) and 16 MiB pieces changed nothing (the pulls and the reduction's remote reads
    // share the same NVLink direction, and each piece adds launches and flag round trips).
    return e && *e ? std::strtoull(e, nullptr, 10) : 0ull;
  }();
  return v;
}


PeerExecutor::TwoShot PeerExecutor::twoshot_form() {
  // Push by default: 3-5% faster than pull on 2xH200 (64 MiB 306 against 291 GB/s busbw, 1 GiB
  // 357 against 348), with one barrier fewer. The kernel form measured 326/333 at 256 MiB/1 GiB
  // against pull's 334/348.
  static const TwoShot v = static_cast<TwoShot>(env_form("SMDDP_TWOSHOT", {"push", "pull", "kernel"}));
  return v;
}

bool PeerExecutor::copy_push() {
  // Push by default: a copy engine writing over NVLink beat one reading by 7-9% on 2xH200
  // (rank_side_probe --forms and the benchmark: 1 GiB AllGather 384 against 351 GB/s busbw).
  static const bool v = env_form("SMDDP_COPY_DIRECTION", {"push", "pull"}) == 0;
  return v;
}

PeerExecutor::PeerExecutor(const std::shared_ptr<Client>& client, int device, cudaStream_t stream)
    : client_(client), device_(device), stream_(stream) {
  // The forms first: a bad setting fails here, at the group's first CUDA op, with its name.
  (void)twoshot_form();
  (void)copy_push();
  if (!stream_ops().wait || !stream_ops().write)
    throw std::runtime_error("the CUDA driver lacks stream memory operations (cuStreamWaitValue64), which the "
                             "rank-side GPU path needs; set SMDDP_GPU_EXEC=daemon");
  my_slot_ = client->local_rank();
  DeviceScope scope(device_);
  check(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device_), "cudaDeviceGetAttribute");
  int lo = 0, hi = 0;
  check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
  check(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, hi), "cudaStreamCreate");
  check(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaStreamCreateWithPriority(&fast_stream_, cudaStreamNonBlocking, hi), "cudaStreamCreate");
  check(cudaStreamCreateWithFlags(&rescue_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  // Outside any caching allocator, so it can be exported whatever PYTORCH_CUDA_ALLOC_CONF says.
  check(cudaMalloc(&flag_block_, kFlagAllocBytes), "cudaMalloc of the smddp flag block");
  check(cudaMemset(flag_block_, 0, kFastStageOffset), "cudaMemset of the smddp flag block");
  // Now, not at a first launch: with lazy loading that may wait for the context to go idle
  // while a fast kernel spins on a peer's flag (see preload_kernels).
  check(kernels::preload_kernels(), "loading the smddp kernels");
  // The one-shot scratch too, at its largest: growing it later keeps the old one until the
  // end (freeing memory waits for the whole device).
  scratch_bytes_ = std::max<std::uint64_t>(oneshot_max_bytes(2), 1 << 20);
  check(cudaMalloc(&scratch_, scratch_bytes_), "cudaMalloc of the smddp one-shot buffer");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cudaIpcMemHandle_t h{};
  check(cudaIpcGetMemHandle(&h, flag_block_), "cudaIpcGetMemHandle of the smddp flag block");
  std::array<std::uint8_t, 64> bytes{};
  static_assert(sizeof h == 64);
  std::memcpy(bytes.data(), &h, sizeof h);
  client->publish_flag_block(bytes);
  peer_flags_.assign(static_cast<std::size_t>(client->local_world_size()), nullptr);
  for (Channel* ch : {&main_, &tail_}) {
    ch->sent.assign(static_cast<std::size_t>(client->local_world_size()), 0);
    ch->waited.assign(static_cast<std::size_t>(client->local_world_size()), 0);
  }
  check(cudaMalloc(&marks_, kMarkWords * sizeof(std::uint64_t)), "cudaMalloc of the smddp progress words");
  check(cudaMemset(marks_, 0, kMarkWords * sizeof(std::uint64_t)), "cudaMemset of the smddp progress words");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

PeerExecutor::~PeerExecutor() {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  // A fast kernel may still wait for a peer that is gone: release it first (what it
  // computes no longer matters), then nothing of ours may still be running.
  if (flag_block_ && rescue_stream_) {
    release_flags();
    cudaStreamSynchronize(rescue_stream_);
  }
  // Every stream that may still touch a peer's memory, before its mapping closes.
  for (cudaStream_t st : {stream_, side_, fast_stream_, rescue_stream_})
    if (st) cudaStreamSynchronize(st);
  if (last_fast_stream_ && last_fast_stream_ != fast_stream_) {
    // A fast kernel ran last on a caller's stream: wait for that point of it.
    cudaEvent_t ev = nullptr;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess) {
      if (cudaEventRecord(ev, last_fast_stream_) == cudaSuccess) cudaEventSynchronize(ev);
      cudaEventDestroy(ev);
    }
    cudaGetLastError();  // the caller's stream may be gone by now
  }
  for (auto& [key, m] : maps_)
    if (m.ptr) cudaIpcCloseMemHandle(m.ptr);
  for (void* p : to_close_) cudaIpcCloseMemHandle(p);
  for (auto* f : peer_flags_)
    if (f) cudaIpcCloseMemHandle(f);
  sdp_graphs_.clear();
  for (auto ev : all_events_) cudaEventDestroy(ev);
  for (cudaStream_t st : {side_, fast_stream_, rescue_stream_})
    if (st) cudaStreamDestroy(st);
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
  if (scratch_) cudaFree(scratch_);
  for (void* p : retired_scratch_) cudaFree(p);
  if (flag_block_) cudaFree(flag_block_);
  if (marks_) cudaFree(marks_);
  restore_device(prev);
}

cudaEvent_t PeerExecutor::take_event() {
  if (!free_events_.empty()) {
    cudaEvent_t ev = free_events_.back();
    free_events_.pop_back();
    return ev;
  }
  DeviceScope scope(device_);
  cudaEvent_t ev = nullptr;
  check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  all_events_.push_back(ev);
  return ev;
}

cudaEvent_t PeerExecutor::record_ready(cudaStream_t user_stream) {
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard lk(mu_);
    ev = take_event();
  }
  check(cudaEventRecord(ev, user_stream), "cudaEventRecord");
  return ev;
}

void PeerExecutor::release_event(cudaEvent_t ev) {
  if (!ev) return;
  std::lock_guard lk(mu_);
  if (ev == last_fast_done_) {
    last_fast_done_released_ = true;  // still orders the next fast op; pooled after it
    return;
  }
  free_events_.push_back(ev);
}

void PeerExecutor::expect(std::uint64_t token, LocalOp op) {
  std::lock_guard lk(mu_);
  expected_[token] = op;
}

void PeerExecutor::forget(std::uint64_t token) {
  std::lock_guard lk(mu_);
  auto it = expected_.find(token);
  if (it == expected_.end()) return;
  if (it->second.ready) free_events_.push_back(it->second.ready);
  expected_.erase(it);
}

void PeerExecutor::on_completion(std::uint64_t token, const ipc::CompletionDesc& c) {
  std::lock_guard lk(mu_);
  if (c.kind == ipc::CompletionKind::Handles) {
    const auto h = c.plan_header();
    for (int i = 0; i < h.handles && static_cast<std::size_t>(i) < ipc::kPlanHandlesPerCompletion; ++i) {
      const auto ph = c.plan_handle(i);
      if (ph.flags & ipc::kPlanHandleReleased) {
        // The owner freed it: an open mapping would keep that memory held on the owner's GPU.
        if (auto it = maps_.find({ph.slot, ph.alloc_id}); it != maps_.end()) {
          if (it->second.ptr) to_close_.push_back(it->second.ptr);
          maps_.erase(it);
        }
        continue;
      }
      auto& m = maps_[{ph.slot, ph.alloc_id}];
      if (std::memcmp(m.handle.data(), ph.handle, m.handle.size()) == 0) continue;
      // The owner's allocation behind this id changed: GPU work queued earlier may still
      // read the old mapping, so it is closed only once that work is done.
      if (m.ptr) to_close_.push_back(m.ptr);
      m.ptr = nullptr;
      std::memcpy(m.handle.data(), ph.handle, m.handle.size());
    }
    return;
  }
  auto it = expected_.find(token);
  if (it == expected_.end()) return;
  LocalOp local = it->second;
  expected_.erase(it);
  if (c.status != ipc::Status::Ok || c.kind != ipc::CompletionKind::Plan) {
    if (local.ready) free_events_.push_back(local.ready);
    return;  // failed: nothing to run (the Work reports the daemon's error)
  }
  Plan p;
  p.token = token;
  p.local = local;
  p.header = c.plan_header();
  const int n = std::min<int>(p.header.members, ipc::kPlanMaxMembers);
  for (int i = 0; i < n; ++i) p.members.push_back(c.plan_member(i));
  if (p.header.flags & ipc::kPlanSplits)
    for (int i = 0; i < n; ++i) p.splits.push_back(c.plan_split(i));
  ready_.push_back(std::move(p));
}

void PeerExecutor::drain() {
  std::vector<std::function<void()>> after;
  {
    std::lock_guard lk(mu_);
    if (ready_.empty() && to_close_.empty()) return;
    DeviceScope scope(device_);
    close_released();  // before the plans' work goes on the GPU
    pump_locked();
    after.swap(deferred_);
  }
  for (auto& cb : after) cb();
}

void PeerExecutor::pump_locked() {
  // A plan waits while a hierarchical operation planned before it has not enqueued its tail:
  // every GPU wait an operation enqueues then depends only on work enqueued before it, in
  // this process and in the others (their plans come in the same order). A later plan's
  // waits enqueued ahead of an earlier operation's last copies could, where their streams
  // share a hardware queue, hold those copies back while the peers wait for them.
  for (;;) {
    flush_tails_locked(deferred_);
    if (ready_.empty() || !hier_tails_.empty()) return;
    {
      Plan p = std::move(ready_.front());
      ready_.pop_front();
      try {
        run(p);
      } catch (const std::exception& e) {
        errors_[p.token] = e.what();
        // A hierarchical operation whose pre part failed to enqueue still owes its tail.
        if (p.local.hier && !p.local.hier->planned) {
          try {
            DeviceScope scope(device_);
            for (auto v : p.local.hier->mark_values) write_word(p.local.hier->word, v, rescue_stream_);
          } catch (const std::exception&) {
            // The context is broken: the copier's copies fail and say so.
          }
          ArenaCopyLanes::release_shard(*p.local.hier->copier);
          p.local.hier->error = e.what();
          p.local.hier->planned = true;
          hier_tails_.push_back(p.local.hier);
          flush_tails_locked(deferred_);
        }
      }
      if (p.local.ready) free_events_.push_back(p.local.ready);
    }
  }
}

bool PeerExecutor::planned(std::uint64_t token) const {
  std::lock_guard lk(mu_);
  return std::none_of(ready_.begin(), ready_.end(), [&](const Plan& p) { return p.token == token; });
}

void PeerExecutor::wait_planned(std::uint64_t token) {
  std::unique_lock lk(mu_);
  for (;;) {
    if (std::none_of(ready_.begin(), ready_.end(), [&](const Plan& p) { return p.token == token; })) return;
    // Held behind a hierarchical operation's tail: drive its rail operation to its end.
    std::shared_ptr<Work> rail = hier_tails_.empty() ? nullptr : hier_tails_.front()->rail.lock();
    lk.unlock();
    if (rail) {
      try {
        rail->wait(std::chrono::milliseconds{0});
      } catch (const std::exception&) {
        // Its own caller sees its failure; its tail goes on all the same.
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // its callbacks are running
    }
    lk.lock();
    DeviceScope scope(device_);
    pump_locked();
    if (!deferred_.empty()) {
      auto after = std::exchange(deferred_, {});
      lk.unlock();
      for (auto& cb : after) cb();
      lk.lock();
    }
  }
}

bool PeerExecutor::no_work_pending_locked() {
  for (cudaStream_t st : {stream_, side_, fast_stream_, rescue_stream_}) {
    if (!st) continue;
    const auto q = cudaStreamQuery(st);
    if (q == cudaSuccess) continue;
    if (q != cudaErrorNotReady) cudaGetLastError();
    return false;
  }
  if (!last_fast_stream_ || last_fast_stream_ == fast_stream_) return true;
  // The last fast op ran on a caller's stream; fast ops run in issue order, so its end is
  // every one's. One issued before a close was due has no event: one is recorded after it now
  // (and after what the caller queued since, which only waits longer), unless that stream is
  // being captured into a graph, where the record would join the graph.
  if (!last_fast_done_) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(last_fast_stream_, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone) {
      cudaGetLastError();
      return false;
    }
    cudaEvent_t ev = take_event();
    if (cudaEventRecord(ev, last_fast_stream_) != cudaSuccess) {
      cudaGetLastError();
      free_events_.push_back(ev);
      return false;
    }
    set_last_fast_locked(last_fast_stream_, ev, false);
  }
  const auto q = cudaEventQuery(last_fast_done_);
  if (q == cudaSuccess) return true;
  if (q != cudaErrorNotReady) cudaGetLastError();
  return false;
}

void PeerExecutor::close_released() {
  if (to_close_.empty() || !no_work_pending_locked()) return;
  for (void* p : to_close_) {
    if (cudaIpcCloseMemHandle(p) != cudaSuccess) cudaGetLastError();
    ++stats_.mappings_closed;
  }
  to_close_.clear();
}

std::optional<std::string> PeerExecutor::take_error(std::uint64_t token) {
  std::lock_guard lk(mu_);
  auto it = errors_.find(token);
  if (it == errors_.end()) return std::nullopt;
  auto e = std::move(it->second);
  errors_.erase(it);
  return e;
}

std::uint64_t* PeerExecutor::peer_flags(int slot) {
  auto& f = peer_flags_.at(static_cast<std::size_t>(slot));
  if (f) return f;
  auto client = client_.lock();
  if (!client) throw std::runtime_error("the smddp client is gone");
  auto h = client->flag_block_of(slot);
  if (!h) throw std::runtime_error("local rank " + std::to_string(slot) + " has not published its GPU flag block");
  cudaIpcMemHandle_t ih{};
  std::memcpy(&ih, h->data(), sizeof ih);
  void* p = nullptr;
  check(cudaIpcOpenMemHandle(&p, ih, cudaIpcMemLazyEnablePeerAccess),
        "cannot map the GPU flag block of local rank " + std::to_string(slot));
  f = static_cast<std::uint64_t*>(p);
  return f;
}

void* PeerExecutor::map(int slot, std::uint64_t alloc_id) {
  auto it = maps_.find({slot, alloc_id});
  if (it == maps_.end())
    throw std::runtime_error("the daemon never sent the IPC handle of local rank " + std::to_string(slot) +
                             "'s allocation " + std::to_string(alloc_id));
  if (!it->second.ptr) {
    cudaIpcMemHandle_t ih{};
    std::memcpy(&ih, it->second.handle.data(), sizeof ih);
    check(cudaIpcOpenMemHandle(&it->second.ptr, ih, cudaIpcMemLazyEnablePeerAccess),
          "cannot map a CUDA buffer of local rank " + std::to_string(slot));
    ++stats_.mappings;
  }
  return it->second.ptr;
}

void* PeerExecutor::resolve(const Plan& p, int member, bool input) {
  if (member == p.header.me) return input ? p.local.in : p.local.out;
  const auto& m = p.members.at(static_cast<std::size_t>(member));
  const ipc::PlanRef& r = input ? m.in : m.out;
  if (r.alloc_id == 0) return nullptr;
  return at(map(m.slot, r.alloc_id), r.offset);
}

void PeerExecutor::signal(const Plan& p) { signal(slots_of(p.members), main_, stream_); }

void PeerExecutor::wait_peers(const Plan& p, cudaStream_t stream) { wait_peers(slots_of(p.members), main_, stream); }

void PeerExecutor::signal(const std::vector<int>& slots, Channel& ch, cudaStream_t stream) {
  const auto& ops = stream_ops();
  const auto s = reinterpret_cast<CUstream>(stream);
  for (int peer : slots) {
    if (peer == my_slot_) continue;
    const auto v = ++ch.sent.at(static_cast<std::size_t>(peer));
    const auto addr = reinterpret_cast<CUdeviceptr>(peer_flags(peer) + ch.base + static_cast<std::size_t>(my_slot_));
    // With its default memory barrier: what the stream wrote before is visible to the peer first.
    if (ops.write(s, addr, v, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS)
      throw std::runtime_error("cuStreamWriteValue64 to local rank " + std::to_string(peer) + " failed");
  }
}

void PeerExecutor::wait_peers(const std::vector<int>& slots, Channel& ch, cudaStream_t stream) {
  const auto& ops = stream_ops();
  const auto s = reinterpret_cast<CUstream>(stream);
  for (int peer : slots) {
    if (peer == my_slot_) continue;
    const auto v = ++ch.waited.at(static_cast<std::size_t>(peer));
    const auto addr = reinterpret_cast<CUdeviceptr>(static_cast<std::uint64_t*>(flag_block_) + ch.base +
                                                    static_cast<std::size_t>(peer));
    if (ops.wait(s, addr, v, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS)
      throw std::runtime_error("cuStreamWaitValue64 failed");
  }
}

void PeerExecutor::write_word(std::uint64_t* word, std::uint64_t value, cudaStream_t stream) {
  if (stream_ops().write(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(word), value,
                         CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS)
    throw std::runtime_error("cuStreamWriteValue64 of a hierarchical operation's progress word failed");
}

void PeerExecutor::barrier(const Plan& p) {
  signal(p);
  wait_peers(p, stream_);
  ++stats_.barriers;
}

void PeerExecutor::fork() {
  // Must happen whatever went wrong: the side stream's waits and copies follow.
  cudaError_t err = cudaEventRecord(fork_, stream_);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(side_, fork_, 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("fork to the side stream: ") + cudaGetErrorString(err));
  }
  forked_ = true;
}

void PeerExecutor::side_copy(void* dst, const void* src, std::uint64_t bytes) {
  forked_ = true;
  copy(dst, src, bytes, side_);
}

void PeerExecutor::reduce(const std::vector<const void*>& inputs, void* out, std::uint64_t count, const LocalOp& l,
                          int n, const std::vector<void*>& outs) {
  if (!dry_error_.empty() || count == 0) return;
  if (!out || std::any_of(inputs.begin(), inputs.end(), [](const void* x) { return x == nullptr; }) ||
      std::any_of(outs.begin(), outs.end(), [](const void* x) { return x == nullptr; })) {
    dry_error_ = "a member of the " + std::string(ipc::to_string(l.op)) + " has no buffer where one is needed";
    return;
  }
  kernels::ReduceArgs a;
  for (std::size_t i = 0; i < inputs.size(); ++i) a.inputs[i] = inputs[i];
  a.n = static_cast<int>(inputs.size());
  a.out = out;
  a.count = count;
  a.dtype = l.dtype;
  a.op = l.reduce_op;
  a.scale = l.scale;
  for (std::size_t i = 0; i < outs.size(); ++i) a.outs[i] = outs[i];
  a.nout = static_cast<int>(outs.size());
  (void)n;
  // A failure only stops this op's data movement: its barriers must still run.
  if (const auto err = kernels::launch_reduce(a, stream_, sms_ * 4); err != cudaSuccess) {
    cudaGetLastError();
    dry_error_ = std::string("reduction kernel: ") + cudaGetErrorString(err);
    return;
  }
  ++stats_.kernel_launches;
}

void PeerExecutor::copy(void* dst, const void* src, std::uint64_t bytes, cudaStream_t on) {
  if (!dry_error_.empty() || bytes == 0 || dst == src) return;
  if (!dst || !src) {
    dry_error_ = "a member of the collective has no buffer where one is needed";
    return;
  }
  if (const auto err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, on ? on : stream_);
      err != cudaSuccess) {
    cudaGetLastError();
    dry_error_ = std::string("cudaMemcpyAsync: ") + cudaGetErrorString(err);
    return;
  }
  ++stats_.copies;
}

void PeerExecutor::copy_beside(void* dst, const void* src, std::uint64_t bytes) {
  if (!dry_error_.empty() || bytes == 0 || dst == src) return;
  if (!dst || !src) {
    dry_error_ = "a member of the collective has no buffer where one is needed";
    return;
  }
  cudaError_t err = cudaEventRecord(fork_, stream_);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(side_, fork_, 0);
  if (err == cudaSuccess) err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, side_);
  if (err != cudaSuccess) {
    cudaGetLastError();
    dry_error_ = std::string("copy beside: ") + cudaGetErrorString(err);
    return;
  }
  forked_ = true;
  ++stats_.copies;
}

void PeerExecutor::join() {
  if (!forked_) return;
  forked_ = false;
  // Must happen whatever went wrong since: the closing barrier waits for the side stream.
  cudaError_t err = cudaEventRecord(join_, side_);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(stream_, join_, 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("cudaStreamWaitEvent: ") + cudaGetErrorString(err));
  }
}

void PeerExecutor::run(const Plan& p) {
  const LocalOp& l = p.local;
  const int n = static_cast<int>(p.members.size());
  // What this op launched, for the daemon's status (counted whatever happens below).
  struct Count {
    PeerExecutor& x;
    ipc::OpType op;
    std::uint64_t kernels0 = x.stats_.kernel_launches, copies0 = x.stats_.copies;
    ~Count() {
      if (auto c = x.client_.lock())
        c->count_gpu_work(op, x.stats_.kernel_launches - kernels0, x.stats_.copies - copies0);
    }
  } count{*this, l.op};
  ++stats_.ops;
  check(cudaStreamWaitEvent(stream_, l.ready, 0), "cudaStreamWaitEvent");
  if (l.hier) return run_hier(p);

  // Every buffer first: a mapping that fails turns the op "dry" (barriers only), so the
  // other ranks, which cannot know, still pass theirs.
  ScheduleArgs a;
  a.op = l.op;
  a.dtype = l.dtype;
  a.count = l.count;
  a.root = l.root;
  a.me = p.header.me;
  a.in.assign(static_cast<std::size_t>(n), nullptr);
  a.out.assign(static_cast<std::size_t>(n), nullptr);
  a.oneshot_max = oneshot_max_bytes(n);
  a.twoshot = twoshot_form();
  a.copy_push = copy_push();
  a.pipeline_bytes = twoshot_piece_bytes();
  for (const auto& x : p.splits) a.splits.push_back({x.send, x.send_dst, x.recv, x.recv_src});
  dry_error_.clear();
  try {
    for (int i = 0; i < n; ++i) {
      a.in[static_cast<std::size_t>(i)] = static_cast<std::byte*>(resolve(p, i, true));
      a.out[static_cast<std::size_t>(i)] = static_cast<std::byte*>(resolve(p, i, false));
    }
  } catch (const std::exception& ex) {
    dry_error_ = ex.what();
  }
  if (const std::uint64_t need = needs_scratch(a); need > scratch_bytes_ && dry_error_.empty()) {
    // Earlier ops may still use the old buffer, and freeing waits for the whole device: it
    // is freed at the end (only SMDDP_ONESHOT_MAX_BYTES above the default gets here).
    if (scratch_) retired_scratch_.push_back(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    const std::uint64_t want = std::max<std::uint64_t>(need, 1 << 20);
    if (cudaMalloc(&scratch_, want) != cudaSuccess) {
      cudaGetLastError();
      scratch_ = nullptr;
      dry_error_ = "cudaMalloc of " + std::to_string(want) + " bytes for the smddp one-shot buffer failed";
    } else {
      scratch_bytes_ = want;
    }
  }
  a.scratch = static_cast<std::byte*>(scratch_);

  std::string why;
  const auto steps = schedule(a, why);
  if (!steps) {
    dry_error_ = why;
    barrier(p);
    barrier(p);
  } else {
    for (const Step& st : *steps) {
      switch (st.kind) {
        case Step::Kind::Barrier: barrier(p); break;
        case Step::Kind::Reduce: {
          std::vector<const void*> inputs(st.inputs.begin(), st.inputs.end());
          if (st.outs.size() == 1) {
            reduce(inputs, st.outs[0], st.count, l, n);
          } else {
            std::vector<void*> outs(st.outs.begin(), st.outs.end());
            reduce(inputs, outs.empty() ? nullptr : outs[0], st.count, l, n, outs);
          }
          break;
        }
        case Step::Kind::Copy: copy(st.dst, st.src, st.bytes); break;
        case Step::Kind::CopyBeside: copy_beside(st.dst, st.src, st.bytes); break;
        case Step::Kind::Join: join(); break;
        case Step::Kind::Signal: signal(p); break;
        case Step::Kind::WaitSide: wait_peers(p, side_); break;
        case Step::Kind::Fork: fork(); break;
        case Step::Kind::SideCopy: side_copy(st.dst, st.src, st.bytes); break;
      }
    }
  }
  if (!dry_error_.empty()) throw std::runtime_error(dry_error_);
}

void PeerExecutor::release_all() {
  std::lock_guard lk(mu_);
  fast_off_ = true;
  try {
    DeviceScope scope(device_);
    release_flags();
    // Barrier and tail words of the flag block, then every progress word: far above any count.
    constexpr std::size_t first = ipc::kBarrierFlagBase * sizeof(std::uint64_t);
    constexpr std::size_t last = (ipc::kTailFlagBase + ipc::kMaxLocalRanks) * sizeof(std::uint64_t);
    if (cudaMemsetAsync(static_cast<std::byte*>(flag_block_) + first, 0x7f, last - first, rescue_stream_) != cudaSuccess)
      cudaGetLastError();
    if (cudaMemsetAsync(marks_, 0x7f, kMarkWords * sizeof(std::uint64_t), rescue_stream_) != cudaSuccess)
      cudaGetLastError();
  } catch (...) {
    // The device is gone: nothing waits on it any more either.
  }
}

}  // namespace smddp::client::gpu
