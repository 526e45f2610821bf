// smddp-bench: nccl-tests-style sweep of one collective through the smddp daemon, for ranks
// started by smddprun (each rank attaches from its environment and uses the world).
//
//   smddprun --nproc-per-node 2 -- smddp-bench -o allreduce -b 8 -e 64M -f 4 -c 1
#include <array>
#include <memory>
#include <string>

#include "client/bench/bench_runner.hpp"
#include "client/bench/check_values.hpp"
#include "client/client.hpp"

namespace smddp::bench {
namespace {

using client::Communicator;

// One function per collective: issue it on `comm` and wait for it (throws client::Error).
void run_allreduce(Communicator& comm, const Call& c) {
  comm.allreduce(c.in, c.out, c.count, c.dtype, c.redop, {.scale = kPremulScale})->wait();
}
void run_allgather(Communicator& comm, const Call& c) { comm.allgather(c.in, c.out, c.count, c.dtype)->wait(); }
void run_reducescatter(Communicator& comm, const Call& c) {
  comm.reduce_scatter(c.in, c.out, c.count, c.dtype, c.redop, {.scale = kPremulScale})->wait();
}
void run_broadcast(Communicator& comm, const Call& c) { comm.broadcast(c.out, c.count, c.dtype, c.root)->wait(); }
void run_alltoall(Communicator& comm, const Call& c) { comm.alltoall(c.in, c.out, c.count, c.dtype)->wait(); }
void run_reduce(Communicator& comm, const Call& c) {
  comm.reduce(c.in, c.out, c.count, c.dtype, c.redop, c.root, {.scale = kPremulScale})->wait();
}
void run_gather(Communicator& comm, const Call& c) { comm.gather(c.in, c.out, c.count, c.dtype, c.root)->wait(); }
void run_scatter(Communicator& comm, const Call& c) { comm.scatter(c.in, c.out, c.count, c.dtype, c.root)->wait(); }
// Ring shift: send to the next rank, receive from the previous one, both in flight at once.
void run_sendrecv(Communicator& comm, const Call& c) {
  const int n = comm.size();
  auto recv = comm.recv(c.out, c.count, c.dtype, (comm.rank() + n - 1) % n, 0);
  auto send = comm.send(c.in, c.count, c.dtype, (comm.rank() + 1) % n, 0);
  send->wait();
  recv->wait();
}

using RunFn = void (*)(Communicator&, const Call&);
// Indexed by Collective.
constexpr std::array<RunFn, kCollectiveCount> kRunners = {
    run_allreduce, run_allgather, run_reducescatter, run_broadcast, run_alltoall,
    run_reduce,    run_gather,    run_scatter,       run_sendrecv};

class SmddpBackend final : public Backend {
 public:
  SmddpBackend() : client_(client::Client::attach(client::AttachOptions::from_env())), world_(client_->world()) {}

  int rank() const override { return world_->rank(); }
  int size() const override { return world_->size(); }

  std::string describe() const override {
    return "smddp-bench: " + std::to_string(client_->world_size()) + " ranks, " +
           std::to_string(client_->local_world_size()) + " per node, " + std::to_string(client_->num_nodes()) +
           " node(s), job " + client_->job_id() + ", daemon pid " + std::to_string(client_->daemon_pid()) +
           "\nhost buffers";
  }

  std::string unsupported(Collective, const Options&) const override { return ""; }  // the daemon decides

  void run(Collective c, const Call& call) override { kRunners[static_cast<std::size_t>(c)](*world_, call); }

  void barrier() override { world_->barrier()->wait(); }

  std::uint64_t sum_over_ranks(std::uint64_t v) override {
    auto in = static_cast<std::int64_t>(v);
    std::int64_t out = 0;
    world_->allreduce(&in, &out, 1, ipc::DType::Int64, ipc::ReduceOp::Sum)->wait();
    return static_cast<std::uint64_t>(out);
  }

 private:
  client::ClientPtr client_;
  client::CommunicatorPtr world_;
};

}  // namespace
}  // namespace smddp::bench

int main(int argc, char** argv) {
  return smddp::bench::bench_main("smddp-bench", argc, argv,
                                  [] { return std::make_unique<smddp::bench::SmddpBackend>(); });
}
