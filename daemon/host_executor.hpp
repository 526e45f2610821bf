// HostExecutor: runs a matched collective whose buffers live in the ranks' staging arenas.
// Large chunks are split across the worker pool by element range (reductions) or by
// destination rank (copies).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "daemon/matcher.hpp"
#include "daemon/worker_pool.hpp"
#include "daemon/traffic.hpp"
#include "ipc/segment.hpp"

namespace smddp::daemon {

class HostExecutor {
 public:
  HostExecutor(const ipc::Segment& segment, int parallelism);

  // Runs `m` (status Ok, every member local). Returns an error for data that contradicts
  // itself across ranks (alltoall split tables), else nullopt; `bytes` gets the bytes written.
  std::optional<std::string> run(const Match& m, std::uint64_t& bytes);

  // Bytes reduced (written by reductions), by operation type, for the operator.
  const BytesByOp& reduced() const noexcept { return reduced_; }

  // The worker pool, shared with the inter-node engine's host steps (same thread only).
  WorkerPool& pool() noexcept { return pool_; }

  // Reads a rank's aux buffer (validated bounds) as `n` values of type T.
  template <class T>
  std::vector<T> read_aux(const Posted& p, std::size_t n) const;

 private:
  std::byte* in(const Posted& p) const;
  std::byte* out(const Posted& p) const;

  const ipc::Segment& segment_;
  WorkerPool pool_;
  BytesByOp reduced_;
};

}  // namespace smddp::daemon
