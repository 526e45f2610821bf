// Removing a job's leftovers on this machine once the job's launcher has ended.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace smddp::daemon {

struct CleanupReport {
  int removed = 0;                      // segments, sockets and fabric regions removed
  std::vector<int> nodes_left;          // nodes whose segment is still owned by a live daemon
  std::vector<int> owners_left;         // those daemons' pids (0: the segment names none)
};

// Removes this machine's segments and control sockets of `job` whose daemons are gone.
// mpirun can return while a daemon it killed is still being torn down (a 100+ MiB mapping takes
// a moment to unmap), so a segment whose owner is alive is retried until `wait` has passed;
// a daemon still alive then is reported, never killed: the command also serves operators,
// who may run it beside a live job.
CleanupReport cleanup_job(const std::string& job, std::chrono::milliseconds wait);

}  // namespace smddp::daemon
