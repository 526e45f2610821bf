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
// scattered chunk) among P nodes. With a the cost of a round (a message's latency and the
// daemons' loop around it), m the cost of handling one message, b the cost of a byte, each phase
// (reduce-scatter, all-gather) costs about
//   direct:  a + (P-1) m + (P-1)/P N b             one round, P-1 messages at once per node;
//   halving: log2 P (a + m) + (P-1)/P N b           plus a round and N b on the folded pairs
//                                                   where P is not a power of two;
//   ring:    (P-1)(a + m) + (P-1)/P N b             one message of N/P per round, to a neighbour.
// kDirectMaxNodes = 8 is measured: on the 2-vCPU machine, 4 and 8 simulated nodes x 1 rank over
// tcp, AllReduce and AllGather from 8 B to 32 MiB in two runs, direct was fastest in 43 of 48
// rows at 8 nodes (from 128 KiB halving took mostly 2-3x its time, the ring 2.5-5x) and 35 of 48
// at 4 (results/2026-12-02-internode-algorithms/). There 16 processes share 2 cores, so a round
// costs milliseconds of scheduling and the count of rounds decides. On real hosts a round costs
// tens of microseconds; the model puts direct first while (P-1-log2 P) m < (log2 P - 1) a, which
// with a = 20 us and m = 2-5 us holds up to 16-32 nodes: the bound stays at the largest count
// measured until a cluster measures more.
// Beyond 8 nodes nothing here measures it, so the rest is from the model, and from NCCL's and
// Gloo's choices. Halving has the fewest rounds for the same bytes. The ring has more rounds but
// only neighbour traffic (halving's first exchange sends half the chunk between the farthest
// nodes, across a fabric's core) and no fold; it pays once each round is bandwidth-bound, when
// its segment N/P is at least a / b: about 20 us x 6-12 GB/s = 120-250 KB over EFA, less over
// tcp. Hence kRingMinSegmentBytes = 128 KiB. With the default 1 MiB chunks a segment reaches it
// only up to 8 nodes, where direct runs: beyond, the ring takes chunks of P x 128 KiB and more
// (a larger daemon.chunk_kib), halving the rest.
Algorithm choose_algorithm(Algorithm setting, const ipc::RequestDesc& d, int ranks, int nodes, bool eager_fits) noexcept {
  if (!runs_by_segments(d.op)) return eager_fits ? Algorithm::Eager : Algorithm::Direct;
  if (setting != Algorithm::Auto) return setting;
  if (eager_fits) return Algorithm::Eager;
  if (nodes <= kDirectMaxNodes) return Algorithm::Direct;
  const std::uint64_t element = ipc::dtype_size(d.dtype);
  const bool per_rank_blocks = d.op == OpType::ReduceScatter || d.op == OpType::AllGather;
  const std::uint64_t bytes = d.chunk_count * element * (per_rank_blocks ? static_cast<std::uint64_t>(ranks) : 1);
  return bytes / static_cast<std::uint64_t>(nodes) >= kRingMinSegmentBytes ? Algorithm::Ring : Algorithm::Halving;
}

}  // namespace smddp::daemon::internode
