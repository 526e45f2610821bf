// One smddp Client per process, shared by every process group (the world communicator has
// id 0; subgroups are communicators created on the same Client).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "client/client.hpp"

namespace smddp::torch_plugin {

// The process's Client, attaching to the node's daemon on first use (from the environment
// the launcher sets). Throws SmddpException(DaemonUnreachable) saying how to start a daemon.
// Each process group holds the returned pointer; the Client detaches once none does.
std::shared_ptr<client::Client> shared_client();

// Under smddprun (the daemon spawned this process), what to tell a rank whose rank or world
// size disagree with the job: MPI.COMM_WORLD is a singleton there, so values taken from it are
// wrong. "" under the other launch paths.
std::string smddprun_layout_hint();

// The Client if one is attached now, else null (no attach attempt).
std::shared_ptr<client::Client> current_client();

// Drops a process group's reference; if that detaches the Client, its progress thread is
// joined with the Python GIL released (it may be finishing a future whose callbacks need it).
void release_client(std::shared_ptr<client::Client>&& client);

// How many times a world process group was created in this process. Mixed into subgroup
// communicator ids so that groups made after destroy_process_group() + init_process_group()
// never reuse an id (every rank goes through the same sequence of inits).
std::uint64_t world_generation();
void bump_world_generation();

// A nonzero 64-bit id for a subgroup named `group_id` (the name torch gives the group, the
// same on every member).
std::uint64_t communicator_id(const std::string& group_id);

}  // namespace smddp::torch_plugin
