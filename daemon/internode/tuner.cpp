#include "daemon/internode/tuner.hpp"

namespace smddp::daemon::internode {

using ipc::OpType;

std::string_view to_string(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::Auto: return "auto";
    case Algorithm::Eager: return "eager";
    case Algorithm::Direct: return "direct";
    case Algorithm::Ring: return "ring";
  }
  return "unknown";
}

std::optional<Algorithm> parse_algorithm(std::string_view name) noexcept {
  for (auto a : {Algorithm::Auto, Algorithm::Direct, Algorithm::Ring})
    if (name == to_string(a)) return a;
  return std::nullopt;
}

bool runs_by_segments(OpType op) noexcept {
  return op == OpType::AllReduce || op == OpType::Reduce || op == OpType::ReduceScatter || op == OpType::AllGather;
}

// The automatic choice, per chunk of N bytes (the vector reduced, or the whole gathered or
// scattered chunk) among P nodes, with a the cost of one round (latency and per-message work)
// and b the cost of a byte:
//   direct:  2 rounds, but each node sends and receives P-1 messages per round:
//            about 2(P-1)a + 2(P-1)/P N b, and P-1 connections busy at once per node;
//   ring:    2(P-1) rounds of one message of N/P each: 2(P-1) a + 2(P-1)/P N b, neighbours only.
// Up to kDirectMaxNodes nodes the direct exchange has the fewest rounds for about the same
// messages. Above it the ring pays for large chunks, where its extra rounds cost little beside
// the bytes and one message per node per round replaces P-1 at once: kRingMinBytes puts the
// switch where a round (tens of microseconds over tcp) costs under a tenth of moving the chunk's
// P-1 segments (b about 1 ns/byte: 512 KiB is ~500 us).
Algorithm choose_algorithm(Algorithm setting, const ipc::RequestDesc& d, int ranks, int nodes, bool eager_fits) noexcept {
  if (!runs_by_segments(d.op)) return eager_fits ? Algorithm::Eager : Algorithm::Direct;
  if (setting != Algorithm::Auto) return setting;
  if (eager_fits) return Algorithm::Eager;
  if (nodes <= kDirectMaxNodes) return Algorithm::Direct;
  const std::uint64_t element = ipc::dtype_size(d.dtype);
  const bool per_rank_blocks = d.op == OpType::ReduceScatter || d.op == OpType::AllGather;
  const std::uint64_t bytes = d.chunk_count * element * (per_rank_blocks ? static_cast<std::uint64_t>(ranks) : 1);
  return bytes >= kRingMinBytes ? Algorithm::Ring : Algorithm::Direct;
}

}  // namespace smddp::daemon::internode
