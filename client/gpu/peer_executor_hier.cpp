// PeerExecutor's part in hierarchical operations across nodes (hier_work.hpp): the marks a
// plan's pre part writes for the shard copier, the plan's in-node parts, and the closing
// barrier ("tail") once the rail operation ended, in the order that keeps every GPU wait behind
// the work it waits for (docs/gpu.md, CUDA tensors across nodes).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "client/gpu/arena_copier.hpp"
#include "client/gpu/cuda_util.hpp"
#include "client/gpu/hier_schedule.hpp"
#include "client/gpu/hier_trace.hpp"
#include "client/gpu/peer_executor.hpp"
#include "client/gpu/peer_executor_impl.hpp"
#include "kernels/device_kernels.hpp"

namespace smddp::client::gpu {

using namespace detail;

PeerExecutor::Marks PeerExecutor::reserve_marks(std::size_t marks) {
  std::lock_guard lk(mu_);
  // Each use of a word writes values above every earlier use's: the epoch in the high bits.
  const std::uint64_t k = mark_ops_++;
  Marks m;
  m.word = marks_ + k % kMarkWords;
  const std::uint64_t epoch = (k / kMarkWords + 1) << 20;
  for (std::size_t j = 0; j < marks; ++j) m.values.push_back(epoch + j + 1);
  return m;
}

void PeerExecutor::run_hier(const Plan& p) {
  const LocalOp& l = p.local;
  HierOp& h = *l.hier;
  const int n = static_cast<int>(p.members.size());
  HierArgs a;
  a.op = l.op;
  a.dtype = l.dtype;
  a.reduce_op = l.reduce_op;
  a.count = l.count;
  a.root = l.root;
  a.layout = &h.layout;
  a.me = h.me;
  a.scratch = static_cast<std::byte*>(h.scratch);
  a.piece_bytes = h.piece_bytes;
  a.in.assign(static_cast<std::size_t>(n), nullptr);
  a.out.assign(static_cast<std::size_t>(n), nullptr);
  dry_error_.clear();
  if (n != h.layout.per_node || p.header.me != h.layout.local_of[static_cast<std::size_t>(h.me)])
    dry_error_ = "the plan names " + std::to_string(n) + " members (this rank at " + std::to_string(p.header.me) +
                 ") where the group holds " + std::to_string(h.layout.per_node) + " a node (this rank at " +
                 std::to_string(h.layout.local_of[static_cast<std::size_t>(h.me)]) + ")";
  try {
    if (dry_error_.empty())
      for (int i = 0; i < n; ++i) {
        a.in[static_cast<std::size_t>(i)] = static_cast<std::byte*>(resolve(p, i, true));
        a.out[static_cast<std::size_t>(i)] = static_cast<std::byte*>(resolve(p, i, false));
      }
  } catch (const std::exception& ex) {
    dry_error_ = ex.what();
  }
  std::string why;
  std::optional<HierSchedule> s;
  if (dry_error_.empty()) s = hier_schedule(a, why);
  if (dry_error_.empty() && !s) dry_error_ = why;
  if (s && s->marks.size() != h.mark_values.size())
    dry_error_ = "the plan's schedule has " + std::to_string(s->marks.size()) + " marks where its issue had " +
                 std::to_string(h.mark_values.size());
  h.slots = slots_of(p.members);
  // Whatever went wrong, the barrier and the marks go on the stream: the node's other members
  // and this rank's own copies wait for them (the data is then wrong, and the Work says so).
  std::size_t next = 0;
  if (!dry_error_.empty()) {
    barrier(p);
  } else {
    const auto marks_upto = [&](std::size_t steps_done) {
      for (; next < s->marks.size() && s->marks[next].after == steps_done; ++next)
        write_word(h.word, h.mark_values[next], stream_);
    };
    marks_upto(0);
    for (std::size_t i = 0; i < s->pre.size(); ++i) {
      const Step& st = s->pre[i];
      switch (st.kind) {
        case Step::Kind::Barrier: barrier(p); break;
        case Step::Kind::Reduce: {
          std::vector<const void*> inputs(st.inputs.begin(), st.inputs.end());
          reduce(inputs, st.outs.at(0), st.count, l, n);
          break;
        }
        case Step::Kind::Copy: copy(st.dst, st.src, st.bytes); break;
        default: dry_error_ = "a hierarchical pre part holds a step it should not"; break;
      }
      marks_upto(i + 1);
    }
    std::vector<std::vector<std::byte*>> targets;
    for (const auto& seg : s->rail.out) targets.push_back(seg.push);
    ArenaCopyLanes::set_push_targets(*h.copier, std::move(targets));
  }
  for (; next < h.mark_values.size(); ++next) write_word(h.word, h.mark_values[next], stream_);
  ArenaCopyLanes::release_shard(*h.copier);
  if (!dry_error_.empty()) h.error = dry_error_;
  hier_trace("op %llu planned: %zu marks, %zu pre steps%s%s", static_cast<unsigned long long>(h.token),
             h.mark_values.size(), s ? s->pre.size() : std::size_t{0}, dry_error_.empty() ? "" : ", dry: ",
             dry_error_.c_str());
  h.planned = true;
  hier_tails_.push_back(l.hier);
  // drain() holds mu_: the callbacks of tails enqueued here run once it is released.
  flush_tails_locked(deferred_);
}

void PeerExecutor::flush_tails_locked(std::vector<std::function<void()>>& after) {
  while (!hier_tails_.empty() && hier_tails_.front()->rail_done) {
    auto h = hier_tails_.front();
    hier_tails_.pop_front();
    try {
      DeviceScope scope(device_);
      const cudaStream_t out = ArenaCopyLanes::out_stream(*h->copier);
      // After the whole pre part (a rank without copies back never waited for it), then the
      // pushes and copies back enqueued so far: the node's other members go on once all of
      // theirs are in.
      if (stream_ops().wait(reinterpret_cast<CUstream>(out), reinterpret_cast<CUdeviceptr>(h->word),
                            h->mark_values.back(), CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS)
        throw std::runtime_error("cuStreamWaitValue64 failed");
      // The wait is a kernel: it runs once the rail operation is over, later than plans that
      // came after it, whose barriers wait on the main stream; a stream memory operation here
      // could hold their work back in a shared hardware queue while the peers need it.
      signal(h->slots, tail_, out);
      kernels::WaitArgs w;
      for (int peer : h->slots) {
        if (peer == my_slot_) continue;
        w.flags[w.n] = static_cast<std::uint64_t*>(flag_block_) + tail_.base + static_cast<std::size_t>(peer);
        w.values[w.n++] = ++tail_.waited.at(static_cast<std::size_t>(peer));
      }
      check(kernels::launch_wait_flags(w, out), "the closing barrier's wait");
      ++stats_.barriers;
    } catch (const std::exception& e) {
      if (h->error.empty()) h->error = std::string("the closing barrier: ") + e.what();
    }
    h->tail_done = true;
    hier_trace("op %llu tail enqueued", static_cast<unsigned long long>(h->token));
    for (auto& cb : h->on_tail) after.push_back(std::move(cb));
    h->on_tail.clear();
  }
  hier_cv_.notify_all();
}

void PeerExecutor::hier_abandon(const std::shared_ptr<HierOp>& h) {
  std::vector<std::function<void()>> after;
  {
    std::lock_guard lk(mu_);
    if (h->planned || h->abandoned) return;
    h->abandoned = true;
    hier_trace("op %llu abandoned (its request failed)", static_cast<unsigned long long>(h->token));
    try {
      DeviceScope scope(device_);
      write_word(h->word, h->mark_values.empty() ? 0 : h->mark_values.back(), rescue_stream_);
    } catch (const std::exception& e) {
      if (h->error.empty()) h->error = e.what();
    }
    ArenaCopyLanes::release_shard(*h->copier);
    after.swap(h->on_tail);
  }
  hier_cv_.notify_all();
  for (auto& cb : after) cb();
}

void PeerExecutor::hier_on_tail(const std::shared_ptr<HierOp>& h, std::function<void()> cb) {
  {
    std::lock_guard lk(mu_);
    if (!h->tail_done && !h->abandoned) {
      h->on_tail.push_back(std::move(cb));
      return;
    }
  }
  cb();
}

void PeerExecutor::hier_rail_done(const std::shared_ptr<HierOp>& h) {
  std::vector<std::function<void()>> after;
  {
    std::lock_guard lk(mu_);
    h->rail_done = true;
    DeviceScope scope(device_);
    pump_locked();  // its tail, then the plans held behind it
    after.swap(deferred_);
  }
  for (auto& cb : after) cb();
}

bool PeerExecutor::hier_wait_tail(const std::shared_ptr<HierOp>& h, std::chrono::steady_clock::time_point until) {
  std::unique_lock lk(mu_);
  const auto began = std::chrono::steady_clock::now();
  bool told = false;
  while (!h->tail_done && !h->abandoned) {
    if (!told && std::chrono::steady_clock::now() - began > std::chrono::seconds(20)) {
      told = true;
      hier_trace("op %llu still waits for its tail after 20 s: planned %d, rail done %d; %zu tails ahead",
                 static_cast<unsigned long long>(h->token), h->planned, h->rail_done, hier_tails_.size());
    }
    // Tails go in plan order: drive the first rail operation ahead of (or of) this one that
    // has not ended.
    std::shared_ptr<Work> ahead;
    for (const auto& x : hier_tails_) {
      if (!x->rail_done) ahead = x->rail.lock();
      if (ahead || x == h) break;
    }
    if (ahead) {
      lk.unlock();
      try {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
        if (left.count() <= 0) return false;
        ahead->wait(left);
      } catch (const std::exception&) {
        // Its own caller sees its failure; its tail goes on all the same.
      }
      lk.lock();
      continue;
    }
    // The plan is on its way (its callback runs on another thread), or a rail operation's
    // callback is still running there.
    if (hier_cv_.wait_until(lk, std::min(until, std::chrono::steady_clock::now() + std::chrono::milliseconds(20))) ==
            std::cv_status::timeout &&
        std::chrono::steady_clock::now() >= until)
      return false;
  }
  return true;
}

}  // namespace smddp::client::gpu
