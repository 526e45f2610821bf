// What each benchmarked collective is, independent of who runs it (smddp, MPI): its name,
// buffer shapes for a given size, the nccl-tests bus-bandwidth factor, and where each output
// element comes from (used by the correctness check).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "ipc/types.hpp"

namespace smddp::bench {

enum class Collective : std::uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  Broadcast,
  AllToAll,
  Reduce,
  Gather,
  Scatter,
  SendRecv,
};
inline constexpr int kCollectiveCount = 9;

std::string_view to_string(Collective c) noexcept;
std::optional<Collective> parse_collective(std::string_view name) noexcept;
// "allreduce|allgather|..." for usage messages.
std::string_view collective_names() noexcept;

bool is_reduction(Collective c) noexcept;  // takes a reduce op
bool has_root(Collective c) noexcept;
// Works on one buffer (broadcast): the root's data is read from the output buffer.
bool is_in_place(Collective c) noexcept;

// Buffers for one size. `count` is what the API call takes (elements per rank or per peer
// block, as in ipc::OpType); the buffers hold in_elems / out_elems elements.
struct Layout {
  std::uint64_t count = 0;
  std::uint64_t in_elems = 0;
  std::uint64_t out_elems = 0;
  std::uint64_t bytes = 0;  // the size column: the larger buffer, as nccl-tests prints it
};

// As nccl-tests: `bytes` is the per-rank buffer size (the output for allgather/gather, the
// input for reducescatter/scatter), rounded down to a whole number of elements per rank.
Layout layout_for(Collective c, std::uint64_t bytes, std::size_t elem_size, int nranks) noexcept;

// busbw = algbw * factor (nccl-tests doc/PERFORMANCE.md).
double bus_factor(Collective c, int nranks) noexcept;

// Where output element `out_index` of rank `rank` comes from: input element `in_index` of
// rank `from_rank`, or, for reductions (from_rank < 0), the reduction over all ranks of their
// input element `in_index`. nullopt: this rank's output is not defined (non-root of
// reduce/gather).
struct Source {
  int from_rank;  // -1: reduced over every rank
  std::uint64_t in_index;
};
std::optional<Source> source_of(Collective c, const Layout& layout, int rank, int nranks, int root,
                                std::uint64_t out_index) noexcept;

}  // namespace smddp::bench
