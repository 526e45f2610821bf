// Order on memory the plugin itself reads or writes, across the ops of a process.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string_view>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "torch_plugin/work_smddp.hpp"

namespace smddp::torch_plugin {

// The client runs ops on overlapping buffers in issue order (client_impl.hpp, touching_), but it
// sees only the buffers it is given. Some ops hand it temporaries instead: they flatten list
// inputs into one at issue, or copy a result into the caller's list when the op ends (the
// epilogue). Those reads and writes of the caller's tensors are ordered here, per process: such
// an op first waits for the earlier ops still pending on memory its tensors overlap, and any op
// waits for an earlier such op on memory its own tensors overlap. Waiting is Work.wait(): the
// CPU waits for the op's end, and for CUDA tensors the current stream follows it.
// Within a node the GPU path orders its ops by stream: the plan path's on the completion stream
// in the daemon's order, the fast path's in issue order. An op of one path on memory a pending
// op of the other path touches waits for that op the same way.
struct Span {
  std::uintptr_t begin = 0, end = 0;
};
// Most ops name one to four tensors: their spans need no allocation at issue.
using Spans = boost::container::small_vector<Span, 4>;

inline bool overlap(const Spans& a, const Spans& b) {
  for (const auto& x : a)
    for (const auto& y : b)
      if (x.begin < y.end && y.begin < x.end) return true;
  return false;
}

inline Spans spans_of(const std::vector<at::Tensor>& tensors) {
  Spans v;
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0 || !t.has_storage()) continue;
    const auto b = reinterpret_cast<std::uintptr_t>(t.data_ptr());
    v.push_back({b, b + static_cast<std::uintptr_t>(t.numel()) * static_cast<std::uintptr_t>(t.element_size())});
  }
  return v;
}

// The ops that read or write the caller's tensors outside the client (see above).
inline bool touches_outside_client(std::string_view op) {
  return op == "allreduce_coalesced" || op == "allgather" || op == "allgather_coalesced" || op == "gather" ||
         op == "scatter" || op == "reduce_scatter" || op == "alltoall";
}

// Which in-node GPU path ran an op (None: any other op).
enum class GpuPath { None, Fast, Plan, Staged, Hier };
inline constexpr std::size_t kGpuPaths = 5;

// Waits for each of `works` (its failure is its own caller's to see: this op goes on after it,
// as on NCCL's stream).
inline void wait_for(const std::vector<c10::intrusive_ptr<WorkSMDDP>>& works) {
  for (const auto& w : works) {
    try {
      w->wait();
    } catch (...) {
    }
  }
}

class PendingWorks {
 public:
  // `spans`: the memory of the op's tensors; `outside`: it touches them outside the client.
  void add(const c10::intrusive_ptr<WorkSMDDP>& work, Spans spans, bool outside, GpuPath path) {
    std::lock_guard lk(mu_);
    // Ops mostly end in issue order: those ended at the front go at once (one still pending
    // there keeps later ones listed, skipped by before(), until the list is long).
    while (!entries_.empty() && ended(entries_.front())) {
      count(entries_.front(), -1);
      entries_.pop_front();
    }
    if (entries_.size() > 64) {
      std::erase_if(entries_, [this](const Entry& e) {
        if (!ended(e)) return false;
        count(e, -1);
        return true;
      });
    }
    entries_.push_back({c10::weak_intrusive_ptr<WorkSMDDP>(work), std::move(spans), outside, path});
    count(entries_.back(), +1);
  }
  // The earlier ops still pending that an op on `spans` waits for: those on overlapping memory
  // where either op touches it outside the client.
  std::vector<c10::intrusive_ptr<WorkSMDDP>> before(const Spans& spans, bool outside) {
    if (!outside && !listed_outside_.load(std::memory_order_relaxed)) return {};
    return matching(spans, [outside](const Entry& e) { return outside || e.outside; });
  }
  // The earlier GPU ops still pending whose memory `spans` overlap and which an op of `path`
  // is not ordered after by itself: those of another GPU path, and any hierarchical one (its
  // last copies run on copy streams of its own, once its bytes are back from the other nodes).
  // The same path orders its own ops: the plan path by the daemon's order on one stream, the
  // fast path by issue order, the staged path by its copiers following each other.
  std::vector<c10::intrusive_ptr<WorkSMDDP>> other_path(const Spans& spans, GpuPath path) {
    bool listed = false;  // steady state runs one path only: no lock then
    for (std::size_t p = 1; p < kGpuPaths; ++p)
      listed = listed || ((p != index(path) || path == GpuPath::Hier) && listed_[p].load(std::memory_order_relaxed));
    if (!listed) return {};
    return matching(spans, [path](const Entry& e) {
      return e.path != GpuPath::None && (e.path != path || path == GpuPath::Hier);
    });
  }

 private:
  struct Entry {
    // Weak: the op keeps itself alive until it ends, and its tensors go with its last strong
    // reference (WorkSMDDP::release_resources), not with this entry.
    c10::weak_intrusive_ptr<WorkSMDDP> work;
    Spans spans;
    bool outside;
    GpuPath path;
  };
  static bool ended(const Entry& e) {
    auto w = e.work.lock();
    return !w || w->finalized();
  }
  static std::size_t index(GpuPath p) { return static_cast<std::size_t>(p); }
  template <class Pred>
  std::vector<c10::intrusive_ptr<WorkSMDDP>> matching(const Spans& spans, Pred&& pred) {
    std::vector<c10::intrusive_ptr<WorkSMDDP>> v;
    std::lock_guard lk(mu_);
    for (const auto& e : entries_) {
      if (!pred(e) || !overlap(e.spans, spans)) continue;
      if (auto w = e.work.lock(); w && !w->finalized()) v.push_back(std::move(w));
    }
    return v;
  }
  // Keeps the counts of listed entries (ended ones included until they go) and their flags.
  void count(const Entry& e, int by) {
    outside_count_ += static_cast<std::size_t>(e.outside ? by : 0);
    path_count_[index(e.path)] += static_cast<std::size_t>(by);
    listed_outside_.store(outside_count_ > 0, std::memory_order_relaxed);
    listed_[index(e.path)].store(path_count_[index(e.path)] > 0, std::memory_order_relaxed);
  }
  std::mutex mu_;
  std::deque<Entry> entries_;
  std::size_t outside_count_ = 0;          // entries with `outside`
  std::array<std::size_t, kGpuPaths> path_count_{};  // entries by GpuPath
  // Read without the lock, as hints that skip it: an op issued by another thread at the same
  // moment is not ordered before this one anyway.
  std::atomic<bool> listed_outside_{false};
  std::array<std::atomic<bool>, kGpuPaths> listed_{};
};

inline PendingWorks& pending_works() {
  static PendingWorks p;
  return p;
}

// What supported_path() found for the op being issued on this thread, for run() to register.
struct Issue {
  const char* op = nullptr;
  Spans spans;
  bool outside = false;
  GpuPath path = GpuPath::None;  // set by device_call() for GPU ops
};
inline thread_local Issue t_issue;

}  // namespace smddp::torch_plugin
