// A node of host ranks for executor tests: one segment with real staging arenas, and
// matches built by hand (as the matcher hands them over: indexed by group rank).
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <string>

#include "daemon/host_executor.hpp"
#include "ipc/segment.hpp"

namespace smddp::daemon::test_node {

using ipc::DType;
using ipc::OpType;
using ipc::ReduceOp;

constexpr std::uint64_t kArena = 4ull << 20;
constexpr std::uint64_t kOutOffset = 2ull << 20;   // output region of each arena
constexpr std::uint64_t kAuxOffset = kArena - 4096;  // aux (split tables) region

inline std::string unique_job() {
  static std::atomic<int> n{0};
  return "t-exec-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

// A node of `ranks` local ranks: one segment (unlinked when the test ends), one executor.
class Node {
 public:
  Node(int ranks, int parallelism)
      : ranks_(ranks), seg_(ipc::Segment::create(spec(ranks))), exec_(seg_, parallelism) {
    // Garbage everywhere, so untouched bytes are told apart from written ones.
    for (int r = 0; r < ranks; ++r) std::memset(seg_.arena(r).data(), 0xAB, kArena);
  }

  template <class T>
  T* input(int r) { return reinterpret_cast<T*>(seg_.arena(r).data()); }
  template <class T>
  T* output(int r) { return reinterpret_cast<T*>(seg_.arena(r).data() + kOutOffset); }
  template <class T>
  T* aux(int r) { return reinterpret_cast<T*>(seg_.arena(r).data() + kAuxOffset); }

  // One Posted per rank, input at the arena's start and output at kOutOffset.
  Match match(ipc::RequestDesc d, std::uint64_t in_bytes, std::uint64_t out_bytes, bool in_place = false) {
    Match m;
    for (int r = 0; r < ranks_; ++r) {
      Posted p;
      p.slot = r;
      p.group_rank = r;
      p.desc = d;
      p.desc.input = {ipc::BufferKind::Arena, {}, 0, in_bytes};
      p.desc.output = {ipc::BufferKind::Arena, {}, in_place ? 0 : kOutOffset, out_bytes};
      if (in_place) p.desc.flags |= ipc::kFlagInPlace;
      m.posted.push_back(p);
    }
    return m;
  }

  std::optional<std::string> run(const Match& m, std::uint64_t& bytes) { return exec_.run(m, bytes); }
  HostExecutor& executor() { return exec_; }

 private:
  static ipc::SegmentSpec spec(int ranks) {
    ipc::SegmentSpec s;
    s.job_id = unique_job();
    s.local_world_size = ranks;
    s.world_size = ranks;
    s.arena_bytes = kArena;
    return s;
  }
  int ranks_;
  ipc::Segment seg_;
  HostExecutor exec_;
};

inline ipc::RequestDesc desc(OpType op, DType t, std::uint64_t count, ReduceOp rop = ReduceOp::Sum, int root = 0) {
  ipc::RequestDesc d;
  d.op = op;
  d.dtype = t;
  d.reduce_op = rop;
  d.root = root;
  d.count = count;
  d.chunk_count = count;
  return d;
}

inline bool untouched(const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i)
    if (b[i] != 0xAB) return false;
  return true;
}

}  // namespace smddp::daemon::test_node
