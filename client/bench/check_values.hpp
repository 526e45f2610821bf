// Correctness check data: inputs are small integers that depend on (rank, index) and are
// exact in every dtype (bfloat16 included), so the expected result of any collective is
// computable here without running one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "client/bench/collectives.hpp"
#include "ipc/types.hpp"

namespace smddp::bench {

// PREMUL_SUM factor the benchmark passes (a power of two, so the result stays exact).
inline constexpr double kPremulScale = 0.5;

// Element access in any dtype, through double (every value used here is exact in double).
double load_value(ipc::DType t, const void* base, std::uint64_t index) noexcept;
void store_value(ipc::DType t, void* base, std::uint64_t index, double v) noexcept;

// What rank `rank` holds at input index `index`. Reductions get values whose sum or product
// over many ranks stays exact (|v| <= 3, or {1, 2, -1} for PRODUCT); pure data movement gets a
// wider range so misplaced blocks are caught.
double input_value(Collective c, ipc::DType t, ipc::ReduceOp op, int rank, std::uint64_t index) noexcept;

// Fills `in` (in_elems elements) with input_value(..., rank, i).
void fill_input(Collective c, ipc::DType t, ipc::ReduceOp op, int rank, void* in, std::uint64_t in_elems) noexcept;

// Byte pattern written over outputs before a checked run; no expected value can equal it.
void poison(void* out, std::uint64_t bytes) noexcept;

struct CheckResult {
  std::uint64_t wrong = 0;
  std::string first_wrong;  // "element 5: expected 3, got -2" for the first few, "" if none
};

// Compares `out` on rank `rank` with what the collective must produce.
CheckResult check_output(Collective c, ipc::DType t, ipc::ReduceOp op, const Layout& layout, int rank,
                         int nranks, int root, const void* out);

}  // namespace smddp::bench
