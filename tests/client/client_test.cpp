#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <numeric>
#include <set>
#include <atomic>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "fake_daemon.hpp"
#include "ipc/names.hpp"

using namespace std::chrono_literals;
using smddp::client::Client;
using smddp::client::DType;
using smddp::client::Error;
using smddp::client::LayoutMismatch;
using smddp::client::OpType;
using smddp::client::ReduceOp;
using smddp::client::Status;
using smddp::testing::Answer;
using smddp::testing::attach_options;
using smddp::testing::FakeDaemon;
using smddp::testing::small_spec;
using smddp::testing::unique_job;
namespace ipc = smddp::ipc;

namespace {

std::vector<float> iota_floats(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 100003) * 0.5f + 1.0f;
  return v;
}

// The Error `f` throws; a test failure if it throws nothing or something else.
template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-smddp exception: " << e.what();
    return Error(Status::Internal, e.what());
  }
  ADD_FAILURE() << "did not throw";
  return Error(Status::Ok, "");
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Client, AttachRegistersTheRankAndExitMarksTheSlot) {
  const auto job = unique_job("attach");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto& slot = daemon.segment().slot(0);
  {
    auto c = Client::attach(attach_options(job));
    EXPECT_EQ(c->rank(), 0);
    EXPECT_EQ(c->world_size(), 1);
    EXPECT_EQ(c->local_rank(), 0);
    EXPECT_EQ(c->local_world_size(), 1);
    EXPECT_EQ(c->node_id(), 0);
    EXPECT_EQ(c->num_nodes(), 1);
    EXPECT_EQ(c->job_id(), job);
    EXPECT_EQ(c->daemon_pid(), ::getpid());
    EXPECT_EQ(slot.state.load(), static_cast<std::uint32_t>(ipc::SlotState::Registered));
    EXPECT_EQ(slot.pid, ::getpid());
    EXPECT_EQ(c->world()->size(), 1);
    EXPECT_EQ(c->world()->id(), 0u);
    EXPECT_EQ(c->job_error(), "");
  }
  EXPECT_EQ(slot.state.load(), static_cast<std::uint32_t>(ipc::SlotState::Exited));
}

TEST(Client, DetachFailsPendingOpsMarksTheSlotAndRefusesNewOnes) {
  const auto job = unique_job("detach");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  auto& slot = daemon.segment().slot(0);
  auto c = Client::attach(attach_options(job));
  const auto in = iota_floats(100);
  std::vector<float> out(100, 0.0f);
  auto w = c->world()->allreduce(in.data(), out.data(), in.size(), DType::Float32, ReduceOp::Sum);
  c->detach();
  EXPECT_TRUE(w->done());
  EXPECT_EQ(error_of([&] { w->wait(5s); }).status(), Status::Shutdown);
  EXPECT_EQ(slot.state.load(), static_cast<std::uint32_t>(ipc::SlotState::Exited));
  const auto e = error_of([&] { c->world()->allreduce(in.data(), out.data(), in.size(), DType::Float32, ReduceOp::Sum); });
  EXPECT_EQ(e.status(), Status::Shutdown);
  EXPECT_TRUE(contains(e.what(), "detached")) << e.what();
  c->detach();  // idempotent
  daemon.release_held();
}

TEST(Client, LargeAllReduceIsChunkedToFitTheArena) {
  const auto job = unique_job("chunks");
  const auto spec = small_spec(job);
  FakeDaemon daemon(spec);
  daemon.start();
  auto c = Client::attach(attach_options(job));
  // 10 MiB of float32 (ten times the arena) plus an odd tail.
  const std::uint64_t n = (10ull << 20) / 4 + 37;
  const auto in = iota_floats(n);
  std::vector<float> out(n, -1.0f);
  auto w = c->world()->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum);
  w->wait(30s);
  EXPECT_TRUE(w->done());
  EXPECT_EQ(w->status(), Status::Ok);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), n * sizeof(float)), 0) << "output differs from input";

  const auto reqs = daemon.requests();
  ASSERT_GT(reqs.size(), 10u) << "a 10 MiB allreduce through a 1 MiB arena must be chunked";
  std::vector<int> covered(n, 0);
  std::set<std::uint64_t> ids;
  std::uint64_t last_offset = 0;
  int last_flags = 0;
  for (const auto& d : reqs) {
    EXPECT_EQ(d.op, OpType::AllReduce);
    EXPECT_EQ(d.seq, reqs.front().seq) << "every chunk of one op carries the op's seq";
    EXPECT_EQ(d.comm_id, 0u);
    EXPECT_EQ(d.count, n) << "count is the whole collective's";
    EXPECT_GT(d.chunk_count, 0u);
    EXPECT_LE(d.chunk_offset + d.chunk_count, n);
    EXPECT_LE(d.chunk_count * sizeof(float), spec.chunk_bytes) << "chunks follow the segment's chunk_bytes";
    EXPECT_EQ(d.input.kind, ipc::BufferKind::Arena);
    EXPECT_EQ(d.input.bytes, d.chunk_count * sizeof(float));
    EXPECT_EQ(d.output.offset, d.input.offset) << "allreduce is staged in place";
    EXPECT_LE(d.input.offset + d.input.bytes, spec.arena_bytes);
    EXPECT_TRUE(ids.insert(d.request_id).second) << "request ids must be unique";
    for (std::uint64_t i = d.chunk_offset; i < d.chunk_offset + d.chunk_count && i < n; ++i) ++covered[i];
    if (d.flags & ipc::kFlagLastChunk) {
      ++last_flags;
      last_offset = d.chunk_offset;
    }
  }
  EXPECT_EQ(std::count(covered.begin(), covered.end(), 1), static_cast<std::ptrdiff_t>(n))
      << "chunks must cover [0, count) exactly once";
  EXPECT_EQ(last_flags, 1);
  const auto max_offset = std::max_element(reqs.begin(), reqs.end(), [](const auto& a, const auto& b) {
                            return a.chunk_offset < b.chunk_offset;
                          })->chunk_offset;
  EXPECT_EQ(last_offset, max_offset) << "the last-chunk flag belongs to the final chunk";
  EXPECT_TRUE(daemon.problems().empty()) << daemon.problems().front();
}

TEST(Client, InPlaceAllReduceAndSeqAdvances) {
  const auto job = unique_job("inplace");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  auto world = c->world();
  const std::uint64_t n = 300000;  // several chunks
  auto buf = iota_floats(n);
  const auto want = buf;
  world->allreduce(buf.data(), buf.data(), n, DType::Float32, ReduceOp::Sum)->wait();
  EXPECT_EQ(buf, want);
  world->allreduce(buf.data(), buf.data(), 1, DType::Float32, ReduceOp::Max)->wait();
  const auto reqs = daemon.requests();
  ASSERT_GE(reqs.size(), 2u);
  EXPECT_EQ(reqs.front().seq, 1u);
  EXPECT_EQ(reqs.back().seq, 2u);
  EXPECT_EQ(reqs.back().reduce_op, ReduceOp::Max);
}

TEST(Client, EveryCollectiveRoundTripsInAWorldOfOne) {
  const auto job = unique_job("colls");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  auto world = c->world();
  const std::uint64_t n = 100000;  // 400 KB: chunked for the ops that stage several blocks
  const auto in = iota_floats(n);
  auto check = [&](const char* what, auto submit) {
    std::vector<float> out(n, -7.0f);
    auto w = submit(out.data());
    w->wait(30s);
    EXPECT_EQ(w->status(), Status::Ok) << what;
    EXPECT_EQ(out, in) << what;
  };
  check("allgather", [&](float* o) { return world->allgather(in.data(), o, n, DType::Float32); });
  check("reduce_scatter", [&](float* o) { return world->reduce_scatter(in.data(), o, n, DType::Float32, ReduceOp::Sum); });
  check("reduce", [&](float* o) { return world->reduce(in.data(), o, n, DType::Float32, ReduceOp::Sum, 0); });
  check("alltoall", [&](float* o) { return world->alltoall(in.data(), o, n, DType::Float32); });
  check("gather", [&](float* o) { return world->gather(in.data(), o, n, DType::Float32, 0); });
  check("scatter", [&](float* o) { return world->scatter(in.data(), o, n, DType::Float32, 0); });
  check("alltoallv", [&](float* o) { return world->alltoallv(in.data(), {n}, o, {n}, DType::Float32); });
  check("broadcast", [&](float* o) {
    std::copy(in.begin(), in.end(), o);
    return world->broadcast(o, n, DType::Float32, 0);
  });
  world->barrier()->wait(10s);
  EXPECT_TRUE(daemon.problems().empty()) << daemon.problems().front();
  // Misuse is refused before anything reaches the daemon.
  const auto before = daemon.requests().size();
  EXPECT_EQ(error_of([&] { world->broadcast(nullptr, 1, DType::Float32, 1); }).status(), Status::InvalidRequest);
  EXPECT_EQ(error_of([&] { world->send(in.data(), 1, DType::Float32, 0, 0); }).status(), Status::InvalidRequest);
  EXPECT_EQ(error_of([&] { world->alltoallv(in.data(), {1, 1}, nullptr, {1}, DType::Float32); }).status(),
            Status::InvalidRequest);
  EXPECT_EQ(daemon.requests().size(), before);
}

TEST(Client, SendAndRecvUseTheirOwnSeqPerPeer) {
  const auto job = unique_job("p2p");
  FakeDaemon daemon(small_spec(job, 2, 2));
  daemon.start();
  auto c = Client::attach(attach_options(job, 0, 2, 2));
  auto world = c->world();
  const std::uint64_t n = 200000;  // 800 KB: more than the p2p window, so several chunks
  const auto in = iota_floats(n);
  std::vector<std::uint8_t> got(n, 0);
  auto s = world->send(in.data(), n, DType::Float32, 1, 3);
  auto r = world->recv(got.data(), n, DType::UInt8, 1, 0x5a);
  auto r2 = world->recv(got.data(), 16, DType::UInt8, 1, 0x5a);
  s->wait(30s);
  r->wait(30s);
  r2->wait(30s);
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](std::uint8_t b) { return b == 0x5a; }));
  std::set<std::uint64_t> send_seqs, recv_seqs;
  for (const auto& d : daemon.requests()) {
    EXPECT_EQ(d.root, 1) << "the peer travels in root";
    (d.op == OpType::Send ? send_seqs : recv_seqs).insert(d.seq);
  }
  EXPECT_EQ(send_seqs, (std::set<std::uint64_t>{1}));
  EXPECT_EQ(recv_seqs, (std::set<std::uint64_t>{1, 2}));
  EXPECT_TRUE(daemon.problems().empty()) << daemon.problems().front();
}

TEST(Client, CompletionCallbacksFireWithoutWait) {
  const auto job = unique_job("callback");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const std::uint64_t n = 1000;
  const auto in = iota_floats(n);
  std::vector<float> out(n, 0.0f);
  auto w = c->world()->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum);
  std::promise<std::thread::id> fired;
  std::atomic<int> calls{0};
  w->on_complete([&] {
    if (calls.fetch_add(1) == 0) fired.set_value(std::this_thread::get_id());
  });
  ASSERT_TRUE(daemon.wait_for_requests(1));
  EXPECT_EQ(calls.load(), 0) << "fired before the daemon answered";
  daemon.release_held();
  // Nobody calls wait() or test(): the progress thread must finish the op.
  auto f = fired.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "callback did not fire without wait()";
  EXPECT_NE(f.get(), std::this_thread::get_id());
  EXPECT_TRUE(w->done());
  EXPECT_EQ(out, in) << "the output is complete when the callback runs";
  // Registered after completion: runs at once, on the caller's thread.
  std::thread::id late;
  w->on_complete([&] { late = std::this_thread::get_id(); });
  EXPECT_EQ(late, std::this_thread::get_id());
  w->wait();
  EXPECT_EQ(calls.load(), 1);
}

TEST(Client, MismatchFailsTheOpWithTheDaemonsTextAndStopsItsChunks) {
  const auto job = unique_job("mismatch");
  const auto spec = small_spec(job);
  FakeDaemon daemon(spec);
  const std::string text = "allreduce mismatch: rank 1 posted count 7, rank 0 posted count 2621440";
  // The first chunk of the first op fails; the daemon answers it before any other.
  daemon.set_policy([&](const ipc::RequestDesc& d, std::size_t) {
    if (d.seq == 1 && d.chunk_offset == 0) return Answer{Answer::Fail, Status::Mismatch, text};
    return Answer{};
  });
  daemon.start();
  auto c = Client::attach(attach_options(job));
  auto world = c->world();
  const std::uint64_t n = (10ull << 20) / 4;
  const auto in = iota_floats(n);
  std::vector<float> out(n, 0.0f);
  auto w = world->allreduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum);
  std::atomic<int> calls{0};
  w->on_complete([&] { calls++; });
  const auto e = error_of([&] { w->wait(30s); });
  EXPECT_EQ(e.status(), Status::Mismatch);
  EXPECT_EQ(std::string(e.what()), text);
  EXPECT_TRUE(w->done());
  EXPECT_EQ(w->status(), Status::Mismatch);
  EXPECT_EQ(w->error(), text);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(w->test()) << "test() of a failed op reports it finished";
  EXPECT_EQ(error_of([&] { w->wait(); }).status(), Status::Mismatch) << "wait() keeps throwing";

  // Later ops still work; once one has finished, the daemon has seen every chunk of the first.
  world->allreduce(in.data(), out.data(), 64, DType::Float32, ReduceOp::Sum)->wait(30s);
  std::size_t first_op = 0;
  for (const auto& d : daemon.requests()) first_op += d.seq == 1;
  const std::uint64_t chunk_elems = spec.chunk_bytes / sizeof(float);
  const std::uint64_t nchunks = (n + chunk_elems - 1) / chunk_elems;
  // Only what was in flight when the mismatch arrived: at most an arena's worth of chunks.
  EXPECT_LE(first_op, spec.arena_bytes / spec.chunk_bytes);
  EXPECT_LT(first_op, nchunks) << "chunks after the failed one were still submitted";
}

TEST(Client, TestNeverBlocks) {
  const auto job = unique_job("test");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  auto c = Client::attach(attach_options(job));
  std::vector<float> buf(1000, 1.0f);
  auto w = c->world()->allreduce(buf.data(), buf.data(), buf.size(), DType::Float32, ReduceOp::Sum);
  ASSERT_TRUE(daemon.wait_for_requests(1));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(w->test());
  // A blocking test() would sit out at least one 20 ms sleep slice per call.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_FALSE(w->done());
  daemon.release_held();
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!w->test() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(w->done());
  EXPECT_EQ(w->status(), Status::Ok);
  EXPECT_EQ(w->error(), "");
}

TEST(Client, WaitWithTimeoutOnUnansweredOpThrowsTimeoutAndTheOpCanStillFinish) {
  const auto job = unique_job("timeout");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const auto in = iota_floats(1000);
  std::vector<float> out(1000, 0.0f);
  auto w = c->world()->allreduce(in.data(), out.data(), in.size(), DType::Float32, ReduceOp::Sum);
  const auto t0 = std::chrono::steady_clock::now();
  const auto e = error_of([&] { w->wait(300ms); });
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(e.status(), Status::Timeout);
  EXPECT_TRUE(contains(e.what(), "300 ms")) << e.what();
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 5s);
  EXPECT_FALSE(w->done()) << "a caller's wait timeout does not end the op";
  daemon.release_held();
  w->wait(30s);
  EXPECT_EQ(out, in);
}

TEST(Client, ConcurrentCollectivesFromSeveralThreads) {
  const auto job = unique_job("threads");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  auto world = c->world();
  constexpr int kThreads = 4, kOps = 20;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        const auto in = iota_floats(static_cast<std::size_t>(1000 + 5000 * t + i));
        std::vector<float> out(in.size(), 0.0f);
        try {
          world->allreduce(in.data(), out.data(), in.size(), DType::Float32, ReduceOp::Sum)->wait(30s);
        } catch (const Error&) {
          bad++;
        }
        if (out != in) bad++;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  std::set<std::uint64_t> seqs;
  for (const auto& d : daemon.requests()) seqs.insert(d.seq);
  EXPECT_EQ(seqs.size(), static_cast<std::size_t>(kThreads * kOps));
  EXPECT_EQ(*seqs.rbegin(), static_cast<std::uint64_t>(kThreads * kOps)) << "seq numbers are dense from 1";
}

TEST(Client, JobErrorReportsTheHeadersJobError) {
  const auto job = unique_job("joberr");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  EXPECT_EQ(c->job_error(), "");
  const std::string why = "rank 3 (pid 4242) on node 1 died";
  std::strncpy(daemon.header().job_error, why.c_str(), sizeof daemon.header().job_error - 1);
  daemon.header().job_failed.store(1, std::memory_order_release);
  EXPECT_EQ(c->job_error(), why);
}

// Fails the job in `daemon`'s header and checks that the failure handler counting `calls` ran
// exactly once within 5 s, without any call into the client.
static void expect_failure_reported_once(FakeDaemon& daemon, const std::atomic<int>& calls, const char* why_missing) {
  EXPECT_EQ(calls.load(), 0) << "ran before any failure";
  daemon.header().job_failed.store(1, std::memory_order_release);
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (calls.load() == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(calls.load(), 1) << why_missing;
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(calls.load(), 1) << "reported more than once";
}

TEST(Client, FailureHandlerRunsOnceWhenTheJobFails) {
  // The GPU fast path releases its waiting kernels from it: it must run although nobody
  // waits on the CPU (the progress thread notices), and only once.
  const auto job = unique_job("failhandler");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  auto c = Client::attach(attach_options(job));
  std::atomic<int> calls{0};
  c->set_failure_handler([&] { calls++; });
  const auto in = iota_floats(100);
  std::vector<float> out(100, 0.0f);
  auto w = c->world()->allreduce(in.data(), out.data(), in.size(), DType::Float32, ReduceOp::Sum);
  std::this_thread::sleep_for(50ms);
  expect_failure_reported_once(daemon, calls, "the progress thread did not report the job's failure");
  daemon.release_held();
  w->wait(30s);
  c->set_failure_handler(nullptr);  // before `calls` goes
}

TEST(Client, FailureHandlerRunsWhenTheJobFailsWithNothingInFlight) {
  // A hierarchical operation's closing barrier can keep the GPU waiting on a peer after every
  // operation finished on the CPU side: a peer that dies then must still reach the handler,
  // which releases that wait, although the client has nothing in flight.
  const auto job = unique_job("failidle");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  std::atomic<int> calls{0};
  c->set_failure_handler([&] { calls++; });
  const auto in = iota_floats(100);
  std::vector<float> out(100, 0.0f);
  c->world()->allreduce(in.data(), out.data(), in.size(), DType::Float32, ReduceOp::Sum)->wait(30s);
  std::this_thread::sleep_for(300ms);  // idle: the progress thread has nothing to do
  expect_failure_reported_once(daemon, calls, "an idle client did not report the job's failure");
  c->set_failure_handler(nullptr);  // before `calls` goes
}

// ---------------------------------------------------------------------------------------
// Attach refusals

TEST(ClientAttach, WrongRankIsRefused) {
  const auto job = unique_job("rank");
  FakeDaemon daemon(small_spec(job, 2, 2));
  auto o = attach_options(job, 0, 2, 2);
  o.rank = 1;  // local rank 0 is global rank 0
  const auto e = error_of([&] { Client::attach(o); });
  EXPECT_EQ(e.status(), Status::InvalidRequest);
  EXPECT_TRUE(contains(e.what(), "RANK 1")) << e.what();
  EXPECT_TRUE(contains(e.what(), "expects rank 0")) << e.what();
  EXPECT_EQ(daemon.segment().slot(0).state.load(), static_cast<std::uint32_t>(ipc::SlotState::Empty))
      << "a refused rank must not keep the slot";
}

TEST(ClientAttach, WrongWorldSizeIsRefused) {
  const auto job = unique_job("world");
  FakeDaemon daemon(small_spec(job, 1, 4));
  auto o = attach_options(job, 0, 3, 1);
  const auto e = error_of([&] { Client::attach(o); });
  EXPECT_EQ(e.status(), Status::InvalidRequest);
  EXPECT_TRUE(contains(e.what(), "WORLD_SIZE is 3")) << e.what();
  EXPECT_TRUE(contains(e.what(), "4")) << e.what();
  // Its own type: the plugin says where a wrong world came from.
  o.world_size = 1;
  try {
    Client::attach(o);
    ADD_FAILURE() << "a world of 1 in a job of 4 was accepted";
  } catch (const LayoutMismatch& m) {
    EXPECT_TRUE(contains(m.what(), "WORLD_SIZE is 1 but the job has 4 ranks")) << m.what();
  }
  EXPECT_EQ(daemon.segment().slot(0).state.load(), static_cast<std::uint32_t>(ipc::SlotState::Empty))
      << "a refused rank must not keep the slot";
}

TEST(ClientAttach, LocalRankAndLocalWorldSizeAreChecked) {
  const auto job = unique_job("local");
  FakeDaemon daemon(small_spec(job, 2, 2));
  auto o = attach_options(job, 2, 3, 2);
  o.world_size = 2;
  auto e = error_of([&] { Client::attach(o); });
  EXPECT_EQ(e.status(), Status::InvalidRequest);
  EXPECT_TRUE(contains(e.what(), "LOCAL_RANK 2")) << e.what();
  o = attach_options(job, 0, 2, 3);
  e = error_of([&] { Client::attach(o); });
  EXPECT_TRUE(contains(e.what(), "LOCAL_WORLD_SIZE is 3")) << e.what();
}

TEST(ClientAttach, SecondRegistrationOfASlotIsRefused) {
  const auto job = unique_job("twice");
  FakeDaemon daemon(small_spec(job, 2, 2));
  daemon.start();
  auto first = Client::attach(attach_options(job, 1, 2, 2));
  const auto e = error_of([&] { Client::attach(attach_options(job, 1, 2, 2)); });
  EXPECT_EQ(e.status(), Status::InvalidRequest);
  EXPECT_TRUE(contains(e.what(), "already taken")) << e.what();
  EXPECT_TRUE(contains(e.what(), "pid " + std::to_string(::getpid()))) << e.what();
  // The other slot is untouched.
  auto other = Client::attach(attach_options(job, 0, 2, 2));
  EXPECT_EQ(other->rank(), 0);
}

TEST(ClientAttach, LayoutVersionMismatchNamesBothVersions) {
  const auto job = unique_job("version");
  FakeDaemon daemon(small_spec(job));
  daemon.header().layout_version = ipc::kLayoutVersion + 41;
  auto o = attach_options(job);
  o.attach_timeout = 20s;
  const auto t0 = std::chrono::steady_clock::now();
  const auto e = error_of([&] { Client::attach(o); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "a version mismatch must not wait out attach_timeout";
  EXPECT_EQ(e.status(), Status::InvalidRequest);
  EXPECT_TRUE(contains(e.what(), "version " + std::to_string(ipc::kLayoutVersion + 41))) << e.what();
  EXPECT_TRUE(contains(e.what(), "version " + std::to_string(ipc::kLayoutVersion))) << e.what();
}

TEST(ClientAttach, NoSegmentSaysHowToStartADaemon) {
  const auto job = unique_job("absent");
  auto o = attach_options(job);
  o.attach_timeout = 100ms;
  const auto e = error_of([&] { Client::attach(o); });
  EXPECT_NE(e.status(), Status::Ok);
  EXPECT_TRUE(contains(e.what(), "smddprun")) << e.what();
  EXPECT_TRUE(contains(e.what(), job)) << e.what();
}

TEST(ClientAttach, InvalidJobIdIsRefused) {
  auto o = attach_options("../etc");
  o.attach_timeout = 100ms;
  EXPECT_EQ(error_of([&] { Client::attach(o); }).status(), Status::InvalidRequest);
}

// The world communicator's seq must not restart when the caller drops the Communicator and
// calls world() again (client.hpp's own example does `client->world().allreduce(...)`): the
// daemon matches collectives by (comm, seq), so a restart makes ranks that kept their handle
// disagree with ranks that did not, and two ops in flight can carry the same seq.
// DISABLED: fails today, see the report (ClientImpl::world() keeps only a weak_ptr, and the
// seq counters live in the CommImpl it recreates).
TEST(Client, WorldSeqSurvivesDroppingTheCommunicator) {
  const auto job = unique_job("seq");
  FakeDaemon daemon(small_spec(job));
  daemon.start();
  auto c = Client::attach(attach_options(job));
  float x = 1.0f;
  c->world()->allreduce(&x, &x, 1, DType::Float32, ReduceOp::Sum)->wait(10s);
  c->world()->allreduce(&x, &x, 1, DType::Float32, ReduceOp::Sum)->wait(10s);
  const auto reqs = daemon.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].seq, 1u);
  EXPECT_EQ(reqs[1].seq, 2u);
}

// The caller drops the Client, the Communicator and the Work while the op is still with the
// daemon (fire-and-forget, or teardown with async ops pending). The answer arriving later must
// neither crash nor hang the process.
// DISABLED: deadlocks today, see the report: the progress thread drops the last OpState
// reference inside progress_locked() with mu_ held (client.cpp ~line 320), ~OpState drops the
// last ClientImpl reference, and ~ClientImpl locks mu_ again (client.cpp:171) on that thread
// (and would then join itself).
TEST(Client, DroppingEverythingWhileAnOpIsPendingIsSafe) {
  const auto job = unique_job("drop");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  auto& slot = daemon.segment().slot(0);
  static std::vector<float> buf(1000, 1.0f);  // outlives the op
  std::atomic<bool> fired{false};
  {
    auto c = Client::attach(attach_options(job));
    auto w = c->world()->allreduce(buf.data(), buf.data(), buf.size(), DType::Float32, ReduceOp::Sum);
    w->on_complete([&] { fired = true; });
  }
  ASSERT_TRUE(daemon.wait_for_requests(1));
  daemon.release_held();
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (slot.state.load() != static_cast<std::uint32_t>(ipc::SlotState::Exited) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(fired.load());
  EXPECT_EQ(slot.state.load(), static_cast<std::uint32_t>(ipc::SlotState::Exited))
      << "the client was never destroyed once its last op finished";
}

// Ops issued back to back on one buffer, with no wait between, run in issue order (as on
// NCCL's stream, or Gloo's queue): a later op copies nothing in before an earlier one that
// writes the memory it touches is done. Before, the second of two async in-place allreduces
// of one tensor read it before the first had written its result.
TEST(Client, AnOpOnMemoryAnEarlierOneWritesWaitsForItsEnd) {
  const auto job = unique_job("order-raw");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const std::uint64_t n = 1000;
  auto buf = iota_floats(n);
  auto a = c->world()->allreduce(buf.data(), buf.data(), n, DType::Float32, ReduceOp::Sum);
  ASSERT_TRUE(daemon.wait_for_requests(1));
  auto b = c->world()->allreduce(buf.data() + n / 2, buf.data() + n / 2, n / 2, DType::Float32, ReduceOp::Sum);
  // An op that may go is posted before its call returns: once the daemon took everything
  // posted so far, the second op must not be among it (no sleep to guess with).
  daemon.settle();
  EXPECT_EQ(daemon.requests().size(), 1u) << "the second op went before the first one wrote the memory";
  daemon.release_held();
  a->wait(10s);
  ASSERT_TRUE(daemon.wait_for_requests(2)) << "the second op never went after the first was done";
  daemon.release_held();
  b->wait(10s);
  EXPECT_EQ(b->status(), Status::Ok);
}

TEST(Client, AnOpThatOverwritesWhatAnEarlierOneOnlyReadsWaitsOnlyForItsReads) {
  const auto job = unique_job("order-war");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const std::uint64_t n = 1000;
  const auto z = iota_floats(n);
  auto x = iota_floats(n);
  std::vector<float> y(n, 0.0f);
  auto a = c->world()->allreduce(x.data(), y.data(), n, DType::Float32, ReduceOp::Sum);  // reads x
  auto b = c->world()->allreduce(z.data(), x.data(), n, DType::Float32, ReduceOp::Sum);  // writes x
  // The first op's bytes are in its arena already: the second may go while it is in flight.
  EXPECT_TRUE(daemon.wait_for_requests(2)) << "the second op waited for the first op's end";
  daemon.release_held();
  a->wait(10s);
  b->wait(10s);
  EXPECT_EQ(y, iota_floats(n)) << "the first op saw the second op's result";
}

TEST(Client, OpsOnDisjointMemoryDoNotWaitForEachOther) {
  const auto job = unique_job("order-disjoint");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const std::uint64_t n = 1000;
  auto buf = iota_floats(2 * n);
  auto a = c->world()->allreduce(buf.data(), buf.data(), n, DType::Float32, ReduceOp::Sum);
  auto b = c->world()->allreduce(buf.data() + n, buf.data() + n, n, DType::Float32, ReduceOp::Sum);
  EXPECT_TRUE(daemon.wait_for_requests(2)) << "an op on other memory waited";
  daemon.release_held();
  a->wait(10s);
  b->wait(10s);
}

TEST(Client, AnOpStuckBehindAnEarlierOneOnItsMemoryTimesOutSayingSo) {
  // The earlier op never finishes (as a receive whose sender never sends): the later one on the
  // same memory never starts, and its timeout names what it waits for.
  const auto job = unique_job("order-timeout");
  FakeDaemon daemon(small_spec(job));
  daemon.set_policy([](const ipc::RequestDesc&, std::size_t) { return Answer{Answer::Hold}; });
  daemon.start();
  auto c = Client::attach(attach_options(job));
  const std::uint64_t n = 100;
  auto buf = iota_floats(n);
  smddp::client::CallOptions quick;
  quick.timeout = 100ms;
  auto a = c->world()->allreduce(buf.data(), buf.data(), n, DType::Float32, ReduceOp::Sum);
  auto b = c->world()->broadcast(buf.data(), n, DType::Float32, 0, quick);
  const auto e = error_of([&] { b->wait(); });  // up to the op's timeout and the client's backstop
  EXPECT_EQ(e.status(), Status::Timeout);
  EXPECT_TRUE(contains(e.what(), "broadcast never started: it waits for an earlier allreduce on the same memory"))
      << e.what();
  EXPECT_EQ(daemon.requests().size(), 1u);
  daemon.release_held();
  a->wait(10s);
}
