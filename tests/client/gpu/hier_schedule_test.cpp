// The hierarchical schedules (client/gpu/hier_schedule.hpp) run on host memory: P simulated
// nodes of G ranks in one process. Each rank has three actors, ordered only as its GPU orders
// them: the main stream (the pre part and its marks), the In lane (copies of the rail input to
// the arena, each after the mark that covers it) and the Out lane (after the final mark and the
// rail operation: copies back, pushes to the node's other members, the tail barrier). Each rail
// operation is an actor of its own that needs every rail member's copies in and comes before
// their copies out (the client posts a chunk once its copy in finished, and copies it out once
// the daemons answered). For every operation, P x G up to 4 x 8, in- and out-of-place, group
// orders that interleave the nodes, and pieces of several sizes, it checks that:
//   - the members of a node signal and wait equally on each barrier count (main, tail), and
//     nothing deadlocks;
//   - no two actors touch the same GPU bytes unordered while one writes (vector clocks);
//   - another rank touches a rank's buffers only while that rank's operation runs (after its
//     first step, before its tail barrier ends), and every actor of a rank is done by then;
//   - the results equal a reference computed from the inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <functional>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "client/gpu/hier_schedule.hpp"
#include "tests/client/gpu/schedule_check.hpp"

namespace smddp::client::gpu {
namespace {

using ipc::DType;
using ipc::OpType;
using Kind = Step::Kind;
using schedule_check::add_into;
using schedule_check::Range;

struct Case {
  OpType op;
  DType dtype;
  std::uint64_t count;
  int nodes, per_node;
  int root = 0;
  bool in_place = false;
  std::uint64_t piece_bytes = 0;
  bool interleave = false;  // group ranks alternate between nodes (not node-major)
  std::string name() const {
    return std::string(ipc::to_string(op)) + " " + std::string(ipc::to_string(dtype)) + " count " +
           std::to_string(count) + " " + std::to_string(nodes) + "x" + std::to_string(per_node) + " root " +
           std::to_string(root) + (in_place ? " in-place" : "") + " piece " + std::to_string(piece_bytes) +
           (interleave ? " interleaved" : "");
  }
};

class Sim {
 public:
  explicit Sim(const Case& c) : c_(c), e_(ipc::dtype_size(c.dtype)), n_(static_cast<std::size_t>(c.nodes * c.per_node)) {
    // Global rank q lives on node q / per_node; the group lists them node-major or interleaved.
    std::vector<int> globals;
    for (int i = 0; i < c.per_node; ++i)
      for (int nd = 0; nd < c.nodes; ++nd) globals.push_back(nd * c.per_node + i);
    if (!c.interleave) std::sort(globals.begin(), globals.end());
    std::string why;
    auto l = GroupLayout::of(globals, c.per_node, why);
    EXPECT_TRUE(l) << why;
    if (l) layout_ = *l;
    const std::uint64_t one = c.count * e_, all = one * n_;
    in_.resize(n_);
    out_.resize(n_);
    scratch_.resize(n_);
    for (std::size_t g = 0; g < n_; ++g) {
      const bool root = static_cast<int>(g) == c.root;
      std::uint64_t in_bytes = 0, out_bytes = 0;
      switch (c.op) {
        case OpType::AllReduce: in_bytes = one; out_bytes = c.in_place ? 0 : one; break;
        case OpType::ReduceScatter: in_bytes = all; out_bytes = one; break;
        case OpType::Reduce: in_bytes = one; out_bytes = root ? one : 0; break;
        case OpType::AllGather: in_bytes = c.in_place ? 0 : one; out_bytes = all; break;
        case OpType::Broadcast: in_bytes = root ? one : 0; out_bytes = root ? 0 : one; break;
        default: break;
      }
      in_[g].resize(in_bytes);
      out_[g].resize(out_bytes);
      for (std::uint64_t i = 0; i < in_bytes; ++i) in_[g][i] = static_cast<std::byte>((g * 131 + i * 7 + 3) & 0xff);
      for (std::uint64_t i = 0; i < out_bytes; ++i) out_[g][i] = std::byte{0xEE};
      if (c.op == OpType::AllGather && c.in_place)
        for (std::uint64_t i = 0; i < one; ++i) out_[g][g * one + i] = static_cast<std::byte>((g * 131 + i * 7 + 3) & 0xff);
    }
    for (std::size_t g = 0; g < n_; ++g) {
      std::byte* in = in_[g].empty() ? nullptr : in_[g].data();
      std::byte* out = out_[g].empty() ? nullptr : out_[g].data();
      if (c.op == OpType::AllReduce && c.in_place) out = in;
      if (c.op == OpType::Broadcast && static_cast<int>(g) == c.root) out = in;
      if (c.op == OpType::AllGather && c.in_place) in = out + g * one;
      ins_.push_back(in);
      outs_.push_back(out);
      before_.push_back(in ? std::vector<std::byte>(in, in + (c.op == OpType::ReduceScatter ? all : one))
                           : std::vector<std::byte>());
    }
  }

  void run() {
    if (::testing::Test::HasFailure()) return;
    sched_.resize(n_);
    for (std::size_t g = 0; g < n_; ++g) {
      HierArgs a;
      a.op = c_.op;
      a.dtype = c_.dtype;
      a.count = c_.count;
      a.root = c_.root;
      a.layout = &layout_;
      a.me = static_cast<int>(g);
      a.piece_bytes = c_.piece_bytes;
      const int node = layout_.node_of[g];
      for (int i = 0; i < layout_.per_node; ++i) {
        const auto m = static_cast<std::size_t>(layout_.at(node, i));
        a.in.push_back(ins_[m]);
        a.out.push_back(outs_[m]);
      }
      scratch_[g].resize(hier_scratch_bytes(a));
      a.scratch = scratch_[g].empty() ? nullptr : scratch_[g].data();
      std::string why;
      auto s = hier_schedule(a, why);
      ASSERT_TRUE(s) << why;
      ASSERT_FALSE(s->marks.empty()) << "rank " << g << " has no mark";
      for (std::size_t j = 1; j < s->marks.size(); ++j) {
        ASSERT_GE(s->marks[j].after, s->marks[j - 1].after);
        ASSERT_GE(s->marks[j].ready, s->marks[j - 1].ready);
      }
      ASSERT_EQ(s->marks.back().after, s->pre.size()) << "rank " << g << ": steps after the last mark";
      ASSERT_GE(s->marks.back().ready, s->rail.in_bytes()) << "rank " << g << ": rail input no mark covers";
      sched_[g] = std::move(*s);
    }
    simulate();
  }

  void simulate() {
    // --- the nodes of the happens-before graph
    enum Lane { Main = 0, In = 1, Out = 2 };
    struct Node {
      std::size_t actor = 0, rank = 0;
      std::vector<std::size_t> deps;
      int channel = -1;  // 0 main barrier, 1 tail barrier
      int signal_k = 0, wait_k = 0;
      std::vector<Range> reads, writes;
      std::function<void()> act;
    };
    std::vector<Node> nodes;
    const std::size_t rails_base = 3 * n_;
    std::vector<std::array<std::optional<std::size_t>, 3>> last(n_);
    const auto add = [&](std::size_t g, int lane, Node nd) {
      nd.rank = g;
      nd.actor = g * 3 + static_cast<std::size_t>(lane);
      if (last[g][static_cast<std::size_t>(lane)]) nd.deps.push_back(*last[g][static_cast<std::size_t>(lane)]);
      nodes.push_back(std::move(nd));
      last[g][static_cast<std::size_t>(lane)] = nodes.size() - 1;
      return nodes.size() - 1;
    };
    std::vector<std::array<std::vector<std::size_t>, 2>> signals(n_);  // by channel
    std::vector<std::array<int, 2>> waits(n_, {0, 0});
    const auto barrier = [&](std::size_t g, int lane, int channel) {
      Node s;
      s.channel = channel;
      s.signal_k = static_cast<int>(signals[g][static_cast<std::size_t>(channel)].size()) + 1;
      signals[g][static_cast<std::size_t>(channel)].push_back(add(g, lane, std::move(s)));
      Node w;
      w.channel = channel;
      w.wait_k = ++waits[g][static_cast<std::size_t>(channel)];
      add(g, lane, std::move(w));
    };
    stage_in_.assign(n_, {});
    stage_out_.assign(n_, {});
    std::vector<std::size_t> final_mark(n_), first_main(n_), tail_end(n_);
    std::vector<std::vector<std::size_t>> in_copies(n_);
    for (std::size_t g = 0; g < n_; ++g) {
      const auto& s = sched_[g];
      stage_in_[g].assign(s.rail.in_bytes(), std::byte{0});
      stage_out_[g].assign(s.rail.out_bytes(), std::byte{0});
      std::size_t next_mark = 0;
      std::uint64_t copied = 0;
      const auto marks_upto = [&](std::size_t steps_done) {
        while (next_mark < s.marks.size() && s.marks[next_mark].after == steps_done) {
          const std::size_t m = add(g, Main, Node{});
          final_mark[g] = m;
          // The In lane copies the rail input this mark covers, after it.
          const std::uint64_t ready = std::min(s.marks[next_mark].ready, s.rail.in_bytes());
          for (const auto& seg : s.rail.in) {
            const std::uint64_t lo = std::max(copied, seg.offset), hi = std::min(ready, seg.offset + seg.bytes);
            if (lo >= hi) continue;
            Node cp;
            cp.deps.push_back(m);
            const std::byte* src = seg.at + (lo - seg.offset);
            cp.reads.push_back({src, src + (hi - lo)});
            cp.act = [this, g, src, lo, hi] { std::memcpy(stage_in_[g].data() + lo, src, hi - lo); };
            in_copies[g].push_back(add(g, In, std::move(cp)));
          }
          copied = std::max(copied, ready);
          ++next_mark;
        }
      };
      marks_upto(0);
      for (std::size_t i = 0; i < s.pre.size(); ++i) {
        const Step& st = s.pre[i];
        if (st.kind == Kind::Barrier) {
          barrier(g, Main, 0);
        } else {
          Node nd;
          if (st.kind == Kind::Reduce) {
            for (auto* p : st.inputs) {
              ASSERT_NE(p, nullptr) << "rank " << g << " reduces a missing input";
              nd.reads.push_back({p, p + st.count * e_});
            }
            for (auto* p : st.outs) {
              ASSERT_NE(p, nullptr) << "rank " << g << " reduces into a missing output";
              nd.writes.push_back({p, p + st.count * e_});
            }
            const Step* sp = &st;
            nd.act = [this, sp] {
              std::vector<std::byte> acc(sp->inputs[0], sp->inputs[0] + sp->count * e_);
              for (std::size_t k = 1; k < sp->inputs.size(); ++k) add_into(acc.data(), sp->inputs[k], sp->count, c_.dtype);
              for (auto* o : sp->outs) std::memcpy(o, acc.data(), acc.size());
            };
          } else {
            ASSERT_EQ(st.kind, Kind::Copy) << "rank " << g << ": a pre step of an unexpected kind";
            ASSERT_NE(st.src, nullptr) << "rank " << g << " copies from a missing buffer";
            ASSERT_NE(st.dst, nullptr) << "rank " << g << " copies into a missing buffer";
            nd.reads.push_back({st.src, st.src + st.bytes});
            nd.writes.push_back({st.dst, st.dst + st.bytes});
            const Step* sp = &st;
            nd.act = [sp] { std::memmove(sp->dst, sp->src, sp->bytes); };
          }
          add(g, Main, std::move(nd));
        }
        marks_upto(i + 1);
      }
      ASSERT_EQ(next_mark, s.marks.size()) << "rank " << g << ": marks past the last step";
      for (std::size_t i = 0; i < nodes.size(); ++i)
        if (nodes[i].actor == g * 3 + Main) {
          first_main[g] = i;
          break;
        }
    }
    // The rail operations: one actor each, after every member's copies in.
    std::vector<std::size_t> rail_node(n_);
    for (int i = 0; i < layout_.per_node; ++i) {
      const auto members = layout_.rail(i);
      Node r;
      r.actor = rails_base + static_cast<std::size_t>(i);
      r.rank = n_;  // no rank's
      for (int g : members) {
        const auto ug = static_cast<std::size_t>(g);
        if (!in_copies[ug].empty()) r.deps.push_back(in_copies[ug].back());
        r.deps.push_back(final_mark[ug]);
      }
      r.act = [this, members] { run_rail(members); };
      nodes.push_back(std::move(r));
      for (int g : members) rail_node[static_cast<std::size_t>(g)] = nodes.size() - 1;
    }
    // The Out lanes: after the final mark and the rail operation, copies back, pushes, tail.
    for (std::size_t g = 0; g < n_; ++g) {
      Node start;
      start.deps = {final_mark[g], rail_node[g]};
      add(g, Out, std::move(start));
      for (const auto& seg : sched_[g].rail.out) {
        Node back;
        std::byte* dst = seg.at;
        const std::uint64_t off = seg.offset, len = seg.bytes;
        back.writes.push_back({dst, dst + len});
        back.act = [this, g, dst, off, len] { std::memcpy(dst, stage_out_[g].data() + off, len); };
        add(g, Out, std::move(back));
        for (std::byte* to : seg.push) {
          ASSERT_NE(to, nullptr) << "rank " << g << " pushes into a missing buffer";
          Node push;
          push.reads.push_back({dst, dst + len});
          push.writes.push_back({to, to + len});
          push.act = [dst, to, len] { std::memmove(to, dst, len); };
          add(g, Out, std::move(push));
        }
      }
      barrier(g, Out, 1);
      tail_end[g] = *last[g][Out];
    }
    // Barrier pairing: the k-th wait of a rank needs the k-th signal of every other member of
    // its node, on the same count.
    for (std::size_t g = 0; g < n_; ++g)
      for (int ch = 0; ch < 2; ++ch) {
        const auto uch = static_cast<std::size_t>(ch);
        const auto peer = static_cast<std::size_t>(layout_.at(layout_.node_of[g], 0));
        ASSERT_EQ(signals[g][uch].size(), signals[peer][uch].size()) << "rank " << g << " signals unequally on count " << ch;
        ASSERT_EQ(waits[g][uch], waits[peer][uch]) << "rank " << g << " waits unequally on count " << ch;
      }
    for (auto& nd : nodes) {
      if (nd.wait_k == 0) continue;
      const int node = layout_.node_of[nd.rank];
      for (int i = 0; i < layout_.per_node; ++i) {
        const auto q = static_cast<std::size_t>(layout_.at(node, i));
        if (q == nd.rank) continue;
        nd.deps.push_back(signals[q][static_cast<std::size_t>(nd.channel)][static_cast<std::size_t>(nd.wait_k - 1)]);
      }
    }
    // --- run in a topological order, with vector clocks
    const std::size_t actors = rails_base + static_cast<std::size_t>(layout_.per_node);
    std::vector<std::vector<std::uint64_t>> vc(nodes.size());
    std::vector<bool> done(nodes.size(), false);
    std::vector<std::uint64_t> ticks(actors, 0);
    for (std::size_t finished = 0; finished < nodes.size();) {
      bool progressed = false;
      for (std::size_t i = 0; i < nodes.size(); ++i) {
        if (done[i]) continue;
        const Node& nd = nodes[i];
        if (!std::all_of(nd.deps.begin(), nd.deps.end(), [&](std::size_t d) { return done[d]; })) continue;
        vc[i].assign(actors, 0);
        for (std::size_t d : nd.deps)
          for (std::size_t a = 0; a < actors; ++a) vc[i][a] = std::max(vc[i][a], vc[d][a]);
        vc[i][nd.actor] = ++ticks[nd.actor];
        if (nd.act) nd.act();  // race-free (checked below), so this order gives the GPUs' result
        done[i] = true;
        ++finished;
        progressed = true;
      }
      ASSERT_TRUE(progressed) << "deadlock: " << nodes.size() - finished << " steps can never run";
    }
    const auto ordered = [&](std::size_t a, std::size_t b) {  // a happens before b
      return vc[a][nodes[a].actor] <= vc[b][nodes[a].actor];
    };
    for (std::size_t x = 0; x < nodes.size(); ++x)
      for (std::size_t y = x + 1; y < nodes.size(); ++y) {
        if (nodes[x].actor == nodes[y].actor) continue;
        const auto clash = [](const std::vector<Range>& w, const std::vector<Range>& o) {
          for (const auto& a : w)
            for (const auto& b : o)
              if (a.overlaps(b)) return true;
          return false;
        };
        if (!clash(nodes[x].writes, nodes[y].writes) && !clash(nodes[x].writes, nodes[y].reads) &&
            !clash(nodes[y].writes, nodes[x].reads))
          continue;
        ASSERT_TRUE(ordered(x, y) || ordered(y, x))
            << "race: rank " << nodes[x].rank << " lane " << nodes[x].actor % 3 << " and rank " << nodes[y].rank
            << " lane " << nodes[y].actor % 3 << " touch the same bytes unordered";
      }
    // A rank's op ends at its tail barrier: every actor of it is done by then, and the others
    // touch its buffers only after its first step and before that end.
    for (std::size_t g = 0; g < n_; ++g) {
      for (std::size_t i = 0; i < nodes.size(); ++i) {
        if (nodes[i].rank != g) continue;
        ASSERT_TRUE(ordered(i, tail_end[g])) << "rank " << g << ": a step may outlive the op";
      }
      std::vector<Range> owned;
      for (const auto* v : {&in_[g], &out_[g], &scratch_[g]})
        if (!v->empty()) owned.push_back({v->data(), v->data() + v->size()});
      for (std::size_t i = 0; i < nodes.size(); ++i) {
        const Node& nd = nodes[i];
        if (nd.rank == g || nd.rank >= n_) continue;
        bool touches = false;
        for (const auto* v : {&nd.reads, &nd.writes})
          for (const auto& r : *v)
            for (const auto& o : owned) touches = touches || r.overlaps(o);
        if (!touches) continue;
        ASSERT_TRUE(ordered(first_main[g], i)) << "rank " << nd.rank << " touches rank " << g << "'s buffer before its op began";
        ASSERT_TRUE(ordered(i, tail_end[g])) << "rank " << nd.rank << " touches rank " << g << "'s buffer after its op may be done";
      }
    }
  }

  // The rail operation among `members` (group ranks, in node order) on their staging.
  void run_rail(const std::vector<int>& members) {
    const auto& r0 = sched_[static_cast<std::size_t>(members[0])].rail;
    const std::uint64_t n = r0.count, b = n * e_;
    if (n == 0) return;
    const auto P = members.size();
    const auto in = [&](std::size_t k) -> std::vector<std::byte>& { return stage_in_[static_cast<std::size_t>(members[k])]; };
    const auto out = [&](std::size_t k) -> std::vector<std::byte>& { return stage_out_[static_cast<std::size_t>(members[k])]; };
    for (int g : members) ASSERT_EQ(sched_[static_cast<std::size_t>(g)].rail.count, n) << "rail members disagree on the count";
    switch (c_.op) {
      case OpType::AllReduce: {
        std::vector<std::byte> acc = in(0);
        for (std::size_t k = 1; k < P; ++k) add_into(acc.data(), in(k).data(), n, c_.dtype);
        for (std::size_t k = 0; k < P; ++k) out(k) = acc;
        break;
      }
      case OpType::ReduceScatter:
        for (std::size_t k = 0; k < P; ++k) {
          std::vector<std::byte> acc(in(0).begin() + static_cast<std::ptrdiff_t>(k * b),
                                     in(0).begin() + static_cast<std::ptrdiff_t>((k + 1) * b));
          for (std::size_t q = 1; q < P; ++q) add_into(acc.data(), in(q).data() + k * b, n, c_.dtype);
          out(k) = acc;
        }
        break;
      case OpType::AllGather:
        for (std::size_t k = 0; k < P; ++k)
          for (std::size_t q = 0; q < P; ++q) std::memcpy(out(k).data() + q * b, in(q).data(), b);
        break;
      case OpType::Broadcast:
        for (std::size_t k = 0; k < P; ++k)
          if (static_cast<int>(k) != r0.root) out(k) = in(static_cast<std::size_t>(r0.root));
        break;
      case OpType::Reduce: {
        std::vector<std::byte> acc = in(0);
        for (std::size_t k = 1; k < P; ++k) add_into(acc.data(), in(k).data(), n, c_.dtype);
        out(static_cast<std::size_t>(r0.root)) = acc;
        break;
      }
      default: FAIL();
    }
  }

  std::vector<std::byte> expected(std::size_t g) const {
    const std::uint64_t one = c_.count * e_;
    const auto sum_at = [&](std::uint64_t off) {
      std::vector<std::byte> acc(before_[0].begin() + static_cast<std::ptrdiff_t>(off),
                                 before_[0].begin() + static_cast<std::ptrdiff_t>(off + one));
      for (std::size_t q = 1; q < n_; ++q) add_into(acc.data(), before_[q].data() + off, c_.count, c_.dtype);
      return acc;
    };
    std::vector<std::byte> v;
    switch (c_.op) {
      case OpType::AllReduce: return sum_at(0);
      case OpType::ReduceScatter: return sum_at(g * one);
      case OpType::Reduce: return static_cast<int>(g) == c_.root ? sum_at(0) : v;
      case OpType::AllGather:
        for (std::size_t q = 0; q < n_; ++q) v.insert(v.end(), before_[q].begin(), before_[q].end());
        return v;
      case OpType::Broadcast: return before_[static_cast<std::size_t>(c_.root)];
      default: return v;
    }
  }
  std::vector<std::byte> result(std::size_t g) const {
    if (!outs_[g]) return {};
    const std::uint64_t one = c_.count * e_;
    const std::uint64_t bytes = c_.op == OpType::AllGather ? one * n_ : one;
    return {outs_[g], outs_[g] + bytes};
  }
  std::size_t n() const { return n_; }

 private:
  Case c_;
  std::uint64_t e_;
  std::size_t n_;
  GroupLayout layout_;
  std::vector<std::vector<std::byte>> in_, out_, scratch_, before_, stage_in_, stage_out_;
  std::vector<std::byte*> ins_, outs_;
  std::vector<HierSchedule> sched_;
};

void check(const Case& c) {
  SCOPED_TRACE(c.name());
  Sim sim(c);
  sim.run();
  if (::testing::Test::HasFatalFailure()) return;
  for (std::size_t g = 0; g < sim.n(); ++g) {
    const auto want = sim.expected(g);
    const auto got = sim.result(g);
    ASSERT_EQ(got.size(), want.size()) << "rank " << g;
    if (got == want) continue;
    std::size_t first = 0;
    while (first < got.size() && got[first] == want[first]) ++first;
    ADD_FAILURE() << "rank " << g << " has a wrong result from byte " << first << " of " << got.size() << ": "
                  << static_cast<int>(got[first]) << " instead of " << static_cast<int>(want[first]);
  }
}

const DType kTypes[] = {DType::Int8, DType::Int32, DType::Int64};
const std::uint64_t kCounts[] = {1, 7, 1001};
// Nodes x ranks per node up to 4 x 8 (one rank per node included: the rails are the group).
const std::pair<int, int> kShapes[] = {{2, 1}, {2, 2}, {3, 2}, {2, 3}, {4, 2}, {2, 8}, {4, 4}, {4, 8}};

TEST(HierSchedule, AllReduceInAndOutOfPlaceInPieces) {
  for (auto [P, G] : kShapes)
    for (auto t : kTypes)
      for (auto count : kCounts)
        for (bool in_place : {false, true})
          for (std::uint64_t piece : {0, 16, 256})
            for (bool inter : {false, true}) check({OpType::AllReduce, t, count, P, G, 0, in_place, piece, inter});
}

TEST(HierSchedule, ReduceScatterInPieces) {
  for (auto [P, G] : kShapes)
    for (auto t : kTypes)
      for (auto count : kCounts)
        for (std::uint64_t piece : {0, 16})
          for (bool inter : {false, true}) check({OpType::ReduceScatter, t, count, P, G, 0, false, piece, inter});
}

TEST(HierSchedule, AllGatherInAndOutOfPlace) {
  for (auto [P, G] : kShapes)
    for (auto t : kTypes)
      for (auto count : kCounts)
        for (bool in_place : {false, true})
          for (bool inter : {false, true}) check({OpType::AllGather, t, count, P, G, 0, in_place, 0, inter});
}

TEST(HierSchedule, BroadcastAndReduceFromEveryRoot) {
  for (auto [P, G] : kShapes)
    for (auto count : kCounts)
      for (int root = 0; root < P * G; ++root)
        for (bool inter : {false, true}) {
          check({OpType::Broadcast, DType::Int32, count, P, G, root, false, 0, inter});
          check({OpType::Reduce, DType::Int32, count, P, G, root, false, 64, inter});
        }
}

TEST(HierSchedule, OnlyEachGpusShardLeavesTheNode) {
  // What crosses PCIe: AllReduce moves 1/G of the tensor out and back per rank, AllGather
  // only the rank's own input out.
  const int P = 2, G = 4;
  const std::uint64_t count = 4096;
  std::vector<int> globals(P * G);
  for (int g = 0; g < P * G; ++g) globals[static_cast<std::size_t>(g)] = g;
  std::string why;
  const auto l = GroupLayout::of(globals, G, why);
  ASSERT_TRUE(l) << why;
  std::vector<std::vector<std::byte>> bufs(G, std::vector<std::byte>(count * 4 * P * G));
  HierArgs a;
  a.dtype = DType::Float32;
  a.count = count;
  a.layout = &*l;
  for (auto& b : bufs) {
    a.in.push_back(b.data());
    a.out.push_back(b.data());
  }
  for (int me = 0; me < G; ++me) {
    a.me = me;
    a.op = OpType::AllReduce;
    auto s = hier_schedule(a, why);
    ASSERT_TRUE(s) << why;
    EXPECT_EQ(s->rail.in_bytes(), count * 4 / G);
    EXPECT_EQ(s->rail.out_bytes(), count * 4 / G);
    a.op = OpType::AllGather;
    s = hier_schedule(a, why);
    ASSERT_TRUE(s) << why;
    EXPECT_EQ(s->rail.in_bytes(), count * 4);
    EXPECT_EQ(s->rail.out_bytes(), count * 4 * P);
  }
}

TEST(HierSchedule, UnequalNodesHaveNoLayoutAndOtherOpsNoForm) {
  std::string why;
  EXPECT_FALSE(GroupLayout::of({0, 1, 2}, 2, why));
  EXPECT_NE(why.find("unequal"), std::string::npos) << why;
  const auto l = GroupLayout::of({0, 2, 1, 3}, 2, why);  // interleaved: nodes still balanced
  ASSERT_TRUE(l) << why;
  EXPECT_EQ(l->nodes, 2);
  EXPECT_EQ(l->per_node, 2);
  EXPECT_EQ(l->rail(0), (std::vector<int>{0, 1}));  // global ranks 0 and 2
  EXPECT_EQ(l->rail(1), (std::vector<int>{2, 3}));  // global ranks 1 and 3
  HierArgs a;
  a.op = OpType::AllToAll;
  a.layout = &*l;
  a.in.assign(2, nullptr);
  a.out.assign(2, nullptr);
  EXPECT_FALSE(hier_schedule(a, why));
  EXPECT_NE(why.find("no hierarchical form"), std::string::npos) << why;
}

}  // namespace
}  // namespace smddp::client::gpu
