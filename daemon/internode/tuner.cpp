#include "daemon/internode/tuner.hpp"

namespace smddp::daemon::internode {

using ipc::OpType;

std::string_view to_string(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::Auto: return "auto";
    case Algorithm::Eager: return "eager";
    case Algorithm::Direct: return "direct";
    case Algorithm::Ring: return "ring";
    case Algorithm::Halving: return "halving";
  }
  return "unknown";
}

std::optional<Algorithm> parse_algorithm(std::string_view name) noexcept {
  for (auto a : {Algorithm::Auto, Algorithm::Direct, Algorithm::Ring, Algorithm::Halving})
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
//   halving: 2 log2 P rounds of one message each: 2 log2(P) a + 2(P-1)/P N b, plus 2 rounds and
//            2 N b on the nodes that fold where P is not a power of two;
//   ring:    2(P-1) rounds of one message of N/P each: 2(P-1) a + 2(P-1)/P N b, neighbours only.
// Up to kDirectMaxNodes nodes the direct exchange has the fewest rounds for about the same
// messages, and measured best (results/2026-12-02-internode-algorithms/). Above it halving has
// the fewest rounds. Ring sends as many bytes and takes more rounds, so it pays only for large
// chunks, where rounds cost little beside the bytes and where its constant neighbour-to-neighbour
// messages (every link carries N/P per round, no long-distance pairs, no fold's extra 2 N b)
// keep every link busy through the pipeline of chunks: NCCL and Gloo pick a ring there too.
// kRingMinBytes puts the switch where a round (tens of microseconds over tcp) costs under a tenth
// of moving the chunk's P-1 segments (b about 1 ns/byte: 512 KiB is ~500 us), see tuner.hpp.
Algorithm choose_algorithm(Algorithm setting, const ipc::RequestDesc& d, int ranks, int nodes, bool eager_fits) noexcept {
  if (!runs_by_segments(d.op)) return eager_fits ? Algorithm::Eager : Algorithm::Direct;
  if (setting != Algorithm::Auto) return setting;
  if (eager_fits) return Algorithm::Eager;
  if (nodes <= kDirectMaxNodes) return Algorithm::Direct;
  const std::uint64_t element = ipc::dtype_size(d.dtype);
  const bool per_rank_blocks = d.op == OpType::ReduceScatter || d.op == OpType::AllGather;
  const std::uint64_t bytes = d.chunk_count * element * (per_rank_blocks ? static_cast<std::uint64_t>(ranks) : 1);
  return bytes >= kRingMinBytes ? Algorithm::Ring : Algorithm::Halving;
}

}  // namespace smddp::daemon::internode
