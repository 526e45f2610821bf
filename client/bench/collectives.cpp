#include "client/bench/collectives.hpp"

#include <algorithm>
#include <array>

namespace smddp::bench {
namespace {

constexpr std::array<std::string_view, kCollectiveCount> kNames = {
    "allreduce", "allgather", "reducescatter", "broadcast", "alltoall",
    "reduce",    "gather",    "scatter",       "sendrecv"};

// Collectives whose `count` is the size split over the ranks, with one buffer holding all
// ranks' blocks.
enum class Shape { Whole, GatherLike, ScatterLike, BlockPerPeer };

constexpr Shape shape_of(Collective c) noexcept {
  switch (c) {
    case Collective::AllGather:
    case Collective::Gather:
      return Shape::GatherLike;
    case Collective::ReduceScatter:
    case Collective::Scatter:
      return Shape::ScatterLike;
    case Collective::AllToAll:
      return Shape::BlockPerPeer;
    default:
      return Shape::Whole;
  }
}

}  // namespace

std::string_view to_string(Collective c) noexcept { return kNames[static_cast<std::size_t>(c)]; }

std::optional<Collective> parse_collective(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return static_cast<Collective>(i);
  return std::nullopt;
}

std::string_view collective_names() noexcept {
  return "allreduce|allgather|reducescatter|broadcast|alltoall|reduce|gather|scatter|sendrecv";
}

bool is_reduction(Collective c) noexcept {
  return c == Collective::AllReduce || c == Collective::ReduceScatter || c == Collective::Reduce;
}

bool has_root(Collective c) noexcept {
  return c == Collective::Broadcast || c == Collective::Reduce || c == Collective::Gather ||
         c == Collective::Scatter;
}

bool is_in_place(Collective c) noexcept { return c == Collective::Broadcast; }

Layout layout_for(Collective c, std::uint64_t bytes, std::size_t elem_size, int nranks) noexcept {
  const auto n = static_cast<std::uint64_t>(std::max(nranks, 1));
  const std::uint64_t total = bytes / elem_size;
  Layout l;
  switch (shape_of(c)) {
    case Shape::Whole:
      l.count = total;
      l.in_elems = l.out_elems = total;
      break;
    case Shape::GatherLike:
      l.count = total / n;
      l.in_elems = l.count;
      l.out_elems = l.count * n;
      break;
    case Shape::ScatterLike:
      l.count = total / n;
      l.in_elems = l.count * n;
      l.out_elems = l.count;
      break;
    case Shape::BlockPerPeer:
      l.count = total / n;
      l.in_elems = l.out_elems = l.count * n;
      break;
  }
  l.bytes = std::max(l.in_elems, l.out_elems) * elem_size;
  return l;
}

double bus_factor(Collective c, int nranks) noexcept {
  const double n = std::max(nranks, 1);
  switch (c) {
    case Collective::AllReduce:
      return 2.0 * (n - 1) / n;
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll:
    case Collective::Gather:
    case Collective::Scatter:
      return (n - 1) / n;
    case Collective::Broadcast:
    case Collective::Reduce:
    case Collective::SendRecv:
      return 1.0;
  }
  return 1.0;
}

std::optional<Source> source_of(Collective c, const Layout& l, int rank, int nranks, int root,
                                std::uint64_t j) noexcept {
  const auto block = [&] { return static_cast<int>(j / l.count); };
  const auto offset_in_block = [&] { return j % l.count; };
  const auto my_block_start = static_cast<std::uint64_t>(rank) * l.count;
  switch (c) {
    case Collective::AllReduce:
      return Source{-1, j};
    case Collective::Reduce:
      if (rank != root) return std::nullopt;
      return Source{-1, j};
    case Collective::ReduceScatter:
      return Source{-1, my_block_start + j};
    case Collective::AllGather:
      return Source{block(), offset_in_block()};
    case Collective::Gather:
      if (rank != root) return std::nullopt;
      return Source{block(), offset_in_block()};
    case Collective::AllToAll:
      return Source{block(), my_block_start + offset_in_block()};
    case Collective::Broadcast:
      return Source{root, j};
    case Collective::Scatter:
      return Source{root, my_block_start + j};
    case Collective::SendRecv:
      return Source{(rank + nranks - 1) % nranks, j};
  }
  return std::nullopt;
}

}  // namespace smddp::bench
