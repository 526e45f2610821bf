// ArenaCopier: the client's StagingCopier (client/client.hpp) for CUDA buffers. It carries CUDA
// tensors of a group that spans nodes: their bytes cross the fabric through the rank's arena,
// so each chunk goes device-to-host into the arena, through the daemons, and host-to-device
// back, pipelined: the client posts a chunk as soon as its copy in has finished and frees it
// once its copy out has, while the copy engines work on the next ones.
//
// The arena is registered with CUDA (pinned), so the copies are asynchronous DMA. Each
// operation gets its own pair of streams (in and out) from a pool, both ordered after the
// work on the caller's stream when it issued the operation, and nothing else: a chunk whose
// copy is enqueued late (the arena was full) never waits behind a later operation's inputs,
// which may themselves wait for this one. A fence is an event on the lane's stream and a host
// function after it on a signal stream of the lane's own: the host function marks its ticket
// passed and wakes the client; passed() asks the event first, so a client thread that spins on
// it sees the copies end sooner. On the lane itself a host function would hold back everything
// after it (the next chunk's copy, the operation's end) until CUDA's callback thread ran it,
// 15-20 us after the copy.
//
// Threading: ArenaCopyLanes may be used from any thread; an operation's copier from the
// client's calls (under its lock) and from CUDA's host-function thread (fences).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "client/client.hpp"
#include "client/gpu/hier_schedule.hpp"

namespace smddp::client::gpu {

// What a hierarchical operation's copier adds to an arena copier's (client/gpu/hier_schedule.hpp):
// where its rail operation's input and output lie in this rank's GPU memory, and the progress
// word the pre part writes on the rank's main stream. A copy in waits (on the GPU, with a stream
// memory operation) until the word shows the mark that covers its bytes; the copier can be made,
// and the rail operation posted, before the plan that enqueues the pre part arrives: what it is
// given until then waits in the copier (release_shard). The Out lane waits for the last mark before its first
// copy (the pre part's barrier comes before any push into the node's other members), and each
// stretch it copies back is pushed to the other members once their buffers are known
// (set_push_targets: the plan maps them).
struct ShardStaging {
  RailOp rail;
  std::uint64_t* word = nullptr;  // this rank's GPU memory
  std::vector<std::pair<std::uint64_t, std::uint64_t>> marks;  // (rail input bytes ready, word value)
  std::uint64_t last = 0;  // the word's value once the whole pre part ran
};

class ArenaCopyLanes : public std::enable_shared_from_this<ArenaCopyLanes> {
 public:
  // Registers `arena` (the client's Client::arena_region()) with CUDA on `device`.
  ArenaCopyLanes(int device, std::byte* arena, std::size_t bytes);
  // Waits for every copy, then unregisters the arena (if release_arena() did not yet).
  ~ArenaCopyLanes();
  ArenaCopyLanes(const ArenaCopyLanes&) = delete;
  ArenaCopyLanes& operator=(const ArenaCopyLanes&) = delete;

  // A copier for one operation whose buffers are `in` and `out` (device pointers on this
  // lanes' device; either may be null), ordered after the work on `producer` so far.
  std::shared_ptr<StagingCopier> copier(const void* in, void* out, cudaStream_t producer);
  // A copier for a hierarchical operation's rail operation (see ShardStaging).
  std::shared_ptr<StagingCopier> shard_copier(ShardStaging shard, cudaStream_t producer);
  // Where the stretches of `copier`'s rail output go in the node's other members (by output
  // segment, as RailSegment::push): pushes what came back already, and the rest as it comes.
  // Failures are reported by the copier's error().
  static void set_push_targets(StagingCopier& copier, std::vector<std::vector<std::byte*>> targets);
  // Until this is called, a shard copier only records what it is given: its copies wait for
  // the pre part's marks, and a wait enqueued before the write it waits for could hold that
  // write back where the two streams share a hardware queue. The executor calls it once the
  // pre part (or, for an abandoned operation, the release of its marks) is enqueued.
  static void release_shard(StagingCopier& copier);
  // Makes `consumer` wait for every copy `copier` (from copier()) enqueued so far, in and out.
  static void order_after(StagingCopier& copier, cudaStream_t consumer);
  // The stream `copier`'s copies out run on (its pair's, held until the copier goes). Once its
  // operation succeeded, every copy in has finished (a chunk goes to the daemon only after its
  // copy in did), so work enqueued here after the last copy out follows all of the op's copies.
  static cudaStream_t out_stream(StagingCopier& copier);
  // Waits for every copy, then undoes the arena's registration; no copier may be made after.
  // The client calls it (Client::set_arena_release) before it unmaps the arena.
  void release_arena() noexcept;

  int device() const noexcept { return device_; }
  bool covers(const std::byte* arena, std::size_t bytes) const noexcept {
    return arena == arena_ && bytes == bytes_;
  }

 private:
  friend class OpCopier;
  // Two streams and the events their operations use (created once: an operation's copier
  // holds the pair alone, from take() to give()).
  struct Pair {
    cudaStream_t in = nullptr, out = nullptr;
    cudaStream_t signal_in = nullptr, signal_out = nullptr;  // the lanes' fences' host functions
    cudaEvent_t ready = nullptr;                           // the caller's stream at the operation's start
    cudaEvent_t fenced_in = nullptr, fenced_out = nullptr;  // each lane's last fence
    cudaEvent_t tail_in = nullptr, tail_out = nullptr;      // each lane's end, for order_after()
  };
  Pair take();
  void give(Pair p);
  static void destroy(Pair& p) noexcept;

  int device_;
  std::byte* arena_;
  std::size_t bytes_;
  std::mutex mu_;
  std::vector<Pair> free_;
  std::vector<Pair> all_;
  bool registered_ = false;
};

}  // namespace smddp::client::gpu
