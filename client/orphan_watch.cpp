#include "client/orphan_watch.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace smddp::client {

std::chrono::seconds orphan_grace_from_env() {
  const char* v = std::getenv(ipc::kOrphanGraceEnv);
  if (!v || !*v) return kOrphanGrace;
  char* end = nullptr;
  const long s = std::strtol(v, &end, 10);
  // The daemon writes it; anything else is a user's edit, and the default is the safe reading.
  if (*end != '\0' || s <= 0) return kOrphanGrace;
  return std::chrono::seconds(s);
}

void watch_for_orphaning(pid_t daemon_pid, std::chrono::seconds grace) {
  // Checked before the once: an attach whose daemon is not our parent must not use it up.
  if (daemon_pid <= 0 || ::getppid() != daemon_pid) return;
  static std::once_flag once;
  std::call_once(once, [daemon_pid, grace] {
    // Detached on purpose: it lives as long as the process and touches no shared state, so the
    // process may exit (or fork) at any moment without joining it.
    std::thread([daemon_pid, grace] {
      while (::getppid() == daemon_pid) std::this_thread::sleep_for(std::chrono::seconds(1));
      const std::string gone = "smddp: this rank's daemon (pid " + std::to_string(daemon_pid) +
                               ") is gone: the rank's next smddp call fails, and the rank is ended in " +
                               std::to_string(grace.count()) + " s if it has not exited\n";
      [[maybe_unused]] const auto g = ::write(STDERR_FILENO, gone.data(), gone.size());
      std::this_thread::sleep_for(grace);
      const std::string why = "smddp: this rank's daemon (pid " + std::to_string(daemon_pid) + ") is gone and the rank " +
                              "has not exited " + std::to_string(grace.count()) +
                              " s later; ending it so that it does not outlive its job\n";
      [[maybe_unused]] const auto n = ::write(STDERR_FILENO, why.data(), why.size());
      ::kill(::getpid(), SIGTERM);
      std::this_thread::sleep_for(std::chrono::seconds(5));
      ::kill(::getpid(), SIGKILL);
    }).detach();
  });
}

}  // namespace smddp::client
