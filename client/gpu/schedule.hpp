// How a rank's part of a GPU collective decomposes into steps: reductions, copies, and
// barriers with every member. Pure C++ (no CUDA): PeerExecutor only moves the bytes each step
// names, and tests/client/gpu runs the same schedules on host memory, for any group size, and
// checks their results and that no two ranks touch the same bytes between two barriers.
//
// Gathers push (`copy_push`): an AllGather or AllToAll rank writes its block into every other
// member's output. On 2xH200 a copy engine writing over NVLink moves 7-9% more than one reading
// (scripts/diag/rank_side_probe.cu --forms: 384 against 351 GB/s per GPU at 1 GiB). Without
// it every rank reads the others' buffers and writes only its own. Two-shot AllReduce has
// three forms (`TwoShot`): rank i's copy engines push its reduced chunk into the others'
// outputs (no barrier between the phases), the others pull it, or rank i's kernel writes it
// into every output.
// Every member of an operation gets the same number of barriers, which depends only on the
// operation, its byte size, the group size and `oneshot_max`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ipc/types.hpp"

namespace smddp::client::gpu {

struct Step {
  enum class Kind {
    Barrier,     // with every other member
    Reduce,      // outs[j][i] = reduce over inputs[k][i], i < count (elements)
    Copy,        // bytes from src to dst, on the rank's stream (copy engine)
    CopyBeside,  // the same on a side stream, beside the next copies; Join waits for it
    Join,        // the main stream waits for everything the side stream was given
    // Split barriers (pipelines): Signal tells every other member that the main stream's
    // work so far is done; WaitSide makes the side stream wait for every other member's next
    // signal. A Barrier is a signal and a wait on the main stream; a member's k-th wait, of
    // either kind, pairs with the others' k-th signal.
    Signal,
    WaitSide,
    Fork,      // the side stream waits for the main stream's work so far
    SideCopy,  // a copy on the side stream (after a Fork or a WaitSide)
  };
  Kind kind = Kind::Barrier;
  std::vector<const std::byte*> inputs;
  std::vector<std::byte*> outs;
  std::uint64_t count = 0;
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  std::uint64_t bytes = 0;
};

// Who moves rank i's reduced chunk to the others in a two-shot AllReduce: its copy engines
// writing (Push), the others' copy engines reading (Pull), or its reduction kernel (Kernel).
enum class TwoShot { Push, Pull, Kernel };

// Uneven AllToAll, for this rank r and member q (elements): r's block for q and where it goes
// in q's output; q's block for r and where it starts in q's input (ipc::PlanSplit).
struct Split {
  std::uint64_t send = 0, send_dst = 0, recv = 0, recv_src = 0;
};

struct ScheduleArgs {
  ipc::OpType op = ipc::OpType::AllReduce;
  ipc::DType dtype = ipc::DType::Float32;
  std::uint64_t count = 0;  // as in client::DeviceCall (per rank / per peer where it says so)
  int root = 0;             // group rank of the root (Send/Recv: members are {sender, receiver})
  int me = 0;
  // By member: buffers as this rank sees them (its own, and the others' mapped here); null
  // where a member has none. The schedule names null where a buffer is missing, and the
  // executor refuses to move bytes then.
  std::vector<std::byte*> in, out;
  std::uint64_t oneshot_max = 0;  // AllReduce up to this many bytes runs one-shot
  TwoShot twoshot = TwoShot::Pull;  // pieces (below) pull whatever it says
  bool copy_push = false;            // AllGather and AllToAll: copy engines write into the others
  std::vector<Split> splits;  // by member: an uneven AllToAll (count unused); empty: even

  // Two-shot pull AllReduce in pieces of about this many bytes per rank's chunk (at most 8):
  // the copies of piece j run on the side stream beside the reduction of piece j+1. 0: one piece.
  std::uint64_t pipeline_bytes = 0;
  std::byte* scratch = nullptr;   // needs_scratch() bytes, when it says so
};

// Bytes of scratch this rank needs (an in-place one-shot AllReduce reduces into scratch and
// copies back after the closing barrier: the others still read its input until then); 0: none.
std::uint64_t needs_scratch(const ScheduleArgs& a);

// The steps, or nullopt and `why` for an operation with no rank-side schedule.
std::optional<std::vector<Step>> schedule(const ScheduleArgs& a, std::string& why);

}  // namespace smddp::client::gpu
