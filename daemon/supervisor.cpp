#include "daemon/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

extern char** environ;

namespace smddp::daemon {

std::string describe_exit(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    const int sig = WTERMSIG(st);
    const char* abbrev = ::sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + (abbrev ? std::string(" (SIG") + abbrev + ")" : "");
  }
  return "ended with wait status " + std::to_string(st);
}

int exit_code_of(int st) {
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return 1;
}

std::vector<std::string> child_environment(const std::map<std::string, std::string>& set,
                                           const std::set<std::string>& drop) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    const auto key = kv.substr(0, kv.find('='));
    if (key.starts_with("OMPI_") || key.starts_with("PMIX_") || key.starts_with("OPAL_") ||
        key.starts_with("PRTE_") || key.starts_with("ORTE_") || set.count(std::string(key)) ||
        drop.count(std::string(key)))
      continue;
    env.emplace_back(kv);
  }
  // A rank that initialises MPI (mpi4py, `python -m mpi4py`) is a singleton. Open MPI 4.1's
  // default singleton starts a helper daemon through ssh/rsh, which aborts where neither
  // exists; an isolated one starts nothing. A value the user gave (smddprun's environment,
  // `-x`, `--mca ess_singleton_isolated`) reaches the daemon as this variable and is kept:
  // only singletons read it, so it can only have been meant for the ranks.
  if (!set.count(std::string(kSingletonIsolated))) {
    const char* user = std::getenv(kSingletonIsolated);
    env.push_back(std::string(kSingletonIsolated) + "=" + (user && *user ? user : "1"));
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

namespace {
struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() {
    if (::pipe2(fd, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe2: ") + ::strerror(errno));
  }
  ~Pipe() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  void close_end(int i) {
    if (fd[i] >= 0) ::close(fd[i]);
    fd[i] = -1;
  }
};
}  // namespace

std::string find_program(const std::string& program, const std::vector<std::string>& env) {
  if (program.find('/') != std::string::npos) return program;
  if (program.empty()) return "";
  const auto path = std::find_if(env.rbegin(), env.rend(), [](const std::string& e) { return e.starts_with("PATH="); });
  if (path == env.rend()) return "";
  std::string_view dirs = std::string_view(*path).substr(5);
  for (;;) {
    const auto colon = dirs.find(':');
    const std::string_view dir = dirs.substr(0, colon);
    const std::string candidate = (dir.empty() ? std::string(".") : std::string(dir)) + "/" + program;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (colon == std::string_view::npos) return "";
    dirs.remove_prefix(colon + 1);
  }
}

pid_t Supervisor::spawn(int local_rank, const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  if (argv.empty()) throw std::invalid_argument("no command to run for the ranks");
  // execvpe searches the daemon's PATH, into which Open MPI may have put its own bin first; the
  // ranks' PATH is the user's (Daemon::run), and `python3` must be the one it names.
  const std::string program = find_program(argv[0], env);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  Pipe status;
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + ::strerror(errno));
  if (pid == 0) {
    // Child: only async-signal-safe calls from here on.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    // A process group of its own: mpirun signals the daemon's group when it aborts the job, and a
    // rank that knows why must live to report it. The daemon ends its ranks; a rank whose daemon
    // was killed ends itself (client/orphan_watch.hpp).
    ::setpgid(0, 0);
    if (!program.empty()) ::execve(program.c_str(), cargv.data(), cenv.data());
    else ::execvpe(cargv[0], cargv.data(), cenv.data());  // not found: fails with execvpe's errno
    const int err = errno;
    [[maybe_unused]] auto n = ::write(status.fd[1], &err, sizeof err);
    ::_exit(127);
  }
  status.close_end(1);
  int err = 0;
  ssize_t n;
  do n = ::read(status.fd[0], &err, sizeof err);
  while (n < 0 && errno == EINTR);
  if (n == sizeof err) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    throw std::runtime_error("cannot run '" + argv[0] + "': " + ::strerror(err));
  }
  running_[pid] = local_rank;
  return pid;
}

std::vector<RankExit> Supervisor::reap() {
  std::vector<RankExit> out;
  for (auto it = running_.begin(); it != running_.end();) {
    int st = 0;
    const pid_t r = ::waitpid(it->first, &st, WNOHANG);
    if (r == it->first || (r < 0 && errno == ECHILD)) {
      out.push_back({it->second, it->first, r == it->first ? st : 0});
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void Supervisor::signal_all(int sig) {
  for (const auto& [pid, rank] : running_) ::kill(pid, sig);
}

Supervisor::~Supervisor() {
  if (running_.empty()) return;
  signal_all(SIGKILL);
  for (const auto& [pid, rank] : running_) {
    int st = 0;
    ::waitpid(pid, &st, 0);
  }
}

}  // namespace smddp::daemon
