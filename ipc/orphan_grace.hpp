// How long a rank outlives its daemon killed outright (daemon.orphan_grace_s): the daemon hands
// its ranks the value in their environment; a rank started without it takes the default.
#pragma once

#include <chrono>

namespace smddp::ipc {

inline constexpr const char* kOrphanGraceEnv = "SMDDP_ORPHAN_GRACE_S";
inline constexpr std::chrono::seconds kDefaultOrphanGrace{60};

}  // namespace smddp::ipc
