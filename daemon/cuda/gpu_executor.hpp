// GpuExecutor: runs matched collectives whose buffers are CUDA memory of the node's ranks.
//
// One daemon process holds every local GPU with peer access enabled. Each rank's buffers
// are opened from their IPC handles in every GPU context that touches them (cached by the
// rank's allocation buffer id: opens cost tens of ms). Per GPU, one stream. A collective:
//   1. each rank's stream (on the rank's own GPU) waits on the rank's interprocess event;
//   2. every participating GPU's stream waits on the others (daemon-private events);
//   3. kernels (reductions, on peer-mapped pointers) and copy-engine copies run;
//   4. a second join, then the daemon's interprocess event of each rank is recorded on the
//      stream of that rank's GPU; its index goes back in the completion.
// All of it is enqueued from the progress thread; nothing here blocks on the GPU.
//
// Without CUDA (no compiler, no driver, no GPU) create() returns nullptr and says why.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/matcher.hpp"
#include "ipc/segment.hpp"

namespace smddp::daemon::cuda {

// Whether any buffer of the request is CUDA memory (such a match runs here).
bool is_device_request(const ipc::RequestDesc& d) noexcept;

struct GpuStats {
  std::uint64_t kernel_launches = 0;
  std::uint64_t copies = 0;  // copy-engine memcpys enqueued
  double enqueue_us = 0;     // CPU time spent enqueuing, all operations
  bool stream_values = false;  // stream-flag synchronization available
  std::map<std::string, std::uint64_t> kernels_by_op;  // "allgather" -> launches
  std::map<std::string, std::uint64_t> ops_by_op;      // "allgather" -> operations
};

// What marks a member's part of a collective done: a daemon event index (interprocess-event
// mode) or a done-flag value (stream-flag mode, kFlagStreamValue).
struct DoneMark {
  int event = -1;
  std::uint64_t value = 0;
};

class GpuExecutor {
 public:
  virtual ~GpuExecutor() = default;
  // Initializes every visible GPU; nullptr (and `why_not`) when the GPU path is unavailable.
  static std::unique_ptr<GpuExecutor> create(const ipc::Segment& segment, std::string& why_not);

  // Enqueues `m` (status Ok, every member local, device buffers). On success `done[i]` marks
  // m.posted[i]'s completion on its GPU and `bytes` the bytes written; else an error text.
  virtual std::optional<std::string> run(const Match& m, std::vector<DoneMark>& done, std::uint64_t& bytes) = 0;

  // Deferred form, for requests with kFlagDaemonCpuWait: maps every buffer now, promises
  // each member a done value (in `done`), and queues the match; progress() enqueues it on
  // the GPUs once every member's stream flag (host memory) reached its value.
  virtual std::optional<std::string> defer(const Match& m, std::vector<DoneMark>& done) = 0;
  // Enqueues the deferred matches whose inputs are ready, in order. Returns whether any ran;
  // sets `error` when the GPU refused one (the caller fails the job) and adds to `bytes`.
  virtual bool progress(std::string& error, std::uint64_t& bytes) = 0;
  virtual bool pending() const = 0;
  // Job failure: writes every promised done value from the CPU, releasing waiting streams.
  virtual void abort_pending() = 0;

  // `slot` freed its allocation `alloc_id`: closes this process's mappings of it. Work on it
  // is over: the owner frees memory only after its collectives on it completed.
  virtual void release_allocation(int slot, std::uint64_t alloc_id) = 0;

  virtual GpuStats stats() const = 0;
  virtual std::string describe() const = 0;  // "2 GPUs (NVIDIA H200 x2), peer access"
};

}  // namespace smddp::daemon::cuda
