// FastLedger: the daemon's record of one communicator's host fast-path requests
// (ipc::kFlagHostFast). The members ran those operations among themselves before they posted
// them; the daemon checks that every member posted the same call with the same fast-op number,
// and counts it. A full match (Matcher::post: a map entry, vectors of 400-byte requests
// allocated and copied) cost about 0.35-0.4 us a request, and with n requests an operation the
// ranks went at that pace. Here an operation is a row of a ring kept in seq order, whose storage
// is reused: a request is a search of the ring, 2 cache lines copied and a bit set.
//
// Only the common case stays here: every member posts the operation fast, with the same call.
// A row whose members disagree, a row whose seq a member posted through the daemon's path or
// had refused, rows that wait longer than kHandOverAfter (or their timeout), and rows that wait
// for a rank that exited leave for the matcher (Matcher::adopt), which judges, times out,
// reports and fails them as it does any collective. A seq that left never comes back: its later
// requests go to the matcher as well (post's ToMatcher), so that the members' calls of one seq
// always meet in one place.
//
// Not thread-safe: the daemon's loop owns it, as it owns the matcher.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "daemon/communicator.hpp"
#include "daemon/posted.hpp"

namespace smddp::daemon {

class FastLedger {
 public:
  // A row that waited this long leaves for the matcher (for its stall report, its timeout, the
  // status's waits): fast operations of a healthy job finish in microseconds.
  static constexpr std::chrono::milliseconds kHandOverAfter{100};

  // `comm`'s members are all on this node and have fast lane `lane`; `default_timeout` is the
  // collectives' timeout where a request gives none.
  FastLedger(const Communicator& comm, int lane, std::chrono::milliseconds default_timeout);

  const Communicator& comm() const noexcept { return *comm_; }
  int lane() const noexcept { return lane_; }
  // The member's group rank, or -1.
  int group_rank_of(int slot) const noexcept {
    return slot >= 0 && slot < static_cast<int>(group_of_slot_.size()) ? group_of_slot_[static_cast<std::size_t>(slot)]
                                                                         : -1;
  }

  enum class Outcome {
    Kept,       // the row waits for more members
    Ran,        // every member posted it and they agree: ran() has it
    Disagree,   // every member posted it and they do not: take_finished() has the calls
    Duplicate,  // this member already posted this seq here
    ToMatcher,  // the seq is not the ledger's: post it to the matcher
  };
  // A validated host fast-path request of member `group_rank` (posted from `slot`). With
  // `keep_ran`, take_finished() has the calls of a row that Ran as well.
  Outcome post(int slot, int group_rank, const ipc::RequestDesc& d, Clock::time_point now, bool keep_ran = false);

  // After Ran: what the daemon counts.
  struct Ran {
    bool single_copy = false;
    std::uint64_t output_bytes = 0;  // summed over the members
  };
  const Ran& ran() const noexcept { return ran_; }
  // After Disagree (or Ran, with keep_ran): the row's calls, by group rank.
  std::vector<Posted> take_finished() noexcept { return std::move(finished_); }

  // A member posted (or had refused) operation `seq` outside the ledger: a row of that seq must
  // meet it in the matcher (take), and so must the seq's later fast requests. Each member posts
  // its seqs in order, so the highest such seq is enough: a fast request above it whose seq no row
  // ever had is the first of its operation.
  void note_elsewhere(std::uint64_t seq) noexcept {
    if (seq > elsewhere_max_) elsewhere_max_ = seq;
  }
  // The calls of `seq`'s row, which leaves the ledger; nullopt if it has none.
  std::optional<std::vector<Posted>> take(std::uint64_t seq);
  // Rows that leave: those older than kHandOverAfter or their timeout (`now`), those that wait
  // for member `group_rank`, or all. Each is a row's calls.
  std::vector<std::vector<Posted>> take_aged(Clock::time_point now);
  std::vector<std::vector<Posted>> take_waiting_for(int group_rank);
  std::vector<std::vector<Posted>> take_all();

  std::size_t rows() const noexcept { return live_; }

  // The output bytes of all members of a host fast-path operation `d` of `n` members.
  static std::uint64_t output_bytes(const ipc::RequestDesc& d, int n);

 private:
  struct Row {
    std::uint64_t seq = 0;
    std::uint64_t posted = 0;  // a bit per group rank
    Clock::time_point first;
    std::chrono::milliseconds timeout{0};  // the shortest of its posters'; 0: none given
    bool live = false;
    std::vector<Posted> calls;  // by group rank; valid where `posted` has the bit
  };
  Row& at(std::size_t i) noexcept { return ring_[(head_ + i) & (ring_.size() - 1)]; }
  // The index of `seq`'s live row, or nullopt.
  std::optional<std::size_t> find(std::uint64_t seq) noexcept;
  Row& open(std::uint64_t seq, Clock::time_point now);
  // Drops the closed rows at the front.
  void trim() noexcept;
  std::vector<Posted> calls_of(const Row& r) const;
  void close(Row& r) noexcept;
  template <class Pred>
  std::vector<std::vector<Posted>> take_where(Pred leaves);

  const Communicator* comm_;
  int lane_;
  std::chrono::milliseconds default_timeout_;
  int n_;
  std::uint64_t full_;                // every member's bit
  std::vector<int> group_of_slot_;    // by slot: group rank or -1
  std::vector<Row> ring_;             // rows in seq order from head_, size_ of them
  std::size_t head_ = 0, size_ = 0, live_ = 0;
  std::uint64_t last_row_seq_ = 0;    // the highest seq a row was ever opened for
  std::uint64_t elsewhere_max_ = 0;   // the highest seq a member posted outside the ledger
  std::vector<Posted> finished_;      // the calls of the row post just closed (Disagree)
  struct BytesOf {                    // output_bytes of the last call that ran
    ipc::OpType op = ipc::OpType::Barrier;
    ipc::DType dtype = ipc::DType::Float32;
    std::uint64_t count = 0;
    std::int32_t root = 0;
    std::uint64_t bytes = 0;
  } bytes_of_;
  Ran ran_;
};

}  // namespace smddp::daemon
