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
template <class Read, class Form>
[[noreturn]] void read_and_exit(const char* name, const char* value, Read read, Form want) {
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

TEST_F(GpuSettings, TwoShotPushesByDefaultAndTakesTheOtherFormsWhenAsked) {
  using T = PeerExecutor::TwoShot;
  EXPECT_EXIT(read_and_exit("SMDDP_TWOSHOT", "", PeerExecutor::twoshot_form, T::Push), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(read_and_exit("SMDDP_TWOSHOT", "pull", PeerExecutor::twoshot_form, T::Pull), ::testing::ExitedWithCode(0),
              "");
  EXPECT_EXIT(read_and_exit("SMDDP_TWOSHOT", "push", PeerExecutor::twoshot_form, T::Push), ::testing::ExitedWithCode(0),
              "");
  EXPECT_EXIT(read_and_exit("SMDDP_TWOSHOT", "kernel", PeerExecutor::twoshot_form, T::Kernel),
              ::testing::ExitedWithCode(0), "");
}

TEST_F(GpuSettings, AValueThatNamesNoFormIsAnErrorNamingTheSetting) {
  EXPECT_EXIT(read_and_exit("SMDDP_COPY_DIRECTION", "sideways", PeerExecutor::copy_push, true),
              ::testing::ExitedWithCode(3), "SMDDP_COPY_DIRECTION='sideways' is not valid: use push or pull");
  EXPECT_EXIT(read_and_exit("SMDDP_TWOSHOT", "Push", PeerExecutor::twoshot_form, PeerExecutor::TwoShot::Push),
              ::testing::ExitedWithCode(3), "SMDDP_TWOSHOT='Push' is not valid: use push, pull or kernel");
}

}  // namespace
}  // namespace smddp::client::gpu
