// Under smddprun a rank is its daemon's child, in a process group of its own: mpirun's abort
// signal then reaches only the daemons, which let their ranks report why the job failed before
// they end them. A rank whose daemon was killed outright has nobody left to end it, and one that
// never calls smddp again would outlive its job while mpirun waits for it. This watch ends such
// a rank: it says on stderr at once that its daemon is gone (while the launcher may still be there
// to show it), and `grace` later, if the rank has not exited, sends itself SIGTERM (SIGKILL 5 s
// later). The grace is the daemon's `daemon.orphan_grace_s` (SMDDP_ORPHAN_GRACE_S): a rank busy
// with its own work for less than that still reaches its next smddp call and raises the named
// error there. Ranks started otherwise (plain mpirun, torchrun) are left alone.
#pragma once

#include <sys/types.h>

#include <chrono>

#include "ipc/orphan_grace.hpp"

namespace smddp::client {

// How long a rank may outlive its daemon when the daemon names no grace: time to reach its next
// smddp call, report the failure and exit on its own.
inline constexpr std::chrono::seconds kOrphanGrace = ipc::kDefaultOrphanGrace;

// The grace the daemon named in SMDDP_ORPHAN_GRACE_S (seconds), else kOrphanGrace.
std::chrono::seconds orphan_grace_from_env();

// Starts the watch once per process, and only when this process is `daemon_pid`'s child.
void watch_for_orphaning(pid_t daemon_pid, std::chrono::seconds grace = kOrphanGrace);

}  // namespace smddp::client
