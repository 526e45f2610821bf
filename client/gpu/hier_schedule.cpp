#include "client/gpu/hier_schedule.hpp"

#include <algorithm>
#include <map>

namespace smddp::client::gpu {
namespace {

using ipc::OpType;
using Kind = Step::Kind;

std::byte* at(std::byte* p, std::uint64_t off) { return p ? p + off : nullptr; }

// At most this many pieces per operation: each costs a kernel launch and a flag write, and past
// a few the first copy out no longer starts noticeably sooner.
constexpr std::uint64_t kMaxPieces = 16;

// [0, len) elements cut into pieces of about `piece_bytes` (16-byte aligned), at most `most`.
std::vector<std::pair<std::uint64_t, std::uint64_t>> pieces(std::uint64_t len, std::uint64_t e,
                                                           std::uint64_t piece_bytes, std::uint64_t most) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> v;
  if (len == 0) return v;
  const std::uint64_t align = std::max<std::uint64_t>(1, 16 / e);
  std::uint64_t n = piece_bytes ? (len * e + piece_bytes - 1) / piece_bytes : 1;
  n = std::clamp<std::uint64_t>(n, 1, std::max<std::uint64_t>(1, most));
  const std::uint64_t step = ((len + n - 1) / n + align - 1) / align * align;
  for (std::uint64_t a = 0; a < len; a += step) v.emplace_back(a, std::min(len, a + step));
  return v;
}

class Parts {
 public:
  explicit Parts(std::uint64_t e) : e_(e) {}
  HierSchedule s;
  void barrier() { s.pre.push_back(Step{}); }
  void reduce(std::vector<const std::byte*> inputs, std::byte* out, std::uint64_t count) {
    if (count == 0) return;
    Step st;
    st.kind = Kind::Reduce;
    st.inputs = std::move(inputs);
    st.outs = {out};
    st.count = count;
    s.pre.push_back(std::move(st));
  }
  void copy(std::byte* dst, const std::byte* src, std::uint64_t bytes) {
    if (bytes == 0 || (dst && dst == src)) return;
    Step st;
    st.kind = Kind::Copy;
    st.dst = dst;
    st.src = src;
    st.bytes = bytes;
    s.pre.push_back(std::move(st));
  }
  void mark(std::uint64_t ready) { s.marks.push_back({s.pre.size(), ready}); }

 private:
  std::uint64_t e_;
};

}  // namespace

std::vector<int> GroupLayout::rail(int local) const {
  std::vector<int> v;
  for (int n = 0; n < nodes; ++n) v.push_back(at(n, local));
  return v;
}

std::optional<GroupLayout> GroupLayout::of(const std::vector<int>& global_ranks, int ranks_per_node, std::string& why) {
  if (global_ranks.empty() || ranks_per_node < 1) {
    why = "an empty group";
    return std::nullopt;
  }
  std::map<int, std::vector<int>> by_node;  // node id -> group ranks, in group-rank order
  for (std::size_t g = 0; g < global_ranks.size(); ++g)
    by_node[global_ranks[g] / ranks_per_node].push_back(static_cast<int>(g));
  const std::size_t per = by_node.begin()->second.size();
  for (const auto& [node, members] : by_node)
    if (members.size() != per) {
      why = "its nodes hold unequal numbers of members (node " + std::to_string(by_node.begin()->first) + ": " +
            std::to_string(per) + ", node " + std::to_string(node) + ": " + std::to_string(members.size()) + ")";
      return std::nullopt;
    }
  GroupLayout l;
  l.nodes = static_cast<int>(by_node.size());
  l.per_node = static_cast<int>(per);
  l.node_of.assign(global_ranks.size(), 0);
  l.local_of.assign(global_ranks.size(), 0);
  int n = 0;
  for (const auto& [node, members] : by_node) {
    for (std::size_t i = 0; i < members.size(); ++i) {
      const auto g = static_cast<std::size_t>(members[i]);
      l.node_of[g] = n;
      l.local_of[g] = static_cast<int>(i);
      l.member.push_back(members[i]);
    }
    ++n;
  }
  return l;
}

ipc::ReduceOp hier_pre_op(ipc::ReduceOp op) { return op; }
ipc::ReduceOp hier_rail_op(ipc::ReduceOp op) {
  return op == ipc::ReduceOp::PremulSum ? ipc::ReduceOp::Sum : op;
}

std::uint64_t RailOp::in_bytes() const {
  std::uint64_t b = 0;
  for (const auto& s : in) b += s.bytes;
  return b;
}
std::uint64_t RailOp::out_bytes() const {
  std::uint64_t b = 0;
  for (const auto& s : out) b += s.bytes;
  return b;
}

std::uint64_t hier_shard_begin(std::uint64_t count, ipc::DType dtype, int per_node, int i) {
  const std::uint64_t e = ipc::dtype_size(dtype);
  const std::uint64_t align = std::max<std::uint64_t>(1, 16 / e);
  const auto g = static_cast<std::uint64_t>(std::max(1, per_node));
  const std::uint64_t q = ((count + g - 1) / g + align - 1) / align * align;
  return std::min<std::uint64_t>(count, q * static_cast<std::uint64_t>(i));
}

std::uint64_t hier_shard_count(std::uint64_t count, ipc::DType dtype, int per_node, int i) {
  return hier_shard_begin(count, dtype, per_node, i + 1) - hier_shard_begin(count, dtype, per_node, i);
}

std::uint64_t hier_scratch_bytes(const HierArgs& a) {
  const std::uint64_t e = ipc::dtype_size(a.dtype);
  const auto& l = *a.layout;
  const int my = l.local_of[static_cast<std::size_t>(a.me)];
  switch (a.op) {
    case OpType::ReduceScatter: return static_cast<std::uint64_t>(l.nodes) * a.count * e;
    case OpType::Reduce: return hier_shard_count(a.count, a.dtype, l.per_node, my) * e;
    default: return 0;
  }
}

std::optional<HierSchedule> hier_schedule(const HierArgs& a, std::string& why) {
  if (!a.layout || a.layout->per_node < 1 || a.layout->nodes < 1) {
    why = "no group layout";
    return std::nullopt;
  }
  const GroupLayout& l = *a.layout;
  const auto G = static_cast<std::size_t>(l.per_node);
  if (a.in.size() != G || a.out.size() != G) {
    why = "buffers for " + std::to_string(a.in.size()) + " members where the node holds " + std::to_string(G);
    return std::nullopt;
  }
  const std::uint64_t e = ipc::dtype_size(a.dtype);
  const auto my = static_cast<std::size_t>(l.local_of[static_cast<std::size_t>(a.me)]);
  const int my_node = l.node_of[static_cast<std::size_t>(a.me)];
  const std::vector<int> rail = l.rail(static_cast<int>(my));
  const auto P = static_cast<std::uint64_t>(l.nodes);
  const auto inputs_at = [&](std::uint64_t off) {
    std::vector<const std::byte*> v;
    for (std::size_t k = 0; k < G; ++k) v.push_back(at(a.in[k], off));
    return v;
  };
  const auto others = [&](std::size_t skip) {
    std::vector<std::size_t> v;
    for (std::size_t k = 0; k < G; ++k)
      if (k != my && k != skip) v.push_back(k);
    return v;
  };
  Parts p(e);
  RailOp& r = p.s.rail;
  r.op = a.op;
  r.reduce_op = ipc::ReduceOp::Sum;
  p.barrier();
  switch (a.op) {
    case OpType::AllReduce:
    case OpType::Reduce: {
      // Local index i reduces shard i of the node's inputs: into its output in place
      // (AllReduce: nobody else reads that shard of its buffer), into scratch (Reduce: only
      // the root has an output).
      const bool all = a.op == OpType::AllReduce;
      const std::uint64_t lo = hier_shard_begin(a.count, a.dtype, l.per_node, static_cast<int>(my));
      const std::uint64_t n = hier_shard_count(a.count, a.dtype, l.per_node, static_cast<int>(my));
      std::byte* shard = all ? at(a.out[my], lo * e) : a.scratch;
      for (const auto& [x, y] : pieces(n, e, a.piece_bytes, kMaxPieces)) {
        p.reduce(inputs_at((lo + x) * e), at(shard, x * e), y - x);
        p.mark(y * e);
      }
      if (p.s.marks.empty()) p.mark(0);
      r.reduce_op = hier_rail_op(a.reduce_op);
      r.count = n;
      r.in.push_back({0, shard, n * e, {}});
      if (all) {
        RailSegment o{0, shard, n * e, {}};
        for (std::size_t k : others(G)) o.push.push_back(at(a.out[k], lo * e));
        r.out.push_back(std::move(o));
        break;
      }
      const int root_node = l.node_of[static_cast<std::size_t>(a.root)];
      const auto root_local = static_cast<std::size_t>(l.local_of[static_cast<std::size_t>(a.root)]);
      r.root = root_node;
      if (my_node == root_node) {
        // The root's node receives the reduced shard: the root into its output, the others into
        // their scratch (in place of their input), then pushed into the root's output.
        if (my == root_local) r.out.push_back({0, at(a.out[my], lo * e), n * e, {}});
        else r.out.push_back({0, shard, n * e, {at(a.out[root_local], lo * e)}});
      }
      break;
    }
    case OpType::ReduceScatter: {
      // The node reduces, for each member of this rank's rail, that member's block; the rail's
      // reduce-scatter then adds the nodes' partial blocks.
      const std::uint64_t total = P * a.count;
      // Pieces over all the blocks together, at most kMaxPieces in all (P may be large).
      const std::uint64_t piece =
          a.piece_bytes ? std::max<std::uint64_t>(a.piece_bytes, (total * e + kMaxPieces - 1) / kMaxPieces) : 0;
      for (std::uint64_t k = 0; k < P; ++k) {
        const auto g = static_cast<std::uint64_t>(rail[static_cast<std::size_t>(k)]);
        for (const auto& [x, y] : pieces(a.count, e, piece, kMaxPieces)) {
          p.reduce(inputs_at((g * a.count + x) * e), at(a.scratch, (k * a.count + x) * e), y - x);
          p.mark((k * a.count + y) * e);
        }
      }
      if (p.s.marks.empty()) p.mark(0);
      r.reduce_op = hier_rail_op(a.reduce_op);
      r.count = a.count;
      r.in.push_back({0, a.scratch, total * e, {}});
      r.out.push_back({0, a.out[my], a.count * e, {}});
      break;
    }
    case OpType::AllGather: {
      // Blocks of this rank's rail arrive from the other nodes; each goes to its place in every
      // member's output.
      p.mark(a.count * e);
      r.count = a.count;
      r.in.push_back({0, a.in[my], a.count * e, {}});
      for (std::uint64_t k = 0; k < P; ++k) {
        const std::uint64_t dst = static_cast<std::uint64_t>(rail[static_cast<std::size_t>(k)]) * a.count * e;
        RailSegment o{k * a.count * e, at(a.out[my], dst), a.count * e, {}};
        for (std::size_t m : others(G)) o.push.push_back(at(a.out[m], dst));
        r.out.push_back(std::move(o));
      }
      break;
    }
    case OpType::Broadcast: {
      // On the root's node each member pulls its shard from the root and pushes it to the
      // others (the root sends each byte once over NVLink); every node's local index i then
      // broadcasts shard i along its rail, and the other nodes push what arrives to their peers.
      const std::uint64_t lo = hier_shard_begin(a.count, a.dtype, l.per_node, static_cast<int>(my));
      const std::uint64_t n = hier_shard_count(a.count, a.dtype, l.per_node, static_cast<int>(my));
      const int root_node = l.node_of[static_cast<std::size_t>(a.root)];
      const auto root_local = static_cast<std::size_t>(l.local_of[static_cast<std::size_t>(a.root)]);
      r.root = root_node;
      r.count = n;
      if (my_node == root_node) {
        // The root's own shard goes from the root to the others the same way.
        std::byte* mine = my == root_local ? at(a.in[my], lo * e) : at(a.out[my], lo * e);
        if (my != root_local) p.copy(mine, at(a.in[root_local], lo * e), n * e);
        for (std::size_t k : others(root_local)) p.copy(at(a.out[k], lo * e), mine, n * e);
        p.mark(n * e);
        r.in.push_back({0, mine, n * e, {}});
      } else {
        p.mark(0);
        RailSegment o{0, at(a.out[my], lo * e), n * e, {}};
        for (std::size_t k : others(G)) o.push.push_back(at(a.out[k], lo * e));
        r.out.push_back(std::move(o));
      }
      break;
    }
    default:
      why = "a " + std::string(ipc::to_string(a.op)) + " has no hierarchical form across nodes";
      return std::nullopt;
  }
  // Zero-byte stretches move nothing: the rail operation's staging skips them.
  std::erase_if(r.in, [](const RailSegment& s) { return s.bytes == 0; });
  std::erase_if(r.out, [](const RailSegment& s) { return s.bytes == 0; });
  return std::move(p.s);
}

}  // namespace smddp::client::gpu
