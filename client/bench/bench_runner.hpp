// The sweep, timing, checking and nccl-tests-style report shared by every benchmark program.
// A program supplies a Backend that can run one collective to completion; everything else
// (sizes, buffers, warmup, timing, verification, output) is here.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "client/bench/bench_options.hpp"
#include "client/bench/collectives.hpp"
#include "ipc/types.hpp"

namespace smddp::bench {

// One call's arguments, in the terms of client::Communicator (count as in ipc::OpType).
// In-place collectives (is_in_place) use only `out`.
struct Call {
  const void* in = nullptr;
  void* out = nullptr;
  std::uint64_t count = 0;
  ipc::DType dtype = ipc::DType::Float32;
  ipc::ReduceOp redop = ipc::ReduceOp::Sum;
  int root = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Comment lines (without '#') for the header that rank 0 prints: the library, the layout.
  virtual std::string describe() const = 0;
  // Whether this backend can run `c` with the options' dtype and reduce op; "" if it can,
  // otherwise why not.
  virtual std::string unsupported(Collective c, const Options& o) const = 0;
  // Runs one collective to completion. Throws std::exception (with a message) on failure.
  virtual void run(Collective c, const Call& call) = 0;
  virtual void barrier() = 0;
  virtual std::uint64_t sum_over_ranks(std::uint64_t v) = 0;
};

// Runs the sweep of `o` on `b`; rank 0 writes the report to `out`, failures go to `err`.
// Returns the exit status: 0, or 1 if a call failed or any element was wrong.
int run_benchmark(const Options& o, Backend& b, std::ostream& out, std::ostream& err);

// parse_options + usage handling + run_benchmark: the whole main() of a benchmark program
// once it has a Backend. `make_backend` is called after the command line is accepted.
template <class MakeBackend>
int bench_main(std::string_view program, int argc, char** argv, MakeBackend make_backend);

}  // namespace smddp::bench

#include "client/bench/bench_runner_inl.hpp"
