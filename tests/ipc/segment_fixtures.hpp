// Job ids and segment specs shared by the segment tests.
#pragma once

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

}  // namespace smddp::ipc::fixtures
