// Rank-side GPU execution (kFlagRankExec) through a real Daemon: the daemon runs in a thread of
// the test (serve_attached: the ranks attach by themselves) and the ranks are Clients in the
// same process, one per local rank. The daemon never touches CUDA for these requests, so the
// buffer references carry fake IPC handle bytes and the test runs on any machine.
//
// What is checked: every member gets the handles of the others' allocations it was not sent
// yet (once per receiver, owner and allocation, again only when the bytes change), then a plan
// whose members are the group's slots and whose `me` is the receiver; members that disagree on
// the flag, or a group larger than the plan holds, get a Mismatch. Fast-path requests
// (kFlagRankFast) are matched and answered without handles or plans, and a member that
// disagrees with them (another size, or the plan path) gets a Mismatch.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "daemon/config.hpp"
#include "daemon/daemon.hpp"
#include "ipc/protocol.hpp"
#include "tests/daemon/daemon_thread.hpp"

namespace smddp::daemon {
namespace {

using namespace std::chrono_literals;
using client::Client;
using client::DeviceBuffer;
using client::DeviceCall;
using client::WorkPtr;
using ipc::CompletionKind;
using ipc::DType;
using ipc::OpType;
using ipc::ReduceOp;
using ipc::Status;

std::string unique_job(const char* tag) { return test_daemon::unique_job("t-rankexec-", tag); }

using test_daemon::DaemonThread;

// What one rank's exec handler received.
class Recorder {
 public:
  Client::ExecHandler handler() {
    return [this](std::uint64_t token, const ipc::CompletionDesc& c) {
      std::lock_guard lk(mu_);
      calls_.push_back({token, c});
    };
  }
  struct Call {
    std::uint64_t token;
    ipc::CompletionDesc c;
  };
  // The calls since the last take().
  std::vector<Call> take() {
    std::lock_guard lk(mu_);
    std::vector<Call> out;
    out.swap(calls_);
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<Call> calls_;
};

// One in-process rank: its client and its handler's record. The recorder outlives the client.
// Leaving detaches: a pending op keeps a client alive, and the daemon thread ends only once
// every rank has left.
struct Rank {
  Recorder rec;
  std::shared_ptr<Client> client;
  Rank() = default;
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;
  ~Rank() {
    if (client) client->detach();
  }
};

std::vector<std::unique_ptr<Rank>> attach_ranks(const std::string& job, int n) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < n; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->client = Client::attach(test_daemon::rank_options(job, r, n));
    rank->client->set_exec_handler(rank->rec.handler());
    ranks.push_back(std::move(rank));
  }
  return ranks;
}

DeviceBuffer fake_buffer(std::uint8_t fill, std::uint64_t alloc_id, std::uint64_t bytes, std::uint64_t offset = 0) {
  DeviceBuffer b;
  b.ipc_handle.fill(fill);
  b.alloc_id = alloc_id;
  b.alloc_bytes = 1 << 20;
  b.offset = offset;
  b.bytes = bytes;
  return b;
}

constexpr std::uint64_t kCount = 256;

// Rank r's in-place allreduce on allocation `alloc_id` whose handle bytes are all `fill`.
DeviceCall allreduce(std::uint64_t token, std::uint8_t fill, std::uint64_t alloc_id) {
  DeviceCall c;
  c.op = OpType::AllReduce;
  c.dtype = DType::Float32;
  c.reduce_op = ReduceOp::Sum;
  c.count = kCount;
  c.input = fake_buffer(fill, alloc_id, kCount * 4, 512);
  c.output = c.input;
  c.rank_exec = true;
  c.exec_token = token;
  return c;
}

bool handle_is(const ipc::PlanHandle& h, std::uint8_t fill) {
  for (std::size_t i = 0; i < ipc::kCudaIpcHandleBytes; ++i)
    if (h.handle[i] != fill) return false;
  return true;
}

// Checks a Handles completion that carries exactly one handle: `slot`'s allocation `alloc_id`,
// whose fake handle bytes are all `fill`.
void expect_one_handle(const Recorder::Call& call, int slot, std::uint64_t alloc_id, std::uint8_t fill) {
  ASSERT_EQ(call.c.kind, CompletionKind::Handles);
  ASSERT_EQ(call.c.plan_header().handles, 1);
  EXPECT_EQ(call.c.plan_handle(0).slot, slot);
  EXPECT_EQ(call.c.plan_handle(0).alloc_id, alloc_id);
  EXPECT_TRUE(handle_is(call.c.plan_handle(0), fill));
}

// Posts calls[r] on rank r, in rank order.
std::vector<WorkPtr> post(const std::vector<std::unique_ptr<Rank>>& ranks, const std::vector<DeviceCall>& calls) {
  std::vector<WorkPtr> w;
  for (std::size_t r = 0; r < calls.size(); ++r) w.push_back(ranks[r]->client->world()->device_op(calls[r]));
  return w;
}

using test_daemon::wait_all;

// Checks a Plan completion of a two-member allreduce: members by group rank (slot 0, slot 1),
// their buffers, and `me`.
void expect_plan(const Recorder::Call& call, std::uint64_t token, int me,
                 const std::vector<std::pair<std::uint64_t, std::uint64_t>>& in_out_allocs) {
  EXPECT_EQ(call.token, token);
  ASSERT_EQ(call.c.kind, CompletionKind::Plan);
  EXPECT_EQ(call.c.status, Status::Ok);
  const auto h = call.c.plan_header();
  ASSERT_EQ(h.members, in_out_allocs.size());
  EXPECT_EQ(h.me, me);
  EXPECT_EQ(h.handles, 0);
  for (int i = 0; i < h.members; ++i) {
    const auto m = call.c.plan_member(i);
    EXPECT_EQ(m.slot, i) << "member " << i;
    EXPECT_EQ(m.in.alloc_id, in_out_allocs[static_cast<std::size_t>(i)].first) << "member " << i;
    EXPECT_EQ(m.in.offset, 512u) << "member " << i;
    EXPECT_EQ(m.in.bytes, kCount * 4) << "member " << i;
    EXPECT_EQ(m.out.alloc_id, in_out_allocs[static_cast<std::size_t>(i)].second) << "member " << i;
    EXPECT_EQ(m.out.bytes, kCount * 4) << "member " << i;
  }
}

// Waits for `w`, which must fail with a Mismatch whose text contains `needle`.
void expect_mismatch(const WorkPtr& w, const char* needle) {
  try {
    w->wait(20s);
    ADD_FAILURE() << "a disagreeing rank's op succeeded";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), Status::Mismatch) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(DaemonRankExec, HandlesAreSentOncePerAllocationThenOnlyPlans) {
  spdlog::set_level(spdlog::level::warn);
  const auto job = unique_job("handles");
  DaemonThread daemon(job, 2);
  auto ranks = attach_ranks(job, 2);
  const std::uint8_t fill[2] = {0xA0, 0xB1};
  const std::uint64_t alloc[2] = {100, 101};

  // 1st: each rank gets one Handles completion with the other's handle, then its plan.
  {
    std::vector<WorkPtr> w;
    for (int r = 0; r < 2; ++r) w.push_back(ranks[r]->client->world()->device_op(allreduce(10 + r, fill[r], alloc[r])));
    wait_all(w);
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_EQ(w[r]->status(), Status::Ok);
      const auto calls = ranks[r]->rec.take();
      ASSERT_EQ(calls.size(), 2u);
      EXPECT_EQ(calls[0].token, 10u + r);
      ASSERT_EQ(calls[0].c.kind, CompletionKind::Handles);
      EXPECT_EQ(calls[0].c.status, Status::Ok);
      ASSERT_EQ(calls[0].c.plan_header().handles, 1) << "in and out share one allocation: one handle";
      const auto h = calls[0].c.plan_handle(0);
      const int peer = 1 - r;
      EXPECT_EQ(h.slot, peer);
      EXPECT_EQ(h.alloc_id, alloc[peer]);
      EXPECT_TRUE(handle_is(h, fill[peer])) << "the peer's handle bytes";
      expect_plan(calls[1], 10u + r, r, {{100, 100}, {101, 101}});
    }
  }

  // 2nd, identical: the handles were sent, so only the plans come.
  {
    std::vector<WorkPtr> w;
    for (int r = 0; r < 2; ++r) w.push_back(ranks[r]->client->world()->device_op(allreduce(20 + r, fill[r], alloc[r])));
    wait_all(w);
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const auto calls = ranks[r]->rec.take();
      ASSERT_EQ(calls.size(), 1u) << "a handle was sent twice";
      expect_plan(calls[0], 20u + r, r, {{100, 100}, {101, 101}});
    }
  }

  // 3rd: rank 0's allocation has new handle bytes (same id): rank 1 is sent them again.
  {
    const auto w = post(ranks, {allreduce(30, 0xC2, alloc[0]), allreduce(31, fill[1], alloc[1])});
    wait_all(w);
    auto calls0 = ranks[0]->rec.take();
    ASSERT_EQ(calls0.size(), 1u) << "rank 1's handle did not change";
    expect_plan(calls0[0], 30, 0, {{100, 100}, {101, 101}});
    auto calls1 = ranks[1]->rec.take();
    ASSERT_EQ(calls1.size(), 2u);
    expect_one_handle(calls1[0], 0, 100u, 0xC2);
    expect_plan(calls1[1], 31, 1, {{100, 100}, {101, 101}});
  }

  // 4th: rank 1 writes into a new allocation: rank 0 is sent only that one's handle.
  {
    auto call1 = allreduce(41, fill[1], alloc[1]);
    call1.output = fake_buffer(0xD3, 201, kCount * 4, 512);
    const auto w = post(ranks, {allreduce(40, 0xC2, alloc[0]), call1});
    wait_all(w);
    auto calls0 = ranks[0]->rec.take();
    ASSERT_EQ(calls0.size(), 2u);
    expect_one_handle(calls0[0], 1, 201u, 0xD3);
    expect_plan(calls0[1], 40, 0, {{100, 100}, {101, 201}});
    auto calls1 = ranks[1]->rec.take();
    ASSERT_EQ(calls1.size(), 1u);
    expect_plan(calls1[0], 41, 1, {{100, 100}, {101, 201}});
  }
}

// A rank that frees an allocation it exported (torch's allocator reports it) has it named,
// kPlanHandleReleased, in the next Handles completion of every rank that was sent its handle,
// ahead of that rank's next plan, and only once; an allocation never sent to anyone is named to
// nobody. (Before, the receivers kept such mappings open for the whole job, which kept the
// owner's freed memory held: 256 MiB more per freed 256 MiB tensor on 2xH200,
// scripts/diag/ipc_release_probe.py.)
TEST(DaemonRankExec, AFreedAllocationIsNamedToTheRanksThatMappedIt) {
  spdlog::set_level(spdlog::level::warn);
  const auto job = unique_job("release");
  DaemonThread daemon(job, 2);
  auto ranks = attach_ranks(job, 2);
  {
    const auto w = post(ranks, {allreduce(10, 0xA0, 100), allreduce(11, 0xB1, 101)});
    wait_all(w);
    for (auto& r : ranks) r->rec.take();
  }
  ranks[0]->client->release_allocation(100);
  ranks[1]->client->release_allocation(999);  // never exported to anyone
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::uint64_t t = 20 + 10 * static_cast<std::uint64_t>(round);
    const auto w = post(ranks, {allreduce(t, 0xE4, 102), allreduce(t + 1, 0xB1, 101)});
    wait_all(w);
    auto calls0 = ranks[0]->rec.take();
    ASSERT_EQ(calls0.size(), 1u) << "rank 0 was told of something";
    expect_plan(calls0[0], t, 0, {{102, 102}, {101, 101}});
    auto calls1 = ranks[1]->rec.take();
    if (round == 1) {
      ASSERT_EQ(calls1.size(), 1u) << "a release or a handle was sent twice";
      expect_plan(calls1[0], t + 1, 1, {{102, 102}, {101, 101}});
      continue;
    }
    ASSERT_EQ(calls1.size(), 2u);
    ASSERT_EQ(calls1[0].c.kind, CompletionKind::Handles);
    ASSERT_EQ(calls1[0].c.plan_header().handles, 2);
    const auto released = calls1[0].c.plan_handle(0);
    EXPECT_EQ(released.slot, 0);
    EXPECT_EQ(released.alloc_id, 100u);
    EXPECT_EQ(released.flags, ipc::kPlanHandleReleased);
    const auto fresh = calls1[0].c.plan_handle(1);
    EXPECT_EQ(fresh.slot, 0);
    EXPECT_EQ(fresh.alloc_id, 102u);
    EXPECT_EQ(fresh.flags, 0u);
    EXPECT_TRUE(handle_is(fresh, 0xE4));
    expect_plan(calls1[1], t + 1, 1, {{102, 102}, {101, 101}});
  }
}

// Rank r's uneven alltoall (float32): sends[q] elements to rank q, recvs[q] from it.
DeviceCall alltoallv(std::uint64_t token, std::uint8_t fill, std::uint64_t alloc_id, std::vector<std::uint64_t> sends,
                     std::vector<std::uint64_t> recvs) {
  std::uint64_t in = 0, out = 0;
  for (auto v : sends) in += v;
  for (auto v : recvs) out += v;
  DeviceCall c;
  c.op = OpType::AllToAll;
  c.dtype = DType::Float32;
  c.input = fake_buffer(fill, alloc_id, in * 4);
  c.output = fake_buffer(fill, alloc_id + 1000, out * 4);
  c.splits = sends;
  c.splits.insert(c.splits.end(), recvs.begin(), recvs.end());
  c.rank_exec = true;
  c.exec_token = token;
  return c;
}

// Rank r's op `w[r]` succeeded and the last completion it got is a plan: that completion
// (none, after a reported failure, otherwise).
std::optional<Recorder::Call> ok_plan(const std::vector<std::unique_ptr<Rank>>& ranks, const std::vector<WorkPtr>& w,
                                      int r) {
  const auto u = static_cast<std::size_t>(r);
  EXPECT_EQ(w[u]->status(), Status::Ok) << "rank " << r;
  const auto calls = ranks[u]->rec.take();
  if (calls.empty() || calls.back().c.kind != CompletionKind::Plan) {
    ADD_FAILURE() << "rank " << r << " got no plan last";
    return std::nullopt;
  }
  return calls.back();
}

// An uneven AllToAll runs rank-side too: the daemon checks the members' split tables against
// each other and sends each member, per peer, its block's length and place in the peer's
// output, and the peer's block's length and place in the peer's input. Tables that disagree
// fail every member, naming the ranks. (Before, uneven AllToAll on CUDA tensors ran in the
// daemon, whose GPU contexts time-slice with the ranks'.)
TEST(DaemonRankExec, UnevenAllToAllPlansCarryEveryBlock) {
  spdlog::set_level(spdlog::level::warn);
  const auto job = unique_job("a2av");
  DaemonThread daemon(job, 2);
  auto ranks = attach_ranks(job, 2);
  // Rank 0 sends 3 to itself and 5 to rank 1; rank 1 sends 7 to rank 0 and 0 to itself.
  {
    const auto w = post(ranks, {alltoallv(10, 0xA0, 100, {3, 5}, {3, 7}), alltoallv(11, 0xB1, 101, {7, 0}, {5, 0})});
    wait_all(w);
    const ipc::PlanSplit want[2][2] = {
        // rank 0: to itself 3 at 0 of its output, from itself 3 at 0; to rank 1: 5 at 0 of rank
        // 1's output, from rank 1: 7 at 0 of rank 1's input.
        {{3, 0, 3, 0}, {5, 0, 7, 0}},
        // rank 1: to rank 0: 7 at 3 of rank 0's output, from rank 0: 5 at 3 of rank 0's input;
        // to itself nothing, at 5 of its output, from 7 of its input.
        {{7, 3, 5, 3}, {0, 5, 0, 7}},
    };
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const auto call = ok_plan(ranks, w, r);
      ASSERT_TRUE(call);
      const auto& plan = call->c;
      EXPECT_TRUE(plan.plan_header().flags & ipc::kPlanSplits);
      for (int q = 0; q < 2; ++q) {
        const auto x = plan.plan_split(q);
        const auto& y = want[r][q];
        EXPECT_EQ(x.send, y.send) << "member " << q;
        EXPECT_EQ(x.send_dst, y.send_dst) << "member " << q;
        EXPECT_EQ(x.recv, y.recv) << "member " << q;
        EXPECT_EQ(x.recv_src, y.recv_src) << "member " << q;
      }
    }
  }
  // Rank 1 expects 4 from rank 0, which sends 5.
  {
    const auto w = post(ranks, {alltoallv(20, 0xA0, 100, {3, 5}, {3, 7}), alltoallv(21, 0xB1, 101, {7, 0}, {4, 0})});
    for (const auto& x : w) expect_mismatch(x, "rank 0 sends 5 elements to rank 1, which expects 4");
  }
}

// A member of an uneven AllToAll that sends and receives nothing has no buffers at all (its
// tensors are empty), yet it runs the plan's barriers with the others: it gets a plan, not a
// "ranks disagree" error.
TEST(DaemonRankExec, UnevenAllToAllMemberWithNothingToMoveGetsAPlan) {
  spdlog::set_level(spdlog::level::warn);
  const auto job = unique_job("a2av0");
  DaemonThread daemon(job, 2);
  auto ranks = attach_ranks(job, 2);
  auto idle = alltoallv(11, 0xB1, 101, {0, 0}, {0, 0});
  idle.input.reset();
  idle.output.reset();
  const auto w = post(ranks, {alltoallv(10, 0xA0, 100, {4, 0}, {4, 0}), idle});
  wait_all(w);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto call = ok_plan(ranks, w, r);
    ASSERT_TRUE(call);
    const auto& plan = call->c;
    EXPECT_EQ(call->token, static_cast<std::uint64_t>(10 + r));
    EXPECT_EQ(plan.plan_member(1).in.alloc_id, 0u) << "the idle member has no buffers";
    EXPECT_EQ(plan.plan_member(1).out.alloc_id, 0u);
    EXPECT_EQ(plan.plan_split(1).send, 0u);
    EXPECT_EQ(plan.plan_split(1).recv, 0u);
    EXPECT_EQ(plan.plan_split(0).send, r == 0 ? 4u : 0u);
  }
}

// A request the daemon refuses (here: an AllReduce without its buffers)
// fails that rank's op, and the other members' of the same op too, whether they posted before
// or after it: without it they could only wait for the timeout.
TEST(DaemonRankExec, ARefusedRequestFailsTheOtherMembersAtOnce) {
  spdlog::set_level(spdlog::level::err);
  const auto job = unique_job("refused");
  DaemonThread daemon(job, 2);
  auto ranks = attach_ranks(job, 2);
  auto refused = [](std::uint64_t token) {
    auto c = allreduce(token, 0xB1, 101);
    c.input.reset();
    c.output.reset();
    return c;
  };
  const auto expect_refused = [](const WorkPtr& w, Status status, const char* needle) {
    try {
      w->wait(5s);
      ADD_FAILURE() << "the op succeeded";
    } catch (const client::Error& e) {
      EXPECT_EQ(e.status(), status) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  for (const bool good_first : {true, false}) {
    SCOPED_TRACE(good_first ? "the good request first" : "the refused request first");
    const std::uint64_t t = good_first ? 10 : 20;
    std::vector<WorkPtr> w(2);
    if (good_first) {
      w[0] = ranks[0]->client->world()->device_op(allreduce(t, 0xA0, 100));
      w[1] = ranks[1]->client->world()->device_op(refused(t + 1));
    } else {
      w[1] = ranks[1]->client->world()->device_op(refused(t + 1));
      w[0] = ranks[0]->client->world()->device_op(allreduce(t, 0xA0, 100));
    }
    expect_refused(w[1], Status::InvalidRequest, "input buffer missing");
    expect_refused(w[0], Status::InvalidRequest, "rank 1's allreduce was refused: invalid request allreduce");
  }
  // The communicator goes on with the next operation.
  wait_all(post(ranks, {allreduce(30, 0xA0, 100), allreduce(31, 0xB1, 101)}));
}

TEST(DaemonRankExec, SendRecvPlansListSenderThenReceiver) {
  spdlog::set_level(spdlog::level::warn);
  const auto job = unique_job("p2p");
  DaemonThread daemon(job, 2);
  auto ranks = attach_ranks(job, 2);
  DeviceCall send;
  send.op = OpType::Send;
  send.count = 64;
  send.root = 1;
  send.tag = 3;
  send.input = fake_buffer(0x51, 300, 64 * 4);
  send.rank_exec = true;
  send.exec_token = 1;
  DeviceCall recv = send;
  recv.op = OpType::Recv;
  recv.root = 0;
  recv.input.reset();
  recv.output = fake_buffer(0x62, 311, 64 * 4, 1024);
  recv.exec_token = 2;
  // The receiver posts first: the order of posting must not matter.
  std::vector<WorkPtr> w(2);
  w[1] = ranks[1]->client->world()->device_op(recv);
  w[0] = ranks[0]->client->world()->device_op(send);
  wait_all(w);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto calls = ranks[r]->rec.take();
    ASSERT_EQ(calls.size(), 2u);
    expect_one_handle(calls[0], 1 - r, r == 0 ? 311u : 300u, r == 0 ? 0x62 : 0x51);
    const auto& plan = calls[1].c;
    EXPECT_EQ(calls[1].token, static_cast<std::uint64_t>(r + 1));
    ASSERT_EQ(plan.kind, CompletionKind::Plan);
    ASSERT_EQ(plan.plan_header().members, 2);
    EXPECT_EQ(plan.plan_header().me, r) << "members are (send, recv)";
    const auto s = plan.plan_member(0), d = plan.plan_member(1);
    EXPECT_EQ(s.slot, 0);
    EXPECT_EQ(s.in.alloc_id, 300u);
    EXPECT_EQ(s.out.alloc_id, 0u) << "a send writes nothing";
    EXPECT_EQ(d.slot, 1);
    EXPECT_EQ(d.in.alloc_id, 0u);
    EXPECT_EQ(d.out.alloc_id, 311u);
    EXPECT_EQ(d.out.offset, 1024u);
  }
}

TEST(DaemonRankExec, RanksThatDisagreeOnTheFlagGetAMismatch) {
  spdlog::set_level(spdlog::level::warn);
  const auto job = unique_job("disagree");
  DaemonThread daemon(job, 2);
  auto ranks = attach_ranks(job, 2);
  // Rank 0 asks for rank-side execution; rank 1 posts the same allreduce without the flag. (On
  // host buffers: a CUDA request without the flag needs the daemon's own GPU path, which a
  // CPU-only machine has not, and is refused before it is matched.)
  auto w0 = ranks[0]->client->world()->device_op(allreduce(7, 0xA0, 100));
  std::vector<float> host(kCount, 1.0f);
  auto w1 = ranks[1]->client->world()->allreduce(host.data(), host.data(), kCount, DType::Float32, ReduceOp::Sum);
  for (auto* w : {&w0, &w1}) expect_mismatch(*w, "disagree");
  const auto calls = ranks[0]->rec.take();
  ASSERT_EQ(calls.size(), 1u) << "no handles or plan for a failed match";
  EXPECT_EQ(calls[0].token, 7u);
  EXPECT_EQ(calls[0].c.kind, CompletionKind::Final);
  EXPECT_EQ(calls[0].c.status, Status::Mismatch);
  EXPECT_NE(std::string(calls[0].c.error_text()).find("disagree"), std::string::npos);
  EXPECT_TRUE(ranks[1]->rec.take().empty()) << "a host op reached the exec handler";

  // The communicator still works, and the failed op sent no handle: the next one sends them.
  std::vector<WorkPtr> w;
  for (int r = 0; r < 2; ++r)
    w.push_back(ranks[r]->client->world()->device_op(allreduce(8, static_cast<std::uint8_t>(0xA0 + r), 100 + r)));
  wait_all(w);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto after = ranks[r]->rec.take();
    ASSERT_EQ(after.size(), 2u);
    EXPECT_EQ(after[0].c.kind, CompletionKind::Handles);
    expect_plan(after[1], 8, r, {{100, 100}, {101, 101}});
  }
}

TEST(DaemonRankExec, RanksWithDifferentScheduleKeysGetAMismatchAndNoPlan) {
  // One rank set SMDDP_ONESHOT_MAX_BYTES (say): its barrier count for this op would differ.
  spdlog::set_level(spdlog::level::warn);
  const auto job = unique_job("schedkey");
  DaemonThread daemon(job, 2);
  auto ranks = attach_ranks(job, 2);
  std::vector<WorkPtr> w;
  for (int r = 0; r < 2; ++r) {
    auto c = allreduce(20, static_cast<std::uint8_t>(0xC0 + r), 400 + r);
    c.wait_value = 1000 + static_cast<std::uint64_t>(r);
    w.push_back(ranks[r]->client->world()->device_op(c));
  }
  for (auto& wk : w) expect_mismatch(wk, "different GPU schedules");
  for (int r = 0; r < 2; ++r) {
    const auto calls = ranks[r]->rec.take();
    ASSERT_EQ(calls.size(), 1u) << "rank " << r << ": handles or a plan for a failed match";
    EXPECT_EQ(calls[0].c.status, Status::Mismatch);
  }
}

TEST(DaemonRankExec, GroupsLargerThanAPlanAreRefused) {
  spdlog::set_level(spdlog::level::warn);
  const int n = ipc::kPlanMaxMembers + 1;
  const auto job = unique_job("big");
  DaemonThread daemon(job, n);
  auto ranks = attach_ranks(job, n);
  std::vector<WorkPtr> w;
  for (int r = 0; r < n; ++r)
    w.push_back(ranks[r]->client->world()->device_op(allreduce(r, static_cast<std::uint8_t>(r), 100 + r)));
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    try {
      w[r]->wait(20s);
      ADD_FAILURE() << "a group of " << n << " got plans";
    } catch (const client::Error& e) {
      EXPECT_EQ(e.status(), Status::Mismatch) << e.what();
      EXPECT_NE(std::string(e.what()).find("groups of up to " + std::to_string(ipc::kPlanMaxMembers)),
                std::string::npos)
          << e.what();
    }
    const auto calls = ranks[r]->rec.take();
    ASSERT_EQ(calls.size(), 1u) << "handles were sent for a refused group";
    EXPECT_EQ(calls[0].c.kind, CompletionKind::Final);
  }
}

}  // namespace smddp::daemon

namespace smddp::daemon {
namespace {

// Opens once; waiters block until then.
class Gate {
 public:
  void wait() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return open_; });
  }
  void open() {
    std::lock_guard lk(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace

// Handles completions come on top of the one completion per request that the client's limit
// on requests in flight (kCompletionRingCapacity) was sized for. A rank whose progress thread
// is held up for a moment (here: its exec handler, deterministically) with fewer requests in
// flight than its ring holds must not fail the job: the daemon's plain completions (complete())
// assume the ring always has room and fail the whole job when it has none.
// (Failed before the daemon waited on a full ring: "rank 0 has more requests in flight than its
// completion ring holds" while it had 130.)
TEST(DaemonRankExec, HandlesCompletionsDoNotOverflowTheCompletionRing) {
  spdlog::set_level(spdlog::level::warn);
  const auto job = unique_job("ring");
  DaemonThread daemon(job, 2);
  Gate gate;
  std::atomic<int> seen0{0};
  auto ranks = attach_ranks(job, 2);
  struct OpenOnExit {  // a test that stops early must not leave rank 0's thread at the gate
    Gate& gate;
    ~OpenOnExit() { gate.open(); }
  } open_on_exit{gate};
  // Rank 0's progress thread stops at the first completion until the gate opens.
  ranks[0]->client->set_exec_handler([&](std::uint64_t, const ipc::CompletionDesc&) {
    if (seen0.fetch_add(1) == 0) gate.wait();
  });
  // 128 ops on fresh allocations (Handles + Plan each), one more on an allocation already sent
  // (Plan only): 257 completions for rank 0, of which its thread took one, so its ring of 256
  // is full with 130 requests in flight. Then a host allreduce, answered by complete().
  constexpr int kFresh = static_cast<int>(ipc::kCompletionRingCapacity / 2);
  std::vector<WorkPtr> w0, w1;
  std::vector<float> host0(kCount, 1.0f), host1(kCount, 2.0f);
  const auto post = [&](int r, std::vector<WorkPtr>& w, std::vector<float>& host) {
    for (int i = 0; i <= kFresh; ++i) {
      const std::uint64_t alloc = 1000u * static_cast<std::uint64_t>(r + 1) + static_cast<std::uint64_t>(i % kFresh);
      w.push_back(ranks[r]->client->world()->device_op(allreduce(static_cast<std::uint64_t>(i), 0x40, alloc)));
    }
    w.push_back(ranks[r]->client->world()->allreduce(host.data(), host.data(), kCount, DType::Float32, ReduceOp::Sum));
  };
  post(0, w0, host0);
  post(1, w1, host1);
  // Rank 1 drains as usual; once its host allreduce is answered the daemon has answered rank
  // 0's too. (The bound only keeps a daemon that waits for rank 0's ring from deadlocking.)
  try {
    w1.back()->wait(3s);
  } catch (const client::Error&) {
  }
  gate.open();
  wait_all(w0);
  wait_all(w1);
  EXPECT_EQ(ranks[0]->client->job_error(), "");
  for (const auto& w : w0) EXPECT_EQ(w->status(), Status::Ok) << w->error();
  EXPECT_EQ(host0, std::vector<float>(kCount, 3.0f));
}

}  // namespace smddp::daemon

namespace smddp::daemon {
namespace {

// The rank's fast op number `seq` (counted over all its groups).
DeviceCall fast_allreduce(std::uint64_t count, std::uint64_t seq = 1) {
  DeviceCall c;
  c.op = OpType::AllReduce;
  c.dtype = DType::Float32;
  c.reduce_op = ReduceOp::Sum;
  c.count = count;
  c.fast = true;
  c.wait_value = seq;
  return c;
}

}  // namespace

TEST(DaemonRankFast, FastRequestsAreMatchedAndAnsweredWithoutPlans) {
  spdlog::set_level(spdlog::level::warn);
  const auto job = unique_job("fast");
  DaemonThread daemon(job, 2);
  auto ranks = attach_ranks(job, 2);
  for (std::uint64_t round = 1; round <= 3; ++round) {
    std::vector<WorkPtr> w;
    for (int r = 0; r < 2; ++r) w.push_back(ranks[r]->client->world()->device_op(fast_allreduce(kCount, round)));
    wait_all(w);
  }
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(ranks[r]->rec.take().empty()) << "rank " << r << " got handles or plans";
}

TEST(DaemonRankFast, AnotherSizeOrThePlanPathIsAMismatch) {
  spdlog::set_level(spdlog::level::warn);
  const auto job = unique_job("fastdis");
  DaemonThread daemon(job, 2);
  auto ranks = attach_ranks(job, 2);
  {
    auto w0 = ranks[0]->client->world()->device_op(fast_allreduce(8));
    auto w1 = ranks[1]->client->world()->device_op(fast_allreduce(16));
    expect_mismatch(w0, "mismatch");
    expect_mismatch(w1, "mismatch");
  }
  {
    // Rank 1 took the plan path (its tensor was larger than the fast path takes).
    auto w0 = ranks[0]->client->world()->device_op(fast_allreduce(kCount));
    auto w1 = ranks[1]->client->world()->device_op(allreduce(9, 0xB1, 201));
    expect_mismatch(w0, "fast path");
    expect_mismatch(w1, "fast path");
  }
  EXPECT_TRUE(ranks[0]->rec.take().empty());
  const auto calls = ranks[1]->rec.take();
  ASSERT_EQ(calls.size(), 1u) << "no handles or plan for a failed match";
  EXPECT_EQ(calls[0].c.status, Status::Mismatch);

  {
    // The same collective, but the ranks' kernels paired it with different fast ops (they
    // issued fast ops of two groups in different orders).
    auto w0 = ranks[0]->client->world()->device_op(fast_allreduce(kCount, 5));
    auto w1 = ranks[1]->client->world()->device_op(fast_allreduce(kCount, 6));
    expect_mismatch(w0, "different orders");
    expect_mismatch(w1, "rank 1 #6");
  }
  {
    // Rank 1's fast path is off after a failure of its own: it says so, and both get an error.
    auto w0 = ranks[0]->client->world()->device_op(fast_allreduce(kCount, 7));
    auto w1 = ranks[1]->client->world()->device_op(fast_allreduce(kCount, ipc::kFastSeqOff));
    expect_mismatch(w0, "rank 1 turned its GPU fast path off");
    expect_mismatch(w1, "turned its GPU fast path off");
  }
  // The communicator still works.
  std::vector<WorkPtr> w;
  for (int r = 0; r < 2; ++r) w.push_back(ranks[r]->client->world()->device_op(fast_allreduce(kCount, 8)));
  wait_all(w);
}

TEST(DaemonRankFast, NobodyWaitsAndTheProgressThreadStillFinishesEveryOp) {
  // As with the plugin's fast path: the caller never waits on the CPU, so only the client's
  // progress thread can take the completions (and free the ring for more requests).
  spdlog::set_level(spdlog::level::warn);
  const auto job = unique_job("fastnowait");
  DaemonThread daemon(job, 2);
  auto ranks = attach_ranks(job, 2);
  constexpr std::uint64_t kOps = 3 * ipc::kCompletionRingCapacity;  // more than the ring holds
  std::vector<std::vector<WorkPtr>> works(2);
  std::vector<std::thread> issuers;
  for (int r = 0; r < 2; ++r)
    issuers.emplace_back([&, r] {
      for (std::uint64_t k = 1; k <= kOps; ++k)
        works[static_cast<std::size_t>(r)].push_back(ranks[r]->client->world()->device_op(fast_allreduce(kCount, k)));
    });
  for (auto& t : issuers) t.join();
  const auto until = std::chrono::steady_clock::now() + 20s;
  for (const auto& rank_works : works)
    for (const auto& w : rank_works) {
      while (!w->done() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
      ASSERT_TRUE(w->done()) << "a fast op nobody waits for never finished";
      EXPECT_EQ(w->status(), Status::Ok) << w->error();
    }
}

TEST(DaemonRankFast, AFastCallWithBuffersIsRefusedByTheClient) {
  spdlog::set_level(spdlog::level::warn);
  const auto job = unique_job("fastbad");
  DaemonThread daemon(job, 1);
  auto ranks = attach_ranks(job, 1);
  auto c = fast_allreduce(kCount);
  c.input = fake_buffer(0xC0, 300, kCount * 4);
  try {
    ranks[0]->client->world()->device_op(c);
    ADD_FAILURE() << "accepted";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidRequest);
    EXPECT_NE(std::string(e.what()).find("no buffers"), std::string::npos) << e.what();
  }
}

}  // namespace smddp::daemon
