// mpi-bench: the same sweep, flags and report as smddp-bench, through MPI collectives on
// MPI_COMM_WORLD: the baseline smddp is compared with (scripts/bench_cpu.sh).
//
//   mpirun -np 2 mpi-bench -o allreduce -b 8 -e 64M -f 4 -c 1
#include <mpi.h>

#include <array>
#include <climits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "client/bench/bench_runner.hpp"

namespace smddp::bench {
namespace {

using ipc::DType;
using ipc::ReduceOp;

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string(what) + ": " + std::string(text, static_cast<std::size_t>(len)));
}

// Half types have no MPI arithmetic; they move as 16-bit words.
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Float16:
    case DType::BFloat16: return MPI_UINT16_T;
    case DType::Int8: return MPI_INT8_T;
    case DType::UInt8: return MPI_UINT8_T;
    case DType::Int32: return MPI_INT32_T;
    case DType::Int64: return MPI_INT64_T;
    case DType::Bool: return MPI_C_BOOL;
  }
  return MPI_DATATYPE_NULL;
}

// MPI allows only logical ops on C bools: SUM/MAX are OR and PRODUCT/MIN are AND there.
std::optional<MPI_Op> mpi_op(ReduceOp op, DType t) {
  if (t == DType::Float16 || t == DType::BFloat16) return std::nullopt;
  if (t == DType::Bool) {
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Max: case ReduceOp::BOr: return MPI_LOR;
      case ReduceOp::Product: case ReduceOp::Min: case ReduceOp::BAnd: return MPI_LAND;
      case ReduceOp::BXor: return MPI_LXOR;
      default: return std::nullopt;
    }
  }
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Product: return MPI_PROD;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::BAnd: return MPI_BAND;
    case ReduceOp::BOr: return MPI_BOR;
    case ReduceOp::BXor: return MPI_BXOR;
    case ReduceOp::Avg:
    case ReduceOp::PremulSum: return std::nullopt;
  }
  return std::nullopt;
}

int mpi_count(std::uint64_t count) {
  if (count > static_cast<std::uint64_t>(INT_MAX)) throw std::runtime_error("count exceeds MPI's int range");
  return static_cast<int>(count);
}

// One function per collective.
void run_allreduce(MPI_Comm comm, const Call& c) {
  check(MPI_Allreduce(c.in, c.out, mpi_count(c.count), mpi_type(c.dtype), *mpi_op(c.redop, c.dtype), comm),
        "MPI_Allreduce");
}
void run_allgather(MPI_Comm comm, const Call& c) {
  const auto t = mpi_type(c.dtype);
  check(MPI_Allgather(c.in, mpi_count(c.count), t, c.out, mpi_count(c.count), t, comm), "MPI_Allgather");
}
void run_reducescatter(MPI_Comm comm, const Call& c) {
  check(MPI_Reduce_scatter_block(c.in, c.out, mpi_count(c.count), mpi_type(c.dtype), *mpi_op(c.redop, c.dtype), comm),
        "MPI_Reduce_scatter_block");
}
void run_broadcast(MPI_Comm comm, const Call& c) {
  check(MPI_Bcast(c.out, mpi_count(c.count), mpi_type(c.dtype), c.root, comm), "MPI_Bcast");
}
void run_alltoall(MPI_Comm comm, const Call& c) {
  const auto t = mpi_type(c.dtype);
  check(MPI_Alltoall(c.in, mpi_count(c.count), t, c.out, mpi_count(c.count), t, comm), "MPI_Alltoall");
}
void run_reduce(MPI_Comm comm, const Call& c) {
  check(MPI_Reduce(c.in, c.out, mpi_count(c.count), mpi_type(c.dtype), *mpi_op(c.redop, c.dtype), c.root, comm),
        "MPI_Reduce");
}
void run_gather(MPI_Comm comm, const Call& c) {
  const auto t = mpi_type(c.dtype);
  check(MPI_Gather(c.in, mpi_count(c.count), t, c.out, mpi_count(c.count), t, c.root, comm), "MPI_Gather");
}
void run_scatter(MPI_Comm comm, const Call& c) {
  const auto t = mpi_type(c.dtype);
  check(MPI_Scatter(c.in, mpi_count(c.count), t, c.out, mpi_count(c.count), t, c.root, comm), "MPI_Scatter");
}
void run_sendrecv(MPI_Comm comm, const Call& c) {
  int rank = 0, n = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &n);
  const auto t = mpi_type(c.dtype);
  check(MPI_Sendrecv(c.in, mpi_count(c.count), t, (rank + 1) % n, 0, c.out, mpi_count(c.count), t, (rank + n - 1) % n,
                     0, comm, MPI_STATUS_IGNORE),
        "MPI_Sendrecv");
}

using RunFn = void (*)(MPI_Comm, const Call&);
// Indexed by Collective.
constexpr std::array<RunFn, kCollectiveCount> kRunners = {
    run_allreduce, run_allgather, run_reducescatter, run_broadcast, run_alltoall,
    run_reduce,    run_gather,    run_scatter,       run_sendrecv};

class MpiBackend final : public Backend {
 public:
  MpiBackend(int* argc, char*** argv) {
    check(MPI_Init(argc, argv), "MPI_Init");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // failures become exceptions
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiBackend() override { MPI_Finalize(); }
  MpiBackend(const MpiBackend&) = delete;
  MpiBackend& operator=(const MpiBackend&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::string describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<std::size_t>(len));
    v = v.substr(0, v.find_first_of(",\n"));
    return "mpi-bench: " + std::to_string(size_) + " ranks, " + v + "\nhost buffers";
  }

  std::string unsupported(Collective c, const Options& o) const override {
    if (is_reduction(c) && !mpi_op(o.redop, o.dtype))
      return "MPI has no " + std::string(ipc::to_string(o.redop)) + " reduction for " +
             std::string(ipc::to_string(o.dtype));
    return "";
  }

  void run(Collective c, const Call& call) override { kRunners[static_cast<std::size_t>(c)](MPI_COMM_WORLD, call); }

  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  std::uint64_t sum_over_ranks(std::uint64_t v) override {
    std::uint64_t sum = 0;
    check(MPI_Allreduce(&v, &sum, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    return sum;
  }

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace
}  // namespace smddp::bench

int main(int argc, char** argv) {
  return smddp::bench::bench_main("mpi-bench", argc, argv,
                                  [&] { return std::make_unique<smddp::bench::MpiBackend>(&argc, &argv); });
}
