// A rank program for integration tests: runs every collective through libsmddp_client on
// host buffers and checks each result against a value computed here independently (in
// float64 or exact integers). Prints one line per failure; exits 1 if anything was wrong.
//
//   collective_check [--sizes 0,1,7,262147] [--big-bytes 67108864] [--dtypes all|float32,...]
#include <malloc.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "client/client.hpp"
#include "kernels/host/host_reduce.hpp"

using namespace smddp::client;
using smddp::ipc::dtype_size;

namespace {

int g_failures = 0;
int g_cases = 0;

// The bool inputs of tests/python/workers/common.py's pattern(): element i is true on the
// ranks whose bit is set in a mask of i (elements 0-2 spell the rank's low three bits; then all
// ranks, none, or a hashed mix), so AND, OR and XOR vary per element and differ from every
// rank's input, and no two ranks' inputs are the same. The index is folded to 16 bits
// (i ^ i >> 16, so blocks starting at multiples of 65536 still differ) and the masks kept in
// one table built at compile time: a hash per element and rank would cost the 64 MiB cases
// a minute.
constexpr std::uint64_t kMasks = 65536;

constexpr std::uint64_t element_hash(std::uint64_t i) {
  std::uint64_t x = (i * 2654435761u) % 4294967296u;
  x ^= x >> 13;
  x = (x * 1540483477u) % 4294967296u;
  return x ^ (x >> 13);
}

// Built at compile time (the table is part of the program, nothing to set up at run time).
constexpr std::array<std::uint8_t, kMasks> kBoolMasks = [] {
  constexpr std::uint8_t kRankBits[] = {0xAA, 0xCC, 0xF0};
  std::array<std::uint8_t, kMasks> m{};
  for (std::uint64_t i = 0; i < kMasks; ++i) {
    const std::uint64_t e = element_hash(i);
    m[i] = static_cast<std::uint8_t>(i < 3 ? kRankBits[i] : e % 3 == 0 ? 0xFF : e % 3 == 1 ? 0 : (e >> 8) & 0xFF);
  }
  return m;
}();

[[gnu::always_inline]] inline bool bool_value(int rank, std::uint64_t i) {
  return (kBoolMasks[(i ^ (i >> 16)) & 0xFFFF] >> (static_cast<unsigned>(rank) % 8)) & 1;
}

// Values small enough that sums and products of a few ranks are exact in every type.
// Inlined: it runs for every element of every rank in the 64 MiB cases.
[[gnu::always_inline]] inline double value(int rank, std::uint64_t i, DType t) {
  if (t == DType::Bool) return bool_value(rank, i) ? 1.0 : 0.0;
  if (t == DType::UInt8) return static_cast<double>((static_cast<std::uint64_t>(rank) * 3 + i) % 5);
  return static_cast<double>(static_cast<std::int64_t>((static_cast<std::uint64_t>(rank + 1) * (i % 13) +
                                                        static_cast<std::uint64_t>(rank)) % 9) - 4);
}

void store(void* p, std::uint64_t i, DType t, double v) {
  switch (t) {
    case DType::Float32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::Float64: static_cast<double*>(p)[i] = v; break;
    case DType::Float16: static_cast<std::uint16_t*>(p)[i] = smddp::host_kernels::float_to_half(static_cast<float>(v)); break;
    case DType::BFloat16: static_cast<std::uint16_t*>(p)[i] = smddp::host_kernels::float_to_bf16(static_cast<float>(v)); break;
    case DType::Int8: static_cast<std::int8_t*>(p)[i] = static_cast<std::int8_t>(static_cast<std::int64_t>(v)); break;
    case DType::UInt8: static_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(static_cast<std::int64_t>(v)); break;
    case DType::Int32: static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(static_cast<std::int64_t>(v)); break;
    case DType::Int64: static_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(v); break;
    case DType::Bool: static_cast<std::uint8_t*>(p)[i] = v != 0; break;
  }
}

double load(const void* p, std::uint64_t i, DType t) {
  switch (t) {
    case DType::Float32: return static_cast<const float*>(p)[i];
    case DType::Float64: return static_cast<const double*>(p)[i];
    case DType::Float16: return smddp::host_kernels::half_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::BFloat16: return smddp::host_kernels::bf16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::Int8: return static_cast<const std::int8_t*>(p)[i];
    case DType::UInt8: return static_cast<const std::uint8_t*>(p)[i];
    case DType::Int32: return static_cast<const std::int32_t*>(p)[i];
    case DType::Int64: return static_cast<double>(static_cast<const std::int64_t*>(p)[i]);
    case DType::Bool: return static_cast<const std::uint8_t*>(p)[i];
  }
  return 0;
}

// Wraps an exact integer result to the type, as two's complement arithmetic does.
double wrap(double v, DType t) {
  const auto x = static_cast<std::int64_t>(v);
  switch (t) {
    case DType::Int8: return static_cast<std::int8_t>(x);
    case DType::UInt8: return static_cast<std::uint8_t>(x);
    case DType::Int32: return static_cast<std::int32_t>(x);
    case DType::Bool: return x != 0;
    default: return v;
  }
}

double reduce_ref(ReduceOp op, DType t, int n, std::uint64_t i, double scale) {
  const bool integer = !smddp::ipc::is_floating(t);
  double acc = value(0, i, t);
  std::int64_t bits = static_cast<std::int64_t>(acc);
  for (int r = 1; r < n; ++r) {
    const double v = value(r, i, t);
    const auto b = static_cast<std::int64_t>(v);
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Avg: case ReduceOp::PremulSum: acc += v; break;
      case ReduceOp::Product: acc = integer ? wrap(acc * v, t) : acc * v; break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
      case ReduceOp::BAnd: bits &= b; break;
      case ReduceOp::BOr: bits |= b; break;
      case ReduceOp::BXor: bits ^= b; break;
    }
  }
  if (op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor) acc = static_cast<double>(bits);
  if (op == ReduceOp::Avg) acc /= n;
  if (op == ReduceOp::PremulSum) acc *= scale;
  if (t == DType::Bool && (op == ReduceOp::Sum || op == ReduceOp::Max)) acc = acc != 0;
  if (t == DType::Bool && (op == ReduceOp::Product || op == ReduceOp::Min)) acc = acc != 0;
  return integer ? wrap(acc, t) : acc;
}

bool close(double got, double want, DType t) {
  if (!smddp::ipc::is_floating(t)) return got == want;
  const double tol = (t == DType::Float16 || t == DType::BFloat16) ? 1e-2 : (t == DType::Float32 ? 1e-6 : 1e-12);
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

struct Case {
  std::string name;
  std::uint64_t wrong = 0;
  std::string first;
};

void check(Case& c, const void* buf, std::uint64_t i, DType t, double want) {
  const double got = load(buf, i, t);
  if (!close(got, want, t)) {
    if (c.wrong++ == 0) c.first = "index " + std::to_string(i) + ": got " + std::to_string(got) + ", want " + std::to_string(want);
  }
}

void report(int rank, Case& c) {
  ++g_cases;
  if (c.wrong) {
    ++g_failures;
    std::printf("rank %d FAIL %s: %llu wrong (first at %s)\n", rank, c.name.c_str(),
                static_cast<unsigned long long>(c.wrong), c.first.c_str());
  }
}

void run_case(int rank, const std::string& name, const std::function<void(Case&)>& body) {
  Case c{name};
  try {
    body(c);
  } catch (const Error& e) {
    c.wrong = 1;
    c.first = std::string("error: ") + e.what();
  }
  report(rank, c);
}

std::vector<std::byte> buffer(std::uint64_t count, DType t) { return std::vector<std::byte>(std::max<std::uint64_t>(1, count * dtype_size(t))); }

void fill(std::vector<std::byte>& b, int rank, std::uint64_t count, DType t, std::uint64_t index_base = 0) {
  for (std::uint64_t i = 0; i < count; ++i) store(b.data(), i, t, value(rank, index_base + i, t));
}

void run_all(Communicator& comm, DType t, std::uint64_t n, bool full) {
  const int me = comm.rank(), size = comm.size();
  const auto un = static_cast<std::uint64_t>(size);
  const std::string tag = std::string(smddp::ipc::to_string(t)) + " count=" + std::to_string(n);

  for (int opi = 0; opi < smddp::ipc::kReduceOpCount; ++opi) {
    const auto op = static_cast<ReduceOp>(opi);
    if (!smddp::ipc::reduce_op_supported(op, t)) continue;
    if (!full && op != ReduceOp::Sum) continue;
    run_case(me, "allreduce " + std::string(smddp::ipc::to_string(op)) + " " + tag, [&](Case& c) {
      auto in = buffer(n, t), out = buffer(n, t);
      fill(in, me, n, t);
      CallOptions o;
      o.scale = 0.5;
      comm.allreduce(in.data(), out.data(), n, t, op, o)->wait();
      for (std::uint64_t i = 0; i < n; ++i) check(c, out.data(), i, t, reduce_ref(op, t, size, i, 0.5));
      // In place too.
      comm.allreduce(in.data(), in.data(), n, t, op, o)->wait();
      for (std::uint64_t i = 0; i < n; ++i) check(c, in.data(), i, t, reduce_ref(op, t, size, i, 0.5));
    });
  }
  const int root = 1 % size;
  run_case(me, "broadcast " + tag, [&](Case& c) {
    auto b = buffer(n, t);
    fill(b, me, n, t);
    comm.broadcast(b.data(), n, t, root)->wait();
    for (std::uint64_t i = 0; i < n; ++i) check(c, b.data(), i, t, value(root, i, t));
  });
  run_case(me, "reduce " + tag, [&](Case& c) {
    auto in = buffer(n, t), out = buffer(n, t);
    fill(in, me, n, t);
    const int r = size - 1;
    comm.reduce(in.data(), out.data(), n, t, ReduceOp::Max, r)->wait();
    if (me == r)
      for (std::uint64_t i = 0; i < n; ++i) check(c, out.data(), i, t, reduce_ref(ReduceOp::Max, t, size, i, 1));
  });
  run_case(me, "allgather " + tag, [&](Case& c) {
    auto in = buffer(n, t), out = buffer(n * un, t);
    fill(in, me, n, t);
    comm.allgather(in.data(), out.data(), n, t)->wait();
    for (int q = 0; q < size; ++q)
      for (std::uint64_t i = 0; i < n; ++i) check(c, out.data(), static_cast<std::uint64_t>(q) * n + i, t, value(q, i, t));
  });
  run_case(me, "reducescatter " + tag, [&](Case& c) {
    auto in = buffer(n * un, t), out = buffer(n, t);
    fill(in, me, n * un, t);
    comm.reduce_scatter(in.data(), out.data(), n, t, ReduceOp::Sum)->wait();
    for (std::uint64_t i = 0; i < n; ++i)
      check(c, out.data(), i, t, reduce_ref(ReduceOp::Sum, t, size, static_cast<std::uint64_t>(me) * n + i, 1));
  });
  run_case(me, "alltoall " + tag, [&](Case& c) {
    auto in = buffer(n * un, t), out = buffer(n * un, t);
    fill(in, me, n * un, t);
    comm.alltoall(in.data(), out.data(), n, t)->wait();
    for (int q = 0; q < size; ++q)
      for (std::uint64_t i = 0; i < n; ++i)
        check(c, out.data(), static_cast<std::uint64_t>(q) * n + i, t, value(q, static_cast<std::uint64_t>(me) * n + i, t));
  });
  if (n <= (1u << 20)) {
    run_case(me, "alltoallv " + tag, [&](Case& c) {
      // Rank q sends (n + q + p) % 5 * (n / 8 + 1) elements to p.
      auto amount = [&](int q, int p) { return static_cast<std::uint64_t>((n + static_cast<std::uint64_t>(q + p)) % 5) * (n / 8 + 1); };
      std::vector<std::uint64_t> send(un), recv(un);
      std::uint64_t ts = 0, tr = 0;
      for (int p = 0; p < size; ++p) {
        send[static_cast<std::size_t>(p)] = amount(me, p);
        recv[static_cast<std::size_t>(p)] = amount(p, me);
        ts += send[static_cast<std::size_t>(p)];
        tr += recv[static_cast<std::size_t>(p)];
      }
      auto in = buffer(ts, t), out = buffer(tr, t);
      fill(in, me, ts, t);
      comm.alltoallv(in.data(), send, out.data(), recv, t)->wait();
      std::uint64_t at = 0;
      for (int q = 0; q < size; ++q) {
        std::uint64_t src_off = 0;
        for (int k = 0; k < me; ++k) src_off += amount(q, k);
        for (std::uint64_t i = 0; i < amount(q, me); ++i) check(c, out.data(), at + i, t, value(q, src_off + i, t));
        at += amount(q, me);
      }
    });
  }
  run_case(me, "gather " + tag, [&](Case& c) {
    auto in = buffer(n, t), out = buffer(n * un, t);
    fill(in, me, n, t);
    comm.gather(in.data(), me == root ? out.data() : nullptr, n, t, root)->wait();
    if (me == root)
      for (int q = 0; q < size; ++q)
        for (std::uint64_t i = 0; i < n; ++i) check(c, out.data(), static_cast<std::uint64_t>(q) * n + i, t, value(q, i, t));
  });
  run_case(me, "scatter " + tag, [&](Case& c) {
    auto in = buffer(n * un, t), out = buffer(n, t);
    fill(in, me, n * un, t);
    comm.scatter(me == root ? in.data() : nullptr, out.data(), n, t, root)->wait();
    for (std::uint64_t i = 0; i < n; ++i) check(c, out.data(), i, t, value(root, static_cast<std::uint64_t>(me) * n + i, t));
  });
  if (size > 1) {
    run_case(me, "sendrecv ring " + tag, [&](Case& c) {
      auto out = buffer(n, t), in = buffer(n, t);
      fill(out, me, n, t);
      const int next = (me + 1) % size, prev = (me + size - 1) % size;
      auto s = comm.send(out.data(), n, t, next, 7);
      auto r = comm.recv(in.data(), n, t, prev, 7);
      s->wait();
      r->wait();
      for (std::uint64_t i = 0; i < n; ++i) check(c, in.data(), i, t, value(prev, i, t));
    });
  }
  run_case(me, "barrier", [&](Case&) { comm.barrier()->wait(); });
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t a = 0;
  while (a <= s.size()) {
    auto b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::uint64_t> sizes = {0, 1, 7, (1u << 20) / 4 + 3};
  std::uint64_t big_bytes = 0;
  std::vector<DType> dtypes;
  bool subgroup = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--sizes") {
      sizes.clear();
      for (auto& s : split(next())) sizes.push_back(std::stoull(s));
    } else if (a == "--big-bytes") {
      big_bytes = std::stoull(next());
    } else if (a == "--dtypes") {
      for (auto& s : split(next())) {
        auto d = smddp::ipc::parse_dtype(s);
        if (!d) { std::fprintf(stderr, "unknown dtype %s\n", s.c_str()); return 2; }
        dtypes.push_back(*d);
      }
    } else if (a == "--subgroup") {
      subgroup = true;
    } else {
      std::fprintf(stderr, "usage: collective_check [--sizes a,b] [--big-bytes N] [--dtypes x,y] [--subgroup]\n");
      return 2;
    }
  }
  if (dtypes.empty())
    for (int d = 0; d < smddp::ipc::kDTypeCount; ++d) dtypes.push_back(static_cast<DType>(d));
  // Buffers come from the heap and stay there once freed: a 64 MiB case allocates up to 768 MiB
  // a rank, which glibc would map and unmap case after case. On a virtual machine whose page
  // faults are slow, faulting those pages in took most of the long run's time (perf of a rank:
  // memset on fresh pages and the kernel's fault path, over three quarters of its samples).
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  try {
    auto client = Client::attach(AttachOptions::from_env());
    auto world = client->world();
    for (DType t : dtypes) {
      for (auto n : sizes) run_all(*world, t, n, true);
      // The big size: every collective, at 64 MiB per rank buffer.
      if (big_bytes) run_all(*world, t, big_bytes / dtype_size(t), false);
    }
    if (subgroup && client->world_size() >= 3) {
      // Ranks {0, 2}: a communicator with a hole in it.
      if (client->rank() == 0 || client->rank() == 2) {
        auto g = client->create_communicator(77, {0, 2});
        for (DType t : {DType::Float32, DType::Int64}) run_all(*g, t, 1000, true);
      }
      world->barrier()->wait();
    }
    std::printf("rank %d: %d cases, %d failed\n", client->rank(), g_cases, g_failures);
  } catch (const Error& e) {
    std::printf("rank error: %s\n", e.what());
    return 3;
  }
  return g_failures ? 1 : 0;
}
