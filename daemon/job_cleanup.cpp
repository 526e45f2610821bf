#include "daemon/job_cleanup.hpp"

#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>

#include "ipc/names.hpp"
#include "ipc/segment.hpp"

namespace smddp::daemon {
namespace {

// The nodes of `job` that have a segment or a control socket on this machine.
std::set<int> nodes_with_leftovers(const std::string& job) {
  std::set<int> nodes;
  std::error_code ec;
  const std::string prefix = std::string(ipc::kSegmentPrefix) + job + ".n";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) nodes.insert(std::atoi(name.c_str() + prefix.size()));
  }
  const std::string sock_prefix = job + ".n";
  for (const auto& e : std::filesystem::directory_iterator(ipc::socket_dir(), ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind(sock_prefix, 0) == 0) nodes.insert(std::atoi(name.c_str() + sock_prefix.size()));
  }
  return nodes;
}

}  // namespace

CleanupReport cleanup_job(const std::string& job, std::chrono::milliseconds wait) {
  ipc::check_job_id(job);
  CleanupReport report;
  std::set<int> pending = nodes_with_leftovers(job);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    for (auto it = pending.begin(); it != pending.end();) {
      const int n = *it;
      report.removed += ipc::Segment::remove_if_stale(job, n);
      if (ipc::Segment::exists(job, n)) {
        ++it;
        continue;
      }
      std::error_code ec;
      report.removed += std::filesystem::remove(ipc::socket_path(job, n), ec);
      it = pending.erase(it);
    }
    if (pending.empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int n : pending) {
    report.nodes_left.push_back(n);
    report.owners_left.push_back(ipc::Segment::owner_pid(job, n));
  }
  return report;
}

}  // namespace smddp::daemon
