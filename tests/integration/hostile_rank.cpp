// Rank program for tests/integration/test_hostile_rank.py. Every rank attaches through the client
// library; rank --hostile then writes into its own part of the shared segment the way a buggy or
// hostile process could, bypassing the library:
//   --mode past-end   its request ring's tail set past the end (more than the ring holds)
//   --mode backwards  its request ring's tail set behind its head
//   --mode garbage    100 descriptors of random bytes pushed into its request ring, and random
//                     bytes over its arena
//   --mode no-drain   refused requests pushed without end, their completions never read
// The other ranks run all-reduces and check every result. Each rank prints
// "RESULT <rank> <unix time> <message>" when an operation fails and exits 1, or "OK <rank>
// <allreduces>" when all of them succeeded; the hostile rank prints "ATTACK <unix time>" first.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "ipc/segment.hpp"

using namespace smddp;
using namespace smddp::client;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The ring's counters as raw words (ipc/ring.hpp: head on the first cache line, tail on the
// second): a hostile process does not go through SpscRing.
std::atomic<std::uint64_t>& ring_word(ipc::SpscRing<ipc::RequestDesc, ipc::kRequestRingCapacity>& ring, int which) {
  return *reinterpret_cast<std::atomic<std::uint64_t>*>(reinterpret_cast<std::byte*>(&ring) + 64 * which);
}

void attack(const std::string& mode, const Client& c) {
  const auto seg = ipc::Segment::attach(c.job_id(), c.node_id());
  ipc::RankSlot& slot = seg.slot(c.local_rank());
  auto& head = ring_word(slot.requests, 0);
  auto& tail = ring_word(slot.requests, 1);
  // The barrier took the ranks' host fast path: the daemon takes its request in later, when it
  // next wakes. Ring it and wait until it has, so that the ring is at rest before the attack.
  for (int i = 0; i < 5000 && head.load() != tail.load(); ++i) {
    seg.header().daemon_bell.ring();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (head.load() != tail.load() || tail.load() == 0) {
    std::fprintf(stderr, "hostile_rank: the ring's layout is not the one this program knows\n");
    std::_Exit(3);
  }
  std::mt19937_64 rng(20261202);
  std::printf("ATTACK %.3f\n", unix_now());
  std::fflush(stdout);
  if (mode == "past-end") {
    tail.store(head.load() + ipc::kRequestRingCapacity + 7);
  } else if (mode == "backwards") {
    tail.store(head.load() - 1);
  } else if (mode == "garbage") {
    std::vector<std::uint8_t> arena_bytes(4096);
    for (auto& b : arena_bytes) b = static_cast<std::uint8_t>(rng());
    const auto arena = seg.arena(c.local_rank());
    std::memcpy(arena.data(), arena_bytes.data(), std::min(arena.size(), arena_bytes.size()));
    for (int i = 0; i < 100; ++i) {
      ipc::RequestDesc d;
      auto* raw = reinterpret_cast<std::uint8_t*>(&d);
      for (std::size_t k = 0; k < sizeof d; ++k) raw[k] = static_cast<std::uint8_t>(rng());
      while (!slot.requests.try_push(d)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } else if (mode == "no-drain") {
    ipc::RequestDesc d;
    d.op = static_cast<ipc::OpType>(250);  // refused at once: an unknown operation
    for (int i = 0; i < 4000; ++i) {
      d.request_id = 1ull << 60 | static_cast<std::uint64_t>(i);
      while (!slot.requests.try_push(d)) {
        seg.header().daemon_bell.ring();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (seg.header().job_failed.load()) return;
      }
      seg.header().daemon_bell.ring();
    }
    return;
  }
  seg.header().daemon_bell.ring();
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode;
  int hostile = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mode") mode = argv[i + 1];
    else if (a == "--hostile") hostile = std::stoi(argv[i + 1]);
  }
  auto client = Client::attach(AttachOptions::from_env());
  auto world = client->world();
  const int me = client->rank(), n = client->world_size();
  int done = 0;
  try {
    // The others may read the job's failure already here (a rank slow to finish the barrier).
    world->barrier()->wait();
    if (me == hostile) attack(mode, *client);
    for (; done < 50; ++done) {
      std::vector<float> v(1000 + static_cast<std::size_t>(done), static_cast<float>(me + 1 + done));
      world->allreduce(v.data(), v.data(), v.size(), DType::Float32, ReduceOp::Sum)->wait();
      const float want = static_cast<float>(n * (n + 1) / 2 + n * done);
      for (float x : v)
        if (x != want) {
          std::printf("WRONG %d allreduce %d gave %g, want %g\n", me, done, x, want);
          return 2;
        }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const Error& e) {
    std::printf("RESULT %d %.3f %s\n", me, unix_now(), e.what());
    std::fflush(stdout);
    return 1;
  }
  std::printf("OK %d %d\n", me, done);
  std::fflush(stdout);
  return 0;
}
