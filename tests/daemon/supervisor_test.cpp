// Supervisor: spawning, reaping and describing how children ended; the child environment.
// Waiting for a child polls reap() until it reports (correctness never rests on a sleep; the
// deadline only turns a hang into a failure).
#include "daemon/supervisor.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <thread>

namespace smddp::daemon {
namespace {

using namespace std::chrono_literals;

// Polls reap() until `want` children have been reported, or 30 s pass.
std::vector<RankExit> reap_n(Supervisor& sup, std::size_t want) {
  std::vector<RankExit> all;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (all.size() < want && std::chrono::steady_clock::now() < deadline) {
    auto got = sup.reap();
    all.insert(all.end(), got.begin(), got.end());
    if (all.size() < want) std::this_thread::sleep_for(2ms);
  }
  return all;
}

// Wait statuses made by real children, rather than by hand.
int status_of_exit(int code) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(code);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return st;
}
int status_of_signal(int sig) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    ::_exit(99);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return st;
}

TEST(Supervisor, DescribeExit) {
  EXPECT_EQ(describe_exit(status_of_exit(0)), "exited with status 0");
  EXPECT_EQ(describe_exit(status_of_exit(3)), "exited with status 3");
  EXPECT_EQ(describe_exit(status_of_signal(SIGKILL)), "was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(describe_exit(status_of_signal(SIGTERM)), "was killed by signal 15 (SIGTERM)");
}

TEST(Supervisor, ExitCodeOf) {
  EXPECT_EQ(exit_code_of(status_of_exit(0)), 0);
  EXPECT_EQ(exit_code_of(status_of_exit(3)), 3);
  EXPECT_EQ(exit_code_of(status_of_exit(255)), 255);
  EXPECT_EQ(exit_code_of(status_of_signal(SIGKILL)), 128 + 9);
  EXPECT_EQ(exit_code_of(status_of_signal(SIGTERM)), 128 + 15);
}

TEST(Supervisor, SpawnAndReapAnExitingChild) {
  Supervisor sup;
  EXPECT_TRUE(sup.all_exited());
  const pid_t pid = sup.spawn(2, {"/bin/sh", "-c", "exit 3"}, child_environment({}));
  EXPECT_GT(pid, 0);
  auto exits = reap_n(sup, 1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].local_rank, 2);
  EXPECT_EQ(exits[0].pid, pid);
  EXPECT_TRUE(WIFEXITED(exits[0].wait_status));
  EXPECT_EQ(exit_code_of(exits[0].wait_status), 3);
  EXPECT_EQ(describe_exit(exits[0].wait_status), "exited with status 3");
  EXPECT_TRUE(sup.all_exited());
  EXPECT_TRUE(sup.reap().empty()) << "an exit is reported once";
}

TEST(Supervisor, RunningChildIsNotReapedUntilSignalled) {
  Supervisor sup;
  const pid_t pid = sup.spawn(0, {"sleep", "30"}, child_environment({}));  // found through PATH
  const pid_t quick = sup.spawn(1, {"/bin/sh", "-c", "exit 0"}, child_environment({}));
  EXPECT_EQ(sup.running(), 2u);
  auto first = reap_n(sup, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].pid, quick);
  EXPECT_EQ(sup.running(), 1u);
  EXPECT_FALSE(sup.all_exited());
  EXPECT_TRUE(sup.reap().empty()) << "sleep 30 is still running";

  sup.signal_all(SIGTERM);
  auto second = reap_n(sup, 1);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].pid, pid);
  EXPECT_EQ(second[0].local_rank, 0);
  EXPECT_EQ(describe_exit(second[0].wait_status), "was killed by signal 15 (SIGTERM)");
  EXPECT_EQ(exit_code_of(second[0].wait_status), 143);
  EXPECT_TRUE(sup.all_exited());
}

TEST(Supervisor, DestructorKillsAndReapsRunningChildren) {
  pid_t pid = 0;
  {
    Supervisor sup;
    pid = sup.spawn(0, {"sleep", "30"}, child_environment({}));
    EXPECT_EQ(::kill(pid, 0), 0);
  }
  // Reaped by the destructor: the pid is no longer our child.
  int st = 0;
  EXPECT_EQ(::waitpid(pid, &st, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(Supervisor, ARankLeadsItsOwnProcessGroupSoASignalToTheDaemonsGroupMissesIt) {
  // mpirun aborts a job by signalling each daemon's process group; the ranks must stay alive to
  // report the failure, and end when the daemon ends them.
  Supervisor sup;
  const pid_t pid = sup.spawn(0, {"sleep", "30"}, child_environment({}));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (::getpgid(pid) != pid && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(::getpgid(pid), pid);
  EXPECT_NE(::getpgid(pid), ::getpgrp());
  sup.signal_all(SIGTERM);
  EXPECT_EQ(reap_n(sup, 1).size(), 1u);
}

TEST(Supervisor, SpawnOfAMissingProgramThrows) {
  Supervisor sup;
  try {
    sup.spawn(0, {"/nonexistent/smddp-no-such-program", "x"}, child_environment({}));
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot run '/nonexistent/smddp-no-such-program'"), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
  EXPECT_TRUE(sup.all_exited()) << "the failed child is reaped, not tracked";
  EXPECT_THROW(sup.spawn(0, {}, {}), std::invalid_argument);
}

// A folder of programs for one test, removed after it.
class ProgramDir {
 public:
  ProgramDir() {
    char tmpl[] = "/tmp/smddp-programs-XXXXXX";
    if (::mkdtemp(tmpl)) path_ = tmpl;
  }
  ~ProgramDir() {
    if (!path_.empty()) std::filesystem::remove_all(path_);
  }
  // A shell script that exits with `status`, executable unless `executable` is false.
  std::string script(const std::string& name, int status, bool executable = true) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file) << "#!/bin/sh\nexit " << status << "\n";
    ::chmod(file.c_str(), executable ? 0755 : 0644);
    return file;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Supervisor, FindProgramSearchesThePathOfTheGivenEnvironment) {
  ProgramDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string probe = dir.script("smddp-probe", 0);
  dir.script("smddp-not-executable", 0, /*executable=*/false);
  std::filesystem::create_directory(dir.path() + "/smddp-a-folder");
  const std::vector<std::string> env{"HOME=/tmp", "PATH=/nonexistent-smddp::" + dir.path()};
  EXPECT_EQ(find_program("smddp-probe", env), probe);
  EXPECT_EQ(find_program("smddp-not-executable", env), "");
  EXPECT_EQ(find_program("smddp-a-folder", env), "");
  EXPECT_EQ(find_program("smddp-probe", {"HOME=/tmp"}), "") << "no PATH";
  EXPECT_EQ(find_program("/bin/sh", {}), "/bin/sh") << "a path is taken as it is";
  EXPECT_EQ(find_program("sub/prog", {}), "sub/prog");
  EXPECT_EQ(find_program("", env), "");
}

TEST(Supervisor, SpawnRunsTheProgramTheChildsPathNamesNotTheDaemons) {
  // Open MPI puts its bin first in the daemon's PATH; a rank's `true` (or `python3`) must still
  // be the one first in the rank's own PATH.
  ProgramDir dir;
  ASSERT_FALSE(dir.path().empty());
  dir.script("true", 7);
  Supervisor sup;
  sup.spawn(0, {"true"}, {"PATH=" + dir.path() + ":/usr/bin:/bin"});
  auto exits = reap_n(sup, 1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(describe_exit(exits[0].wait_status), "exited with status 7");
}

TEST(Supervisor, ChildGetsTheGivenEnvironment) {
  Supervisor sup;
  // Exit status 0 only if the variable came through and a stripped one did not.
  sup.spawn(0, {"/bin/sh", "-c", "test \"$SMDDP_T_VAR\" = hello && test -z \"$OMPI_COMM_WORLD_RANK\""},
            {"SMDDP_T_VAR=hello", "PATH=/usr/bin:/bin"});
  auto exits = reap_n(sup, 1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(describe_exit(exits[0].wait_status), "exited with status 0");
}

// Sets environment variables for one test and restores them.
class ScopedEnv {
 public:
  ScopedEnv& set(const char* k, const char* v) {
    const char* old = ::getenv(k);
    saved_.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
    ::setenv(k, v, 1);
    return *this;
  }
  ScopedEnv& unset(const char* k) {
    const char* old = ::getenv(k);
    saved_.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
    ::unsetenv(k);
    return *this;
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

bool has(const std::vector<std::string>& env, const std::string& kv) {
  return std::find(env.begin(), env.end(), kv) != env.end();
}
bool has_key(const std::vector<std::string>& env, const std::string& key) {
  return std::any_of(env.begin(), env.end(), [&](const std::string& e) { return e.starts_with(key + "="); });
}

TEST(Supervisor, ChildEnvironmentStripsLauncherVariablesAndAppliesOverrides) {
  ScopedEnv env;
  env.set("OMPI_COMM_WORLD_RANK", "3")
      .set("PMIX_RANK", "3")
      .set("OPAL_PREFIX", "/x")
      .set("SMDDP_T_KEEP", "kept")
      .set("SMDDP_T_REPLACED", "old")
      .set("NOT_OMPI_X", "kept too");
  const auto e = child_environment({{"SMDDP_T_REPLACED", "new"}, {"SMDDP_T_ADDED", "a=b"}, {"OMPI_T_SET", "explicit"}});
  EXPECT_FALSE(has_key(e, "OMPI_COMM_WORLD_RANK"));
  EXPECT_FALSE(has_key(e, "PMIX_RANK"));
  EXPECT_FALSE(has_key(e, "OPAL_PREFIX"));
  EXPECT_TRUE(has(e, "SMDDP_T_KEEP=kept"));
  EXPECT_TRUE(has(e, "NOT_OMPI_X=kept too"));
  EXPECT_TRUE(has(e, "SMDDP_T_REPLACED=new"));
  EXPECT_FALSE(has(e, "SMDDP_T_REPLACED=old"));
  EXPECT_EQ(std::count_if(e.begin(), e.end(), [](const std::string& s) { return s.starts_with("SMDDP_T_REPLACED="); }), 1);
  EXPECT_TRUE(has(e, "SMDDP_T_ADDED=a=b"));
  EXPECT_TRUE(has(e, "OMPI_T_SET=explicit")) << "what is set explicitly wins over the stripping";
  if (::getenv("PATH")) {
    EXPECT_TRUE(has_key(e, "PATH"));
  }
}

TEST(Supervisor, ChildEnvironmentDropsTheNamesItIsToldToUnlessSetWinsOverThem) {
  ScopedEnv env;
  env.set("SMDDP_T_DROPPED", "x").set("SMDDP_T_DROPPED_BUT_SET", "old").set("SMDDP_T_KEPT", "y");
  const auto e = child_environment({{"SMDDP_T_DROPPED_BUT_SET", "new"}}, {"SMDDP_T_DROPPED", "SMDDP_T_DROPPED_BUT_SET"});
  EXPECT_FALSE(has_key(e, "SMDDP_T_DROPPED"));
  EXPECT_TRUE(has(e, "SMDDP_T_DROPPED_BUT_SET=new"));
  EXPECT_FALSE(has(e, "SMDDP_T_DROPPED_BUT_SET=old"));
  EXPECT_TRUE(has(e, "SMDDP_T_KEPT=y"));
}

TEST(Supervisor, ChildEnvironmentMakesMpiAnIsolatedSingleton) {
  ScopedEnv env;
  // What mpirun gives the daemon; none of it may reach the ranks.
  env.set("OMPI_COMM_WORLD_SIZE", "4").set("OMPI_MCA_plm_rsh_agent", "ssh : rsh").set("PMIX_NAMESPACE", "x");
  env.unset(kSingletonIsolated);
  auto e = child_environment({{"RANK", "1"}});
  EXPECT_TRUE(has(e, "OMPI_MCA_ess_singleton_isolated=1"));
  EXPECT_EQ(std::count_if(e.begin(), e.end(), [](const std::string& s) { return s.starts_with("OMPI_"); }), 1)
      << "only the singleton setting is an OMPI_ variable of a rank";
  EXPECT_FALSE(has_key(e, "OMPI_COMM_WORLD_SIZE"));
  EXPECT_FALSE(has_key(e, "OMPI_MCA_plm_rsh_agent"));
  EXPECT_FALSE(has_key(e, "PMIX_NAMESPACE"));
  EXPECT_TRUE(has(e, "RANK=1"));

  // A value the user gave (it reaches the daemon through mpirun) is kept, once.
  env.set(kSingletonIsolated, "0");
  e = child_environment({});
  EXPECT_TRUE(has(e, "OMPI_MCA_ess_singleton_isolated=0"));
  EXPECT_FALSE(has(e, "OMPI_MCA_ess_singleton_isolated=1"));
  EXPECT_EQ(std::count_if(e.begin(), e.end(), [](const std::string& s) { return s.starts_with("OMPI_"); }), 1);

  // What the caller sets wins over both.
  e = child_environment({{kSingletonIsolated, "1"}});
  EXPECT_TRUE(has(e, "OMPI_MCA_ess_singleton_isolated=1"));
  EXPECT_EQ(std::count_if(e.begin(), e.end(), [](const std::string& s) { return s.starts_with("OMPI_"); }), 1);
}

TEST(Supervisor, RankWithTheChildEnvironmentSeesTheSingletonSetting) {
  ScopedEnv env;
  env.set("OMPI_COMM_WORLD_RANK", "2").unset(kSingletonIsolated);
  Supervisor sup;
  sup.spawn(0, {"/bin/sh", "-c", "test \"$OMPI_MCA_ess_singleton_isolated\" = 1 && test -z \"$OMPI_COMM_WORLD_RANK\""},
            child_environment({}));
  auto exits = reap_n(sup, 1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(describe_exit(exits[0].wait_status), "exited with status 0");
}

}  // namespace
}  // namespace smddp::daemon
