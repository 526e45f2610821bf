// Job ids and segment specs shared by the segment tests.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "ipc/segment.hpp"

namespace smddp::ipc::fixtures {

// A job id of this test process: "t-<tag>-<pid>".
inline std::string unique_job(const std::string& tag) { return "t-" + tag + "-" + std::to_string(::getpid()); }

// A segment of two ranks with 1 MiB arenas.
inline SegmentSpec small_spec(const std::string& job) {
  SegmentSpec s;
  s.job_id = job;
  s.local_world_size = 2;
  s.world_size = 2;
  s.arena_bytes = 1 << 20;
  return s;
}

// A daemon of `job` that created its segment and died without unlinking it, like a crashed or
// killed daemon; returns its pid (-1 if fork failed).
inline pid_t crashed_daemon(const std::string& job) {
  const pid_t child = ::fork();
  if (child == 0) {
    auto seg = Segment::create(small_spec(job));
    seg.disown();
    ::_exit(0);
  }
  if (child > 0) ::waitpid(child, nullptr, 0);
  return child;
}

}  // namespace smddp::ipc::fixtures
