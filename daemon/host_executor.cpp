#include "daemon/host_executor.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "daemon/alltoall_splits.hpp"
#include "kernels/host/host_reduce.hpp"
#include "ipc/types.hpp"

namespace smddp::daemon {

using ipc::OpType;

namespace {
// Below this many bytes per task, splitting costs more than it saves.
constexpr std::uint64_t kMinBytesPerTask = 128 << 10;

void move_bytes(std::byte* dst, const std::byte* src, std::uint64_t n) {
  if (n && dst != src) std::memmove(dst, src, n);
}
}  // namespace

HostExecutor::HostExecutor(const ipc::Segment& segment, int parallelism) : segment_(segment), pool_(parallelism) {}

std::byte* HostExecutor::in(const Posted& p) const {
  return segment_.arena(p.slot).data() + p.desc.input.offset;
}
std::byte* HostExecutor::out(const Posted& p) const {
  return segment_.arena(p.slot).data() + p.desc.output.offset;
}

template <class T>
std::vector<T> HostExecutor::read_aux(const Posted& p, std::size_t n) const {
  std::vector<T> v(n);
  std::memcpy(v.data(), segment_.arena(p.slot).data() + p.desc.aux.offset, n * sizeof(T));
  return v;
}
template std::vector<std::int32_t> HostExecutor::read_aux(const Posted&, std::size_t) const;
template std::vector<std::int64_t> HostExecutor::read_aux(const Posted&, std::size_t) const;

std::optional<std::string> HostExecutor::run(const Match& m, std::uint64_t& bytes) {
  const auto& ps = m.posted;  // indexed by group rank
  const auto& d0 = ps.front().desc;
  const int n = static_cast<int>(ps.size());
  const std::size_t e = ipc::dtype_size(d0.dtype);
  const std::uint64_t c = d0.chunk_count;
  const std::uint64_t cb = c * e;
  const int root = d0.root;
  bytes = 0;

  // Splits [0, c) into ranges of at least kMinBytesPerTask, one task each.
  const auto ranges = [&](std::uint64_t elems) {
    const std::uint64_t by_size = std::max<std::uint64_t>(1, elems * e / kMinBytesPerTask);
    return static_cast<int>(std::min<std::uint64_t>(by_size, static_cast<std::uint64_t>(pool_.parallelism())));
  };
  const auto range_of = [](std::uint64_t elems, int tasks, int t) {
    // 64-element alignment keeps vector loops whole and cache lines unshared.
    std::uint64_t per = (elems + static_cast<std::uint64_t>(tasks) - 1) / static_cast<std::uint64_t>(tasks);
    per = (per + 63) / 64 * 64;
    std::uint64_t lo = std::min(elems, per * static_cast<std::uint64_t>(t));
    return std::pair{lo, std::min(elems, lo + per)};
  };
  host_kernels::ReduceParams params;
  params.premul_scale = d0.scale;
  params.avg_divisor = static_cast<double>(n);

  switch (d0.op) {
    case OpType::AllReduce: {
      const int tasks = ranges(c);
      pool_.parallel_for(tasks, [&](int t) {
        auto [lo, hi] = range_of(c, tasks, t);
        if (lo >= hi) return;
        std::vector<const void*> inputs(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) inputs[static_cast<std::size_t>(r)] = in(ps[static_cast<std::size_t>(r)]) + lo * e;
        std::byte* dst0 = out(ps[0]) + lo * e;
        host_kernels::host_reduce(d0.dtype, d0.reduce_op, inputs, dst0, hi - lo, params);
        for (int r = 1; r < n; ++r) move_bytes(out(ps[static_cast<std::size_t>(r)]) + lo * e, dst0, (hi - lo) * e);
      });
      bytes = cb * static_cast<std::uint64_t>(n);
      reduced_.add(d0.op, cb);
      break;
    }
    case OpType::Reduce: {
      const Posted& rp = ps[static_cast<std::size_t>(root)];
      const int tasks = ranges(c);
      pool_.parallel_for(tasks, [&](int t) {
        auto [lo, hi] = range_of(c, tasks, t);
        if (lo >= hi) return;
        std::vector<const void*> inputs(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) inputs[static_cast<std::size_t>(r)] = in(ps[static_cast<std::size_t>(r)]) + lo * e;
        host_kernels::host_reduce(d0.dtype, d0.reduce_op, inputs, out(rp) + lo * e, hi - lo, params);
      });
      bytes = cb;
      reduced_.add(d0.op, cb);
      break;
    }
    case OpType::ReduceScatter: {
      pool_.parallel_for(n, cb * static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n), [&](int r) {
        std::vector<const void*> inputs(static_cast<std::size_t>(n));
        for (int q = 0; q < n; ++q)
          inputs[static_cast<std::size_t>(q)] = in(ps[static_cast<std::size_t>(q)]) + static_cast<std::uint64_t>(r) * cb;
        host_kernels::host_reduce(d0.dtype, d0.reduce_op, inputs, out(ps[static_cast<std::size_t>(r)]), c, params);
      });
      bytes = cb * static_cast<std::uint64_t>(n);
      reduced_.add(d0.op, cb * static_cast<std::uint64_t>(n));
      break;
    }
    case OpType::Broadcast: {
      const std::byte* src = in(ps[static_cast<std::size_t>(root)]);
      pool_.parallel_for(n, cb * static_cast<std::uint64_t>(n), [&](int r) { move_bytes(out(ps[static_cast<std::size_t>(r)]), src, cb); });
      bytes = cb * static_cast<std::uint64_t>(n - 1);
      break;
    }
    case OpType::AllGather: {
      pool_.parallel_for(n, cb * static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n), [&](int r) {
        for (int q = 0; q < n; ++q)
          move_bytes(out(ps[static_cast<std::size_t>(r)]) + static_cast<std::uint64_t>(q) * cb, in(ps[static_cast<std::size_t>(q)]), cb);
      });
      bytes = cb * static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n);
      break;
    }
    case OpType::Gather: {
      std::byte* dst = out(ps[static_cast<std::size_t>(root)]);
      pool_.parallel_for(n, cb * static_cast<std::uint64_t>(n), [&](int q) {
        move_bytes(dst + static_cast<std::uint64_t>(q) * cb, in(ps[static_cast<std::size_t>(q)]), cb);
      });
      bytes = cb * static_cast<std::uint64_t>(n);
      break;
    }
    case OpType::Scatter: {
      const std::byte* src = in(ps[static_cast<std::size_t>(root)]);
      pool_.parallel_for(n, cb * static_cast<std::uint64_t>(n), [&](int r) {
        move_bytes(out(ps[static_cast<std::size_t>(r)]), src + static_cast<std::uint64_t>(r) * cb, cb);
      });
      bytes = cb * static_cast<std::uint64_t>(n);
      break;
    }
    case OpType::AllToAll: {
      if (!(d0.flags & ipc::kFlagSplits)) {
        pool_.parallel_for(n, cb * static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n), [&](int r) {
          for (int q = 0; q < n; ++q)
            move_bytes(out(ps[static_cast<std::size_t>(r)]) + static_cast<std::uint64_t>(q) * cb,
                 in(ps[static_cast<std::size_t>(q)]) + static_cast<std::uint64_t>(r) * cb, cb);
        });
        bytes = cb * static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n);
        break;
      }
      // Split tables: aux holds n send counts then n receive counts (elements).
      const auto un = static_cast<std::size_t>(n);
      SplitTables tab(un);
      for (std::size_t r = 0; r < un; ++r) tab[r] = read_aux<std::int64_t>(ps[r], 2 * un);
      std::vector<std::uint64_t> in_bytes, out_bytes;
      for (const auto& p : ps) {
        in_bytes.push_back(p.desc.input.bytes);
        out_bytes.push_back(p.desc.output.bytes);
      }
      if (auto bad = check_split_tables(tab, e, in_bytes, out_bytes)) return *bad;
      std::uint64_t moved = 0;
      for (const auto b : out_bytes) moved += b;
      pool_.parallel_for(n, moved, [&](int r) {
        const auto ur = static_cast<std::size_t>(r);
        for (std::size_t q = 0; q < un; ++q)
          move_bytes(out(ps[ur]) + recv_offset(tab, ur, q) * e, in(ps[q]) + send_offset(tab, q, ur) * e,
                     static_cast<std::uint64_t>(tab[q][ur]) * e);
      });
      for (std::size_t r = 0; r < un; ++r) bytes += ps[r].desc.output.bytes;
      break;
    }
    case OpType::Send:
    case OpType::Recv: {
      // posted = {send, recv}
      move_bytes(out(ps[1]), in(ps[0]), cb);
      bytes = cb;
      break;
    }
    case OpType::Barrier:
    case OpType::CommCreate:
      break;
  }
  return std::nullopt;
}

}  // namespace smddp::daemon
