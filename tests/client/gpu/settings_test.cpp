// The GPU executor's form settings: a value that names no form is an error that names the
// setting, never a silent default (the ranks' schedules must agree, and a typo would measure
// or run the wrong form). Each case runs in a fresh process: the settings are read once.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "client/gpu/peer_executor.hpp"

namespace smddp::client::gpu {
namespace {

// Exits 0 with `want`, 1 with the other form, 3 after printing the error.
template <class Read>
[[noreturn]] void read_and_exit(const char* name, const char* value, Read read, bool want) {
  ::setenv(name, value, 1);
  try {
    std::exit(read() == want ? 0 : 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(3);
  }
}

class GpuSettings : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(GpuSettings, CopiesPushByDefaultAndPullWhenAsked) {
  EXPECT_EXIT(read_and_exit("SMDDP_COPY_DIRECTION", "", PeerExecutor::copy_push, true), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(read_and_exit("SMDDP_COPY_DIRECTION", "push", PeerExecutor::copy_push, true), ::testing::ExitedWithCode(0),
              "");
  EXPECT_EXIT(read_and_exit("SMDDP_COPY_DIRECTION", "pull", PeerExecutor::copy_push, false),
              ::testing::ExitedWithCode(0), "");
}

TEST_F(GpuSettings, TwoShotIsTheCopyFormByDefaultAndTheKernelFormWhenAsked) {
  EXPECT_EXIT(read_and_exit("SMDDP_TWOSHOT", "", PeerExecutor::twoshot_push, false), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(read_and_exit("SMDDP_TWOSHOT", "kernel", PeerExecutor::twoshot_push, true), ::testing::ExitedWithCode(0),
              "");
  EXPECT_EXIT(read_and_exit("SMDDP_TWOSHOT", "copy", PeerExecutor::twoshot_push, false), ::testing::ExitedWithCode(0),
              "");
}

TEST_F(GpuSettings, AValueThatNamesNoFormIsAnErrorNamingTheSetting) {
  EXPECT_EXIT(read_and_exit("SMDDP_COPY_DIRECTION", "sideways", PeerExecutor::copy_push, true),
              ::testing::ExitedWithCode(3), "SMDDP_COPY_DIRECTION='sideways' is not valid: use push or pull");
  // The old names of the two-shot forms are refused too, not read as the default.
  EXPECT_EXIT(read_and_exit("SMDDP_TWOSHOT", "push", PeerExecutor::twoshot_push, false), ::testing::ExitedWithCode(3),
              "SMDDP_TWOSHOT='push' is not valid: use kernel or copy");
}

}  // namespace
}  // namespace smddp::client::gpu
