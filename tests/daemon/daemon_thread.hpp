// A real Daemon serving attached local ranks on a thread of the test (serve_attached: the
// ranks attach by themselves, as in-process Clients). Destroy the ranks' clients first: the
// daemon's loop ends once every rank that attached has left.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "daemon/config.hpp"
#include "daemon/daemon.hpp"

namespace smddp::daemon::test_daemon {

inline std::string unique_job(const char* prefix, const char* tag) {
  static std::atomic<int> n{0};
  return std::string(prefix) + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

// Small arenas and chunks, one worker, and timeouts that fail a broken test rather than hang it.
inline DaemonConfig small_config() {
  DaemonConfig c;
  c.arena_bytes = 1ull << 20;
  c.chunk_bytes = 64ull << 10;
  c.worker_threads = 1;
  c.collective_timeout = std::chrono::seconds(60);
  c.exit_grace = std::chrono::seconds(1);
  return c;
}

// How in-process rank `r` of `n` attaches to the daemon of `job` (node 0).
inline client::AttachOptions rank_options(const std::string& job, int r, int n) {
  client::AttachOptions o;
  o.job_id = job;
  o.node_id = 0;
  o.rank = o.local_rank = r;
  o.world_size = o.local_world_size = n;
  o.attach_timeout = std::chrono::seconds(10);
  return o;
}

// Waits for every rank's Work; failures are reported, not thrown.
inline void wait_all(const std::vector<client::WorkPtr>& works) {
  for (std::size_t r = 0; r < works.size(); ++r) {
    try {
      works[r]->wait(std::chrono::seconds(20));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
}

// Every member of `members` (indexes into `ranks`) creates communicator `comm_id`, concurrently
// as ranks would; their handles in member order.
inline std::vector<client::CommunicatorPtr> create_communicator(const std::vector<std::shared_ptr<client::Client>>& ranks,
                                                                std::uint64_t comm_id, const std::vector<int>& members) {
  std::vector<std::future<client::CommunicatorPtr>> made;
  for (int r : members)
    made.push_back(std::async(std::launch::async, [&, r] { return ranks[r]->create_communicator(comm_id, members); }));
  std::vector<client::CommunicatorPtr> out;
  for (auto& m : made) out.push_back(m.get());
  return out;
}

class DaemonThread {
 public:
  DaemonThread(const std::string& job, int nproc, DaemonConfig config = small_config())
      : daemon_(layout(job, nproc), std::move(config)) {
    thread_ = std::thread([this] { rc_ = daemon_.serve_attached(std::chrono::seconds(30)); });
  }
  DaemonThread(const DaemonThread&) = delete;
  DaemonThread& operator=(const DaemonThread&) = delete;
  ~DaemonThread() {
    if (thread_.joinable()) thread_.join();
  }
  // Waits for the daemon to end (every rank detached) and returns its exit code.
  int join() {
    if (thread_.joinable()) thread_.join();
    return rc_;
  }

 private:
  static JobLayout layout(const std::string& job, int nproc) {
    JobLayout l;
    l.job_id = job;
    l.nproc_per_node = nproc;
    l.hostname = "localhost";
    return l;
  }

  Daemon daemon_;
  std::thread thread_;
  int rc_ = -1;
};

}  // namespace smddp::daemon::test_daemon
