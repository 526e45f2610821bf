// WorkSMDDP: the c10d::Work of one process-group call. It may cover several client
// operations (a coalesced call, a mixed-dtype list) and other WorkSMDDPs (endCoalescing);
// it finishes when all of them have, then runs its epilogue (copies from staging tensors into
// the caller's tensors) and completes its Future with the output tensors. Completion is
// driven by the client's completion callbacks, so futures complete without anyone waiting
// (what DDP's gradient hooks need).
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "client/client.hpp"
#include "torch_plugin/cuda_support.hpp"
#include "torch_plugin/torch_compat.hpp"

namespace smddp::torch_plugin {

// The first failure of an operation whose wait() had already returned (the GPU fast path's
// wait() only orders the caller's stream): the process group raises it at its next call.
class AsyncErrors {
 public:
  void note(std::exception_ptr e) {
    std::lock_guard lock(mu_);
    if (!first_) first_ = std::move(e);
  }
  std::exception_ptr first() const {
    std::lock_guard lock(mu_);
    return first_;
  }

 private:
  mutable std::mutex mu_;
  std::exception_ptr first_;
};

class WorkSMDDP : public c10d::Work {
 public:
  // `op_name` names the call in error messages ("allreduce"); `outputs` are what result()
  // and the Future report.
  WorkSMDDP(int rank, c10d::OpType type, const char* op_name, std::vector<at::Tensor> outputs);
  ~WorkSMDDP() override;
  // The last strong reference went while weak ones remain (the plugin's list of pending ops):
  // the tensors, GPU marks and client ops go now, not when the object does.
  void release_resources() override;

  // --- building (before arm()) ---
  void add_op(client::WorkPtr op);
  void add_dependency(c10::intrusive_ptr<WorkSMDDP> child);
  // Tensors the client reads or writes until the work is done (inputs, staging buffers).
  void keep_alive(at::Tensor t);
  // Runs once, after every op succeeded, before the Future completes.
  void set_epilogue(std::function<void()> fn);
  // Starts listening for completion. The work may complete inside this call.
  void arm();

  // --- c10d::Work ---
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  const char* op_name() const noexcept { return op_name_; }
  // Whether the op has ended (success or failure), without progressing anything.
  bool finalized() const;

  // --- GPU path (before arm()) ---
  // The work's tensors are CUDA tensors on `device`: its Future is CUDA-aware, completion
  // orders a pool stream after the daemon's events, wait() orders the caller's stream.
  void set_cuda(std::shared_ptr<gpu::CudaPath> path, c10::Device device);
  bool cuda() const noexcept { return cuda_ != nullptr; }
  // An input event to hand back to the pool once the daemon answered.
  void add_input_event(int index);
  // Rank-side GPU execution: the op's token (its plan runs in finalize()).
  void add_exec_token(std::uint64_t token);
  // A staging buffer (expandable segments) this work uses; if `copy_to` is defined, the
  // buffer is copied into it on completion, before the epilogue.
  void add_staging(std::shared_ptr<gpu::CudaPath::Staging> s, at::Tensor copy_to);
  // Across nodes: the copier that moves the op's bytes through the arena. On completion the
  // op ends after its copies out (on the copier's Out lane), where the epilogue runs; a failed
  // copy fails the work.
  void add_arena_copier(std::shared_ptr<client::StagingCopier> copier);
  // The GPU fast path: the op's kernel is already enqueued; `mark` follows it. If this work is
  // that one op alone, wait() only makes the caller's stream wait for it (as NCCL's), and a
  // failure reported later goes to `errors`.
  void set_fast(std::shared_ptr<gpu::CudaPath::FastMark> mark);
  void set_async_errors(std::shared_ptr<AsyncErrors> errors);

 private:
  void child_done();
  void finalize();
  // Registers a callback that runs once this work finished (used by parents).
  void when_finished(std::function<void()> cb);

  const char* op_name_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_alive_;
  std::function<void()> epilogue_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;

  // Guards ops_, children_, listeners_ and finalized_ (c10d::Work::mutex_ guards completed_
  // and exception_ and is never held while calling out).
  mutable std::mutex state_mutex_;
  std::vector<client::WorkPtr> ops_;
  std::vector<c10::intrusive_ptr<WorkSMDDP>> children_;
  std::vector<std::function<void()>> listeners_;
  bool finalized_ = false;
  std::atomic<int> pending_{0};
  bool armed_ = false;

  std::shared_ptr<gpu::CudaPath> cuda_;
  c10::Device cuda_device_{c10::DeviceType::CPU};
  std::vector<int> input_events_;
  std::vector<std::uint64_t> exec_tokens_;
  std::shared_ptr<gpu::CudaPath::Done> done_;  // set before completion; read by synchronize()
  std::vector<c10::intrusive_ptr<WorkSMDDP>> sync_children_;
  std::vector<std::pair<std::shared_ptr<gpu::CudaPath::Staging>, at::Tensor>> staging_;
  std::vector<std::shared_ptr<client::StagingCopier>> arena_copiers_;
  // Until finalize(), or the Work's end for a lone fast op (its waits and Future use it).
  std::shared_ptr<gpu::CudaPath::FastMark> fast_;
  bool waited_async_ = false;  // wait() returned before finalize(): report failures later
  bool future_at_issue_ = false;  // a lone fast op: its Future completes from the mark (getFuture)
  bool future_marked_ = false;    // ... which happened (or finalize() failed it)
  std::shared_ptr<AsyncErrors> async_errors_;
  // The work is one fast op with nothing to do on completion (state_mutex_ held).
  bool stream_only_locked() const;
};

}  // namespace smddp::torch_plugin
