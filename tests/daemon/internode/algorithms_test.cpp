// The algorithms across nodes (direct, ring, recursive halving/doubling, and the tuner's choice):
// P engines in one process, each a "node" with its own segment, worker pool and transport
// endpoint (the in-process loopback; tcp;ofi_rxm on loopback for some cases where libfabric is
// built). Operations are cut into chunks as the client cuts them and every chunk is in flight at
// once; results are checked against a reference computed here, and every node and rank must
// agree bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/host/host_reduce.hpp"
#include "daemon/internode/engine.hpp"
#include "daemon/internode/op.hpp"
#include "tests/daemon/internode/loopback_transport.hpp"

namespace smddp::daemon::internode {
namespace {

using ipc::DType;
using ipc::OpType;
using ipc::ReduceOp;

constexpr std::uint64_t kArena = 20ull << 20;      // per rank: the largest case's chunks, all in flight
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// Sanitizer builds take the same paths (two chunks, the last of 3 elements; every algorithm
// named, since Auto runs Direct up to 8 nodes) with a quarter of the bytes: TSan made the
// full-size cases most of the sanitizer run.
constexpr std::uint64_t kChunkBytes = 256ull << 10;
constexpr std::uint64_t kLarge = (1ull << 16) + 3;  // 256 KiB of float32, and 3 elements
#else
constexpr std::uint64_t kChunkBytes = 1ull << 20;  // the default daemon.chunk_kib
constexpr std::uint64_t kLarge = (1ull << 18) + 3; // 1 MiB of float32, and 3 elements
#endif

std::string unique_job() {
  static std::atomic<int> n{0};
  return "t-algo-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

enum class Net { Loopback, Fabric };

// P nodes of R ranks each, and one communicator over every rank. `group`: group rank -> global
// rank (default: the identity), so a group's ranks may interleave the nodes.
class Cluster {
 public:
  struct Node {
    explicit Node(ipc::Segment s) : seg(std::move(s)) {}
    ipc::Segment seg;
    WorkerPool pool{2};
    Communicator comm;
    std::unique_ptr<Engine> engine;
  };

  // `settings`: fabric.algorithm, one for every node or one per node.
  Cluster(int nodes, int ranks, std::vector<Algorithm> settings, Net net, std::vector<int> group = {},
          Engine::Options options = {}, bool distinct_hosts = false)
      : nodes_(nodes), ranks_(ranks), loopback_(net == Net::Loopback ? std::make_shared<transport::LoopbackFabric>() : nullptr) {
    if (group.empty())
      for (int g = 0; g < nodes * ranks; ++g) group.push_back(g);
    const auto job = unique_job();
    std::vector<std::unique_ptr<transport::Transport>> transports;
    std::vector<NodeCard> cards;
    Topology t;
    t.num_nodes = nodes;
    t.nproc_per_node = ranks;
    for (int i = 0; i < nodes; ++i) {
      ipc::SegmentSpec s;
      s.job_id = job;
      s.node_id = i;
      s.num_nodes = nodes;
      s.local_world_size = ranks;
      s.world_size = nodes * ranks;
      s.first_rank = i * ranks;
      s.arena_bytes = kArena;
      node_.push_back(std::make_unique<Node>(ipc::Segment::create(s)));
      auto& comm = node_.back()->comm;
      comm.id = 0;
      for (int g : group) {
        comm.global_ranks.push_back(g);
        comm.slots.push_back(g / ranks == i ? g % ranks : -1);
      }
      transports.push_back(open(net));
      NodeCard card{transports.back()->local_addresses(), {}};
      for (int r = 0; r < ranks; ++r) card.rail_of_slot.push_back(r % transports.back()->endpoints());
      cards.push_back(std::move(card));
      t.nodes.push_back({::getpid(), distinct_hosts ? "host-" + std::to_string(i) : "test-host"});
    }
    for (int i = 0; i < nodes; ++i) {
      t.node_id = i;
      options.algorithm = settings.at(settings.size() == 1 ? 0 : static_cast<std::size_t>(i));
      node_[static_cast<std::size_t>(i)]->engine =
          std::make_unique<Engine>(t, std::move(transports[static_cast<std::size_t>(i)]), cards,
                                   node_[static_cast<std::size_t>(i)]->seg, node_[static_cast<std::size_t>(i)]->pool, options);
    }
  }

  int nodes() const { return nodes_; }
  int ranks() const { return ranks_; }
  int group_size() const { return nodes_ * ranks_; }
  Node& node(int i) { return *node_[static_cast<std::size_t>(i)]; }
  const Communicator& comm() const { return node_.front()->comm; }
  // Group rank g's node and slot.
  int node_of(int g) const { return comm().global_ranks[static_cast<std::size_t>(g)] / ranks_; }
  int slot_of(int g) const { return comm().global_ranks[static_cast<std::size_t>(g)] % ranks_; }
  std::byte* arena(int g) { return node(node_of(g)).seg.arena(slot_of(g)).data(); }
  transport::LoopbackFabric& loopback() { return *loopback_; }

  // Drives every engine `rounds` times (operations that end meanwhile are dropped).
  void step(int rounds) {
    for (int k = 0; k < rounds; ++k)
      for (int i = 0; i < nodes_; ++i) node(i).engine->progress(Clock::now());
  }

  // Drives every engine not in `stopped` until each has finished `want` operations or `limit`
  // passed; as the daemon does, a peer's failure fails everything in flight.
  std::vector<std::vector<Finished>> drive(std::size_t want, std::chrono::seconds limit = std::chrono::seconds(60),
                                           const std::vector<int>& stopped = {}) {
    std::vector<std::vector<Finished>> done(static_cast<std::size_t>(nodes_));
    const auto until = Clock::now() + limit;
    const auto running = [&](int i) { return std::find(stopped.begin(), stopped.end(), i) == stopped.end(); };
    for (;;) {
      bool all = true;
      for (int i = 0; i < nodes_; ++i) all = all && (!running(i) || done[static_cast<std::size_t>(i)].size() >= want);
      if (all || Clock::now() > until) return done;
      for (int i = 0; i < nodes_; ++i) {
        if (!running(i)) continue;
        auto& e = *node(i).engine;
        for (auto& f : e.progress(Clock::now())) done[static_cast<std::size_t>(i)].push_back(std::move(f));
        if (auto f = e.take_peer_failure())
          for (auto& x : e.fail_all(ipc::Status::PeerFailed, f->error)) done[static_cast<std::size_t>(i)].push_back(std::move(x));
      }
    }
  }

 private:
  std::unique_ptr<transport::Transport> open(Net net) {
    if (net == Net::Loopback) return std::make_unique<transport::LoopbackTransport>(loopback_);
#ifdef SMDDP_HAVE_FABRIC
    transport::TransportConfig c;
    c.provider = "tcp;ofi_rxm";
    c.interface = "lo";
    return transport::make_fabric_transport(c);
#else
    throw std::logic_error("no libfabric in this build");
#endif
  }

  int nodes_, ranks_;
  std::shared_ptr<transport::LoopbackFabric> loopback_;
  std::vector<std::unique_ptr<Node>> node_;
};

// ---- values and reference

// Small whole numbers: every order of addition gives the same sum, in every dtype tested.
double whole_value(int g, std::uint64_t i) {
  return static_cast<double>(static_cast<std::int64_t>((static_cast<std::uint64_t>(g) + 1) * (i % 13) + static_cast<std::uint64_t>(g)) % 9 - 4);
}

void store(std::byte* p, std::uint64_t i, DType t, double v) {
  switch (t) {
    case DType::Float32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::BFloat16: reinterpret_cast<std::uint16_t*>(p)[i] = host_kernels::float_to_bf16(static_cast<float>(v)); break;
    case DType::Int64: reinterpret_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(v); break;
    default: throw std::logic_error("dtype not used here");
  }
}

double load(const std::byte* p, std::uint64_t i, DType t) {
  switch (t) {
    case DType::Float32: return reinterpret_cast<const float*>(p)[i];
    case DType::BFloat16: return host_kernels::bf16_to_float(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case DType::Int64: return static_cast<double>(reinterpret_cast<const std::int64_t*>(p)[i]);
    default: throw std::logic_error("dtype not used here");
  }
}

// The reduction of whole values as the daemon computes it: AVG is the sum times 1/n in float32
// (then rounded to the dtype), PREMUL_SUM the sum of the scaled inputs (exact here).
double reference(ReduceOp op, DType t, int n, double scale, const std::function<double(int)>& value) {
  double r = value(0);
  for (int g = 1; g < n; ++g) r = op == ReduceOp::Max ? std::max(r, value(g)) : r + value(g);
  if (op == ReduceOp::PremulSum) r *= scale;
  if (op == ReduceOp::Avg) r = static_cast<double>(static_cast<float>(r) * static_cast<float>(1.0 / n));
  if (t == DType::BFloat16) r = host_kernels::bf16_to_float(host_kernels::float_to_bf16(static_cast<float>(r)));
  return r;
}

struct Call {
  OpType op;
  DType dtype;
  ReduceOp reduce;
  std::uint64_t count;  // AllReduce, Reduce: of the tensor; ReduceScatter, AllGather: of one rank's block
  int root = 0;
  double scale = 0.5;  // PREMUL_SUM
  std::uint64_t chunk_bytes = kChunkBytes;  // daemon.chunk_kib
};

std::string describe(const Call& c) {
  return std::string(ipc::to_string(c.op)) + " " + std::string(ipc::to_string(c.dtype)) + " " +
         std::string(ipc::to_string(c.reduce)) + " of " + std::to_string(c.count);
}

// Elements of one chunk, as the client's plan() cuts them (client/communicator.cpp).
std::uint64_t chunk_elements(const Call& c, int n) {
  const std::uint64_t mult = c.op == OpType::Reduce ? 2
                             : (c.op == OpType::AllGather || c.op == OpType::ReduceScatter) ? static_cast<std::uint64_t>(n) + 1
                                                                                          : 1;
  std::uint64_t chunk = std::max<std::uint64_t>(1, std::min(c.chunk_bytes, kArena / 4) / (mult * ipc::dtype_size(c.dtype)));
  return chunk > 64 ? chunk / 64 * 64 : chunk;
}

// Where one chunk of one rank sits in its arena.
struct ChunkPlace {
  std::uint64_t offset, count;  // elements of the call's count (within each block)
  std::uint64_t in, out;        // arena offsets
};

class Collective {
 public:
  // Runs `call` (sequence number `seq`) on every rank; inputs from `value(g, i)` (i over the
  // whole input of rank g: block r of ReduceScatter starts at r * count).
  Collective(Cluster& cluster, const Call& call, std::uint64_t seq, const std::function<double(int, std::uint64_t)>& value)
      : cluster_(cluster), call_(call) {
    const int n = cluster.group_size();
    const std::uint64_t e = ipc::dtype_size(call.dtype), chunk = chunk_elements(call, n);
    const bool blocks_in = call.op == OpType::ReduceScatter, blocks_out = call.op == OpType::AllGather;
    std::uint64_t at = 0;
    for (std::uint64_t off = 0; off == 0 || off < call.count; off += chunk) {
      const std::uint64_t len = std::min(chunk, call.count - off);
      ChunkPlace p{off, len, at, 0};
      at += ((blocks_in ? static_cast<std::uint64_t>(n) : 1) * len * e + 63) / 64 * 64;
      p.out = at;
      at += ((blocks_out ? static_cast<std::uint64_t>(n) : 1) * len * e + 63) / 64 * 64;
      places_.push_back(p);
    }
    if (at > kArena) throw std::logic_error(describe(call) + " needs more arena than the test gives");
    for (int g = 0; g < n; ++g)
      for (const auto& p : places_) {
        std::byte* in = cluster.arena(g) + p.in;
        for (int r = 0; r < (blocks_in ? n : 1); ++r)
          for (std::uint64_t k = 0; k < p.count; ++k)
            store(in, static_cast<std::uint64_t>(r) * p.count + k, call.dtype,
                  value(g, static_cast<std::uint64_t>(r) * call.count + p.offset + k));
        std::memset(cluster.arena(g) + p.out, 0xa5, (blocks_out ? static_cast<std::uint64_t>(n) : 1) * p.count * e);
      }
    for (int i = 0; i < cluster.nodes(); ++i)
      for (const auto& p : places_) {
        Match m{&cluster.node(i).comm, {}, ipc::Status::Ok, {}};
        for (int g = 0; g < n; ++g) {
          if (cluster.node_of(g) != i) continue;
          Posted x;
          x.slot = cluster.slot_of(g);
          x.group_rank = g;
          auto& d = x.desc;
          d.op = call.op;
          d.dtype = call.dtype;
          d.reduce_op = call.reduce;
          d.count = call.count;
          d.chunk_offset = p.offset;
          d.chunk_count = p.count;
          d.seq = seq;
          d.root = call.root;
          d.scale = call.scale;
          d.input = {ipc::BufferKind::Arena, {}, p.in, (blocks_in ? static_cast<std::uint64_t>(n) : 1) * p.count * e};
          d.output = {ipc::BufferKind::Arena, {}, p.out, (blocks_out ? static_cast<std::uint64_t>(n) : 1) * p.count * e};
          m.posted.push_back(x);
        }
        cluster.node(i).engine->start(std::move(m), Clock::now());
      }
  }
  std::size_t chunks() const { return places_.size(); }
  const std::vector<ChunkPlace>& places() const { return places_; }

  // Every chunk ended well on every node.
  void expect_ok(const std::vector<std::vector<Finished>>& done) const {
    for (int i = 0; i < cluster_.nodes(); ++i) {
      ASSERT_EQ(done[static_cast<std::size_t>(i)].size(), chunks()) << describe(call_) << ": node " << i << " timed out";
      for (const auto& f : done[static_cast<std::size_t>(i)])
        ASSERT_EQ(f.match.status, ipc::Status::Ok) << describe(call_) << ": node " << i << ": " << f.match.error;
    }
  }
  // Output element k (of the whole output of rank g: AllGather's block h at h * count) of each
  // rank that has an output, through `check(g, k, got)`.
  void for_each_output(const std::function<void(int, std::uint64_t, double)>& check) const {
    const int n = cluster_.group_size();
    const std::uint64_t e = ipc::dtype_size(call_.dtype);
    const bool blocks_out = call_.op == OpType::AllGather;
    for (int g = 0; g < n; ++g) {
      if (call_.op == OpType::Reduce && g != call_.root) continue;
      for (const auto& p : places_) {
        const std::byte* out = cluster_.arena(g) + p.out;
        for (int h = 0; h < (blocks_out ? n : 1); ++h)
          for (std::uint64_t k = 0; k < p.count; ++k)
            check(g, static_cast<std::uint64_t>(h) * call_.count + p.offset + k,
                  load(out, static_cast<std::uint64_t>(h) * p.count + k, call_.dtype));
      }
      (void)e;
    }
  }
  // Every rank's output holds the same bytes (AllReduce, AllGather).
  void expect_every_rank_agrees() const {
    const int n = cluster_.group_size();
    const std::uint64_t e = ipc::dtype_size(call_.dtype);
    const std::uint64_t blocks = call_.op == OpType::AllGather ? static_cast<std::uint64_t>(n) : 1;
    for (int g = 1; g < n; ++g)
      for (const auto& p : places_)
        ASSERT_EQ(std::memcmp(cluster_.arena(g) + p.out, cluster_.arena(0) + p.out, blocks * p.count * e), 0)
            << describe(call_) << ": rank " << g << " (node " << cluster_.node_of(g) << ") differs from rank 0 in the chunk at "
            << p.offset;
  }

 private:
  Cluster& cluster_;
  Call call_;
  std::vector<ChunkPlace> places_;
};

// Runs `call` on whole values and checks every output against the reference.
void check_call(Cluster& cluster, const Call& call, std::uint64_t seq) {
  const int n = cluster.group_size();
  Collective run(cluster, call, seq, whole_value);
  run.expect_ok(cluster.drive(run.chunks()));
  if (::testing::Test::HasFatalFailure()) return;
  std::uint64_t wrong = 0;
  std::string first_wrong;
  run.for_each_output([&](int g, std::uint64_t k, double got) {
    double want = 0;
    switch (call.op) {
      case OpType::AllGather: want = whole_value(static_cast<int>(k / call.count), k % call.count); break;
      case OpType::ReduceScatter:
        want = reference(call.reduce, call.dtype, n, call.scale,
                         [&](int h) { return whole_value(h, static_cast<std::uint64_t>(g) * call.count + k); });
        break;
      default: want = reference(call.reduce, call.dtype, n, call.scale, [&](int h) { return whole_value(h, k); });
    }
    if (got != want && wrong++ == 0)
      first_wrong = "rank " + std::to_string(g) + " element " + std::to_string(k) + ": " + std::to_string(got) +
                    ", want " + std::to_string(want);
  });
  EXPECT_EQ(wrong, 0u) << describe(call) << ": " << wrong << " wrong, first " << first_wrong;
  if (call.op == OpType::AllReduce || call.op == OpType::AllGather) run.expect_every_rank_agrees();
}

// ---- every algorithm, node count and ranks per node

struct Shape {
  int nodes, ranks;
  Algorithm algorithm;
  Net net = Net::Loopback;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.nodes << " nodes x " << s.ranks << " ranks, " << to_string(s.algorithm) << (s.net == Net::Fabric ? ", tcp" : "");
}

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  return std::to_string(info.param.nodes) + "x" + std::to_string(info.param.ranks) + "_" +
         std::string(to_string(info.param.algorithm)) + (info.param.net == Net::Fabric ? "_tcp" : "");
}

class AlgorithmsTest : public ::testing::TestWithParam<Shape> {
 protected:
  AlgorithmsTest() : cluster(GetParam().nodes, GetParam().ranks, {GetParam().algorithm}, GetParam().net) {}
  // Small sizes: every combination; 1 MiB + 3 elements (two or more chunks, the last of 3):
  // the `large` ones.
  void check_sizes(OpType op, const std::vector<std::pair<DType, ReduceOp>>& small,
                   const std::vector<std::pair<DType, ReduceOp>>& large, int root = 0) {
    std::uint64_t seq = 0;
    for (std::uint64_t count : {0, 1, 7})
      for (const auto& [t, r] : small) {
        check_call(cluster, {op, t, r, count, root}, ++seq);
        if (HasFatalFailure()) return;
      }
    for (const auto& [t, r] : large) {
      check_call(cluster, {op, t, r, kLarge, root}, ++seq);
      if (HasFatalFailure()) return;
    }
  }
  Cluster cluster;
};

TEST_P(AlgorithmsTest, AllReduceGivesEveryRankTheReference) {
  check_sizes(OpType::AllReduce,
              {{DType::Float32, ReduceOp::Sum}, {DType::Float32, ReduceOp::Avg}, {DType::Float32, ReduceOp::Max},
               {DType::Float32, ReduceOp::PremulSum}, {DType::BFloat16, ReduceOp::Sum}, {DType::BFloat16, ReduceOp::Avg},
               {DType::BFloat16, ReduceOp::Max}, {DType::BFloat16, ReduceOp::PremulSum}, {DType::Int64, ReduceOp::Sum},
               {DType::Int64, ReduceOp::Max}},
              {{DType::Float32, ReduceOp::Sum}, {DType::BFloat16, ReduceOp::Avg}, {DType::Float32, ReduceOp::PremulSum},
               {DType::Int64, ReduceOp::Max}});
}

TEST_P(AlgorithmsTest, ReduceScatterGivesEachRankItsReducedBlock) {
  check_sizes(OpType::ReduceScatter,
              {{DType::Float32, ReduceOp::Sum}, {DType::Float32, ReduceOp::PremulSum}, {DType::BFloat16, ReduceOp::Avg},
               {DType::Int64, ReduceOp::Max}},
              {{DType::Float32, ReduceOp::Sum}, {DType::BFloat16, ReduceOp::Avg}});
}

TEST_P(AlgorithmsTest, AllGatherGivesEveryRankEveryBlock) {
  check_sizes(OpType::AllGather, {{DType::Float32, ReduceOp::Sum}, {DType::BFloat16, ReduceOp::Sum}, {DType::Int64, ReduceOp::Sum}},
              {{DType::Float32, ReduceOp::Sum}});
}

TEST_P(AlgorithmsTest, ReduceGivesTheRootTheReference) {
  // The root on the last node, then in the middle (under halving, maybe a node that folded).
  for (int root : {cluster.group_size() - 1, cluster.group_size() / 2}) {
    check_sizes(OpType::Reduce,
                {{DType::Float32, ReduceOp::Sum}, {DType::BFloat16, ReduceOp::Avg}, {DType::Int64, ReduceOp::Max}},
                {{DType::Float32, ReduceOp::Sum}}, root);
    if (HasFatalFailure()) return;
  }
}

// Values whose sum depends on the order of addition: the nodes add in different orders under a
// ring or halving, yet every rank must get the same bits (each element is reduced at one node,
// then copied), close to the exact sum.
TEST_P(AlgorithmsTest, FloatSumsAgreeBitForBitOnEveryNode) {
  const auto value = [](int g, std::uint64_t i) {
    const std::uint64_t h = (i * 0x9e3779b97f4a7c15ull) ^ (static_cast<std::uint64_t>(g + 1) * 0xbf58476d1ce4e5b9ull);
    return static_cast<double>(h >> 11) / static_cast<double>(1ull << 53) * 2.0 - 1.0;
  };
  const int n = cluster.group_size();
  std::uint64_t seq = 0;
  for (DType t : {DType::Float32, DType::BFloat16})
    for (ReduceOp r : {ReduceOp::Sum, ReduceOp::Avg}) {
      const Call call{OpType::AllReduce, t, r, 100003};
      Collective run(cluster, call, ++seq, value);
      run.expect_ok(cluster.drive(run.chunks()));
      if (HasFatalFailure()) return;
      run.expect_every_rank_agrees();
      double worst = 0;
      run.for_each_output([&](int, std::uint64_t k, double got) {
        double exact = 0;
        for (int g = 0; g < n; ++g) {
          const double v = value(g, k);
          exact += t == DType::BFloat16 ? host_kernels::bf16_to_float(host_kernels::float_to_bf16(static_cast<float>(v))) : static_cast<double>(static_cast<float>(v));
        }
        if (r == ReduceOp::Avg) exact /= n;
        worst = std::max(worst, std::abs(got - exact));
      });
      // bfloat16 keeps 8 significant bits: half a unit in the last place of values below 16.
      EXPECT_LT(worst, t == DType::BFloat16 ? 0.07 : 1e-4) << describe(call);
    }
}

// Half types add their partial sums in float32 across the nodes and round once, at the owner,
// as host_reduce does: 256 on node 0 plus 1 from each other node. Rounded to bfloat16 at each
// addition (spacing 2 above 256), 256 + 1 would stay 256 each time.
TEST_P(AlgorithmsTest, HalfTypesAddInFloat32AndRoundOnce) {
  const int P = cluster.nodes(), R = cluster.ranks();
  const auto value = [&](int g, std::uint64_t) { return (cluster.node_of(g) == 0 ? 256.0 : 1.0) / R; };
  const double exact = 256.0 + (P - 1);
  const double want = host_kernels::bf16_to_float(host_kernels::float_to_bf16(static_cast<float>(exact)));
  const Call call{OpType::AllReduce, DType::BFloat16, ReduceOp::Sum, 4099};
  Collective run(cluster, call, 1, value);
  run.expect_ok(cluster.drive(run.chunks()));
  if (HasFatalFailure()) return;
  std::uint64_t wrong = 0;
  run.for_each_output([&](int, std::uint64_t, double got) { wrong += got != want; });
  EXPECT_EQ(wrong, 0u) << "want " << want << " (" << exact << " rounded once) everywhere";
}

std::vector<Shape> every_shape() {
  std::vector<Shape> out;
  for (int nodes : {2, 3, 4, 5, 7, 8})
    for (int ranks : {1, 2})
      for (Algorithm a : {Algorithm::Direct, Algorithm::Ring, Algorithm::Halving, Algorithm::Auto}) out.push_back({nodes, ranks, a});
  return out;
}
INSTANTIATE_TEST_SUITE_P(Loopback, AlgorithmsTest, ::testing::ValuesIn(every_shape()), shape_name);

#ifdef SMDDP_HAVE_FABRIC
// A real provider: tcp;ofi_rxm over the loopback interface, its rendezvous protocol for large
// messages, its own order of completions.
INSTANTIATE_TEST_SUITE_P(Tcp, AlgorithmsTest,
                         ::testing::Values(Shape{3, 2, Algorithm::Ring, Net::Fabric}, Shape{3, 2, Algorithm::Halving, Net::Fabric},
                                           Shape{8, 1, Algorithm::Ring, Net::Fabric}, Shape{8, 1, Algorithm::Halving, Net::Fabric},
                                           Shape{5, 1, Algorithm::Auto, Net::Fabric}),
                         shape_name);
#endif

// ---- the rest

// Beyond kDirectMaxNodes the tuner chooses per chunk: an operation's full chunks may go around
// the ring while its last, small one goes by halving (10 nodes: two of them fold).
TEST(Algorithms, AutoChoosesPerChunkAndTheChunksStillAgree) {
  constexpr int kNodes = kDirectMaxNodes + 2;
  Cluster cluster(kNodes, 1, {Algorithm::Auto}, Net::Loopback);
  // Chunks of kNodes segments of kRingMinSegmentBytes (the client cuts Reduce's chunks to half
  // its budget), then one of a few elements.
  const std::uint64_t chunk_bytes = kRingMinSegmentBytes * kNodes;
  for (const auto& [op, count] : {std::pair{OpType::AllReduce, 2 * chunk_bytes / 4 + 3}, std::pair{OpType::Reduce, chunk_bytes / 4 + 5}}) {
    Call call{op, DType::Float32, ReduceOp::Sum, count, kNodes / 2};
    call.chunk_bytes = op == OpType::Reduce ? 2 * chunk_bytes : chunk_bytes;
    std::set<Algorithm> chosen;
    for (std::uint64_t off = 0; off < count; off += chunk_elements(call, kNodes)) {
      ipc::RequestDesc d;
      d.op = op;
      d.dtype = call.dtype;
      d.chunk_count = std::min(chunk_elements(call, kNodes), count - off);
      chosen.insert(choose_algorithm(Algorithm::Auto, d, kNodes, kNodes, false));
    }
    ASSERT_EQ(chosen, (std::set<Algorithm>{Algorithm::Ring, Algorithm::Halving})) << "the test no longer mixes them";
    check_call(cluster, call, op == OpType::AllReduce ? 1 : 2);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// A group whose ranks interleave the nodes (group rank g on node g % P): a node's blocks are not
// consecutive in the output, and the algorithms order them by node, then place them.
TEST(Algorithms, GroupsWhoseRanksInterleaveTheNodesPlaceEveryBlock) {
  for (Algorithm a : {Algorithm::Ring, Algorithm::Halving, Algorithm::Direct}) {
    for (int nodes : {3, 5}) {
      std::vector<int> group;
      for (int s = 0; s < 2; ++s)
        for (int i = 0; i < nodes; ++i) group.push_back(i * 2 + s);
      Cluster cluster(nodes, 2, {a}, Net::Loopback, group);
      std::uint64_t seq = 0;
      for (std::uint64_t count : {1, 7, 5000}) {
        for (OpType op : {OpType::AllGather, OpType::ReduceScatter, OpType::AllReduce}) {
          SCOPED_TRACE(std::string(to_string(a)) + " on " + std::to_string(nodes) + " nodes");
          check_call(cluster, {op, DType::Float32, ReduceOp::Sum, count}, ++seq);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

// A node whose network fails in the middle of a ring or of the exchanges: every node's
// operation fails, naming that node, within seconds: its neighbours see their messages to it
// fail, the others hear no more heartbeats from it and fail what they run (as the daemon does).
TEST(Algorithms, ANodeThatFailsMidOperationFailsItOnEveryNode) {
  for (Algorithm a : {Algorithm::Ring, Algorithm::Halving}) {
    SCOPED_TRACE(to_string(a));
    Engine::Options o;
    o.heartbeat_every = std::chrono::milliseconds(50);
    o.heartbeat_timeout = std::chrono::milliseconds(3000);
    constexpr int kNodes = 5, kVictim = 2;
    Cluster cluster(kNodes, 1, {a}, Net::Loopback, {}, o, true);
    const Call call{OpType::AllReduce, DType::Float32, ReduceOp::Sum, 1 << 20};
    Collective run(cluster, call, 1, whole_value);
    cluster.step(3);  // the descriptors and a step or two of every chunk
    ASSERT_EQ(cluster.node(0).engine->in_flight(), run.chunks()) << "ended before the failure";
    cluster.loopback().break_transport(kVictim);
    const auto start = Clock::now();
    auto done = cluster.drive(run.chunks(), std::chrono::seconds(20), {kVictim});
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
    for (int i = 0; i < kNodes; ++i) {
      if (i == kVictim) continue;
      EXPECT_EQ(done[static_cast<std::size_t>(i)].size(), run.chunks()) << "node " << i << " still waits";
      for (const auto& f : done[static_cast<std::size_t>(i)]) {
        EXPECT_EQ(f.match.status, ipc::Status::PeerFailed) << f.match.error;
        const bool names_it = f.match.error.find("on node 2 stopped answering") != std::string::npos ||
                              f.match.error.find("transport 2 failed") != std::string::npos;
        EXPECT_TRUE(names_it) << "node " << i << ": " << f.match.error;
      }
    }
  }
}

// The choice travels with the descriptors: nodes whose settings make them choose differently
// fail the chunk naming both choices, instead of exchanging messages that do not fit.
TEST(Algorithms, NodesThatChooseDifferentAlgorithmsFailNamingBoth) {
  Cluster cluster(3, 1, {Algorithm::Ring, Algorithm::Halving, Algorithm::Ring}, Net::Loopback);
  const Call call{OpType::AllReduce, DType::Float32, ReduceOp::Sum, 5000};
  Collective run(cluster, call, 1, whole_value);
  auto done = cluster.drive(run.chunks(), std::chrono::seconds(20));
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(done[static_cast<std::size_t>(i)].size(), run.chunks()) << "node " << i;
    for (const auto& f : done[static_cast<std::size_t>(i)]) {
      EXPECT_EQ(f.match.status, ipc::Status::Mismatch) << f.match.error;
      EXPECT_TRUE(f.mismatch);
      EXPECT_NE(f.match.error.find("nodes chose different algorithms for allreduce(float32, count=5000"), std::string::npos)
          << f.match.error;
      EXPECT_NE(f.match.error.find("node 0 ring, node 1 halving"), std::string::npos) << f.match.error;
    }
  }
}

TEST(Tuner, ChoosesByNodesAndChunkBytes) {
  ipc::RequestDesc d;
  d.op = OpType::AllReduce;
  d.dtype = DType::Float32;
  d.chunk_count = 1 << 10;
  EXPECT_EQ(choose_algorithm(Algorithm::Auto, d, 8, 8, true), Algorithm::Eager);
  EXPECT_EQ(choose_algorithm(Algorithm::Ring, d, 8, 8, true), Algorithm::Ring) << "forced: small data too";
  EXPECT_EQ(choose_algorithm(Algorithm::Auto, d, 4, kDirectMaxNodes, false), Algorithm::Direct);
  EXPECT_EQ(choose_algorithm(Algorithm::Auto, d, 5, kDirectMaxNodes + 1, false), Algorithm::Halving);
  // The ring once each of its steps moves a segment of kRingMinSegmentBytes.
  constexpr int kNodes = kDirectMaxNodes + 2;
  d.chunk_count = kRingMinSegmentBytes / 4 * kNodes;
  EXPECT_EQ(choose_algorithm(Algorithm::Auto, d, kNodes, kNodes, false), Algorithm::Ring);
  EXPECT_EQ(choose_algorithm(Algorithm::Auto, d, kDirectMaxNodes, kDirectMaxNodes, false), Algorithm::Direct);
  d.chunk_count -= 1;
  EXPECT_EQ(choose_algorithm(Algorithm::Auto, d, kNodes, kNodes, false), Algorithm::Halving);
  // AllGather and ReduceScatter count every rank's block.
  d.op = OpType::AllGather;
  d.chunk_count = kRingMinSegmentBytes / 4 * kNodes / (2 * kNodes);
  EXPECT_EQ(choose_algorithm(Algorithm::Auto, d, 2 * kNodes, kNodes, false), Algorithm::Ring);
  EXPECT_EQ(choose_algorithm(Algorithm::Auto, d, kNodes, kNodes, false), Algorithm::Halving);
  // Broadcast has no ring: a forced ring leaves it as it was.
  d.op = OpType::Broadcast;
  EXPECT_EQ(choose_algorithm(Algorithm::Ring, d, 16, 8, false), Algorithm::Direct);
  EXPECT_EQ(choose_algorithm(Algorithm::Ring, d, 16, 8, true), Algorithm::Eager);
  EXPECT_EQ(parse_algorithm("halving"), Algorithm::Halving);
  EXPECT_EQ(parse_algorithm("eager"), std::nullopt);
}

}  // namespace
}  // namespace smddp::daemon::internode
