#include "client/host_fast.hpp"

#include <array>
#include <cstring>
#include <stdexcept>

#include "kernels/host/host_reduce.hpp"

namespace smddp::client::host_fast {

using ipc::FastCell;
using ipc::OpType;
using ipc::Segment;

namespace {

void reduce(const FastCell& call, std::span<FastCell* const> cells, std::uint64_t offset, std::byte* out,
            std::uint64_t count) {
  if (count == 0) return;
  host_kernels::ReduceParams params;
  params.premul_scale = call.scale;
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

void read_output(std::span<FastCell* const> cells, int me, std::byte* out) {
  const FastCell& call = *cells[static_cast<std::size_t>(me)];
  const std::uint64_t block = call.count * ipc::dtype_size(call.dtype);
  const auto n = cells.size();
  const auto root = static_cast<std::size_t>(call.root);
  const auto mine = static_cast<std::uint64_t>(me);
  switch (call.op) {
    case OpType::Barrier: return;
    case OpType::AllReduce: return reduce(call, cells, 0, out, call.count);
    case OpType::Reduce:
      if (me == call.root) reduce(call, cells, 0, out, call.count);
      return;
    case OpType::ReduceScatter: return reduce(call, cells, mine * block, out, call.count);
    case OpType::Broadcast:
      if (me != call.root && block) std::memcpy(out, Segment::fast_input(*cells[root]), block);
      return;
    case OpType::AllGather:
      for (std::size_t m = 0; m < n && block; ++m) std::memcpy(out + m * block, Segment::fast_input(*cells[m]), block);
      return;
    case OpType::Gather:
      if (me != call.root) return;
      for (std::size_t m = 0; m < n && block; ++m) std::memcpy(out + m * block, Segment::fast_input(*cells[m]), block);
      return;
    case OpType::Scatter:
      if (block) std::memcpy(out, Segment::fast_input(*cells[root]) + mine * block, block);
      return;
    case OpType::AllToAll:
      for (std::size_t m = 0; m < n && block; ++m)
        std::memcpy(out + m * block, Segment::fast_input(*cells[m]) + mine * block, block);
      return;
    case OpType::Send:
    case OpType::Recv:
    case OpType::CommCreate:
      break;
  }
  throw std::logic_error(std::string("the host fast path does not run ") + std::string(ipc::to_string(call.op)));
}

}  // namespace smddp::client::host_fast
