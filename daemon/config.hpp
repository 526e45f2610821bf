// Daemon configuration: an ini file (configs/default.ini) overridden by --set SECTION.KEY=VALUE.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "daemon/internode/tuner.hpp"
#include "daemon/transport/fault_plan.hpp"
#include "ipc/orphan_grace.hpp"

namespace smddp::daemon {

// daemon.split_reduce_min_kib: "auto" (the default), a size, or "off". Auto: 64 KiB when the
// node's ranks and its daemon have a core each, 256 KiB when they share cores; a member waiting
// for the others' shares then holds a core they need (measured: docs/performance.md).
struct SplitReduceMin {
  static constexpr std::uint64_t kWithCores = 64ull << 10;
  static constexpr std::uint64_t kSharedCores = 256ull << 10;
  bool automatic = true;
  std::optional<std::uint64_t> bytes;  // when not automatic; nullopt: off
  static SplitReduceMin fixed(std::optional<std::uint64_t> b) { return {false, b}; }
  std::optional<std::uint64_t> resolve(bool shared_cores) const {
    if (!automatic) return bytes;
    return shared_cores ? kSharedCores : kWithCores;
  }
  bool operator==(const SplitReduceMin&) const = default;
};

// A size setting that is "auto" or the operator's: auto resolves to IfTrue or IfFalse by a fact
// of the node the daemon knows at start (cores to spare, cores shared).
template <class Self, std::uint64_t IfTrue, std::uint64_t IfFalse>
struct AutoBytes {
  bool automatic = true;
  std::uint64_t bytes = 0;  // when not automatic
  static Self fixed(std::uint64_t b) {
    Self s;
    s.automatic = false;
    s.bytes = b;
    return s;
  }
  std::uint64_t resolve(bool fact) const {
    if (!automatic) return bytes;
    return fact ? IfTrue : IfFalse;
  }
  bool operator==(const AutoBytes&) const = default;
};

// daemon.host_fast_read_kib: "auto" (the default) or a size. Auto (resolve(helpers)): 2 MiB where
// each rank has helper threads to copy with (ipc::copy_threads >= 2: cores to spare), which
// split a large read from the cells (a 4-rank all-gather of 2 MiB: 512 KiB a cell); 1 MiB
// otherwise.
struct HostFastRead : AutoBytes<HostFastRead, 2ull << 20, 1ull << 20> {};

// daemon.host_fast_reduce_kib: "auto" (the default) or a size. Auto (resolve(shared_cores)):
// 256 KiB for 2 members, x 2 / n for n, when the node's ranks and its daemon have a core each;
// 1 MiB for any number when they share cores. A size holds for any number. Each member of a fast
// all-reduce reduces every member's input: n times the arithmetic of the reduction split among
// the ranks, which wins once the ranks run at once (4 ranks at 128 KiB: 2.2x on 16 cores; at 64
// KiB 1.6x), while on shared cores the split's hand-offs cost more than the extra reads (4 ranks
// at 256 KiB on 2 cores: the split 2.7x slower; docs/performance.md).
struct HostFastReduce : AutoBytes<HostFastReduce, 1ull << 20, 256ull << 10> {
  // Whether the resolved limit is 2 members' and shrinks as 2 / n (SegmentHeader::fast_reduce_shrinks).
  bool shrinks(bool shared_cores) const { return automatic && !shared_cores; }
};

// daemon.host_single_copy_reduce_kib: "auto" (the default), a size, or "off". An all-reduce
// beyond the cells' limits takes the host fast path by single copy in two phases
// (SegmentHeader::fast_single_copy_reduce_bytes): each member reads (n - 1) / n of an input and
// of an output from the others' processes, where the split through the arenas copies a whole
// input in and a whole output out. Auto: with 2 members from 64 KiB, and with 3 or 4 from
// 16 MiB, when the ranks and the daemon have a core each; with 2 members at 64 KiB-4 MiB when
// they share cores. Measured (docs/performance.md): 2 members 1.3-3.6x the split on 16 cores,
// 1.1-1.4x to 4 MiB and 0.7x at 16 MiB on 2; 4 members 1.3-1.6x from 16 MiB, 0.8-1.1x below; 8
// members 0.6-0.9x (every member pins pages of every other, and they wait on each other). A
// size: 2 members from it, at any size, and never with more.
struct SingleCopyReduce {
  static constexpr std::uint64_t kFrom = 64ull << 10;
  static constexpr std::uint64_t kUptoSharedCores = 4ull << 20;
  static constexpr std::uint64_t kWideFrom = 16ull << 20;
  bool automatic = true;
  std::optional<std::uint64_t> bytes;  // when not automatic; nullopt: off
  static SingleCopyReduce fixed(std::optional<std::uint64_t> b) { return {false, b}; }
  struct Resolved {
    std::uint64_t from = 0, upto = 0, wide_from = 0;  // SegmentHeader's three; 0 as there
  };
  Resolved resolve(bool shared_cores) const {
    if (!automatic) return {bytes.value_or(0), 0, 0};
    if (shared_cores) return {kFrom, kUptoSharedCores, 0};
    return {kFrom, 0, kWideFrom};
  }
  bool operator==(const SingleCopyReduce&) const = default;
};

struct DaemonConfig {
  std::string config_path;  // "" when built-in defaults are used
  std::uint64_t arena_bytes = 32ull << 20;
  std::uint64_t chunk_bytes = 1ull << 20;
  int worker_threads = 0;
  std::chrono::microseconds spin{50};
  // Host collectives that only move bytes: ranks copy their outputs straight from the members'
  // arenas when one copies at least this much (daemon/arena_sources.hpp); nullopt: never.
  std::optional<std::uint64_t> direct_read_min_bytes = 8ull << 10;
  // Host reductions within a node: the ranks each reduce a share of a chunk from the members'
  // arenas (ipc::CompletionKind::Shares) instead of the daemon reducing all of it, for
  // reduce-scatter always and for allreduce and reduce from this many input bytes a chunk (a
  // member's). Off: the daemon always reduces.
  SplitReduceMin split_reduce_min;
  // Host collectives whose largest input is at most this many bytes run on the ranks' fast path
  // in groups within one node (ipc::kFlagHostFast): the size of each fast cell; 0: off.
  std::uint64_t host_fast_bytes = 512ull << 10;
  // ... and whose largest member reads at most this many bytes from the cells (a member of an
  // all-reduce or all-gather reads every member's input; 512 KiB each with 2 ranks).
  HostFastRead host_fast_read;
  // ... and, for all-reduce and reduce, reduces at most this many: beyond it the reduction split
  // among the ranks is faster.
  HostFastReduce host_fast_reduce;
  // Collectives that only move bytes, whose largest input is at least this many bytes, take the
  // host fast path by single copy at any size: each member reads the others' inputs where they
  // are, with process_vm_readv (SegmentHeader::fast_single_copy_bytes). nullopt: off. Off, too,
  // where the ranks cannot read each other's memory (ipc::peer_reads_unavailable).
  std::optional<std::uint64_t> host_single_copy_min_bytes = 64ull << 10;
  // A gather of 3 or 4 members takes it from this input size (and at least the above), where
  // the ranks have copy helpers (ipc::copy_threads): its root reads n - 1 inputs over them
  // (SegmentHeader::fast_single_copy_gather_wide_bytes). Where they share cores the root reads
  // alone, and the arenas measured faster.
  static constexpr std::uint64_t kSingleCopyGatherWideFrom = 1ull << 20;
  // All-reduces beyond the cells by single copy in two phases (SingleCopyReduce).
  SingleCopyReduce host_single_copy_reduce;
  std::chrono::seconds stall_warning{60};
  std::chrono::seconds collective_timeout{1800};
  std::chrono::seconds exit_grace{10};
  // How long a rank may outlive this daemon killed outright (client/orphan_watch.hpp): a rank busy
  // in its own work that long still reaches its next call and the named error; one that never
  // calls again holds its GPU that long after the job.
  std::chrono::seconds orphan_grace = ipc::kDefaultOrphanGrace;
  std::string log_level = "info";
  std::string fabric_provider = "tcp;ofi_rxm";
  std::string fabric_interface = "auto";  // daemon/internode/interface_choice.hpp
  int fabric_endpoints = 1;              // endpoints ("rails"): one per EFA device on AWS
  std::size_t fabric_max_inflight = 64;  // sends posted to the provider at once, per endpoint
  std::size_t fabric_max_message = 0;    // largest provider message (bytes); 0: the provider's
  // How collectives move among the nodes: Auto lets the tuner choose per chunk
  // (daemon/internode/tuner.hpp); Direct, Ring or Halving force one (tests, benchmarks).
  internode::Algorithm fabric_algorithm = internode::Algorithm::Auto;
  // Testing only: a fault the daemon's transport injects (transport/fault_injection.hpp), and the
  // file whose appearance starts it ("{node}" stands for the node id; "": from the start).
  transport::FaultPlan fabric_fault;
  std::string fabric_fault_trigger;

  // Reads `path` (may be empty: defaults), then applies `overrides` ("section.key=value").
  // Throws std::invalid_argument naming the bad key or value.
  static DaemonConfig load(const std::string& path, const std::vector<std::string>& overrides);
};

}  // namespace smddp::daemon
