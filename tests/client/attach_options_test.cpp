#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "client/client.hpp"

using smddp::client::AttachOptions;
using smddp::client::Error;
using smddp::client::Status;

namespace {

// Sets the launcher's variables for one test and restores the previous environment after.
class EnvGuard {
 public:
  static constexpr const char* kNames[] = {"SMDDP_JOB_ID", "SMDDP_NODE_ID", "RANK",
                                           "LOCAL_RANK",   "WORLD_SIZE",    "LOCAL_WORLD_SIZE"};
  EnvGuard() {
    for (const char* n : kNames) {
      if (const char* v = std::getenv(n)) saved_[n] = v;
      else saved_[n] = std::nullopt;
    }
    set("SMDDP_JOB_ID", "job-1");
    set("SMDDP_NODE_ID", "3");
    set("RANK", "5");
    set("LOCAL_RANK", "1");
    set("WORLD_SIZE", "8");
    set("LOCAL_WORLD_SIZE", "4");
  }
  ~EnvGuard() {
    for (const auto& [n, v] : saved_) {
      if (v) ::setenv(n.c_str(), v->c_str(), 1);
      else ::unsetenv(n.c_str());
    }
  }
  void set(const char* n, const char* v) { ::setenv(n, v, 1); }
  void unset(const char* n) { ::unsetenv(n); }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// The Error from_env() throws, or a test failure when it throws nothing.
std::optional<Error> from_env_error() {
  try {
    AttachOptions::from_env();
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace

TEST(AttachOptionsFromEnv, ReadsEveryVariable) {
  EnvGuard env;
  const auto o = AttachOptions::from_env();
  EXPECT_EQ(o.job_id, "job-1");
  EXPECT_EQ(o.node_id, 3);
  EXPECT_EQ(o.rank, 5);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_EQ(o.world_size, 8);
  EXPECT_EQ(o.local_world_size, 4);
}

TEST(AttachOptionsFromEnv, NodeIdDefaultsToZero) {
  EnvGuard env;
  env.unset("SMDDP_NODE_ID");
  EXPECT_EQ(AttachOptions::from_env().node_id, 0);
}

TEST(AttachOptionsFromEnv, MissingJobIdSaysHowToLaunch) {
  EnvGuard env;
  env.unset("SMDDP_JOB_ID");
  auto e = from_env_error();
  ASSERT_TRUE(e) << "from_env accepted a missing SMDDP_JOB_ID";
  EXPECT_EQ(e->status(), Status::InvalidRequest);
  const std::string what = e->what();
  EXPECT_NE(what.find("SMDDP_JOB_ID"), std::string::npos) << what;
  EXPECT_NE(what.find("smddprun"), std::string::npos) << what;
  env.set("SMDDP_JOB_ID", "");  // empty counts as missing
  ASSERT_TRUE(from_env_error());
}

TEST(AttachOptionsFromEnv, EachMissingRequiredVariableIsNamed) {
  for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}) {
    EnvGuard env;
    env.unset(name);
    auto e = from_env_error();
    ASSERT_TRUE(e) << "missing " << name << " was accepted";
    EXPECT_EQ(e->status(), Status::InvalidRequest);
    const std::string what = e->what();
    EXPECT_NE(what.find(std::string(name) + " is not set"), std::string::npos) << what;
  }
}

TEST(AttachOptionsFromEnv, MalformedNumbersAreRejected) {
  for (const char* bad : {"abc", "3x", "-1", "1.5", "99999999999999999999", "0x10"}) {
    for (const char* name : {"RANK", "SMDDP_NODE_ID", "WORLD_SIZE"}) {
      EnvGuard env;
      env.set(name, bad);
      auto e = from_env_error();
      ASSERT_TRUE(e) << name << "='" << bad << "' was accepted";
      EXPECT_EQ(e->status(), Status::InvalidRequest);
      const std::string what = e->what();
      EXPECT_NE(what.find(name), std::string::npos) << what;
      EXPECT_NE(what.find(bad), std::string::npos) << "the message should quote the bad value: " << what;
    }
  }
}
