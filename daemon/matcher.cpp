#include "daemon/matcher.hpp"

#include <algorithm>
#include <sstream>

#include "ipc/types.hpp"

namespace smddp::daemon {

using ipc::OpType;
using ipc::RequestDesc;
using ipc::Status;

namespace {

std::string posted_twice(const RequestDesc& d) {
  return "rank posted " + describe_call(d) + " twice with seq " + std::to_string(d.seq);
}

}  // namespace

std::string describe_call(const RequestDesc& d) {
  std::ostringstream s;
  s << ipc::to_string(d.op) << "(";
  if (d.op == OpType::Barrier) return s.str() + ")";
  s << ipc::to_string(d.dtype) << ", count=" << d.count;
  if (d.chunk_count != d.count) s << ", chunk=" << d.chunk_offset << "+" << d.chunk_count;
  if (reduces(d.op)) s << ", op=" << ipc::to_string(d.reduce_op);
  if (rooted(d.op)) s << ", root=" << d.root;
  if (d.op == OpType::Send || d.op == OpType::Recv) s << ", peer=" << d.root << ", tag=" << d.tag;
  if (d.flags & ipc::kFlagSplits) s << ", uneven splits";
  s << ")";
  return s.str();
}

Matcher::Matcher(std::vector<int> slot_of_global, std::chrono::milliseconds default_timeout)
    : slot_of_global_(std::move(slot_of_global)), default_timeout_(default_timeout) {
  auto world = std::make_unique<Communicator>();
  world->id = 0;
  for (int g = 0; g < static_cast<int>(slot_of_global_.size()); ++g) {
    world->global_ranks.push_back(g);
    world->slots.push_back(slot_of_global_[static_cast<std::size_t>(g)]);
  }
  comms_.emplace(0, std::move(world));
}

const Communicator* Matcher::find(std::uint64_t comm_id) const {
  auto it = comms_.find(comm_id);
  return it == comms_.end() ? nullptr : it->second.get();
}

std::chrono::milliseconds Matcher::timeout_of(const RequestDesc& d) const {
  return d.timeout_ms ? std::chrono::milliseconds(d.timeout_ms) : default_timeout_;
}

Matcher::P2pOp Matcher::p2p_op(int group_rank, const RequestDesc& d) {
  const bool is_send = d.op == OpType::Send;
  return {d.comm_id, is_send ? group_rank : d.root, is_send ? d.root : group_rank, d.seq};
}

std::optional<Matcher::Failure> Matcher::failed_seq(std::uint64_t comm, std::uint64_t seq) const {
  auto it = failed_.find({comm, seq});
  if (it == failed_.end()) return std::nullopt;
  return it->second;
}

Match Matcher::fail_entry(const Entry& e, Status status, const std::string& error) {
  Match m{e.comm, {}, status, error};
  for (const auto& q : e.by_rank)
    if (q) m.posted.push_back(*q);
  return m;
}

void Matcher::fail_seq(std::uint64_t comm, std::uint64_t seq, Status status, const std::string& error,
                       std::vector<Match>& out) {
  failed_[{comm, seq}] = Failure{status, error};
  // Chunks of a failed collective arrive shortly after; old entries are of no use.
  while (failed_.size() > 4096) failed_.erase(failed_.begin());
  // Its other chunks already waiting here fail now, not at the timeout.
  auto it = collectives_.lower_bound(CollKey{comm, seq, 0});
  while (it != collectives_.end() && std::get<0>(it->first) == comm && std::get<1>(it->first) == seq) {
    out.push_back(fail_entry(it->second, status, error));
    it = collectives_.erase(it);
  }
}

std::vector<Match> Matcher::post(int slot, int group_rank, const RequestDesc& d, Clock::time_point now) {
  std::vector<Match> out;
  const Communicator* comm = find(d.comm_id);
  Posted p{slot, group_rank, d, now};
  if (comm == nullptr) {
    out.push_back({nullptr, {p}, Status::InvalidRequest,
                   "communicator " + std::to_string(d.comm_id) + " does not exist on this node"});
    return out;
  }
  if (d.op == OpType::Send || d.op == OpType::Recv) {
    const bool is_send = d.op == OpType::Send;
    const P2pOp op = p2p_op(group_rank, d);
    P2pKey key = std::tuple_cat(op, std::make_tuple(d.chunk_offset));
    if (auto f = failed_p2p_.find(op); f != failed_p2p_.end()) {
      out.push_back({comm, {p}, f->second.status, f->second.error});
      return out;
    }
    auto [it, fresh] = p2p_.try_emplace(key, P2pEntry{comm, {}, {}, now, timeout_of(d)});
    auto& e = it->second;
    auto& mine = is_send ? e.send : e.recv;
    if (mine) {
      out.push_back({comm, {p}, Status::InvalidRequest, "duplicate " + describe_call(d) + " with seq " +
                                                            std::to_string(d.seq)});
      return out;
    }
    mine = p;
    e.timeout = std::min(e.timeout, timeout_of(d));
    if (e.send && e.recv) {
      Match m{comm, {*e.send, *e.recv}, Status::Ok, {}};
      const auto& s = e.send->desc;
      const auto& r = e.recv->desc;
      if (s.dtype != r.dtype || s.count != r.count || s.chunk_offset != r.chunk_offset ||
          s.chunk_count != r.chunk_count || s.tag != r.tag) {
        m.status = Status::Mismatch;
        m.error = "send/recv mismatch on communicator " + std::to_string(d.comm_id) + ": rank " +
                  std::to_string(comm->global_ranks[static_cast<std::size_t>(e.send->group_rank)]) + " called " +
                  describe_call(s) + ", rank " +
                  std::to_string(comm->global_ranks[static_cast<std::size_t>(e.recv->group_rank)]) + " called " +
                  describe_call(r);
      }
      p2p_.erase(it);
      out.push_back(std::move(m));
    }
    return out;
  }

  if (FastLedger* ledger = fast_ledger(d.comm_id)) {
    if (!(d.flags & ipc::kFlagHostFast)) leave_ledger(*ledger, d.seq, out);
    else if (post_to_ledger(*ledger, slot, group_rank, d, now, true, out) != FastLedger::Outcome::ToMatcher)
      return out;
  }
  post_collective(*comm, p, out);
  return out;
}

void Matcher::post_collective(const Communicator& comm, const Posted& p, std::vector<Match>& out) {
  const RequestDesc& d = p.desc;
  if (auto f = failed_seq(d.comm_id, d.seq)) {
    out.push_back({&comm, {p}, f->status, f->error});
    return;
  }
  CollKey key{d.comm_id, d.seq, d.chunk_offset};
  auto [it, fresh] = collectives_.try_emplace(key);
  auto& e = it->second;
  if (fresh) {
    e.comm = &comm;
    e.by_rank.resize(static_cast<std::size_t>(comm.size()));
    e.first = p.at;
    e.timeout = timeout_of(d);
  }
  e.first = std::min(e.first, p.at);
  auto& cell = e.by_rank[static_cast<std::size_t>(p.group_rank)];
  if (cell) {
    out.push_back({&comm, {p}, Status::InvalidRequest, posted_twice(d)});
    return;
  }
  cell = p;
  ++e.count;
  e.timeout = std::min(e.timeout, timeout_of(d));
  // Judged once every member posted, so a mismatch error names every rank's call. A group
  // across nodes is judged by the inter-node engine, on every member's call.
  if (e.count == comm.local_member_count()) {
    Match m;
    if (comm.local_member_count() == comm.size()) {
      m = check_signatures(e, key);
    } else {
      m = Match{e.comm, {}, Status::Ok, {}};
      for (auto& q : e.by_rank)
        if (q) m.posted.push_back(*q);
    }
    collectives_.erase(it);
    const bool failed = m.status != Status::Ok;
    const std::string error = m.error;
    out.push_back(std::move(m));
    if (failed) fail_seq(d.comm_id, d.seq, Status::Mismatch, error, out);
  }
}

void Matcher::open_fast_lane(std::uint64_t comm_id, int lane) {
  if (const Communicator* comm = find(comm_id))
    ledgers_.try_emplace(comm_id, std::make_unique<FastLedger>(*comm, lane, default_timeout_));
}

FastLedger* Matcher::fast_ledger(std::uint64_t comm_id) noexcept {
  const auto it = ledgers_.find(comm_id);
  return it == ledgers_.end() ? nullptr : it->second.get();
}

std::vector<Match> Matcher::post_host_fast(FastLedger& ledger, int slot, int group_rank, const RequestDesc& d,
                                           Clock::time_point now, bool& ran) {
  std::vector<Match> out;
  const auto outcome = post_to_ledger(ledger, slot, group_rank, d, now, false, out);
  if (outcome == FastLedger::Outcome::ToMatcher) post_collective(ledger.comm(), Posted{slot, group_rank, d, now}, out);
  ran = outcome == FastLedger::Outcome::Ran;
  return out;
}

FastLedger::Outcome Matcher::post_to_ledger(FastLedger& ledger, int slot, int group_rank, const RequestDesc& d,
                                            Clock::time_point now, bool keep_ran, std::vector<Match>& out) {
  const auto outcome = ledger.post(slot, group_rank, d, now, keep_ran);
  switch (outcome) {
    case FastLedger::Outcome::Kept:
    case FastLedger::Outcome::ToMatcher:
      break;
    case FastLedger::Outcome::Ran:
      if (keep_ran) out.push_back({&ledger.comm(), ledger.take_finished(), Status::Ok, {}});
      break;
    case FastLedger::Outcome::Disagree:
      // The entries' own judgment names every call (or passes it on to the daemon's check of
      // the fast-op numbers).
      adopt(ledger.comm(), ledger.take_finished(), out);
      break;
    case FastLedger::Outcome::Duplicate:
      out.push_back({&ledger.comm(), {Posted{slot, group_rank, d, now}}, Status::InvalidRequest, posted_twice(d)});
      break;
  }
  return outcome;
}

void Matcher::adopt(const Communicator& comm, std::vector<Posted> calls, std::vector<Match>& out) {
  for (const Posted& p : calls) post_collective(comm, p, out);
}

void Matcher::adopt(FastLedger& ledger, std::vector<std::vector<Posted>> rows, std::vector<Match>& out) {
  for (auto& calls : rows) adopt(ledger.comm(), std::move(calls), out);
}

void Matcher::leave_ledger(FastLedger& ledger, std::uint64_t seq, std::vector<Match>& out) {
  ledger.note_elsewhere(seq);
  if (auto calls = ledger.take(seq)) adopt(ledger.comm(), std::move(*calls), out);
}

std::size_t Matcher::pending_count() const noexcept {
  std::size_t n = collectives_.size() + p2p_.size() + creates_.size();
  for (const auto& [id, ledger] : ledgers_) n += ledger->rows();
  return n;
}

Match Matcher::check_signatures(Entry& e, const CollKey& key) {
  Match m{e.comm, {}, Status::Ok, {}};
  for (auto& q : e.by_rank)
    if (q) m.posted.push_back(*q);
  if (auto err = disagreement(*e.comm, std::get<1>(key), m.posted)) {
    m.status = Status::Mismatch;
    m.error = std::move(*err);
  }
  return m;
}

std::optional<std::string> disagreement(const Communicator& comm, std::uint64_t seq, const std::vector<Posted>& posted) {
  if (posted.empty() || std::all_of(posted.begin(), posted.end(), [&](const Posted& p) {
        return same_signature(posted.front().desc, p.desc);
      }))
    return std::nullopt;
  std::ostringstream s;
  s << "collective mismatch on communicator " << comm.id << " (operation #" << seq << "):";
  const char* sep = " ";
  for (const auto& p : posted) {
    s << sep << "rank " << comm.global_ranks[static_cast<std::size_t>(p.group_rank)] << " called "
      << describe_call(p.desc);
    sep = ", ";
  }
  return s.str();
}

std::vector<Match> Matcher::post_create(int slot, const RequestDesc& d, std::vector<int> members,
                                        Clock::time_point now) {
  std::vector<Match> out;
  Posted p{slot, -1, d, now};
  auto fail_one = [&](std::string why) {
    out.push_back({nullptr, {p}, Status::InvalidRequest, std::move(why)});
    return out;
  };
  if (d.comm_id == 0) return fail_one("communicator id 0 is the world and cannot be created");
  if (comms_.count(d.comm_id)) return fail_one("communicator " + std::to_string(d.comm_id) + " already exists");
  const int world = static_cast<int>(slot_of_global_.size());
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return fail_one("communicator members contain a rank twice");
  for (int g : members)
    if (g < 0 || g >= world) return fail_one("communicator member " + std::to_string(g) + " is not a rank of the job");
  int my_global = -1;
  for (int g = 0; g < world; ++g)
    if (slot_of_global_[static_cast<std::size_t>(g)] == slot) my_global = g;
  auto pos = std::find(members.begin(), members.end(), my_global);
  if (pos == members.end())
    return fail_one("rank " + std::to_string(my_global) + " asked to create a communicator it is not a member of");
  p.group_rank = static_cast<int>(pos - members.begin());

  auto [it, fresh] = creates_.try_emplace(d.comm_id);
  auto& e = it->second;
  if (fresh) {
    e.members = members;
    e.first = now;
    e.timeout = timeout_of(d);
  }
  e.posted.push_back(p);
  e.lists.push_back(members);
  if (e.members != members) {
    std::ostringstream t;
    t << "communicator " << d.comm_id << " created with different member lists:";
    for (std::size_t i = 0; i < e.posted.size(); ++i) {
      t << (i ? "; " : " ") << "slot " << e.posted[i].slot << " asked for [";
      for (std::size_t k = 0; k < e.lists[i].size(); ++k) t << (k ? "," : "") << e.lists[i][k];
      t << "]";
    }
    Match m{nullptr, e.posted, Status::Mismatch, t.str()};
    creates_.erase(it);
    out.push_back(std::move(m));
    return out;
  }
  int local_members = 0;
  for (int g : members) local_members += slot_of_global_[static_cast<std::size_t>(g)] >= 0;
  if (static_cast<int>(e.posted.size()) == local_members) {
    auto comm = std::make_unique<Communicator>();
    comm->id = d.comm_id;
    comm->global_ranks = members;
    for (int g : members) comm->slots.push_back(slot_of_global_[static_cast<std::size_t>(g)]);
    const Communicator* c = comm.get();
    comms_.emplace(d.comm_id, std::move(comm));
    Match m{c, std::move(e.posted), Status::Ok, {}};
    creates_.erase(it);
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<Match> Matcher::expire(Clock::time_point now, std::chrono::seconds stall_after,
                                   std::vector<StallInfo>& new_stalls) {
  std::vector<Match> out;
  // Fast operations that wait this long are the entries' to time out and report.
  for (auto& [id, ledger] : ledgers_) adopt(*ledger, ledger->take_aged(now), out);
  struct Failed {
    std::uint64_t comm, seq;
    std::string error;
  };
  std::vector<Failed> timed_out;
  for (auto it = collectives_.begin(); it != collectives_.end();) {
    auto& e = it->second;
    const auto age = now - e.first;
    std::vector<int> missing;
    for (int g = 0; g < e.comm->size(); ++g)
      if (!e.by_rank[static_cast<std::size_t>(g)] && e.comm->slots[static_cast<std::size_t>(g)] >= 0)
        missing.push_back(e.comm->global_ranks[static_cast<std::size_t>(g)]);
    const RequestDesc* any = nullptr;
    for (auto& q : e.by_rank)
      if (q) any = &q->desc;
    if (age >= e.timeout) {
      std::ostringstream s;
      s << describe_call(*any) << " on communicator " << std::get<0>(it->first) << " (operation #"
        << std::get<1>(it->first) << ") timed out after "
        << std::chrono::duration_cast<std::chrono::milliseconds>(e.timeout).count() / 1000.0
        << " s: rank(s)";
      for (int g : missing) s << " " << g;
      s << " never posted it";
      timed_out.push_back({std::get<0>(it->first), std::get<1>(it->first), s.str()});
      out.push_back(fail_entry(e, Status::Timeout, s.str()));
      it = collectives_.erase(it);
      continue;
    }
    if (!e.stall_reported && age >= stall_after) {
      e.stall_reported = true;
      new_stalls.push_back({std::get<0>(it->first), std::get<1>(it->first), any->op,
                            std::chrono::duration<double>(age).count(), missing});
    }
    ++it;
  }
  for (const auto& f : timed_out) fail_seq(f.comm, f.seq, Status::Timeout, f.error, out);
  for (auto it = p2p_.begin(); it != p2p_.end();) {
    auto& e = it->second;
    const auto age = now - e.first;
    const Posted& have = e.send ? *e.send : *e.recv;
    const int missing_group = e.send ? std::get<2>(it->first) : std::get<1>(it->first);
    const int missing = e.comm->global_ranks[static_cast<std::size_t>(missing_group)];
    if (age >= e.timeout) {
      Match m{e.comm, {have}, Status::Timeout,
              describe_call(have.desc) + " timed out: rank " + std::to_string(missing) + " never posted the matching " +
                  (e.send ? "recv" : "send")};
      out.push_back(std::move(m));
      it = p2p_.erase(it);
      continue;
    }
    if (!e.stall_reported && age >= stall_after) {
      e.stall_reported = true;
      new_stalls.push_back({std::get<0>(it->first), std::get<3>(it->first), have.desc.op,
                            std::chrono::duration<double>(age).count(), {missing}});
    }
    ++it;
  }
  for (auto it = creates_.begin(); it != creates_.end();) {
    if (now - it->second.first >= it->second.timeout) {
      out.push_back({nullptr, it->second.posted, Status::Timeout,
                     "creating communicator " + std::to_string(it->first) + " timed out: not every member joined"});
      it = creates_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void Matcher::add_waits(Clock::time_point now, std::vector<RankWait>& out) const {
  const auto waited = [&](const Posted& p) { return std::chrono::duration<double>(now - p.at).count(); };
  for (const auto& [key, e] : collectives_) {
    std::vector<int> missing;
    for (int g = 0; g < e.comm->size(); ++g)
      if (!e.by_rank[static_cast<std::size_t>(g)] && e.comm->slots[static_cast<std::size_t>(g)] >= 0)
        missing.push_back(e.comm->global_ranks[static_cast<std::size_t>(g)]);
    for (const auto& p : e.by_rank)
      if (p)
        out.push_back({e.comm->global_ranks[static_cast<std::size_t>(p->group_rank)], false, 0, p->desc.op,
                       std::get<0>(key), std::get<1>(key), waited(*p), missing});
  }
  for (const auto& [key, e] : p2p_) {
    const Posted& have = e.send ? *e.send : *e.recv;
    const int missing_group = e.send ? std::get<2>(key) : std::get<1>(key);
    out.push_back({e.comm->global_ranks[static_cast<std::size_t>(have.group_rank)], false, 0, have.desc.op,
                   std::get<0>(key), std::get<3>(key), waited(have),
                   {e.comm->global_ranks[static_cast<std::size_t>(missing_group)]}});
  }
}

std::vector<StallInfo> Matcher::stalls(Clock::time_point now, std::chrono::seconds stall_after) const {
  std::vector<StallInfo> out;
  for (const auto& [key, e] : collectives_) {
    const auto age = now - e.first;
    if (age < stall_after) continue;
    StallInfo s{std::get<0>(key), std::get<1>(key), ipc::OpType::Barrier, std::chrono::duration<double>(age).count(), {}};
    for (int g = 0; g < e.comm->size(); ++g) {
      const auto& q = e.by_rank[static_cast<std::size_t>(g)];
      if (q) s.op = q->desc.op;
      else if (e.comm->slots[static_cast<std::size_t>(g)] >= 0)
        s.missing_global_ranks.push_back(e.comm->global_ranks[static_cast<std::size_t>(g)]);
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<Match> Matcher::fail_waiting_for(int slot, Status status, const std::string& error) {
  std::vector<Match> out;
  for (auto& [id, ledger] : ledgers_)
    if (const int g = ledger->group_rank_of(slot); g >= 0) adopt(*ledger, ledger->take_waiting_for(g), out);
  for (auto it = collectives_.begin(); it != collectives_.end();) {
    auto& e = it->second;
    auto g = e.comm->group_rank_of_slot(slot);
    if (g && !e.by_rank[static_cast<std::size_t>(*g)]) {
      failed_[{std::get<0>(it->first), std::get<1>(it->first)}] = Failure{status, error};
      out.push_back(fail_entry(e, status, error));
      it = collectives_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = creates_.begin(); it != creates_.end();) {
    const auto& e = it->second;
    bool waits = false;
    for (int g : e.members) {
      if (slot_of_global_[static_cast<std::size_t>(g)] != slot) continue;
      waits = std::none_of(e.posted.begin(), e.posted.end(), [&](const Posted& p) { return p.slot == slot; });
    }
    if (waits) {
      out.push_back({nullptr, e.posted, status, error});
      it = creates_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = p2p_.begin(); it != p2p_.end();) {
    auto& e = it->second;
    const int missing_group = e.send ? std::get<2>(it->first) : std::get<1>(it->first);
    if (e.comm->slots[static_cast<std::size_t>(missing_group)] == slot) {
      out.push_back({e.comm, {e.send ? *e.send : *e.recv}, status, error});
      it = p2p_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<Match> Matcher::fail_sequence(std::uint64_t comm, std::uint64_t seq, Status status,
                                          const std::string& error) {
  std::vector<Match> out;
  if (FastLedger* ledger = fast_ledger(comm)) leave_ledger(*ledger, seq, out);
  fail_seq(comm, seq, status, error, out);
  return out;
}

std::vector<Match> Matcher::fail_partners(int group_rank, const RequestDesc& d, Status status,
                                          const std::string& error) {
  std::vector<Match> out;
  if (d.op == OpType::CommCreate) return out;
  if (d.op != OpType::Send && d.op != OpType::Recv) {
    if (FastLedger* ledger = fast_ledger(d.comm_id)) leave_ledger(*ledger, d.seq, out);
    fail_seq(d.comm_id, d.seq, status, error, out);
    return out;
  }
  const P2pOp op = p2p_op(group_rank, d);
  failed_p2p_[op] = Failure{status, error};
  while (failed_p2p_.size() > 4096) failed_p2p_.erase(failed_p2p_.begin());
  // Every chunk of the partner's side already waiting here (a waiting entry holds one side).
  auto it = p2p_.lower_bound(std::tuple_cat(op, std::make_tuple(std::uint64_t{0})));
  const auto op_of = [](const P2pKey& k) { return P2pOp{std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k)}; };
  while (it != p2p_.end() && op_of(it->first) == op) {
    out.push_back({it->second.comm, {it->second.send ? *it->second.send : *it->second.recv}, status, error});
    it = p2p_.erase(it);
  }
  return out;
}

std::vector<Match> Matcher::fail_all(Status status, const std::string& error) {
  std::vector<Match> out;
  for (auto& [id, ledger] : ledgers_) adopt(*ledger, ledger->take_all(), out);
  for (auto& [key, e] : collectives_) {
    Match m{e.comm, {}, status, error};
    for (auto& q : e.by_rank)
      if (q) m.posted.push_back(*q);
    out.push_back(std::move(m));
  }
  collectives_.clear();
  for (auto& [key, e] : p2p_) {
    Match m{e.comm, {}, status, error};
    if (e.send) m.posted.push_back(*e.send);
    if (e.recv) m.posted.push_back(*e.recv);
    out.push_back(std::move(m));
  }
  p2p_.clear();
  for (auto& [id, e] : creates_) out.push_back({nullptr, e.posted, status, error});
  creates_.clear();
  return out;
}

}  // namespace smddp::daemon
