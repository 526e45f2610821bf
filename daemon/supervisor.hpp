// Supervisor: starts the node's training ranks as children and notices when they end.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace smddp::daemon {

struct RankExit {
  int local_rank;
  pid_t pid;
  int wait_status;  // as returned by waitpid
};

// "exited with status 3", "was killed by signal 9 (SIGKILL)".
std::string describe_exit(int wait_status);
// The shell's convention: the exit status, or 128 + signal number.
int exit_code_of(int wait_status);

class Supervisor {
 public:
  Supervisor() = default;
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;
  ~Supervisor();  // kills and reaps children still running

  // Starts `argv` with `env` (full environment, "K=V"), a program named without a slash found
  // through env's PATH (not the daemon's). Throws std::runtime_error when the program cannot be
  // executed (reported by the child through a close-on-exec pipe).
  pid_t spawn(int local_rank, const std::vector<std::string>& argv, const std::vector<std::string>& env);
  // Non-blocking: children that ended since the last call.
  std::vector<RankExit> reap();
  void signal_all(int sig);
  bool all_exited() const noexcept { return running_.empty(); }
  std::size_t running() const noexcept { return running_.size(); }

 private:
  std::map<pid_t, int> running_;  // pid -> local rank
};

// Where a shell would find `program` through the PATH in `env` ("K=V" entries): `program` itself
// when it holds a slash, else the first executable file of that name in PATH's directories (an
// empty entry being the working directory), else "" (none, or env has no PATH).
std::string find_program(const std::string& program, const std::vector<std::string>& env);

// Makes a rank's MPI_Init (Open MPI) start a standalone singleton, without a helper daemon.
inline constexpr const char* kSingletonIsolated = "OMPI_MCA_ess_singleton_isolated";

// Child environment: the daemon's own, without the MPI launcher's variables (ranks are not
// part of the MPI job) and the names in `drop`, with kSingletonIsolated=1 unless the daemon's
// environment gives it another value, plus `set` (which wins over both).
std::vector<std::string> child_environment(const std::map<std::string, std::string>& set,
                                           const std::set<std::string>& drop = {});

}  // namespace smddp::daemon
