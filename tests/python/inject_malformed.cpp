// Test-only library for the fault matrix (workers/soak_worker.py --malformed-rank): a rank, through
// ctypes, pushes into its own request ring a descriptor the daemon must refuse, as a buggy plugin
// would: its last world collective's descriptor, copied, made an all-reduce with the next sequence
// number and a count no arena can hold. The rank must have nothing else being posted at that moment (the ring
// has one producer). The daemon refuses it, fails the world operation of that sequence on every
// member, and the rank's own next world collective (the same sequence) fails with it.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>

#include "ipc/protocol.hpp"
#include "ipc/segment.hpp"

namespace {

using Ring = smddp::ipc::SpscRing<smddp::ipc::RequestDesc, smddp::ipc::kRequestRingCapacity>;

// The ring's slots as raw storage (ipc/ring.hpp: head, tail, then the slots, each counter on a
// cache line of its own): the descriptors already consumed are still there to copy.
const smddp::ipc::RequestDesc* ring_slots(const Ring& ring) {
  return reinterpret_cast<const smddp::ipc::RequestDesc*>(reinterpret_cast<const std::byte*>(&ring) + 128);
}

}  // namespace

// Returns 0 and writes the refused descriptor's sequence into *seq_out, or -1 with a reason in err.
extern "C" int smddp_test_post_malformed(const char* job, int node, int local_rank, std::uint64_t* seq_out, char* err,
                                         int err_bytes) {
  try {
    using namespace smddp::ipc;
    const auto seg = Segment::attach(job, node);
    RankSlot& slot = seg.slot(local_rank);
    const RequestDesc* slots = ring_slots(slot.requests);
    const RequestDesc* last = nullptr;
    for (std::size_t i = 0; i < kRequestRingCapacity; ++i) {
      const auto& d = slots[i];
      const bool collective = d.op != OpType::Send && d.op != OpType::Recv && d.op != OpType::CommCreate;
      if (d.comm_id == 0 && d.request_id != 0 && collective && (!last || d.seq > last->seq)) last = &d;
    }
    if (!last) {
      std::snprintf(err, static_cast<std::size_t>(err_bytes), "no world collective in rank %d's request ring", local_rank);
      return -1;
    }
    RequestDesc d = *last;
    d.op = OpType::AllReduce;
    d.aux = {};
    d.request_id = (1ull << 62) | d.seq;  // an id the client never gave: its answer is dropped
    d.seq += 1;
    d.count = d.chunk_count = 1ull << 60;  // far past any arena
    d.chunk_offset = 0;
    if (!slot.requests.try_push(d)) {
      std::snprintf(err, static_cast<std::size_t>(err_bytes), "rank %d's request ring is full", local_rank);
      return -1;
    }
    seg.header().daemon_bell.ring();
    *seq_out = d.seq;
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(err, static_cast<std::size_t>(err_bytes), "%s", e.what());
    return -1;
  }
}
