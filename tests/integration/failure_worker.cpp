// Rank program for the failure tests (tests/integration/test_failures.py).
//   --mode mismatch   every rank calls allreduce with count 8 + rank; expects one error naming
//                     each call, then checks the communicator still works
//   --mode mismatch-paths  rank 0 calls allreduce with count 8 (the ranks' host fast path), the
//                     others with count 100000 (through the daemon); otherwise as mismatch
//   --mode idle       every rank attaches, then sleeps --seconds (default 10) between two barriers
//                     (scripts/measure_idle.sh measures the daemon's CPU meanwhile)
//   --mode refused    rank --victim posts an allreduce the daemon refuses (a CUDA request without
//                     its buffers) while the others post a good one, then a send to rank
//                     victim + 1 that is refused likewise; every rank reports how long its failed
//                     operation took ("RESULT" and "P2P" lines), then all run one more allreduce
//   --mode stuck      rank --victim writes its pid to DIR/victim.pid and sleeps (to be killed);
//                     the others wait in an allreduce and report how their wait ended
//   --mode share-stop every rank calls a 1 MiB allreduce (its ranks each reduce a share of it)
//                     with a --seconds timeout: rank --victim first, then it writes its pid to
//                     DIR/victim.pid and stops itself (SIGSTOP); the others once DIR/go exists
//                     (the test makes it once the victim stopped), and report how their wait ended
//   --mode busy       every rank writes DIR/ready.<rank>, then works outside smddp for --seconds
//                     (the test kills the daemon meanwhile), then calls an allreduce and writes
//                     how it ended to DIR/result.<rank> (the launcher may be gone by then)
// Each rank prints "RESULT <rank> <unix time of the error> <message>" when an operation
// fails, and exits 1 after a failure (as an uncaught exception would), 0 otherwise.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "client/client.hpp"

using namespace smddp::client;

namespace {
double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
// Waits for `work` and prints how it ended; the exit status a rank then has.
int report(int me, Work& work) {
  try {
    work.wait();
    std::printf("RESULT %d %.3f no error\n", me, unix_now());
    return 0;
  } catch (const Error& e) {
    std::printf("RESULT %d %.3f %s\n", me, unix_now(), e.what());
    std::fflush(stdout);
    return 1;
  }
}
}  // namespace

int main(int argc, char** argv) {
  std::string mode, dir = "/tmp";
  int victim = -1, seconds = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mode") mode = argv[i + 1];
    else if (a == "--dir") dir = argv[i + 1];
    else if (a == "--victim") victim = std::stoi(argv[i + 1]);
    else if (a == "--seconds") seconds = std::stoi(argv[i + 1]);
  }
  auto client = Client::attach(AttachOptions::from_env());
  auto world = client->world();
  const int me = client->rank();
  std::vector<float> buf(64, 1.0f);
  world->barrier()->wait();

  if (mode == "mismatch" || mode == "mismatch-paths") {
    const std::uint64_t count =
        mode == "mismatch" ? 8 + static_cast<std::uint64_t>(me) : me == 0 ? 8 : 100000;
    buf.resize(count);
    try {
      world->allreduce(buf.data(), buf.data(), count, DType::Float32, ReduceOp::Sum)->wait();
      std::printf("RESULT %d %.3f no error\n", me, unix_now());
      return 0;
    } catch (const Error& e) {
      std::printf("RESULT %d %.3f %s\n", me, unix_now(), e.what());
    }
    // The group stays usable after a mismatch.
    std::vector<float> ok(4, 1.0f);
    world->allreduce(ok.data(), ok.data(), 4, DType::Float32, ReduceOp::Sum)->wait();
    std::printf("AFTER %d %g\n", me, ok[0]);
    std::fflush(stdout);
    return 0;
  }
  if (mode == "refused") {
    // The daemon refuses a rank-side CUDA request that names no buffers ("input buffer missing").
    DeviceCall bad;
    bad.count = 8;
    bad.rank_exec = true;
    const auto timed = [&](const char* label, auto&& op) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        op();
        std::printf("%s %d %.3f no error\n", label, me, unix_now());
      } catch (const Error& e) {
        const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("%s %d %.3f after %.2f s: %s\n", label, me, unix_now(), took, e.what());
      }
      std::fflush(stdout);
    };
    timed("RESULT", [&] {
      if (me == victim) world->device_op(bad)->wait();
      else world->allreduce(buf.data(), buf.data(), 8, DType::Float32, ReduceOp::Sum)->wait();
    });
    if (me == victim) {
      bad.op = OpType::Send;
      bad.root = victim + 1;
      timed("P2P", [&] { world->device_op(bad)->wait(); });
    } else if (me == victim + 1) {
      timed("P2P", [&] { world->recv(buf.data(), 8, DType::Float32, victim, 0)->wait(); });
    }
    std::vector<float> ok(4, 1.0f);
    world->allreduce(ok.data(), ok.data(), 4, DType::Float32, ReduceOp::Sum)->wait();
    std::printf("AFTER %d %g\n", me, ok[0]);
    std::fflush(stdout);
    return 0;
  }
  if (mode == "idle") {
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    world->barrier()->wait();
    return 0;
  }
  if (mode == "stuck") {
    std::ofstream(dir + "/ready." + std::to_string(me)) << getpid() << "\n";
    if (me == victim) {
      std::ofstream(dir + "/victim.pid") << getpid() << "\n";
      std::this_thread::sleep_for(std::chrono::seconds(120));
      return 0;
    }
    return report(me, *world->allreduce(buf.data(), buf.data(), buf.size(), DType::Float32, ReduceOp::Sum));
  }
  if (mode == "busy") {
    std::ofstream(dir + "/ready." + std::to_string(me)) << getpid() << "\n";
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    std::string how = "no error";
    int rc = 0;
    try {
      world->allreduce(buf.data(), buf.data(), buf.size(), DType::Float32, ReduceOp::Sum)->wait();
    } catch (const Error& e) {
      how = e.what();
      rc = 1;
    }
    std::ofstream(dir + "/result." + std::to_string(me) + ".tmp") << how << "\n";
    std::rename((dir + "/result." + std::to_string(me) + ".tmp").c_str(), (dir + "/result." + std::to_string(me)).c_str());
    return rc;
  }
  if (mode == "share-stop") {
    std::vector<float> big(1 << 18, 1.0f);
    world->set_default_timeout(std::chrono::seconds(seconds));
    if (me == victim) {
      // Posted first: the match, and every member's share, come only once it has stopped.
      auto work = world->allreduce(big.data(), big.data(), big.size(), DType::Float32, ReduceOp::Sum);
      std::ofstream(dir + "/victim.pid") << getpid() << "\n";
      ::raise(SIGSTOP);
      return 0;
    }
    while (!std::ifstream(dir + "/go")) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto work = world->allreduce(big.data(), big.data(), big.size(), DType::Float32, ReduceOp::Sum);
    std::ofstream(dir + "/ready." + std::to_string(me)) << getpid() << "\n";
    return report(me, *work);
  }
  std::fprintf(stderr, "unknown --mode %s\n", mode.c_str());
  return 2;
}
