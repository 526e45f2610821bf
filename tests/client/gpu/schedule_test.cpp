// The GPU path's schedules (client/gpu/schedule.hpp) run on host memory: n simulated ranks in
// one process, each with a main and a side stream, ordered only as the GPUs order them
// (stream order, fork and join, and the flags of barriers and signals). For every collective,
// group size 1-8, dtype width, in-place form, one-shot and two-shot (copy-engine pull or push,
// pipelined pull, kernel push), and copy-engine pulls and pushes of the gathers, it checks:
//   - every member signals and waits the same number of times (or a GPU would wait forever),
//     and nothing deadlocks;
//   - no two actors (a rank's streams) touch the same bytes unordered while one of them
//     writes (a race on the GPUs), by vector clocks over the happens-before order;
//   - another rank touches a rank's buffers only while that rank's op runs (after its first
//     step, before its last);
//   - the results equal a reference computed independently.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "client/gpu/schedule.hpp"
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
  int n;
  int root = 0;
  bool in_place = false;
  std::uint64_t oneshot_max = 1 << 20;
  TwoShot twoshot = TwoShot::Pull;
  std::uint64_t pipeline_bytes = 0;
  bool copy_push = false;
  // Uneven AllToAll: sends[r][q] elements from rank r to rank q (count unused); empty: even.
  std::vector<std::vector<std::uint64_t>> sends;
  std::string name() const {
    return std::string(ipc::to_string(op)) + " " + std::string(ipc::to_string(dtype)) + " count " +
           std::to_string(count) + " n " + std::to_string(n) + " root " + std::to_string(root) +
           (in_place ? " in-place" : "") + " oneshot_max " + std::to_string(oneshot_max) + " twoshot " +
           (twoshot == TwoShot::Push ? "push" : twoshot == TwoShot::Pull ? "pull" : "kernel") + " pipeline_bytes " +
           std::to_string(pipeline_bytes) + (copy_push ? " copy_push" : "") + (sends.empty() ? "" : " uneven");
  }
};

class Sim {
 public:
  explicit Sim(const Case& c) : c_(c), e_(ipc::dtype_size(c.dtype)), n_(static_cast<std::size_t>(c.n)) {
    const std::uint64_t one = c.count * e_, all = one * n_;
    in_.resize(n_);
    out_.resize(n_);
    scratch_.resize(n_);
    for (std::size_t r = 0; r < n_; ++r) {
      const bool root = static_cast<int>(r) == c.root;
      std::uint64_t in_bytes = 0, out_bytes = 0;
      switch (c.op) {
        case OpType::AllReduce: in_bytes = one; out_bytes = c.in_place ? 0 : one; break;
        case OpType::ReduceScatter: in_bytes = all; out_bytes = one; break;
        case OpType::Reduce: in_bytes = one; out_bytes = root ? one : 0; break;
        case OpType::AllGather: in_bytes = c.in_place ? 0 : one; out_bytes = all; break;
        case OpType::AllToAll:
          in_bytes = c.sends.empty() ? all : sent(r, n_) * e_;
          out_bytes = c.sends.empty() ? all : received(r, n_) * e_;
          break;
        case OpType::Broadcast: in_bytes = root ? one : 0; out_bytes = root ? 0 : one; break;
        case OpType::Gather: in_bytes = one; out_bytes = root ? all : 0; break;
        case OpType::Scatter: in_bytes = root ? all : 0; out_bytes = one; break;
        case OpType::Send: in_bytes = r == 0 ? one : 0; out_bytes = r == 1 ? one : 0; break;
        default: break;
      }
      in_[r].resize(in_bytes);
      out_[r].resize(out_bytes);
      for (std::uint64_t i = 0; i < in_bytes; ++i) in_[r][i] = static_cast<std::byte>((r * 131 + i * 7 + 3) & 0xff);
      for (std::uint64_t i = 0; i < out_bytes; ++i) out_[r][i] = std::byte{0xEE};  // poison
      if (c.op == OpType::AllGather && c.in_place)
        for (std::uint64_t i = 0; i < one; ++i) out_[r][r * one + i] = static_cast<std::byte>((r * 131 + i * 7 + 3) & 0xff);
    }
    // What each member's buffers are (the same pointer in every rank's view: one process).
    for (std::size_t r = 0; r < n_; ++r) {
      std::byte* in = in_[r].empty() ? nullptr : in_[r].data();
      std::byte* out = out_[r].empty() ? nullptr : out_[r].data();
      if (c.op == OpType::AllReduce && c.in_place) out = in;
      if (c.op == OpType::Broadcast && static_cast<int>(r) == c.root) out = in;
      if (c.op == OpType::AllGather && c.in_place) in = out + r * one;
      ins_.push_back(in);
      outs_.push_back(out);
    }
    inputs_before_.resize(n_);
    for (std::size_t r = 0; r < n_; ++r)
      if (ins_[r]) inputs_before_[r].assign(ins_[r], ins_[r] + input_bytes(r));
  }

  // Uneven AllToAll: elements rank r sends to ranks [0, q), and receives from them.
  std::uint64_t sent(std::size_t r, std::size_t q) const {
    std::uint64_t v = 0;
    for (std::size_t k = 0; k < q; ++k) v += c_.sends[r][k];
    return v;
  }
  std::uint64_t received(std::size_t r, std::size_t q) const {
    std::uint64_t v = 0;
    for (std::size_t k = 0; k < q; ++k) v += c_.sends[k][r];
    return v;
  }

  std::uint64_t input_bytes(std::size_t r) const {
    const std::uint64_t one = c_.count * e_;
    if (c_.op == OpType::AllToAll && !c_.sends.empty()) return sent(r, n_) * e_;
    switch (c_.op) {
      case OpType::ReduceScatter:
      case OpType::AllToAll: return one * n_;
      case OpType::Scatter: return static_cast<int>(r) == c_.root ? one * n_ : 0;
      default: return one;
    }
  }

  // Builds every rank's steps and runs them phase by phase; returns false (with failures
  // recorded) on a schedule error, unequal barriers or a race.
  void run() {
    std::vector<std::vector<Step>> steps(n_);
    for (std::size_t r = 0; r < n_; ++r) {
      ScheduleArgs a;
      a.op = c_.op == OpType::Send && r == 1 ? OpType::Recv : c_.op;
      a.dtype = c_.dtype;
      a.count = c_.count;
      a.root = c_.root;
      a.me = static_cast<int>(r);
      a.in = ins_;
      a.out = outs_;
      a.oneshot_max = c_.oneshot_max;
      a.twoshot = c_.twoshot;
      a.pipeline_bytes = c_.pipeline_bytes;
      a.copy_push = c_.copy_push;
      if (!c_.sends.empty())
        // What the daemon derives from the members' tables (daemon/alltoall_splits.hpp).
        for (std::size_t q = 0; q < n_; ++q) {
          std::uint64_t dst = 0, src = 0;
          for (std::size_t k = 0; k < r; ++k) {
            dst += c_.sends[k][q];
            src += c_.sends[q][k];
          }
          a.splits.push_back({c_.sends[r][q], dst, c_.sends[q][r], src});
        }
      scratch_[r].resize(needs_scratch(a));
      a.scratch = scratch_[r].empty() ? nullptr : scratch_[r].data();
      std::string why;
      auto s = schedule(a, why);
      ASSERT_TRUE(s) << why;
      steps[r] = std::move(*s);
    }
    simulate(steps);
  }

  // Runs every rank's steps as the GPUs may: each rank has a main and a side stream, ordered
  // only by stream order, Fork/Join/CopyBeside and the flags (a rank's k-th wait, of a
  // Barrier or a WaitSide, needs every other rank's k-th signal, of a Barrier or a Signal).
  // Vector clocks say which accesses are ordered: two by different actors that touch the
  // same bytes, one of them writing, with neither before the other, are a race. A state
  // where nothing can run any more with steps left is a deadlock (a GPU would wait for ever).
  void simulate(const std::vector<std::vector<Step>>& steps) {
    const std::size_t actors = 2 * n_;
    struct Node {
      const Step* step = nullptr;  // null: the signal half of a barrier
      std::size_t actor = 0;
      std::vector<std::size_t> deps;  // nodes
      int wait_k = 0;                 // > 0: waits for every other rank's wait_k-th signal
      int signal_k = 0;               // > 0: this rank's signal_k-th signal
      std::size_t rank = 0;
    };
    std::vector<Node> nodes;
    std::vector<std::vector<std::size_t>> signal_of(n_);  // rank -> node of its k-th signal (k-1)
    std::vector<int> waits(n_, 0);
    for (std::size_t r = 0; r < n_; ++r) {
      std::optional<std::size_t> last[2];
      int signals = 0;
      const auto add = [&](Node nd, int on) {
        nd.rank = r;
        nd.actor = r * 2 + static_cast<std::size_t>(on);
        if (last[on]) nd.deps.push_back(*last[on]);
        nodes.push_back(std::move(nd));
        last[on] = nodes.size() - 1;
        return nodes.size() - 1;
      };
      const auto fork = [&] {  // the side stream waits for the main stream's work so far
        if (!last[0]) return;
        Node f;
        f.deps.push_back(*last[0]);
        add(f, 1);
      };
      for (const Step& st : steps[r]) {
        Node nd;
        nd.step = &st;
        switch (st.kind) {
          case Kind::Barrier: {
            Node sig;
            sig.signal_k = ++signals;
            signal_of[r].push_back(add(sig, 0));
            nd.wait_k = ++waits[r];
            add(nd, 0);
            break;
          }
          case Kind::Signal:
            nd.signal_k = ++signals;
            signal_of[r].push_back(add(nd, 0));
            break;
          case Kind::WaitSide:
            nd.wait_k = ++waits[r];
            add(nd, 1);
            break;
          case Kind::Fork: fork(); break;
          case Kind::CopyBeside:
            fork();
            add(nd, 1);
            break;
          case Kind::SideCopy: add(nd, 1); break;
          case Kind::Join:
            if (last[1]) nd.deps.push_back(*last[1]);
            add(nd, 0);
            break;
          default: add(nd, 0); break;  // Reduce, Copy
        }
      }
    }
    for (std::size_t r = 1; r < n_; ++r) {
      ASSERT_EQ(signal_of[r].size(), signal_of[0].size()) << "rank " << r << " signals a different number of times";
      ASSERT_EQ(waits[r], waits[0]) << "rank " << r << " waits a different number of times";
    }
    ASSERT_EQ(static_cast<std::size_t>(waits[0]), signal_of[0].size()) << "signals and waits do not pair up";
    for (auto& nd : nodes)
      if (nd.wait_k > 0)
        for (std::size_t q = 0; q < n_; ++q)
          if (q != nd.rank) nd.deps.push_back(signal_of[q][static_cast<std::size_t>(nd.wait_k - 1)]);

    // Topological order, vector clocks and the accesses of each node.
    std::vector<std::vector<std::uint64_t>> vc(nodes.size());
    std::vector<bool> done(nodes.size(), false);
    struct Access {
      std::size_t node;
      Range range;
      bool write;
    };
    std::vector<Access> accesses;
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
        if (const Step* s = nd.step) {
          if (s->kind == Kind::Reduce) {
            const std::uint64_t b = s->count * e_;
            for (auto* p : s->inputs) {
              ASSERT_NE(p, nullptr) << "rank " << nd.rank << " reduces a missing input";
              accesses.push_back({i, {p, p + b}, false});
            }
            for (auto* p : s->outs) {
              ASSERT_NE(p, nullptr) << "rank " << nd.rank << " reduces into a missing output";
              accesses.push_back({i, {p, p + b}, true});
            }
          } else if (s->kind == Kind::Copy || s->kind == Kind::CopyBeside || s->kind == Kind::SideCopy) {
            ASSERT_NE(s->src, nullptr) << "rank " << nd.rank << " copies from a missing buffer";
            ASSERT_NE(s->dst, nullptr) << "rank " << nd.rank << " copies into a missing buffer";
            accesses.push_back({i, {s->src, s->src + s->bytes}, false});
            accesses.push_back({i, {s->dst, s->dst + s->bytes}, true});
          }
          execute(*s);  // race-free (checked below), so this order gives the GPUs' result
        }
        done[i] = true;
        ++finished;
        progressed = true;
      }
      ASSERT_TRUE(progressed) << "deadlock: " << nodes.size() - finished << " steps can never run";
    }
    // The op is done when its main stream is (the executor marks completion there): every
    // step of a rank, side stream included, must come before its last main-stream step.
    for (std::size_t r = 0; r < n_; ++r) {
      std::optional<std::size_t> last_main;
      for (std::size_t i = 0; i < nodes.size(); ++i)
        if (nodes[i].actor == r * 2) last_main = i;
      if (!last_main) continue;
      for (std::size_t i = 0; i < nodes.size(); ++i) {
        if (nodes[i].rank != r) continue;
        ASSERT_LE(vc[i][nodes[i].actor], vc[*last_main][nodes[i].actor])
            << "rank " << r << ": a step on its " << (nodes[i].actor % 2 ? "side" : "main")
            << " stream may still run when the op is marked done";
      }
    }
    const auto before = [&](const Access& a, const Access& b) {
      return vc[a.node][nodes[a.node].actor] <= vc[b.node][nodes[a.node].actor];
    };
    for (std::size_t x = 0; x < accesses.size(); ++x)
      for (std::size_t y = x + 1; y < accesses.size(); ++y) {
        const Access& a = accesses[x];
        const Access& b = accesses[y];
        if (nodes[a.node].actor == nodes[b.node].actor || !(a.write || b.write) || !a.range.overlaps(b.range)) continue;
        ASSERT_TRUE(before(a, b) || before(b, a))
            << "race: rank " << nodes[a.node].rank << (nodes[a.node].actor % 2 ? " (side)" : "") << " and rank "
            << nodes[b.node].rank << (nodes[b.node].actor % 2 ? " (side)" : "") << " touch the same bytes unordered";
      }
    // A rank's buffers are the op's only between its first and its last main-stream step:
    // before, its stream may still use them (earlier work); after, the caller owns them again.
    // So another rank may read or write them (a pull or a push) only inside that window.
    for (std::size_t r = 0; r < n_; ++r) {
      std::optional<std::size_t> first_main, last_main;
      for (std::size_t i = 0; i < nodes.size(); ++i)
        if (nodes[i].actor == r * 2) {
          if (!first_main) first_main = i;
          last_main = i;
        }
      if (!first_main) continue;
      const std::size_t mine = r * 2;
      std::vector<Range> owned;
      for (const auto* v : {&in_[r], &out_[r], &scratch_[r]})
        if (!v->empty()) owned.push_back({v->data(), v->data() + v->size()});
      for (const Access& a : accesses) {
        const Node& nd = nodes[a.node];
        if (nd.rank == r || std::none_of(owned.begin(), owned.end(), [&](const Range& o) { return o.overlaps(a.range); }))
          continue;
        ASSERT_GE(vc[a.node][mine], vc[*first_main][mine])
            << "rank " << nd.rank << (a.write ? " writes" : " reads") << " rank " << r
            << "'s buffer before rank " << r << "'s op began";
        ASSERT_LE(vc[a.node][nd.actor], vc[*last_main][nd.actor])
            << "rank " << nd.rank << (a.write ? " writes" : " reads") << " rank " << r
            << "'s buffer when rank " << r << "'s op may be done";
      }
    }
  }

  void execute(const Step& s) {
    if (s.kind == Kind::Copy || s.kind == Kind::CopyBeside || s.kind == Kind::SideCopy) {
      std::memmove(s.dst, s.src, s.bytes);
    } else if (s.kind == Kind::Reduce) {
      std::vector<std::byte> acc(s.inputs[0], s.inputs[0] + s.count * e_);
      for (std::size_t i = 1; i < s.inputs.size(); ++i) add_into(acc.data(), s.inputs[i], s.count, c_.dtype);
      for (auto* o : s.outs) std::memcpy(o, acc.data(), acc.size());
    }
  }

  // The expected output of rank r, from the inputs as they were before the collective.
  std::vector<std::byte> expected(std::size_t r) const {
    const std::uint64_t one = c_.count * e_;
    const auto sum_block = [&](std::uint64_t off) {
      std::vector<std::byte> acc(inputs_before_[0].begin() + static_cast<std::ptrdiff_t>(off),
                                 inputs_before_[0].begin() + static_cast<std::ptrdiff_t>(off + one));
      for (std::size_t q = 1; q < n_; ++q) add_into(acc.data(), inputs_before_[q].data() + off, c_.count, c_.dtype);
      return acc;
    };
    const auto root = static_cast<std::size_t>(c_.root);
    std::vector<std::byte> v;
    switch (c_.op) {
      case OpType::AllReduce: return sum_block(0);
      case OpType::ReduceScatter: return sum_block(r * one);
      case OpType::Reduce: return r == root ? sum_block(0) : v;
      case OpType::AllGather:
        for (std::size_t q = 0; q < n_; ++q) v.insert(v.end(), inputs_before_[q].begin(), inputs_before_[q].end());
        return v;
      case OpType::AllToAll:
        for (std::size_t q = 0; q < n_; ++q) {
          const std::uint64_t from = c_.sends.empty() ? r * one : sent(q, r) * e_;
          const std::uint64_t len = c_.sends.empty() ? one : c_.sends[q][r] * e_;
          v.insert(v.end(), inputs_before_[q].begin() + static_cast<std::ptrdiff_t>(from),
                   inputs_before_[q].begin() + static_cast<std::ptrdiff_t>(from + len));
        }
        return v;
      case OpType::Broadcast: return inputs_before_[root];
      case OpType::Gather:
        if (r != root) return v;
        for (std::size_t q = 0; q < n_; ++q) v.insert(v.end(), inputs_before_[q].begin(), inputs_before_[q].end());
        return v;
      case OpType::Scatter:
        return {inputs_before_[root].begin() + static_cast<std::ptrdiff_t>(r * one),
                inputs_before_[root].begin() + static_cast<std::ptrdiff_t>((r + 1) * one)};
      case OpType::Send: return r == 1 ? inputs_before_[0] : v;
      default: return v;
    }
  }

  std::vector<std::byte> result(std::size_t r) const {
    if (!outs_[r]) return {};
    const std::uint64_t one = c_.count * e_;
    std::uint64_t bytes = one;
    if (c_.op == OpType::AllGather || c_.op == OpType::AllToAll || c_.op == OpType::Gather) bytes = one * n_;
    if (c_.op == OpType::AllToAll && !c_.sends.empty()) bytes = received(r, n_) * e_;
    return {outs_[r], outs_[r] + bytes};
  }

  std::size_t n() const { return n_; }

 private:
  Case c_;
  std::uint64_t e_;
  std::size_t n_;
  std::vector<std::vector<std::byte>> in_, out_, scratch_, inputs_before_;
  std::vector<std::byte*> ins_, outs_;
};

void check(const Case& c) {
  SCOPED_TRACE(c.name());
  Sim sim(c);
  sim.run();
  if (::testing::Test::HasFatalFailure()) return;
  for (std::size_t r = 0; r < sim.n(); ++r) {
    const auto want = sim.expected(r);
    const auto got = sim.result(r);
    ASSERT_EQ(got.size(), want.size()) << "rank " << r;
    EXPECT_TRUE(got == want) << "rank " << r << " has a wrong result";
  }
}

const DType kTypes[] = {DType::Int8, DType::Int32, DType::Int64};
const std::uint64_t kCounts[] = {1, 7, 64, 1001};

TEST(GpuSchedule, AllReduceOneShotAndTwoShotPullAndPushInAndOutOfPlace) {
  for (int n = 1; n <= 8; ++n)
    for (auto t : kTypes)
      for (auto count : kCounts)
        for (bool in_place : {false, true})
          for (std::uint64_t oneshot_max : {std::uint64_t{1} << 20, std::uint64_t{0}})  // one-shot, two-shot
            for (TwoShot form : {TwoShot::Pull, TwoShot::Push, TwoShot::Kernel}) {
              if (oneshot_max && form != TwoShot::Pull) continue;
              check({OpType::AllReduce, t, count, n, 0, in_place, oneshot_max, form});
            }
}

TEST(GpuSchedule, TwoShotCopyPushHasNoBarrierBetweenItsPhases) {
  // What the push form buys besides the faster direction: one barrier fewer than the pull.
  for (bool copy_push : {false, true}) {
    std::vector<std::byte> a(64), b(64), c(64), d(64);
    ScheduleArgs x;
    x.op = OpType::AllReduce;
    x.dtype = DType::Int32;
    x.count = 16;
    x.in = {a.data(), b.data()};
    x.out = {c.data(), d.data()};
    x.twoshot = copy_push ? TwoShot::Push : TwoShot::Pull;
    std::string why;
    auto s = schedule(x, why);
    ASSERT_TRUE(s) << why;
    EXPECT_EQ(std::count_if(s->begin(), s->end(), [](const Step& st) { return st.kind == Kind::Barrier; }),
              copy_push ? 2 : 3);
  }
}

TEST(GpuSchedule, TwoShotChunksCoverEveryElementWhenTheyDoNotDivideEvenly) {
  // Fewer aligned chunks than ranks (count 1 with 8 ranks) and ragged last chunks.
  for (int n : {2, 3, 5, 8})
    for (std::uint64_t count : {1, 2, 15, 17, 33, 4099}) check({OpType::AllReduce, DType::Int8, count, n, 0, true, 0});
}

TEST(GpuSchedule, TwoShotPullPipelinedInPieces) {
  // Pieces of 16 bytes up to a whole chunk: 1 to 8 pieces, ragged last ones, empty ones where
  // a chunk is short, in and out of place.
  for (int n = 2; n <= 8; ++n)
    for (auto t : kTypes)
      for (std::uint64_t count : {7, 64, 1001, 4099})
        for (std::uint64_t piece : {16, 64, 1024})
          for (bool in_place : {false, true})
            for (TwoShot form : {TwoShot::Pull, TwoShot::Push})  // pieces keep the pull form either way
              check({OpType::AllReduce, t, count, n, 0, in_place, 0, form, piece});
}

TEST(GpuSchedule, ReduceScatterAndReduceToEveryRoot) {
  for (int n = 1; n <= 8; ++n)
    for (auto t : kTypes)
      for (auto count : kCounts) {
        check({OpType::ReduceScatter, t, count, n});
        for (int root = 0; root < n; ++root) check({OpType::Reduce, t, count, n, root});
      }
}

TEST(GpuSchedule, AllGatherInAndOutOfPlaceAndAllToAllPulledAndPushed) {
  for (int n = 1; n <= 8; ++n)
    for (auto t : kTypes)
      for (auto count : kCounts) {
        for (bool copy_push : {false, true}) {
          check({OpType::AllGather, t, count, n, 0, false, 1 << 20, TwoShot::Pull, 0, copy_push});
          check({OpType::AllGather, t, count, n, 0, true, 1 << 20, TwoShot::Pull, 0, copy_push});
          check({OpType::AllToAll, t, count, n, 0, false, 1 << 20, TwoShot::Pull, 0, copy_push});
        }
      }
}

TEST(GpuSchedule, UnevenAllToAllPulledAndPushed) {
  // Split tables as MoE routing makes them: random, with empty blocks, a rank that sends
  // nothing, one that receives nothing, and a rank's block to itself.
  std::uint64_t seed = 12345;
  const auto next = [&seed] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return seed >> 33;
  };
  for (int n = 1; n <= 8; ++n)
    for (int pattern = 0; pattern < 4; ++pattern)
      for (auto t : kTypes)
        for (bool copy_push : {false, true}) {
          const auto un = static_cast<std::size_t>(n);
          std::vector<std::vector<std::uint64_t>> sends(un, std::vector<std::uint64_t>(un));
          for (std::size_t r = 0; r < un; ++r)
            for (std::size_t q = 0; q < un; ++q) {
              const std::uint64_t v = next() % 40;
              sends[r][q] = v % 5 == 0 ? 0 : v;  // about a fifth of the blocks empty
              if (pattern == 1 && r == 0) sends[r][q] = 0;             // rank 0 sends nothing
              if (pattern == 2 && q == un - 1) sends[r][q] = 0;        // the last rank receives nothing
              if (pattern == 3) sends[r][q] = r == q ? 1001 : v;       // a large block to itself
            }
          Case c{OpType::AllToAll, t, 0, n, 0, false, 1 << 20, TwoShot::Pull, 0, copy_push};
          c.sends = sends;
          check(c);
        }
}

TEST(GpuSchedule, BroadcastGatherScatterFromEveryRoot) {
  for (int n = 1; n <= 8; ++n)
    for (auto count : kCounts)
      for (int root = 0; root < n; ++root) {
        check({OpType::Broadcast, DType::Int32, count, n, root});
        check({OpType::Gather, DType::Int32, count, n, root});
        check({OpType::Scatter, DType::Int32, count, n, root});
      }
}

TEST(GpuSchedule, SendRecvThePeerPulls) {
  for (auto count : kCounts) check({OpType::Send, DType::Int64, count, 2});
}

TEST(GpuSchedule, BarriersDependOnlyOnWhatEveryMemberKnows) {
  // A rank in place and a rank out of place still pass the same barriers (the count is
  // what every member shares), in each AllReduce form.
  for (std::uint64_t oneshot_max : {std::uint64_t{1} << 20, std::uint64_t{0}})
  for (bool copy_push : {false, true}) {
    std::vector<std::byte> a(64), b(64), c(64);
    ScheduleArgs x;
    x.op = OpType::AllReduce;
    x.dtype = DType::Int32;
    x.count = 16;
    x.in = {a.data(), b.data()};
    x.out = {a.data(), c.data()};  // rank 0 in place, rank 1 not
    x.oneshot_max = oneshot_max;
    x.twoshot = copy_push ? TwoShot::Push : TwoShot::Pull;
    std::vector<std::byte> scratch(64);
    x.scratch = scratch.data();
    std::size_t barriers[2] = {0, 0};
    for (int me = 0; me < 2; ++me) {
      x.me = me;
      std::string why;
      auto s = schedule(x, why);
      ASSERT_TRUE(s) << why;
      barriers[me] = static_cast<std::size_t>(
          std::count_if(s->begin(), s->end(), [](const Step& st) { return st.kind == Kind::Barrier; }));
    }
    EXPECT_EQ(barriers[0], barriers[1]);
  }
}

TEST(GpuSchedule, MissingBuffersShowAsNullAndUnsupportedOpsSayWhy) {
  ScheduleArgs x;
  x.op = OpType::AllGather;
  x.dtype = DType::Int32;
  x.count = 4;
  std::vector<std::byte> out(32);
  x.in = {nullptr, nullptr};  // the peer's input never mapped
  x.out = {out.data(), nullptr};
  std::string why;
  auto s = schedule(x, why);
  ASSERT_TRUE(s);
  EXPECT_TRUE(std::any_of(s->begin(), s->end(), [](const Step& st) { return st.kind == Kind::Copy && !st.src; }));
  x.op = OpType::Barrier;
  EXPECT_FALSE(schedule(x, why));
  EXPECT_NE(why.find("not supported"), std::string::npos) << why;
}

}  // namespace
}  // namespace smddp::client::gpu
