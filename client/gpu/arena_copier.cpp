#include "client/gpu/arena_copier.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <functional>
#include <mutex>
#include <optional>

#include "client/gpu/cuda_util.hpp"
#include "client/gpu/peer_executor_impl.hpp"

namespace smddp::client::gpu {

// What a fence's host function touches: shared with it, so a copier dropped while its last
// fences are still queued stays valid until they ran.
struct CopierState {
  struct Lane {
    cudaStream_t stream = nullptr;          // the copies
    cudaStream_t signal = nullptr;          // the fences' host functions, each after its event
    cudaEvent_t event = nullptr;            // recorded at each fence (the pair's own)
    std::uint64_t issued = 0;               // last ticket handed out (client's lock)
    std::uint64_t recorded = 0;             // the ticket `event` was last recorded for (client's lock)
    std::atomic<std::uint64_t> passed{0};   // last ticket whose copies finished
  };
  std::array<Lane, 2> lanes;  // by StagingCopier::Lane
  std::mutex mu;              // wake and error
  std::function<void()> wake;
  std::string error;
};

namespace {
// Driver entry points (no libcuda link, as for the executor's stream operations).
struct Driver {
  CUresult (*query)(CUstream) = nullptr;
  CUresult (*name)(CUresult, const char**) = nullptr;
  CUresult (*event_query)(CUevent) = nullptr;
};
const Driver& driver() {
  static const Driver d{driver_entry<CUresult (*)(CUstream)>("cuStreamQuery"),
                        driver_entry<CUresult (*)(CUresult, const char**)>("cuGetErrorName"),
                        driver_entry<CUresult (*)(CUevent)>("cuEventQuery")};
  return d;
}

// Whether a query of our stream or event says a copy failed. The capture errors say only that
// the calling thread captures a CUDA graph (it waits on an op inside its capture region), which
// forbids queries; the copies are not at fault.
bool copy_failed(CUresult e) {
  return e != CUDA_SUCCESS && e != CUDA_ERROR_NOT_READY &&
         (e < CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || e > CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
}

std::string error_name(CUresult e) {
  const char* name = nullptr;
  if (!driver().name || driver().name(e, &name) != CUDA_SUCCESS || !name) name = "unknown CUDA error";
  return std::string(name) + " (" + std::to_string(e) + ")";
}

struct Fence {
  std::shared_ptr<CopierState> state;
  int lane;
  std::uint64_t ticket;
};

// Tickets only grow, whoever stores them first (a failed fence passes at once, before the
// host functions of earlier ones ran).
void raise(std::atomic<std::uint64_t>& passed, std::uint64_t ticket) {
  std::uint64_t now = passed.load(std::memory_order_relaxed);
  while (now < ticket && !passed.compare_exchange_weak(now, ticket, std::memory_order_release)) {
  }
}

void CUDART_CB fence_passed(void* arg) {
  std::unique_ptr<Fence> f(static_cast<Fence*>(arg));
  raise(f->state->lanes[static_cast<std::size_t>(f->lane)].passed, f->ticket);
  std::function<void()> wake;
  {
    std::lock_guard lk(f->state->mu);
    wake = f->state->wake;
  }
  if (wake) wake();
}
}  // namespace

class OpCopier final : public StagingCopier {
 public:
  OpCopier(std::shared_ptr<ArenaCopyLanes> lanes, const void* in, void* out, cudaStream_t producer,
           std::optional<ShardStaging> shard = std::nullopt)
      : lanes_(std::move(lanes)),
        in_(static_cast<const std::byte*>(in)),
        out_(static_cast<std::byte*>(out)),
        shard_(std::move(shard)) {
    pair_ = lanes_->take();
    state_->lanes[0].stream = pair_.in;
    state_->lanes[0].signal = pair_.signal_in;
    state_->lanes[0].event = pair_.fenced_in;
    state_->lanes[1].stream = pair_.out;
    state_->lanes[1].signal = pair_.signal_out;
    state_->lanes[1].event = pair_.fenced_out;
    try {
      DeviceScope scope(lanes_->device());
      // Both lanes follow the caller's stream as it is now: the inputs are written, and the
      // outputs are no longer read by anything issued before the operation. The Out lane
      // waits at its first copy, and only if no copy in has finished by then (see copy_out).
      check(cudaEventRecord(pair_.ready, producer), "cudaEventRecord");
      // A shard copier waits at release_shard(): nothing of it goes on its streams before.
      if (!shard_) check(cudaStreamWaitEvent(pair_.in, pair_.ready, 0), "cudaStreamWaitEvent");
    } catch (...) {
      release();
      throw;
    }
  }
  ~OpCopier() override { release(); }
  OpCopier(const OpCopier&) = delete;
  OpCopier& operator=(const OpCopier&) = delete;

  void set_wake(std::function<void()> wake) override {
    std::lock_guard lk(state_->mu);
    state_->wake = std::move(wake);
  }
  void copy_in(std::byte* to, std::uint64_t offset, std::uint64_t bytes) noexcept override {
    if (!shard_) return copy(to, in_ + offset, bytes, cudaMemcpyDeviceToHost, pair_.in);
    std::lock_guard lk(pend_mu_);
    if (!released_) return pending_.push_back({Pending::In, to, offset, bytes, nullptr});
    shard_copy_in(to, offset, bytes);
  }
  void copy_out(std::uint64_t offset, const std::byte* from, std::uint64_t bytes) noexcept override {
    if (!shard_) return arena_copy_out(offset, from, bytes);
    std::lock_guard lk(pend_mu_);
    if (!released_) return pending_.push_back({Pending::Out, nullptr, offset, bytes, from});
    shard_copy_out(offset, from, bytes);
  }
  // Enqueues what the copier was given before the plan's pre part was enqueued: its waits on
  // the marks then come after the writes of the marks, in any hardware queue they share.
  void release_shard() {
    std::lock_guard lk(pend_mu_);
    if (released_) return;
    released_ = true;
    try {
      DeviceScope scope(lanes_->device());
      check(cudaStreamWaitEvent(pair_.in, pair_.ready, 0), "cudaStreamWaitEvent");
    } catch (const std::exception& x) {
      fail(x.what());
    }
    for (const auto& p : pending_) {
      switch (p.what) {
        case Pending::In: shard_copy_in(p.to, p.offset, p.bytes); break;
        case Pending::Out: shard_copy_out(p.offset, p.from, p.bytes); break;
        case Pending::FenceIn: record_fence(Lane::In, p.offset); break;
        case Pending::FenceOut: record_fence(Lane::Out, p.offset); break;
      }
    }
    pending_.clear();
  }

 private:
  void shard_copy_in(std::byte* to, std::uint64_t offset, std::uint64_t bytes) noexcept {
    // The stretch is written once the pre part passed the mark that covers its end.
    std::uint64_t value = shard_->last;
    for (const auto& [ready, v] : shard_->marks)
      if (ready >= offset + bytes) {
        value = v;
        break;
      }
    if (value > waited_in_) {
      wait_word(pair_.in, value);
      waited_in_ = value;
    }
    for_segments(shard_->rail.in, offset, bytes, [&](const RailSegment&, std::byte* dev, std::uint64_t done,
                                                     std::uint64_t len) {
      copy(to + done, dev, len, cudaMemcpyDeviceToHost, pair_.in);
    });
  }
  void shard_copy_out(std::uint64_t offset, const std::byte* from, std::uint64_t bytes) noexcept {
    {
      if (!out_ordered_) {
        // Pushes into the other members come after the pre part's barrier with them.
        out_ordered_ = true;
        wait_word(pair_.out, shard_->last);
      }
      for_segments(shard_->rail.out, offset, bytes, [&](const RailSegment& seg, std::byte* dev, std::uint64_t done,
                                                        std::uint64_t len) {
        copy(dev, from + done, len, cudaMemcpyHostToDevice, pair_.out);
        const std::size_t index = static_cast<std::size_t>(&seg - shard_->rail.out.data());
        const std::uint64_t within = static_cast<std::uint64_t>(dev - seg.at);
        std::lock_guard lk(push_mu_);
        if (push_known_) push(index, within, len);
        else back_.push_back({index, within, len});
      });
    }
  }
  void arena_copy_out(std::uint64_t offset, const std::byte* from, std::uint64_t bytes) noexcept {
    if (!out_ordered_) {
      // A finished copy in shows that the In lane got past `ready`, so the caller's work
      // before the operation is over: one driver call less per operation that has inputs.
      out_ordered_ = true;
      if (state_->lanes[static_cast<std::size_t>(Lane::In)].passed.load(std::memory_order_acquire) == 0) {
        try {
          DeviceScope scope(lanes_->device());
          check(cudaStreamWaitEvent(pair_.out, pair_.ready, 0), "cudaStreamWaitEvent");
        } catch (const std::exception& x) {
          fail(x.what());
        }
      }
    }
    copy(out_ + offset, from, bytes, cudaMemcpyHostToDevice, pair_.out);
  }

 public:
  cudaStream_t out_stream() const noexcept { return pair_.out; }
  void set_push_targets(std::vector<std::vector<std::byte*>> targets) {
    std::lock_guard lk(push_mu_);
    if (!shard_ || push_known_) return;
    if (targets.size() != shard_->rail.out.size()) {
      fail("the plan names " + std::to_string(targets.size()) + " stretches to push where the rail output has " +
           std::to_string(shard_->rail.out.size()));
      return;
    }
    push_targets_ = std::move(targets);
    push_known_ = true;
    for (const auto& b : back_) push(b.segment, b.within, b.bytes);
    back_.clear();
  }
  std::uint64_t fence(Lane lane) noexcept override {
    auto& l = state_->lanes[static_cast<std::size_t>(lane)];
    const std::uint64_t ticket = ++l.issued;
    if (shard_) {
      std::lock_guard lk(pend_mu_);
      if (!released_) {
        pending_.push_back({lane == Lane::In ? Pending::FenceIn : Pending::FenceOut, nullptr, ticket, 0, nullptr});
        return ticket;
      }
    }
    record_fence(lane, ticket);
    return ticket;
  }
  void record_fence(Lane lane, std::uint64_t ticket) noexcept {
    auto& l = state_->lanes[static_cast<std::size_t>(lane)];
    auto f = std::make_unique<Fence>(Fence{state_, static_cast<int>(lane), ticket});
    try {
      DeviceScope scope(lanes_->device());
      // Two signs of the same point: the event for a client thread that polls passed() while
      // it spins, the host function to wake one that sleeps. The event tells sooner
      // (scripts/diag/fence_probe.cu: 6.5-8.4 against 23-24 us after an 8 B-64 KiB copy).
      check(cudaEventRecord(l.event, l.stream), "cudaEventRecord");
      l.recorded = ticket;
      check(cudaStreamWaitEvent(l.signal, l.event, 0), "cudaStreamWaitEvent");
      check(cudaLaunchHostFunc(l.signal, fence_passed, f.get()), "cudaLaunchHostFunc");
      f.release();  // fence_passed owns it now
      return;
    } catch (const std::exception& x) {
      fail(x.what());
    }
    // The client must not wait for ever: the fence passes once the copies before it are over,
    // and the error fails the operation. Waiting under the client's lock goes against the
    // copier's contract, but only here: a host function that cannot be enqueued means a
    // broken context, whose streams end at once.
    cudaStreamSynchronize(l.stream);
    raise(l.passed, ticket);
  }
  bool passed(Lane lane, std::uint64_t ticket) const noexcept override {
    auto& l = state_->lanes[static_cast<std::size_t>(lane)];
    if (l.passed.load(std::memory_order_acquire) >= ticket) return true;
    // The event marks the lane's latest fence only, so only a question about that one asks it:
    // the client asks about every region still draining at each step, and one query per lane
    // is all that can tell anything (a small op's chunk is always its lane's latest).
    if (l.recorded != ticket || !event_done(l.event)) return false;
    raise(l.passed, ticket);  // its host function, and those before it, may not have run yet
    return true;
  }
  void drain() noexcept override {
    try {
      DeviceScope scope(lanes_->device());
      cudaStreamSynchronize(pair_.in);
      cudaStreamSynchronize(pair_.out);
    } catch (...) {
      // The device is gone: nothing will copy any more either.
    }
  }

  void follow(StagingCopier& earlier) noexcept override {
    auto* e = dynamic_cast<OpCopier*>(&earlier);
    if (!e) {
      fail("an earlier operation on the same memory was not staged by a CUDA copier");
      return;
    }
    try {
      DeviceScope scope(lanes_->device());
      // Events of our own, recorded and waited on at once: the earlier pair's are recorded by
      // other threads too (order_after), and this ordering is rare (ops chained on one tensor).
      for (cudaStream_t s : {e->pair_.in, e->pair_.out}) {
        cudaEvent_t ev = nullptr;
        check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
        const cudaError_t r = cudaEventRecord(ev, s);
        cudaError_t w1 = cudaSuccess, w2 = cudaSuccess;
        if (r == cudaSuccess) {
          w1 = cudaStreamWaitEvent(pair_.in, ev, 0);
          w2 = cudaStreamWaitEvent(pair_.out, ev, 0);
        }
        cudaEventDestroy(ev);  // released once the waits are through
        check(r, "ordering after an earlier operation's copies");
        check(w1, "ordering after an earlier operation's copies");
        check(w2, "ordering after an earlier operation's copies");
      }
    } catch (const std::exception& x) {
      fail(x.what());
    }
  }

  // Both lanes: after a failure, dropped chunks' copies in may still read the input.
  void order_after(cudaStream_t consumer) {
    DeviceScope scope(lanes_->device());
    for (auto [s, done] : {std::pair{pair_.in, pair_.tail_in}, std::pair{pair_.out, pair_.tail_out}}) {
      check(cudaEventRecord(done, s), "ordering after the copies through the arena");
      check(cudaStreamWaitEvent(consumer, done, 0), "ordering after the copies through the arena");
    }
  }
  std::string error() const override {
    // A copy that faulted while it ran breaks the context: its fence's host function never
    // runs, so the streams' state is where the failure shows (querying never blocks).
    // Through the driver: the runtime's query would leave "not ready" for a later
    // cudaGetLastError() on this thread to mistake for a failed launch.
    if (const auto& d = driver(); d.query) {
      std::optional<DeviceScope> scope;
      try {
        scope.emplace(lanes_->device());  // the stream's context current on this thread
      } catch (const std::exception& x) {
        fail(x.what());
      }
      for (cudaStream_t s : {pair_.in, pair_.out}) {
        const CUresult e = d.query(reinterpret_cast<CUstream>(s));
        if (copy_failed(e)) fail("a copy through the arena failed: " + error_name(e));
      }
    }
    std::lock_guard lk(state_->mu);
    return state_->error;
  }

 private:
  void copy(void* dst, const void* src, std::uint64_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    try {
      DeviceScope scope(lanes_->device());
      check(cudaMemcpyAsync(dst, src, bytes, kind, s), kind == cudaMemcpyDeviceToHost
                                                            ? "copying a CUDA tensor into the arena"
                                                            : "copying the arena into a CUDA tensor");
    } catch (const std::exception& x) {
      fail(x.what());
    }
  }
  // Whether `event`'s work has finished, without waiting. Through the driver, as error() for
  // the same reason; a failure is kept for error() to report.
  bool event_done(cudaEvent_t event) const noexcept {
    const auto& d = driver();
    if (!d.event_query) return false;
    try {
      DeviceScope scope(lanes_->device());
      const CUresult e = d.event_query(reinterpret_cast<CUevent>(event));
      if (e == CUDA_SUCCESS) return true;
      if (copy_failed(e)) fail("a copy through the arena failed: " + error_name(e));
    } catch (const std::exception& x) {
      fail(x.what());
    }
    return false;
  }
  // Calls fn(segment, device address, bytes done before it, length) for the stretches of
  // [offset, offset + bytes) of the rail input or output, in order.
  template <class Fn>
  void for_segments(const std::vector<RailSegment>& segs, std::uint64_t offset, std::uint64_t bytes, Fn&& fn) {
    std::uint64_t done = 0;
    for (const auto& seg : segs) {
      if (done == bytes) break;
      const std::uint64_t at = offset + done;
      if (at < seg.offset || at >= seg.offset + seg.bytes) continue;
      const std::uint64_t len = std::min(bytes - done, seg.offset + seg.bytes - at);
      fn(seg, seg.at + (at - seg.offset), done, len);
      done += len;
    }
    if (done != bytes)
      fail("a copy of " + std::to_string(bytes) + " bytes at " + std::to_string(offset) +
           " falls outside the rail operation's stretches");
  }
  // Makes `s` wait until the progress word reaches `value` (the pre part's marks).
  void wait_word(cudaStream_t s, std::uint64_t value) {
    try {
      DeviceScope scope(lanes_->device());
      if (detail::stream_ops().wait(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(shard_->word), value,
                                    CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS)
        fail("cuStreamWaitValue64 on the hierarchical operation's progress word failed");
    } catch (const std::exception& x) {
      fail(x.what());
    }
  }
  // The stretch `within` bytes into output segment `segment` came back: on to the other members
  // (push_mu_ held).
  void push(std::size_t segment, std::uint64_t within, std::uint64_t bytes) {
    const RailSegment& seg = shard_->rail.out[segment];
    for (std::byte* to : push_targets_[segment]) {
      if (!to) {
        fail("a member of the node has no buffer to push the rail operation's result into");
        continue;
      }
      try {
        DeviceScope scope(lanes_->device());
        check(cudaMemcpyAsync(to + within, seg.at + within, bytes, cudaMemcpyDeviceToDevice, pair_.out),
              "pushing a piece of the rail operation's result to a member of the node");
      } catch (const std::exception& x) {
        fail(x.what());
      }
    }
  }
  void fail(const std::string& why) const {
    std::lock_guard lk(state_->mu);
    if (state_->error.empty()) state_->error = why;
  }
  void release() {
    if (pair_.in) lanes_->give(pair_);
    pair_ = {};
  }

  std::shared_ptr<ArenaCopyLanes> lanes_;
  const std::byte* in_;
  std::byte* out_;
  ArenaCopyLanes::Pair pair_;
  bool out_ordered_ = false;  // the Out lane waited for `ready`, or needs not (client's lock)
  std::shared_ptr<CopierState> state_ = std::make_shared<CopierState>();
  // A hierarchical operation's rail operation (shard_copier): its stretches, and the marks its
  // copies in wait for.
  std::optional<ShardStaging> shard_;
  std::uint64_t waited_in_ = 0;  // the last word value the In lane waited for (client's lock)
  struct Back {
    std::size_t segment;
    std::uint64_t within, bytes;
  };
  // Shard copiers: what they were given before release_shard() (the plan), in order.
  struct Pending {
    enum What { In, Out, FenceIn, FenceOut } what;
    std::byte* to;
    std::uint64_t offset;  // FenceIn/FenceOut: the ticket
    std::uint64_t bytes;
    const std::byte* from;
  };
  std::mutex pend_mu_;
  bool released_ = false;
  std::vector<Pending> pending_;
  std::mutex push_mu_;  // the copies out (client's lock) and set_push_targets (the plan's thread)
  bool push_known_ = false;
  std::vector<std::vector<std::byte*>> push_targets_;
  std::vector<Back> back_;  // stretches back before the targets were known
};

ArenaCopyLanes::ArenaCopyLanes(int device, std::byte* arena, std::size_t bytes)
    : device_(device), arena_(arena), bytes_(bytes) {
  if (!arena || bytes == 0) throw std::runtime_error("this rank has no arena to stage CUDA tensors through");
  DeviceScope scope(device_);
  check(cudaHostRegister(arena_, bytes_, cudaHostRegisterPortable),
        "cudaHostRegister of the smddp arena (CUDA tensors across nodes are staged through it)");
  registered_ = true;
}

ArenaCopyLanes::~ArenaCopyLanes() {
  release_arena();
  try {
    DeviceScope scope(device_);
    for (auto& p : all_) destroy(p);
  } catch (...) {
    // Teardown after the device failed: nothing left to release through it.
  }
}

void ArenaCopyLanes::release_arena() noexcept {
  std::lock_guard lk(mu_);
  if (!registered_) return;
  registered_ = false;
  try {
    DeviceScope scope(device_);
    for (auto& p : all_) {
      cudaStreamSynchronize(p.in);
      cudaStreamSynchronize(p.out);
    }
    cudaHostUnregister(arena_);
  } catch (...) {
    // The device failed: nothing left to release through it.
  }
}

std::shared_ptr<StagingCopier> ArenaCopyLanes::copier(const void* in, void* out, cudaStream_t producer) {
  {
    std::lock_guard lk(mu_);
    if (!registered_) throw std::runtime_error("the arena is gone (its client was destroyed)");
  }
  return std::make_shared<OpCopier>(shared_from_this(), in, out, producer);
}

std::shared_ptr<StagingCopier> ArenaCopyLanes::shard_copier(ShardStaging shard, cudaStream_t producer) {
  {
    std::lock_guard lk(mu_);
    if (!registered_) throw std::runtime_error("the arena is gone (its client was destroyed)");
  }
  if (!shard.word) throw std::runtime_error("a hierarchical operation's copier without its progress word");
  return std::make_shared<OpCopier>(shared_from_this(), nullptr, nullptr, producer, std::move(shard));
}

void ArenaCopyLanes::set_push_targets(StagingCopier& copier, std::vector<std::vector<std::byte*>> targets) {
  dynamic_cast<OpCopier&>(copier).set_push_targets(std::move(targets));
}

void ArenaCopyLanes::release_shard(StagingCopier& copier) { dynamic_cast<OpCopier&>(copier).release_shard(); }

void ArenaCopyLanes::order_after(StagingCopier& copier, cudaStream_t consumer) {
  dynamic_cast<OpCopier&>(copier).order_after(consumer);
}

cudaStream_t ArenaCopyLanes::out_stream(StagingCopier& copier) {
  return dynamic_cast<OpCopier&>(copier).out_stream();
}

ArenaCopyLanes::Pair ArenaCopyLanes::take() {
  {
    std::lock_guard lk(mu_);
    if (!free_.empty()) {
      Pair p = free_.back();
      free_.pop_back();
      return p;
    }
  }
  DeviceScope scope(device_);
  Pair p;
  try {
    for (cudaStream_t* s : {&p.in, &p.out, &p.signal_in, &p.signal_out})
      check(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking), "cudaStreamCreate");
    for (cudaEvent_t* e : {&p.ready, &p.fenced_in, &p.fenced_out, &p.tail_in, &p.tail_out})
      check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");
  } catch (...) {
    destroy(p);
    throw;
  }
  std::lock_guard lk(mu_);
  all_.push_back(p);
  return p;
}

void ArenaCopyLanes::destroy(Pair& p) noexcept {
  for (cudaStream_t s : {p.in, p.out, p.signal_in, p.signal_out})
    if (s) cudaStreamDestroy(s);
  for (cudaEvent_t e : {p.ready, p.fenced_in, p.fenced_out, p.tail_in, p.tail_out})
    if (e) cudaEventDestroy(e);
  p = {};
}

void ArenaCopyLanes::give(Pair p) {
  // Reused by a later operation: its copies then also wait for this one's last ones, which
  // depend on nothing later, so nothing can wait in a circle.
  std::lock_guard lk(mu_);
  free_.push_back(p);
}

}  // namespace smddp::client::gpu
