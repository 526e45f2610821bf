#include "client/host_fast.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "ipc/cross_memory.hpp"
#include "kernels/host/host_reduce.hpp"

namespace smddp::client::host_fast {

using ipc::FastCell;
using ipc::OpType;
using ipc::Segment;

namespace {

// A plain sum of a few elements (loss scalars, metrics, counts: most small host all-reduces),
// in group-rank order as the kernels add, so the same bits on every member. The kernels'
// dispatch cost about 200 instructions of an 8-byte all-reduce's 3,100. Integers wrap, as the
// kernels' do. False when it does not apply.
template <class T, class Acc = T>
void sum_few(std::span<FastCell* const> cells, std::uint64_t offset, std::byte* out, std::uint64_t count) {
  for (std::uint64_t i = 0; i < count; ++i) {
    Acc acc;
    std::memcpy(&acc, Segment::fast_input(*cells[0]) + offset + i * sizeof(T), sizeof(T));
    for (std::size_t m = 1; m < cells.size(); ++m) {
      Acc v;
      std::memcpy(&v, Segment::fast_input(*cells[m]) + offset + i * sizeof(T), sizeof(T));
      acc = static_cast<Acc>(acc + v);
    }
    std::memcpy(out + i * sizeof(T), &acc, sizeof(T));
  }
}

bool reduce_few(const FastCell& call, std::span<FastCell* const> cells, std::uint64_t offset, std::byte* out,
                std::uint64_t count) {
  constexpr std::uint64_t kFew = 16;
  if (count > kFew || call.reduce_op != ipc::ReduceOp::Sum) return false;
  switch (call.dtype) {
    case ipc::DType::Float32: sum_few<float>(cells, offset, out, count); return true;
    case ipc::DType::Float64: sum_few<double>(cells, offset, out, count); return true;
    case ipc::DType::Int32: sum_few<std::int32_t, std::uint32_t>(cells, offset, out, count); return true;
    case ipc::DType::Int64: sum_few<std::int64_t, std::uint64_t>(cells, offset, out, count); return true;
    default: return false;
  }
}

void reduce(const FastCell& call, std::span<FastCell* const> cells, std::uint64_t offset, double scale,
            std::byte* out, std::uint64_t count) {
  if (count == 0) return;
  if (reduce_few(call, cells, offset, out, count)) return;
  host_kernels::ReduceParams params;
  params.premul_scale = scale;
  // The members' inputs at `offset` bytes in (on the stack: this runs for every small op).
  std::array<const void*, ipc::kMaxLocalRanks> in{};
  for (std::size_t m = 0; m < cells.size(); ++m) in[m] = Segment::fast_input(*cells[m]) + offset;
  host_kernels::host_reduce(call.dtype, call.reduce_op, std::span<const void* const>(in.data(), cells.size()), out,
                            count, params);
}

}  // namespace

namespace {

// Blocks of `count` elements the most demanding member publishes (`in`) and reads from the
// cells (`read`) in a group of n; nullopt for operations the path does not take.
struct Blocks {
  std::uint64_t in = 0, read = 0;
};
std::optional<Blocks> blocks_of(OpType op, std::uint64_t n) {
  switch (op) {
    case OpType::Barrier: return Blocks{0, 0};
    case OpType::AllReduce:
    case OpType::Reduce:
    case OpType::AllGather:
    case OpType::Gather:
      return Blocks{1, n};  // its input; every member's (the root's read for reduce and gather)
    case OpType::Broadcast: return Blocks{1, 1};
    case OpType::Scatter: return Blocks{n, 1};  // the root's n blocks; one block each
    case OpType::ReduceScatter:
    case OpType::AllToAll:
      return Blocks{n, n};  // n blocks each; a block from each member
    case OpType::Send:
    case OpType::Recv:
    case OpType::CommCreate:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<std::uint64_t> bytes_of(std::uint64_t blocks, std::uint64_t count, ipc::DType dtype) {
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(count, ipc::dtype_size(dtype), &bytes) || __builtin_mul_overflow(bytes, blocks, &bytes))
    return std::nullopt;
  return bytes;
}

}  // namespace

std::optional<std::uint64_t> largest_input(OpType op, std::uint64_t count, ipc::DType dtype, int members) {
  const auto b = blocks_of(op, static_cast<std::uint64_t>(members));
  return b ? bytes_of(b->in, count, dtype) : std::nullopt;
}

std::optional<std::uint64_t> largest_read(OpType op, std::uint64_t count, ipc::DType dtype, int members) {
  const auto b = blocks_of(op, static_cast<std::uint64_t>(members));
  return b ? bytes_of(b->read, count, dtype) : std::nullopt;
}

bool fits(OpType op, std::uint64_t count, ipc::DType dtype, int members, std::uint64_t cell_bytes,
          std::uint64_t read_bytes, std::uint64_t reduce_bytes, bool reduce_shrinks) {
  const auto in = largest_input(op, count, dtype, members);
  const auto read = largest_read(op, count, dtype, members);
  if (!in || !read || *in > cell_bytes || *read > read_bytes) return false;
  if (op != OpType::AllReduce && op != OpType::Reduce) return true;
  // Each member reduces n inputs here, against one share of them split among the ranks: where
  // the ranks have a core each the split wins sooner the more they are (docs/performance.md).
  const auto n = static_cast<std::uint64_t>(members);
  return *read <= (reduce_shrinks && n > 2 ? reduce_bytes * 2 / n : reduce_bytes);
}

bool single_copy(OpType op, std::uint64_t count, ipc::DType dtype, int members, std::uint64_t single_copy_bytes,
                 std::uint64_t gather_wide_from) {
  if (single_copy_bytes == 0) return false;
  switch (op) {
    case OpType::AllToAll:
    case OpType::Scatter:
      // Through shared memory every block is copied in, then out: one copy saves half at any n.
      break;
    case OpType::Gather:
      if (members == 2) break;
      // Only the root reads: with 3 or 4 members it reads n - 1 inputs over its helpers (where
      // the node resolved gather_wide_from) where the arenas' path copies every block twice.
      if (members > 4 || gather_wide_from == 0) return false;
      single_copy_bytes = std::max(single_copy_bytes, gather_wide_from);
      break;
    case OpType::AllGather:
      // Through shared memory each member copies its own block in (n - 1 blocks read each):
      // one copy saves half the copies with 2 members, a quarter with 4, where the kernel's
      // per-page cost lost to the cells and the arenas (docs/performance.md).
      if (members != 2) return false;
      break;
    default:
      // Reductions; and broadcast, whose root copies in while its readers copy out through the
      // daemon's path, chunk by chunk: that won from 4 MiB.
      return false;
  }
  const auto in = largest_input(op, count, dtype, members);
  return in && *in >= single_copy_bytes;
}

bool input_stays_put(OpType op, std::uint64_t count, ipc::DType dtype, int me, const std::byte* in,
                     std::uint64_t in_bytes, const std::byte* out, std::uint64_t out_bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(in), b = reinterpret_cast<std::uintptr_t>(out);
  if (!in_bytes || !out_bytes || a + in_bytes <= b || b + out_bytes <= a) return true;
  if (op == OpType::AllReduce) return in == out && in_bytes == out_bytes;
  return (op == OpType::AllGather || op == OpType::Gather) &&
         in == out + static_cast<std::uint64_t>(me) * count * ipc::dtype_size(dtype);
}

std::uint64_t input_bytes(OpType op, std::uint64_t count, ipc::DType dtype, int members, int me, int root) {
  const std::uint64_t block = count * ipc::dtype_size(dtype);
  const auto n = static_cast<std::uint64_t>(members);
  switch (op) {
    case OpType::AllReduce:
    case OpType::Reduce:
    case OpType::AllGather:
    case OpType::Gather:
      return block;
    case OpType::Broadcast: return me == root ? block : 0;
    case OpType::Scatter: return me == root ? n * block : 0;
    case OpType::ReduceScatter:
    case OpType::AllToAll:
      return n * block;
    default: return 0;
  }
}

bool same_call(const FastCell& a, const FastCell& b) {
  if (a.comm_id != b.comm_id || a.seq != b.seq || a.op != b.op || a.dtype != b.dtype || a.count != b.count)
    return false;
  if (reduces(a.op) && a.reduce_op != b.reduce_op) return false;
  if (rooted(a.op) && a.root != b.root) return false;
  return true;
}

namespace {

// The byte-moving collectives' outputs, copy(m, offset, dst, bytes) taking `bytes` from member
// m's input at `offset`.
template <class Copy>
void copy_output(const FastCell& call, std::size_t n, int me, std::byte* out, Copy&& copy) {
  const std::uint64_t block = call.count * ipc::dtype_size(call.dtype);
  const auto root = static_cast<std::size_t>(call.root);
  const auto mine = static_cast<std::uint64_t>(me);
  if (!block) return;
  switch (call.op) {
    case OpType::Broadcast:
      if (me != call.root) copy(root, 0, out, block);
      return;
    case OpType::AllGather:
      for (std::size_t m = 0; m < n; ++m) copy(m, 0, out + m * block, block);
      return;
    case OpType::Gather:
      if (me != call.root) return;
      for (std::size_t m = 0; m < n; ++m) copy(m, 0, out + m * block, block);
      return;
    case OpType::Scatter: return copy(root, mine * block, out, block);
    case OpType::AllToAll:
      for (std::size_t m = 0; m < n; ++m) copy(m, mine * block, out + m * block, block);
      return;
    default: break;
  }
  throw std::logic_error(std::string("the host fast path does not copy for ") + std::string(ipc::to_string(call.op)));
}

// A copy of `bytes` from member m's memory at `offset` into `dst`.
struct Piece {
  std::size_t m;
  std::uint64_t offset;
  std::byte* dst;
  std::uint64_t bytes;
};

// Runs copy over the pieces, on this thread alone, or with a pool and enough bytes cut into equal
// parts of whole pages over its threads: by single copy at least kMinCopyPart each and no more
// than the threads (each part pins pages of its own); with `min_part` (reads from the cells) parts
// of that size, any number, which the threads take as they come.
template <class Copy>
void copy_in_parts(std::span<const Piece> pieces, CopyPool* pool, Copy&& copy, std::uint64_t min_part = 0) {
  std::uint64_t total = 0;
  for (const Piece& p : pieces) total += p.bytes;
  int parts = 1;
  if (pool && min_part) parts = static_cast<int>(std::min<std::uint64_t>(64, total / min_part));
  else if (pool)
    parts = static_cast<int>(std::min<std::uint64_t>(static_cast<std::uint64_t>(pool->threads()), total / kMinCopyPart));
  if (parts < 2) {
    for (const Piece& p : pieces) copy(p.m, p.offset, p.dst, p.bytes);
    return;
  }
  constexpr std::uint64_t page = 4096;
  run_parts(*pool, pieces, total, parts, page, [&](const Piece& p, std::uint64_t from, std::uint64_t n) {
    copy(p.m, p.offset + from, p.dst + from, n);
  });
}

}  // namespace

void read_output(std::span<FastCell* const> cells, std::span<const int> pids, int me, double premul_scale,
                 std::byte* out, CopyPool* pool) {
  const FastCell& call = *cells[static_cast<std::size_t>(me)];
  switch (call.op) {
    case OpType::Barrier: return;
    case OpType::AllReduce:
    case OpType::Reduce:
    case OpType::ReduceScatter:
      for (const FastCell* c : cells)
        if (c->by_address) throw std::logic_error("the host fast path reduces from the cells only");
      if (call.op == OpType::AllReduce) return reduce(call, cells, 0, premul_scale, out, call.count);
      if (call.op == OpType::ReduceScatter)
        return reduce(call, cells, static_cast<std::uint64_t>(me) * call.count * ipc::dtype_size(call.dtype),
                      premul_scale, out, call.count);
      if (me == call.root) reduce(call, cells, 0, premul_scale, out, call.count);
      return;
    case OpType::Send:
    case OpType::Recv:
    case OpType::CommCreate:
      throw std::logic_error(std::string("the host fast path does not run ") + std::string(ipc::to_string(call.op)));
    default: break;
  }
  const auto own_source = [&](const FastCell& c, std::uint64_t offset) {
    return reinterpret_cast<const std::byte*>(static_cast<std::uintptr_t>(Segment::fast_address(c))) + offset;
  };
  const auto copy = [&](std::size_t m, std::uint64_t offset, std::byte* dst, std::uint64_t bytes) {
    const FastCell& c = *cells[m];
    if (!c.by_address) {
      std::memcpy(dst, Segment::fast_input(const_cast<FastCell&>(c)) + offset, bytes);
    } else if (m == static_cast<std::size_t>(me)) {
      // Its own input, in this process (an in-place all-gather's is already where it goes).
      const auto* src = own_source(c, offset);
      if (src != dst) std::memmove(dst, src, bytes);
    } else {
      if (m >= pids.size()) throw std::logic_error("the host fast path lacks a member's pid");
      ipc::read_peer(pids[m], Segment::fast_address(c) + offset, dst, bytes);
    }
  };
  if (!pool || pool->threads() < 2) return copy_output(call, cells.size(), me, out, copy);
  if (!call.by_address) {
    // From the cells: a large read in parts over the helpers.
    std::vector<Piece> pieces;
    std::uint64_t total = 0;
    copy_output(call, cells.size(), me, out, [&](std::size_t m, std::uint64_t offset, std::byte* dst, std::uint64_t bytes) {
      pieces.push_back({m, offset, dst, bytes});
      total += bytes;
    });
    return copy_in_parts(pieces, total >= kSplitCopiesFrom ? pool : nullptr, copy, kCopyPart);
  }
  // Single copy with threads to spare: the copies, cut into equal parts of whole pages.
  std::vector<Piece> pieces;
  bool overlaps = false;  // its own block moves within memory it overlaps: one memmove keeps it right
  copy_output(call, cells.size(), me, out, [&](std::size_t m, std::uint64_t offset, std::byte* dst, std::uint64_t bytes) {
    pieces.push_back({m, offset, dst, bytes});
    if (m == static_cast<std::size_t>(me) && cells[m]->by_address) {
      const auto* src = own_source(*cells[m], offset);
      overlaps = overlaps || (src != dst && src < dst + bytes && dst < src + bytes);
    }
  });
  copy_in_parts(pieces, overlaps ? nullptr : pool, copy);
}

bool single_copy_reduce(OpType op, std::uint64_t count, ipc::DType dtype, int members, std::uint64_t from,
                        std::uint64_t upto, std::uint64_t wide_from) {
  if (op != OpType::AllReduce) return false;
  const auto in = bytes_of(1, count, dtype);
  if (!in) return false;
  if (members == 2) return from != 0 && *in >= from && (upto == 0 || *in <= upto);
  // Every member pins pages of every other and waits for all of them: measured behind the
  // arenas with 8 members at every size, with 4 below 16 MiB (docs/performance.md).
  return (members == 3 || members == 4) && wide_from != 0 && *in >= wide_from;
}

namespace {

int parts_for(CopyPool* pool, std::uint64_t bytes) {
  if (!pool || pool->threads() < 2) return 1;
  return static_cast<int>(std::clamp<std::uint64_t>(bytes / kMinCopyPart, 1, static_cast<std::uint64_t>(pool->threads())));
}

}  // namespace

void reduce_share(std::span<FastCell* const> cells, std::span<const int> pids, int me, double premul_scale,
                  std::byte* out, std::vector<std::byte>& scratch, CopyPool* pool) {
  const FastCell& call = *cells[static_cast<std::size_t>(me)];
  const std::size_t n = cells.size();
  if (pids.size() < n) throw std::logic_error("the host fast path lacks a member's pid");
  const std::uint64_t elem = ipc::dtype_size(call.dtype);
  const auto [lo, hi] = ipc::share_range(call.count, static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(me));
  if (lo == hi) return;
  const std::uint64_t piece = kSharePiece / elem;  // elements a read takes
  const int parts = parts_for(pool, (hi - lo) * elem);
  const std::uint64_t per_part = (n - 1) * kSharePiece;
  if (scratch.size() < static_cast<std::uint64_t>(parts) * per_part) scratch.resize(static_cast<std::uint64_t>(parts) * per_part);
  const auto* own = reinterpret_cast<const std::byte*>(static_cast<std::uintptr_t>(Segment::fast_address(call)));
  host_kernels::ReduceParams params;
  params.premul_scale = premul_scale;
  const auto run_part = [&](int j) {
    const auto [first, last] = element_part(lo, hi, parts, j);
    std::byte* mine = scratch.data() + static_cast<std::uint64_t>(j) * per_part;
    std::array<const void*, ipc::kMaxLocalRanks> in{};
    for (std::uint64_t at = first; at < last; at += piece) {
      const std::uint64_t count = std::min(piece, last - at);
      std::byte* next = mine;
      for (std::size_t m = 0; m < n; ++m) {
        if (m == static_cast<std::size_t>(me)) {
          in[m] = own + at * elem;
          continue;
        }
        ipc::read_peer(pids[m], Segment::fast_address(*cells[m]) + at * elem, next, count * elem);
        in[m] = next;
        next += kSharePiece;
      }
      host_kernels::host_reduce(call.dtype, call.reduce_op, std::span<const void* const>(in.data(), n), out + at * elem,
                                count, params);
    }
  };
  if (parts < 2) return run_part(0);
  pool->run(parts, run_part);
}

void gather_shares(std::span<FastCell* const> cells, std::span<const int> pids, int me, std::byte* out, CopyPool* pool) {
  const FastCell& call = *cells[static_cast<std::size_t>(me)];
  const std::size_t n = cells.size();
  if (pids.size() < n) throw std::logic_error("the host fast path lacks a member's pid");
  const std::uint64_t elem = ipc::dtype_size(call.dtype);
  std::vector<Piece> pieces;
  for (std::size_t m = 0; m < n; ++m) {
    if (m == static_cast<std::size_t>(me)) continue;
    const auto [lo, hi] = ipc::share_range(call.count, static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(m));
    if (lo < hi) pieces.push_back({m, lo * elem, out + lo * elem, (hi - lo) * elem});
  }
  copy_in_parts(pieces, pool, [&](std::size_t m, std::uint64_t offset, std::byte* dst, std::uint64_t bytes) {
    ipc::read_peer(pids[m], Segment::fast_output_address(*cells[m]) + offset, dst, bytes);
  });
}

}  // namespace smddp::client::host_fast
