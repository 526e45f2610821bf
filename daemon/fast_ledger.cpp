#include "daemon/fast_ledger.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "ipc/segment.hpp"
#include "ipc/validate.hpp"

namespace smddp::daemon {

// A row's members are a bit each: a fast lane's communicator is all on one node.
static_assert(ipc::kMaxLocalRanks <= 64);

FastLedger::FastLedger(const Communicator& comm, int lane, std::chrono::milliseconds default_timeout)
    : comm_(&comm), lane_(lane), default_timeout_(default_timeout), n_(comm.size()),
      full_(n_ >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n_) - 1), ring_(8) {
  int top = -1;
  for (int s : comm.slots) top = std::max(top, s);
  group_of_slot_.assign(static_cast<std::size_t>(top + 1), -1);
  for (int g = 0; g < n_; ++g)
    if (const int s = comm.slots[static_cast<std::size_t>(g)]; s >= 0) group_of_slot_[static_cast<std::size_t>(s)] = g;
}

std::optional<std::size_t> FastLedger::find(std::uint64_t seq) noexcept {
  // A member behind the others finds its row at the front: the others wait for it there.
  if (size_ && at(0).seq == seq) return at(0).live ? std::optional<std::size_t>(0) : std::nullopt;
  // Rows are in seq order, each seq once: rows open only above the highest seq so far.
  std::size_t lo = 0, hi = size_;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (at(mid).seq < seq) lo = mid + 1;
    else hi = mid;
  }
  if (lo < size_ && at(lo).seq == seq && at(lo).live) return lo;
  return std::nullopt;
}

void FastLedger::trim() noexcept {
  while (size_ && !at(0).live) {
    head_ = (head_ + 1) & (ring_.size() - 1);
    --size_;
  }
}

FastLedger::Row& FastLedger::open(std::uint64_t seq, Clock::time_point now) {
  if (size_ == ring_.size()) {
    std::vector<Row> bigger(ring_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) bigger[i] = std::move(at(i));
    ring_ = std::move(bigger);
    head_ = 0;
  }
  Row& r = at(size_);
  ++size_;
  ++live_;
  r.seq = seq;
  r.posted = 0;
  r.first = now;
  r.timeout = default_timeout_;
  r.live = true;
  if (r.calls.size() != static_cast<std::size_t>(n_)) r.calls.resize(static_cast<std::size_t>(n_));
  last_row_seq_ = seq;
  return r;
}

void FastLedger::close(Row& r) noexcept {
  r.live = false;
  --live_;
}

std::vector<Posted> FastLedger::calls_of(const Row& r) const {
  std::vector<Posted> out;
  for (int g = 0; g < n_; ++g)
    if (r.posted & (std::uint64_t{1} << g)) out.push_back(r.calls[static_cast<std::size_t>(g)]);
  return out;
}

FastLedger::Outcome FastLedger::post(int slot, int group_rank, const ipc::RequestDesc& d, Clock::time_point now,
                                     bool keep_ran) {
  trim();
  Row* r = nullptr;
  if (d.seq > last_row_seq_) {
    // The first request of its operation here, unless a member took it elsewhere already.
    if (d.seq <= elsewhere_max_) return Outcome::ToMatcher;
    r = &open(d.seq, now);
  } else if (const auto i = find(d.seq)) {
    r = &at(*i);
  } else {
    return Outcome::ToMatcher;  // its row left (or it never had one): its other calls are in the matcher
  }
  const std::uint64_t bit = std::uint64_t{1} << group_rank;
  if (r->posted & bit) return Outcome::Duplicate;
  r->posted |= bit;
  Posted& c = r->calls[static_cast<std::size_t>(group_rank)];
  c.slot = slot;
  c.group_rank = group_rank;
  c.at = now;
  // The call's fields: a fast request's buffer fields are empty, and a row's never change.
  std::memcpy(static_cast<void*>(&c.desc), &d, offsetof(ipc::RequestDesc, input));
  if (d.timeout_ms) r->timeout = std::min(r->timeout, std::chrono::milliseconds(d.timeout_ms));
  if (r->posted != full_) return Outcome::Kept;

  const ipc::RequestDesc& first = r->calls.front().desc;
  const bool agree = std::all_of(r->calls.begin() + 1, r->calls.end(), [&](const Posted& p) {
    return p.desc.wait_value == first.wait_value && same_signature(first, p.desc);
  });
  if (agree) {
    // A loop of like calls asks for the same count each time.
    if (first.op != bytes_of_.op || first.dtype != bytes_of_.dtype || first.count != bytes_of_.count ||
        first.root != bytes_of_.root) {
      bytes_of_ = {first.op, first.dtype, first.count, first.root, output_bytes(first, n_)};
    }
    ran_ = Ran{(first.flags & ipc::kFlagSingleCopy) != 0, bytes_of_.bytes};
    if (keep_ran) finished_ = calls_of(*r);
    close(*r);
    return Outcome::Ran;
  }
  finished_ = calls_of(*r);
  close(*r);
  return Outcome::Disagree;
}

std::optional<std::vector<Posted>> FastLedger::take(std::uint64_t seq) {
  trim();
  const auto i = find(seq);
  if (!i) return std::nullopt;
  auto calls = calls_of(at(*i));
  close(at(*i));
  return calls;
}

template <class Pred>
std::vector<std::vector<Posted>> FastLedger::take_where(Pred leaves) {
  std::vector<std::vector<Posted>> out;
  for (std::size_t i = 0; i < size_; ++i) {
    Row& r = at(i);
    if (!r.live || !leaves(r)) continue;
    out.push_back(calls_of(r));
    close(r);
  }
  trim();
  return out;
}

std::vector<std::vector<Posted>> FastLedger::take_aged(Clock::time_point now) {
  return take_where([&](const Row& r) { return now - r.first >= std::min<Clock::duration>(kHandOverAfter, r.timeout); });
}

std::vector<std::vector<Posted>> FastLedger::take_waiting_for(int group_rank) {
  return take_where([&](const Row& r) { return !(r.posted & (std::uint64_t{1} << group_rank)); });
}

std::vector<std::vector<Posted>> FastLedger::take_all() {
  return take_where([](const Row&) { return true; });
}

std::uint64_t FastLedger::output_bytes(const ipc::RequestDesc& d, int n) {
  const auto out = [&](int g) -> std::uint64_t {
    const auto x = ipc::expected_bytes(d, n, g);
    return x && x->output ? *x->output : 0;
  };
  // Every member alike but a root.
  if (!ipc::rooted(d.op) || n < 2) return out(0) * static_cast<std::uint64_t>(n);
  return out(d.root) + out(d.root == 0 ? 1 : 0) * static_cast<std::uint64_t>(n - 1);
}

}  // namespace smddp::daemon
