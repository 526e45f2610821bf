// The host fast path's collectives (ipc::kFlagHostFast): what one member reads from the
// members' fast cells (ipc::FastCell, by group rank) once every member published its input.
// The daemon is not on this path; ClientImpl (host_fast_path.cpp) publishes, waits and posts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "client/copy_pool.hpp"
#include "ipc/segment.hpp"

namespace smddp::client::host_fast {

// Bytes the most demanding member of the call publishes (the root's n blocks of a scatter,
// everyone's n blocks of a reduce_scatter or alltoall): what decides, alike on every member,
// whether the call takes the fast path. nullopt for operations the path does not take.
std::optional<std::uint64_t> largest_input(ipc::OpType op, std::uint64_t count, ipc::DType dtype, int members);

// Bytes the most demanding member reads from the cells: every member's input for an all-reduce,
// an all-gather or a reduce (gather) root, the n blocks of a reduce_scatter or alltoall, one
// block for a broadcast or scatter. Every member reduces (or copies) the whole call itself, so
// from some size on the daemon's paths, which split a reduction among the members, are faster:
// this is what SegmentHeader::fast_read_bytes bounds. nullopt where largest_input is.
std::optional<std::uint64_t> largest_read(ipc::OpType op, std::uint64_t count, ipc::DType dtype, int members);

// Whether a call takes the host fast path, from the call and the node's limits alone (so that
// every member decides alike): its largest input fits a cell and its largest read the limit, and
// for an all-reduce or a reduce, whose every member reduces every member's input (n times the
// arithmetic of the reduction split among the ranks), that read fits reduce_bytes too, or with
// `reduce_shrinks` reduce_bytes x 2 / n (reduce_bytes then being the limit of 2 members).
bool fits(ipc::OpType op, std::uint64_t count, ipc::DType dtype, int members, std::uint64_t cell_bytes,
          std::uint64_t read_bytes, std::uint64_t reduce_bytes, bool reduce_shrinks);

// Whether a call takes the fast path by single copy (FastCell::by_address), again alike on every
// member: an alltoall or a scatter, or an all-gather or a gather of 2 members, whose largest
// input is at least single_copy_bytes (SegmentHeader::fast_single_copy_bytes; 0: never), or a
// gather of 3 or 4 members whose input is also at least gather_wide_from
// (SegmentHeader::fast_single_copy_gather_wide_bytes; 0: never). Then no cell or read limit
// applies: the members read each other's inputs where they are.
bool single_copy(ipc::OpType op, std::uint64_t count, ipc::DType dtype, int members, std::uint64_t single_copy_bytes,
                 std::uint64_t gather_wide_from = 0);

// Whether an all-reduce that does not take the cells (fits) takes the fast path by single copy in
// two phases (reduce_share, then gather_shares), alike on every member, from the node's limits
// (SegmentHeader::fast_single_copy_reduce_bytes and the two after it): with 2 members an input
// of at least `from` and at most `upto` (0: any), with 3 or 4 at least `wide_from`; 0 in `from`
// or `wide_from`: never. Each member reads (n - 1) / n of an input and of an output where the
// split through the arenas copies a whole input in and a whole output out, and no daemon
// answer comes between.
bool single_copy_reduce(ipc::OpType op, std::uint64_t count, ipc::DType dtype, int members, std::uint64_t from,
                        std::uint64_t upto, std::uint64_t wide_from);

// Whether member `me` may let the others read its input (`in_bytes` at `in`) while it writes its
// output (`out_bytes` at `out`): the two do not overlap, or only where its own block lands on
// itself (an in-place all-gather or gather), or an in-place all-reduce (by single copy each share
// of the input is read by its owner before anyone writes it). Otherwise it publishes a copy.
bool input_stays_put(ipc::OpType op, std::uint64_t count, ipc::DType dtype, int me, const std::byte* in,
                     std::uint64_t in_bytes, const std::byte* out, std::uint64_t out_bytes);

// Bytes member `me` publishes: its input, none for a broadcast's or scatter's non-roots.
std::uint64_t input_bytes(ipc::OpType op, std::uint64_t count, ipc::DType dtype, int members, int me, int root);

// Whether two members' cells hold the same call: the fields the daemon's matcher compares.
bool same_call(const ipc::FastCell& a, const ipc::FastCell& b);

// Writes member `me`'s output of the call every cell holds (`cells` by group rank, all
// published and checked with same_call) into `out`. Reductions combine the members in group-rank
// order, so every member computes the same bits; a premul_sum scales every input by
// `premul_scale`, the caller's. A member whose cell is by_address is read from
// its process, `pids` by group rank (empty when no cell is), its own input in place. Throws
// std::runtime_error when such a read fails. By single copy, `pool` (if any) shares the copies
// out in parts of at least kMinCopyPart.
void read_output(std::span<ipc::FastCell* const> cells, std::span<const int> pids, int me, double premul_scale,
                 std::byte* out, CopyPool* pool = nullptr);
// An all-reduce by single copy, phase 1: member `me` reduces its share (ipc::share_range) of every
// member's input, the others' read from their processes (`pids`) piece by piece into `scratch`,
// in group-rank order into the same elements of `out` (its output, which may be its input).
// Every share is reduced by one member, so every member ends with the same bits. Throws
// std::runtime_error when a read fails.
void reduce_share(std::span<ipc::FastCell* const> cells, std::span<const int> pids, int me, double premul_scale,
                  std::byte* out, std::vector<std::byte>& scratch, CopyPool* pool = nullptr);
// Phase 2, once every member's FastDone::reduced reached the operation: copies every other
// member's share from its output (Segment::fast_output_address) into `out`.
void gather_shares(std::span<ipc::FastCell* const> cells, std::span<const int> pids, int me, std::byte* out,
                   CopyPool* pool = nullptr);
// Bytes of each member's input a phase-1 read takes into the scratch at once: the reduction then
// reads them from this core's cache.
inline constexpr std::uint64_t kSharePiece = 128ull << 10;
// A part smaller than this costs more to hand to a helper thread (a wake-up, tens of us in a
// VM) than it saves.
inline constexpr std::uint64_t kMinCopyPart = 1ull << 20;

}  // namespace smddp::client::host_fast
