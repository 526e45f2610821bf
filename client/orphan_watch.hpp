// Under smddprun a rank is its daemon's child, in a process group of its own: mpirun's abort
// signal then reaches only the daemons, which let their ranks report why the job failed before
// they end them. A rank whose daemon was killed outright has nobody left to end it, and one that
// never calls smddp again would outlive its job while mpirun waits for it. This watch ends such
// a rank: `grace` after its parent daemon is gone it says so on stderr and sends itself SIGTERM
// (SIGKILL 5 s later). Ranks started otherwise (plain mpirun, torchrun) are left alone.
#pragma once

#include <sys/types.h>

#include <chrono>

namespace smddp::client {

// How long a rank may outlive its daemon: time to report the failure and exit on its own.
inline constexpr std::chrono::seconds kOrphanGrace{10};

// Starts the watch once per process, and only when this process is `daemon_pid`'s child.
void watch_for_orphaning(pid_t daemon_pid, std::chrono::seconds grace = kOrphanGrace);

}  // namespace smddp::client
