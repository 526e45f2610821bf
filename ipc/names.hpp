// Job- and node-scoped names of segments and control sockets.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace smddp::ipc {

// A job id is 1..48 characters of [A-Za-z0-9_.-]. Throws std::invalid_argument otherwise:
// it ends up in file names, so nothing else is accepted.
void check_job_id(std::string_view job_id);

// "smddp.<job>.n<node>": the POSIX shm name (no leading slash), /dev/shm/<name> on Linux.
std::string segment_name(std::string_view job_id, int node_id);
inline constexpr std::string_view kSegmentPrefix = "smddp.";

// The control sockets' directory: $SMDDP_SOCKET_DIR, else $XDG_RUNTIME_DIR/smddp, else
// /tmp/smddp-<uid>. ensure_socket_dir() creates it 0700 and refuses one that another user
// owns or that others can enter.
std::filesystem::path socket_dir();
std::filesystem::path ensure_socket_dir();
std::filesystem::path socket_path(std::string_view job_id, int node_id);

}  // namespace smddp::ipc
