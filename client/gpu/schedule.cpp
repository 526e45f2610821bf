#include "client/gpu/schedule.hpp"

#include <algorithm>

namespace smddp::client::gpu {
namespace {

using ipc::OpType;
using Kind = Step::Kind;

// Null stays null, so a missing buffer shows in the step instead of a bogus address.
std::byte* at(std::byte* p, std::uint64_t off) { return p ? p + off : nullptr; }

class Builder {
 public:
  std::vector<Step> steps;
  void barrier() { steps.push_back(Step{}); }
  void reduce(std::vector<const std::byte*> inputs, std::vector<std::byte*> outs, std::uint64_t count) {
    if (count == 0) return;
    Step s;
    s.kind = Kind::Reduce;
    s.inputs = std::move(inputs);
    s.outs = std::move(outs);
    s.count = count;
    steps.push_back(std::move(s));
  }
  void copy(std::byte* dst, const std::byte* src, std::uint64_t bytes, Kind kind = Kind::Copy) {
    if (bytes == 0 || (dst && dst == src)) return;  // in place: nothing to move
    Step s;
    s.kind = kind;
    s.dst = dst;
    s.src = src;
    s.bytes = bytes;
    steps.push_back(std::move(s));
  }
  void signal() { steps.push_back(Step{Kind::Signal}); }
  void wait_side() { steps.push_back(Step{Kind::WaitSide}); }
  void fork() { steps.push_back(Step{Kind::Fork}); }
  void join_side() { steps.push_back(Step{Kind::Join}); }
  void join() {
    if (!steps.empty() && steps.back().kind == Kind::CopyBeside) {
      // Nothing ran beside it yet: the copy can just as well run on the main stream.
      steps.back().kind = Kind::Copy;
      return;
    }
    if (std::any_of(steps.begin(), steps.end(), [](const Step& s) { return s.kind == Kind::CopyBeside; }))
      steps.push_back(Step{Kind::Join});
  }
};

constexpr std::uint64_t kMaxPieces = 8;

bool oneshot(const ScheduleArgs& a, int n) {
  return a.count * ipc::dtype_size(a.dtype) <= a.oneshot_max || n == 1;
}

}  // namespace

std::uint64_t needs_scratch(const ScheduleArgs& a) {
  const int n = static_cast<int>(a.in.size());
  if (a.op != OpType::AllReduce || n < 2 || !oneshot(a, n)) return 0;
  const auto me = static_cast<std::size_t>(a.me);
  const bool in_place = a.in[me] && a.in[me] == a.out[me];
  return in_place ? a.count * ipc::dtype_size(a.dtype) : 0;
}

std::optional<std::vector<Step>> schedule(const ScheduleArgs& a, std::string& why) {
  const int n = static_cast<int>(a.in.size());
  const int me = a.me;
  const std::uint64_t e = ipc::dtype_size(a.dtype);
  const auto m = static_cast<std::size_t>(me);
  std::byte* my_in = a.in[m];
  std::byte* my_out = a.out[m];
  const auto inputs_at = [&](std::uint64_t off) {
    std::vector<const std::byte*> v;
    for (int i = 0; i < n; ++i) v.push_back(at(a.in[static_cast<std::size_t>(i)], off));
    return v;
  };
  const auto block = [&](int i) { return static_cast<std::uint64_t>(i) * a.count * e; };
  Builder b;
  switch (a.op) {
    case OpType::AllReduce:
      if (oneshot(a, n)) {
        // Every rank reduces all inputs. In place it must not overwrite its input while the
        // others still read it: into scratch, copied back after the closing barrier.
        const bool scratch = needs_scratch(a) > 0;
        b.barrier();
        b.reduce(inputs_at(0), {scratch ? a.scratch : my_out}, a.count);
        b.barrier();
        if (scratch) b.copy(my_out, a.scratch, a.count * e);
      } else {
        // Two-shot: chunk i (16-byte aligned) is reduced by rank i, then fetched by the others
        // (pull) or written into every output by rank i (push). In place is safe: meanwhile the
        // others read only their own chunks of this rank's buffer.
        const std::uint64_t align = std::max<std::uint64_t>(1, 16 / e);
        const std::uint64_t q =
            ((a.count + static_cast<std::uint64_t>(n) - 1) / static_cast<std::uint64_t>(n) + align - 1) / align * align;
        const auto first = [&](int i) { return std::min<std::uint64_t>(a.count, q * static_cast<std::uint64_t>(i)); };
        const std::uint64_t mine = first(me + 1) - first(me);
        // Pieces per chunk: the same on every member (it depends on what they share).
        const std::uint64_t pieces =
            a.twoshot == TwoShot::Kernel || a.pipeline_bytes == 0
                ? 1
                : std::clamp<std::uint64_t>((q * e + a.pipeline_bytes - 1) / a.pipeline_bytes, 1, kMaxPieces);
        b.barrier();
        if (pieces > 1) {
          // Piece j of every chunk: reduced by its owner, who signals; the others' side
          // streams wait for that and pull it while the owners reduce piece j+1.
          const std::uint64_t qp = (q + pieces - 1) / pieces + align - 1;
          const std::uint64_t piece = qp / align * align;
          const auto lo = [&](int i, std::uint64_t j) { return std::min(first(i + 1), first(i) + j * piece); };
          b.fork();
          for (std::uint64_t j = 0; j < pieces; ++j) {
            b.reduce(inputs_at(lo(me, j) * e), {at(my_out, lo(me, j) * e)}, lo(me, j + 1) - lo(me, j));
            b.signal();
            b.wait_side();
            for (int i = 0; i < n; ++i)
              if (i != me)
                b.copy(at(my_out, lo(i, j) * e), at(a.out[static_cast<std::size_t>(i)], lo(i, j) * e),
                       (lo(i, j + 1) - lo(i, j)) * e, Kind::SideCopy);
          }
          b.join_side();
        } else if (a.twoshot == TwoShot::Kernel) {
          std::vector<std::byte*> outs;
          for (int i = 0; i < n; ++i) outs.push_back(at(a.out[static_cast<std::size_t>(i)], first(me) * e));
          b.reduce(inputs_at(first(me) * e), outs, mine);
          b.barrier();
        } else if (a.twoshot == TwoShot::Push) {
          // The others' kernels read only their own chunks of this rank's buffer, so chunk
          // `me` may land in their outputs (in place: their inputs) without a barrier first.
          b.reduce(inputs_at(first(me) * e), {at(my_out, first(me) * e)}, mine);
          for (int i = 0; i < n; ++i)
            if (i != me) b.copy(at(a.out[static_cast<std::size_t>(i)], first(me) * e), at(my_out, first(me) * e), mine * e);
        } else {
          b.reduce(inputs_at(first(me) * e), {at(my_out, first(me) * e)}, mine);
          b.barrier();
          for (int i = 0; i < n; ++i)
            if (i != me)
              b.copy(at(my_out, first(i) * e), at(a.out[static_cast<std::size_t>(i)], first(i) * e),
                     (first(i + 1) - first(i)) * e);
        }
        b.barrier();
      }
      break;
    case OpType::ReduceScatter:
      b.barrier();
      b.reduce(inputs_at(block(me)), {my_out}, a.count);
      b.barrier();
      break;
    case OpType::Reduce:
      b.barrier();
      if (me == a.root) b.reduce(inputs_at(0), {my_out}, a.count);
      b.barrier();
      break;
    case OpType::AllGather:
    case OpType::AllToAll: {
      // Block i of every output comes from rank i (AllGather: its input; AllToAll: its block
      // for that rank). This rank's own block moves beside the others (another copy engine).
      const bool gather = a.op == OpType::AllGather;
      if (!a.splits.empty()) {
        // Uneven: this rank's blocks lie in its input, and the others' in its output, in rank order.
        const auto sent_before = [&](int i) {
          std::uint64_t off = 0;
          for (int k = 0; k < i; ++k) off += a.splits[static_cast<std::size_t>(k)].send;
          return off * e;
        };
        const auto received_before = [&](int i) {
          std::uint64_t off = 0;
          for (int k = 0; k < i; ++k) off += a.splits[static_cast<std::size_t>(k)].recv;
          return off * e;
        };
        b.barrier();
        b.copy(at(my_out, received_before(me)), at(my_in, sent_before(me)), a.splits[m].send * e, Kind::CopyBeside);
        for (int i = 0; i < n; ++i) {
          if (i == me) continue;
          const auto u = static_cast<std::size_t>(i);
          const Split& x = a.splits[u];
          if (a.copy_push)
            b.copy(at(a.out[u], x.send_dst * e), at(my_in, sent_before(i)), x.send * e);
          else
            b.copy(at(my_out, received_before(i)), at(a.in[u], x.recv_src * e), x.recv * e);
        }
        b.join();
        b.barrier();
        break;
      }
      b.barrier();
      b.copy(at(my_out, block(me)), gather ? my_in : at(my_in, block(me)), a.count * e, Kind::CopyBeside);
      for (int i = 0; i < n; ++i) {
        if (i == me) continue;
        const auto u = static_cast<std::size_t>(i);
        if (a.copy_push)
          b.copy(at(a.out[u], block(me)), gather ? my_in : at(my_in, block(i)), a.count * e);
        else
          b.copy(at(my_out, block(i)), gather ? a.in[u] : at(a.in[u], block(me)), a.count * e);
      }
      b.join();
      b.barrier();
      break;
    }
    case OpType::Broadcast:
      b.barrier();
      b.copy(my_out, a.in[static_cast<std::size_t>(a.root)], a.count * e);
      b.barrier();
      break;
    case OpType::Gather:
      b.barrier();
      if (me == a.root)
        for (int i = 0; i < n; ++i) b.copy(at(my_out, block(i)), a.in[static_cast<std::size_t>(i)], a.count * e);
      b.barrier();
      break;
    case OpType::Scatter:
      b.barrier();
      b.copy(my_out, at(a.in[static_cast<std::size_t>(a.root)], block(me)), a.count * e);
      b.barrier();
      break;
    case OpType::Send:
    case OpType::Recv:
      // Members are {sender, receiver}; the receiver pulls.
      b.barrier();
      if (me == 1) b.copy(my_out, a.in[0], a.count * e);
      b.barrier();
      break;
    default:
      why = "rank-side execution of " + std::string(ipc::to_string(a.op)) + " is not supported";
      return std::nullopt;
  }
  return std::move(b.steps);
}

}  // namespace smddp::client::gpu
