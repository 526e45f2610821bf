// Cross-memory attach (process_vm_readv): one process copies another's memory straight into
// its own, one copy where shared memory takes two (into the segment, out of it). The host fast
// path's single-copy form reads the members' inputs this way (client/host_fast_path.cpp), as
// Open MPI's shared-memory transport does with its single copy on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace smddp::ipc {

// Why this node's ranks cannot read each other this way (nullopt: they can): the kernel or a
// seccomp profile refuses process_vm_readv, or Yama's ptrace_scope is 2 or 3. Scope 1 is fine
// once each rank calls allow_peer_reads. Run by the daemon, which runs as its ranks do.
std::optional<std::string> peer_reads_unavailable();

// Lets the processes of this user read this one's memory where Yama's ptrace_scope is 1
// (descendants only otherwise; the ranks are siblings): PR_SET_PTRACER_ANY, as Open MPI's
// shared-memory transport does. Nothing where Yama is absent or its scope is 0.
void allow_peer_reads();

// Copies `bytes` from `address` in process `pid` into `out`. Throws std::runtime_error naming the
// process and the kernel's reason when it cannot (the process ended, the range is not mapped,
// reads are refused).
void read_peer(int pid, std::uint64_t address, std::byte* out, std::size_t bytes);

}  // namespace smddp::ipc
