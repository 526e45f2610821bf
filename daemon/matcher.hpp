// Matcher: lines collectives up across the ranks of a node.
//
// Each rank numbers its operations per communicator (seq); a pipelined operation posts one
// request per chunk, all with the same seq and their own chunk_offset. A collective (comm,
// seq, chunk) is ready once every local member posted it and all agree on its signature
// (op, dtype, count, chunk, reduce op, root, flags). Send/recv pair up by (comm, src, dst,
// per-pair seq). Disagreement fails the collective on every member with one message naming
// each rank's call; a failed seq stays failed, so chunks still in flight fail at once.
//
// A communicator with a host fast lane has a FastLedger: its fast requests (ipc::kFlagHostFast)
// are lined up there first, cheaply, and leave for the matcher's entries (adopt) when they need
// more than a count (daemon/fast_ledger.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "daemon/communicator.hpp"
#include "daemon/fast_ledger.hpp"
#include "daemon/posted.hpp"
#include "daemon/wait_for.hpp"
#include "ipc/protocol.hpp"

namespace smddp::daemon {

// What the matcher decided: run `posted` (status Ok), or fail every one of them.
struct Match {
  const Communicator* comm = nullptr;
  std::vector<Posted> posted;  // collectives: indexed by group rank; p2p: {send, recv}
  ipc::Status status = ipc::Status::Ok;
  std::string error;
};

struct StallInfo {
  std::uint64_t comm_id;
  std::uint64_t seq;
  ipc::OpType op;
  double waiting_s;
  std::vector<int> missing_global_ranks;
};

class Matcher {
 public:
  // The world communicator (id 0) holds every global rank; `slot_of_global` maps global rank
  // to local slot (-1 if remote).
  Matcher(std::vector<int> slot_of_global, std::chrono::milliseconds default_timeout);

  // Finds the communicator and the poster's group rank (validation needs them).
  const Communicator* find(std::uint64_t comm_id) const;

  // Queues a validated request. Returns the matches it completes (0 or 1), and the failures of
  // what it made leave a fast ledger.
  std::vector<Match> post(int slot, int group_rank, const ipc::RequestDesc& desc, Clock::time_point now);
  // The host fast path: communicator `comm_id` (all its members on this node) got fast lane `lane`.
  void open_fast_lane(std::uint64_t comm_id, int lane);
  std::size_t fast_lane_count() const noexcept { return ledgers_.size(); }
  // Its ledger, or nullptr.
  FastLedger* fast_ledger(std::uint64_t comm_id) noexcept;
  // post() for a validated host fast-path request of member `group_rank` of the ledger's
  // communicator, without the match of an operation that every member posted and that agrees:
  // `ran` is then true, and ledger.ran() has what to count.
  std::vector<Match> post_host_fast(FastLedger& ledger, int slot, int group_rank, const ipc::RequestDesc& desc,
                                    Clock::time_point now, bool& ran);
  // CommCreate requests: `members` are the global ranks read from the poster's aux buffer.
  std::vector<Match> post_create(int slot, const ipc::RequestDesc& desc, std::vector<int> members,
                                 Clock::time_point now);

  // Fails collectives past their timeout; reports (once each) those past `stall_after`.
  std::vector<Match> expire(Clock::time_point now, std::chrono::seconds stall_after,
                            std::vector<StallInfo>& new_stalls);
  // Current stalls (for status), older than `stall_after`.
  std::vector<StallInfo> stalls(Clock::time_point now, std::chrono::seconds stall_after) const;
  // Each posted rank's wait for the local ranks that have not posted (wait_for.hpp).
  void add_waits(Clock::time_point now, std::vector<RankWait>& out) const;
  // Fails what waits for `slot` to post (that rank has exited).
  std::vector<Match> fail_waiting_for(int slot, ipc::Status status, const std::string& error);
  // Fails operation `seq` of `comm`: its chunks waiting here now, later ones as they come
  // (the inter-node signature check found a mismatch).
  std::vector<Match> fail_sequence(std::uint64_t comm, std::uint64_t seq, ipc::Status status, const std::string& error);
  // Fails the partners of a request the daemon refused (`group_rank` posted `desc`): the other
  // members of its collective, or the other side of its send/recv, waiting here now or posting
  // later. CommCreate has no partners to fail here.
  std::vector<Match> fail_partners(int group_rank, const ipc::RequestDesc& desc, ipc::Status status,
                                   const std::string& error);
  // Fails everything pending (job failure).
  std::vector<Match> fail_all(ipc::Status status, const std::string& error);

  std::size_t pending_count() const noexcept;
  std::size_t communicator_count() const noexcept { return comms_.size(); }

 private:
  using CollKey = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>;      // comm, seq, chunk
  using P2pKey = std::tuple<std::uint64_t, int, int, std::uint64_t, std::uint64_t>;  // comm, src, dst, seq, chunk
  using P2pOp = std::tuple<std::uint64_t, int, int, std::uint64_t>;                  // comm, src, dst, seq
  // The send/recv `group_rank` posted as `d`, by sender and receiver.
  static P2pOp p2p_op(int group_rank, const ipc::RequestDesc& d);
  struct Entry {
    const Communicator* comm;
    std::vector<std::optional<Posted>> by_rank;
    int count = 0;
    Clock::time_point first;
    std::chrono::milliseconds timeout;
    bool stall_reported = false;
  };
  struct P2pEntry {
    const Communicator* comm;
    std::optional<Posted> send, recv;
    Clock::time_point first;
    std::chrono::milliseconds timeout;
    bool stall_reported = false;
  };
  struct CreateEntry {
    std::vector<int> members;
    std::vector<Posted> posted;
    std::vector<std::vector<int>> lists;  // what each poster asked for, for the mismatch text
    Clock::time_point first;
    std::chrono::milliseconds timeout;
  };

  std::chrono::milliseconds timeout_of(const ipc::RequestDesc& d) const;
  struct Failure {
    ipc::Status status;
    std::string error;
  };
  std::optional<Failure> failed_seq(std::uint64_t comm, std::uint64_t seq) const;
  // Records that (comm, seq) failed and fails its chunks already waiting here.
  void fail_seq(std::uint64_t comm, std::uint64_t seq, ipc::Status status, const std::string& error,
                std::vector<Match>& out);
  Match check_signatures(Entry& e, const CollKey& key);
  // A collective's request, past the fast ledger.
  void post_collective(const Communicator& comm, const Posted& p, std::vector<Match>& out);
  // Calls that left a fast ledger join the entries, as if posted now (they keep their times).
  void adopt(const Communicator& comm, std::vector<Posted> calls, std::vector<Match>& out);
  void adopt(FastLedger& ledger, std::vector<std::vector<Posted>> rows, std::vector<Match>& out);
  // Operation `seq` was posted (or refused) outside the ledger: its row leaves it.
  void leave_ledger(FastLedger& ledger, std::uint64_t seq, std::vector<Match>& out);
  // The ledger's answer to a fast request, acted on (ToMatcher: post it as any collective).
  FastLedger::Outcome post_to_ledger(FastLedger& ledger, int slot, int group_rank, const ipc::RequestDesc& d,
                                     Clock::time_point now, bool keep_ran, std::vector<Match>& out);
  static Match fail_entry(const Entry& e, ipc::Status status, const std::string& error);

  std::vector<int> slot_of_global_;
  std::chrono::milliseconds default_timeout_;
  std::map<std::uint64_t, std::unique_ptr<Communicator>> comms_;
  std::map<std::uint64_t, std::unique_ptr<FastLedger>> ledgers_;  // by communicator id
  std::map<CollKey, Entry> collectives_;
  std::map<P2pKey, P2pEntry> p2p_;
  std::map<std::uint64_t, CreateEntry> creates_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, Failure> failed_;  // (comm, seq) -> why
  std::map<P2pOp, Failure> failed_p2p_;
};

// "allreduce(float32, count=8, op=sum)": how a rank's call is named in error messages.
std::string describe_call(const ipc::RequestDesc& d);

// The mismatch error naming every member's call ("collective mismatch on communicator 0
// (operation #3): rank 0 called ..., rank 1 called ..."), or nullopt when they agree.
std::optional<std::string> disagreement(const Communicator& comm, std::uint64_t seq, const std::vector<Posted>& posted);

}  // namespace smddp::daemon
