// Command line shared by smddp-bench and the MPI baseline (nccl-tests flags).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "client/bench/collectives.hpp"
#include "ipc/types.hpp"

namespace smddp::bench {

struct Options {
  Collective op = Collective::AllReduce;
  std::uint64_t min_bytes = 32ull << 20;  // nccl-tests defaults: one size, 32 MiB
  std::uint64_t max_bytes = 32ull << 20;
  double step_factor = 1.0;               // > 1: sizes grow by this factor
  std::uint64_t step_bytes = 1ull << 20;  // otherwise: sizes grow by this many bytes
  ipc::DType dtype = ipc::DType::Float32;
  ipc::ReduceOp redop = ipc::ReduceOp::Sum;
  int root = 0;
  bool check = true;
  int iters = 20;
  int warmup = 5;
  bool help = false;
};

// A bad command line; the message names the flag and what is wrong with it.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "64", "8K", "64M", "1G" (powers of 1024, as nccl-tests).
std::uint64_t parse_size(std::string_view text);

// Parses argv. `program` names the tool in messages. Throws UsageError.
Options parse_options(int argc, char** argv);

std::string usage(std::string_view program);

// The byte sizes of the sweep, min to max, before rounding to whole elements.
std::vector<std::uint64_t> sweep_sizes(const Options& o);

}  // namespace smddp::bench
