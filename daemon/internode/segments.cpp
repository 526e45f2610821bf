// What the ring and halving/doubling schedules share, and the choice between them.
#include "daemon/internode/segments.hpp"

#include <algorithm>
#include <stdexcept>

#include "kernels/host/half.hpp"
#include "kernels/host/host_reduce.hpp"

namespace smddp::daemon::internode {

using ipc::DType;

namespace {
[[noreturn]] void no_schedule(Algorithm a) {
  throw std::logic_error("no segment schedule for algorithm " + std::string(to_string(a)));
}
}  // namespace

int reduce_scatter_steps(Algorithm a, int nodes) {
  if (a == Algorithm::Ring) return nodes;
  if (a == Algorithm::Halving) return Fold(nodes).exchanges() + 2;
  no_schedule(a);
}

void reduce_scatter_step(Engine::Ctx& c, Algorithm a, const ReduceScatterData& d, int step) {
  if (a == Algorithm::Ring) return ring_reduce_scatter(c, d, step);
  if (a == Algorithm::Halving) return halving_reduce_scatter(c, d, step);
  no_schedule(a);
}

Range reduce_scatter_result(Algorithm a, const std::vector<std::uint64_t>& lo, int node) {
  if (a == Algorithm::Ring) return segment(lo, node);
  if (a == Algorithm::Halving) return halving_result(lo, node);
  no_schedule(a);
}

std::uint64_t largest_receive(Algorithm a, const std::vector<std::uint64_t>& lo, int node) {
  if (a == Algorithm::Ring) return ring_largest_receive(lo);
  if (a == Algorithm::Halving) return halving_largest_receive(lo, node);
  no_schedule(a);
}

int all_gather_steps(Algorithm a, int nodes) {
  if (a == Algorithm::Ring) return nodes - 1;
  if (a == Algorithm::Halving) return Fold(nodes).exchanges() + 2;
  no_schedule(a);
}

void all_gather_step(Engine::Ctx& c, Algorithm a, const AllGatherData& d, bool from_segments, int step) {
  if (a == Algorithm::Ring) return ring_all_gather(c, d, step);
  if (a == Algorithm::Halving) return doubling_all_gather(c, d, from_segments, step);
  no_schedule(a);
}

void hand_over_segments(Engine::Ctx& c, Algorithm a, const std::vector<std::uint64_t>& lo, std::byte* buf,
                        std::uint64_t element) {
  if (a != Algorithm::Halving) return;  // a ring leaves every node its own segment
  const Fold fold(node_count(c.op()));
  const int me = c.op().me;
  if (fold.took_fold(me)) send_range(c, me - 1, buf, segment(lo, me - 1), element);
  if (fold.index_of(me) < 0) recv_range(c, me + 1, buf, segment(lo, me), element);
}

int node_count(const Op& op) { return static_cast<int>(op.nodes.size()); }

void send_range(Engine::Ctx& c, int node, const std::byte* base, Range r, std::uint64_t element) {
  if (r.size() > 0) c.send(node, 0, base + r.lo * element, r.size() * element);
}

void recv_range(Engine::Ctx& c, int node, std::byte* base, Range r, std::uint64_t element) {
  if (r.size() > 0) c.recv(node, 0, base + r.lo * element, r.size() * element);
}

void recv_range_into(Engine::Ctx& c, int node, std::byte* buf, Range r, std::uint64_t element) {
  if (r.size() > 0) c.recv(node, 0, buf, r.size() * element);
}

void add_received(Engine::Ctx& c, const ReduceScatterData& d, Range r, const std::byte* base, const std::byte* received) {
  if (r.size() == 0) return;
  const std::uint64_t e = ipc::dtype_size(d.dtype);
  c.reduce(d.dtype, d.op, {base + r.lo * e, received}, d.out + r.lo * e, r.size(), 1.0);
}

DType partial_dtype(DType t) { return t == DType::Float16 || t == DType::BFloat16 ? DType::Float32 : t; }

namespace {
// Splits an element-wise conversion over the worker pool when it moves enough bytes.
template <class Fn>
void convert_in_parallel(Engine::Ctx& c, std::uint64_t count, Fn&& fn) {
  const int tasks = c.pool().parallelism();
  const std::uint64_t per = (count + static_cast<std::uint64_t>(tasks) - 1) / static_cast<std::uint64_t>(tasks);
  c.pool().parallel_for(tasks, count * 6, [&](int t) {
    const std::uint64_t lo = std::min(count, per * static_cast<std::uint64_t>(t));
    const std::uint64_t hi = std::min(count, lo + per);
    for (std::uint64_t i = lo; i < hi; ++i) fn(i);
  });
}
}  // namespace

void widen(Engine::Ctx& c, DType from, const std::byte* in, std::byte* out, std::uint64_t count) {
  const auto* h = reinterpret_cast<const std::uint16_t*>(in);
  auto* f = reinterpret_cast<float*>(out);
  if (from == DType::BFloat16) convert_in_parallel(c, count, [&](std::uint64_t i) { f[i] = host_kernels::half_bits::bf16_to_float(h[i]); });
  else convert_in_parallel(c, count, [&](std::uint64_t i) { f[i] = host_kernels::half_bits::half_to_float(h[i]); });
}

void narrow(Engine::Ctx& c, DType to, const std::byte* in, std::byte* out, std::uint64_t count) {
  const auto* f = reinterpret_cast<const float*>(in);
  auto* h = reinterpret_cast<std::uint16_t*>(out);
  if (to == DType::BFloat16) convert_in_parallel(c, count, [&](std::uint64_t i) { h[i] = host_kernels::half_bits::float_to_bf16(f[i]); });
  else convert_in_parallel(c, count, [&](std::uint64_t i) { h[i] = host_kernels::half_bits::float_to_half(f[i]); });
}

void finish_result(Engine::Ctx& c, const SegmentPlan& plan, DType dtype, ipc::ReduceOp op, Range r) {
  if (r.size() == 0) return;
  const double avg = 1.0 / c.op().size();
  if (plan.widened) {
    std::byte* partial = plan.widened + r.lo * sizeof(float);
    if (op == ipc::ReduceOp::Avg) host_kernels::host_scale(DType::Float32, partial, r.size(), avg);
    narrow(c, dtype, partial, plan.result + r.lo * ipc::dtype_size(dtype), r.size());
  } else if (op == ipc::ReduceOp::Avg) {
    host_kernels::host_scale(dtype, plan.result + r.lo * ipc::dtype_size(dtype), r.size(), avg);
  }
}

std::vector<std::uint64_t> place_blocks_by_node(Engine::Ctx& c, SegmentPlan& plan) {
  const int n = c.op().size(), P = node_count(c.op());
  std::vector<std::uint64_t> bounds(static_cast<std::size_t>(P) + 1, 0);
  std::vector<int> node(static_cast<std::size_t>(n));
  for (int g = 0; g < n; ++g) {
    node[static_cast<std::size_t>(g)] = c.node_index_of(g);
    ++bounds[static_cast<std::size_t>(node[static_cast<std::size_t>(g)]) + 1];
  }
  for (std::size_t j = 1; j < bounds.size(); ++j) bounds[j] += bounds[j - 1];
  std::vector<std::uint64_t> next(bounds.begin(), bounds.end() - 1);
  plan.place.resize(static_cast<std::size_t>(n));
  plan.places_in_rank_order = true;
  for (int g = 0; g < n; ++g) {
    const std::uint64_t at = next[static_cast<std::size_t>(node[static_cast<std::size_t>(g)])]++;
    plan.place[static_cast<std::size_t>(g)] = at;
    plan.places_in_rank_order = plan.places_in_rank_order && at == static_cast<std::uint64_t>(g);
  }
  return bounds;
}

}  // namespace smddp::daemon::internode
