// Rank-side GPU execution (DeviceCall::rank_exec) as the client sees it: every completion of
// such an op goes to the exec handler with the call's token, in ring order; a Handles
// completion does not finish the op, the Plan after it does. The test plays the daemon and
// answers the requests by hand (FakeDaemon::push_completion); no CUDA is involved.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "fake_daemon.hpp"

using namespace std::chrono_literals;
using smddp::client::Client;
using smddp::client::DeviceBuffer;
using smddp::client::DeviceCall;
using smddp::client::DType;
using smddp::client::Error;
using smddp::client::OpType;
using smddp::client::ReduceOp;
using smddp::client::Status;
using smddp::client::Work;
using smddp::testing::Answer;
using smddp::testing::attach_options;
using smddp::testing::FakeDaemon;
using smddp::testing::small_spec;
using smddp::testing::unique_job;
namespace ipc = smddp::ipc;

namespace {

// What the exec handler was given, and whether the watched Work was already done then.
struct Call {
  std::uint64_t token = 0;
  ipc::CompletionDesc c;
  bool work_done = false;
};

class Recorder {
 public:
  // The handler to install; `watched` (may stay null) is the Work whose done() it samples.
  Client::ExecHandler handler() {
    return [this](std::uint64_t token, const ipc::CompletionDesc& c) {
      const Work* w = watched.load();
      std::lock_guard lk(mu_);
      calls_.push_back({token, c, w != nullptr && w->done()});
      cv_.notify_all();
    };
  }
  bool wait_for(std::size_t n) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 10s, [&] { return calls_.size() >= n; });
  }
  std::vector<Call> calls() const {
    std::lock_guard lk(mu_);
    return calls_;
  }
  std::atomic<const Work*> watched{nullptr};

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> calls_;
};

DeviceBuffer fake_buffer(std::uint8_t fill, std::uint64_t alloc_id, std::uint64_t bytes) {
  DeviceBuffer b;
  b.ipc_handle.fill(fill);  // fake IPC handle bytes: nobody maps them here
  b.alloc_id = alloc_id;
  b.alloc_bytes = 1 << 20;
  b.offset = 256;
  b.bytes = bytes;
  return b;
}

DeviceCall rank_exec_allreduce(std::uint64_t token, std::uint64_t n = 16) {
  DeviceCall call;
  call.op = OpType::AllReduce;
  call.dtype = DType::Float32;
  call.reduce_op = ReduceOp::Sum;
  call.count = n;
  call.input = fake_buffer(0x11, 77, n * 4);
  call.output = call.input;
  call.rank_exec = true;
  call.exec_token = token;
  return call;
}

ipc::CompletionDesc reply_to(const ipc::RequestDesc& d, ipc::CompletionKind kind) {
  ipc::CompletionDesc c;
  c.request_id = d.request_id;
  c.comm_id = d.comm_id;
  c.seq = d.seq;
  c.kind = kind;
  return c;
}

ipc::CompletionDesc handles_for(const ipc::RequestDesc& d, int peer_slot, std::uint64_t alloc_id, std::uint8_t fill) {
  auto c = reply_to(d, ipc::CompletionKind::Handles);
  ipc::PlanHeader h;
  h.handles = 1;
  c.set_plan_header(h);
  ipc::PlanHandle ph;
  ph.slot = peer_slot;
  ph.alloc_id = alloc_id;
  std::memset(ph.handle, fill, sizeof ph.handle);
  c.set_plan_handle(0, ph);
  return c;
}

ipc::CompletionDesc plan_for(const ipc::RequestDesc& d, std::uint16_t me) {
  auto c = reply_to(d, ipc::CompletionKind::Plan);
  for (int i = 0; i < 2; ++i) {
    ipc::PlanMember m;
    m.slot = i;
    m.in = {static_cast<std::uint64_t>(77 + i), 256, d.input.bytes};
    m.out = m.in;
    c.set_plan_member(i, m);
  }
  ipc::PlanHeader h;
  h.members = 2;
  h.me = me;
  c.set_plan_header(h);
  return c;
}

}  // namespace

TEST(ClientRankExec, HandlerGetsHandlesThenPlanAndOnlyThePlanFinishesTheOp) {
  const auto job = unique_job("rankexec");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  Recorder rec;
  auto c = Client::attach(attach_options(job));
  c->set_exec_handler(rec.handler());

  const std::uint64_t token = 0xC0FFEE;
  auto w = c->world()->device_op(rank_exec_allreduce(token));
  rec.watched = w.get();
  std::atomic<int> callbacks{0};
  w->on_complete([&] { callbacks++; });
  ASSERT_TRUE(daemon.wait_for_requests(1));
  const auto d = daemon.requests().at(0);
  // What the client posted: the flag, and the CUDA references with the handle bytes.
  EXPECT_NE(d.flags & ipc::kFlagRankExec, 0u);
  EXPECT_EQ(d.flags & (ipc::kFlagStreamValue | ipc::kFlagDaemonCpuWait), 0u);
  EXPECT_EQ(d.input.kind, ipc::BufferKind::CudaIpc);
  EXPECT_EQ(d.input.alloc_id, 77u);
  EXPECT_EQ(d.input.ipc_handle[0], 0x11);
  EXPECT_EQ(d.count, 16u);

  daemon.push_completion(0, handles_for(d, 1, 4242, 0x7E));
  ASSERT_TRUE(rec.wait_for(1));
  // The Handles completion reached the handler but did not end the op.
  EXPECT_FALSE(w->test());
  EXPECT_FALSE(w->done());
  EXPECT_EQ(callbacks.load(), 0);
  {
    const auto calls = rec.calls();
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].token, token);
    EXPECT_EQ(calls[0].c.kind, ipc::CompletionKind::Handles);
    EXPECT_EQ(calls[0].c.status, Status::Ok);
    EXPECT_EQ(calls[0].c.plan_header().handles, 1);
    const auto ph = calls[0].c.plan_handle(0);
    EXPECT_EQ(ph.slot, 1);
    EXPECT_EQ(ph.alloc_id, 4242u);
    EXPECT_EQ(ph.handle[0], 0x7E);
    EXPECT_EQ(ph.handle[ipc::kCudaIpcHandleBytes - 1], 0x7E);
    EXPECT_FALSE(calls[0].work_done);
  }

  daemon.push_completion(0, plan_for(d, 0));
  w->wait(10s);
  EXPECT_TRUE(w->done());
  EXPECT_EQ(w->status(), Status::Ok);
  EXPECT_EQ(w->error(), "");
  // The Work is done before its callbacks run (on the thread that saw the completion, once it
  // released the client's lock): wait() may return first.
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (callbacks.load() == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(callbacks.load(), 1);
  const auto calls = rec.calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].c.kind, ipc::CompletionKind::Handles) << "the handler saw them out of ring order";
  EXPECT_EQ(calls[1].c.kind, ipc::CompletionKind::Plan);
  EXPECT_EQ(calls[1].token, token);
  EXPECT_FALSE(calls[1].work_done) << "the handler must see the plan before the Work is done";
  const auto h = calls[1].c.plan_header();
  EXPECT_EQ(h.members, 2);
  EXPECT_EQ(h.me, 0);
  EXPECT_EQ(calls[1].c.plan_member(1).slot, 1);
  EXPECT_EQ(calls[1].c.plan_member(1).in.alloc_id, 78u);
  EXPECT_EQ(calls[1].c.plan_member(0).out.bytes, 64u);
  daemon.drop_held();
}

TEST(ClientRankExec, TokensFollowTheirRequestsWhateverTheOrder) {
  const auto job = unique_job("rankexec-two");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  Recorder rec;
  auto c = Client::attach(attach_options(job));
  c->set_exec_handler(rec.handler());
  auto w1 = c->world()->device_op(rank_exec_allreduce(101));
  auto w2 = c->world()->device_op(rank_exec_allreduce(202));
  ASSERT_TRUE(daemon.wait_for_requests(2));
  const auto reqs = daemon.requests();
  ASSERT_NE(reqs[0].request_id, reqs[1].request_id);
  // The second op's plan first, then the first op's handles and plan.
  daemon.push_completion(0, plan_for(reqs[1], 1));
  w2->wait(10s);
  EXPECT_FALSE(w1->done());
  daemon.push_completion(0, handles_for(reqs[0], 1, 9, 0x01));
  ASSERT_TRUE(rec.wait_for(2));
  EXPECT_FALSE(w1->test());
  daemon.push_completion(0, plan_for(reqs[0], 1));
  w1->wait(10s);
  const auto calls = rec.calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].token, 202u);
  EXPECT_EQ(calls[0].c.kind, ipc::CompletionKind::Plan);
  EXPECT_EQ(calls[1].token, 101u);
  EXPECT_EQ(calls[1].c.kind, ipc::CompletionKind::Handles);
  EXPECT_EQ(calls[2].token, 101u);
  EXPECT_EQ(calls[2].c.kind, ipc::CompletionKind::Plan);
  daemon.drop_held();
}

TEST(ClientRankExec, AFailedOpReachesTheHandlerWithItsStatus) {
  const auto job = unique_job("rankexec-fail");
  // Declared before the daemon: its thread reads `text` through the policy until it stops.
  const std::string text = "smddp allreduce: ranks disagree on where GPU work runs";
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([&](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Fail, Status::Mismatch, text}; });
  daemon.start();
  Recorder rec;
  auto c = Client::attach(attach_options(job));
  c->set_exec_handler(rec.handler());
  auto w = c->world()->device_op(rank_exec_allreduce(77));
  rec.watched = w.get();
  try {
    w->wait(10s);
    ADD_FAILURE() << "a failed op did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Mismatch);
    EXPECT_EQ(std::string(e.what()), text);
  }
  EXPECT_TRUE(w->done());
  EXPECT_EQ(w->status(), Status::Mismatch);
  const auto calls = rec.calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].token, 77u);
  EXPECT_EQ(calls[0].c.kind, ipc::CompletionKind::Final);
  EXPECT_EQ(calls[0].c.status, Status::Mismatch);
  EXPECT_EQ(std::string(calls[0].c.error_text()), text);
  EXPECT_FALSE(calls[0].work_done);
}

TEST(ClientRankExec, WithoutAHandlerThePlanStillFinishesTheOp) {
  const auto job = unique_job("rankexec-nohandler");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  auto c = Client::attach(attach_options(job));
  auto w = c->world()->device_op(rank_exec_allreduce(5));
  ASSERT_TRUE(daemon.wait_for_requests(1));
  const auto d = daemon.requests().at(0);
  daemon.push_completion(0, handles_for(d, 1, 3, 0x22));
  // The ring is drained by test(); the Handles completion must not finish the op.
  for (int i = 0; i < 50 && !w->done(); ++i) {
    EXPECT_FALSE(w->test());
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_FALSE(w->done());
  daemon.push_completion(0, plan_for(d, 0));
  w->wait(10s);
  EXPECT_EQ(w->status(), Status::Ok);
  daemon.drop_held();
}

TEST(ClientRankExec, OtherOpsNeverReachTheHandler) {
  const auto job = unique_job("rankexec-other");
  FakeDaemon daemon(small_spec(job));  // answers everything at once, Final and Ok
  daemon.start();
  Recorder rec;
  auto c = Client::attach(attach_options(job));
  c->set_exec_handler(rec.handler());
  auto call = rank_exec_allreduce(9);
  call.rank_exec = false;  // a daemon-side device op
  auto w = c->world()->device_op(call);
  w->wait(10s);
  std::vector<float> in(32, 1.0f), out(32, 0.0f);
  c->world()->allreduce(in.data(), out.data(), in.size(), DType::Float32, ReduceOp::Sum)->wait(10s);
  ASSERT_TRUE(daemon.wait_for_requests(2));
  EXPECT_EQ(daemon.requests().at(0).flags & ipc::kFlagRankExec, 0u);
  EXPECT_TRUE(rec.calls().empty());
}

namespace {

TEST(ClientRankExec, GpuWorkIsCountedInTheRanksSlotByOperation) {
  const auto job = unique_job("rankexec-count");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  c->count_gpu_work(OpType::AllGather, 0, 2);
  c->count_gpu_work(OpType::AllGather, 0, 2);
  c->count_gpu_work(OpType::AllReduce, 1, 1);
  const auto& slot = daemon.segment().slot(0);
  EXPECT_EQ(slot.gpu_ops[static_cast<int>(OpType::AllGather)].load(), 2u);
  EXPECT_EQ(slot.gpu_kernels[static_cast<int>(OpType::AllGather)].load(), 0u);
  EXPECT_EQ(slot.gpu_ops[static_cast<int>(OpType::AllReduce)].load(), 1u);
  EXPECT_EQ(slot.gpu_kernels[static_cast<int>(OpType::AllReduce)].load(), 1u);
  EXPECT_EQ(slot.gpu_copies.load(), 5u);
  // The rank reads back what it counted (the plugin's gpu_work(), for tests and operators).
  const auto w = c->gpu_work();
  EXPECT_EQ(w.ops[static_cast<int>(OpType::AllGather)], 2u);
  EXPECT_EQ(w.kernels[static_cast<int>(OpType::AllGather)], 0u);
  EXPECT_EQ(w.ops[static_cast<int>(OpType::AllReduce)], 1u);
  EXPECT_EQ(w.kernels[static_cast<int>(OpType::AllReduce)], 1u);
  EXPECT_EQ(w.copies, 5u);
}

}  // namespace
