// The GPU executor's form settings: a value that names no form is an error that names the
// setting, never a silent default (the ranks' schedules must agree, and a typo would measure
// or run the wrong form). Each case runs in a fresh process: the settings are read once.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <tuple>
#include <vector>

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

// Whether a float32 op with `in_bytes` of input takes the fast path in a group of n ranks.
bool fast(ipc::OpType op, std::uint64_t in_bytes, int n = 2) {
  static float dummy[1];
  FastOp f;
  f.op = op;
  f.count = in_bytes / 4 / (op == ipc::OpType::ReduceScatter ? static_cast<std::uint64_t>(n) : 1);
  f.in = dummy;
  f.out = dummy;
  f.slots.resize(static_cast<std::size_t>(n));
  return PeerExecutor::fast_eligible(f);
}

// Exits 0 when every (op, input bytes, ranks) case is `want`, else 1 naming the first that is not.
[[noreturn]] void limits_exit(const char* value, bool want,
                              const std::vector<std::tuple<ipc::OpType, std::uint64_t, int>>& cases) {
  if (value) ::setenv("SMDDP_FAST_MAX_BYTES", value, 1);
  else ::unsetenv("SMDDP_FAST_MAX_BYTES");
  for (const auto& [op, bytes, n] : cases)
    if (fast(op, bytes, n) != want) {
      std::fprintf(stderr, "%s of %llu bytes with %d ranks\n", std::string(ipc::to_string(op)).c_str(),
                   static_cast<unsigned long long>(bytes), n);
      std::exit(1);
    }
  std::exit(0);
}

constexpr std::uint64_t kMiB = 1 << 20;
using ipc::OpType;

// With 2 ranks, AllReduce and ReduceScatter take the fast path up to 16 MiB of input and
// AllGather up to 8 MiB, where it stops beating the plan path; with more ranks 2/n of 4 MiB.
TEST_F(GpuSettings, FastPathLimitsByDefaultArePerOperation) {
  EXPECT_EXIT(limits_exit(nullptr, true,
                          {{OpType::AllReduce, 16 * kMiB, 2},
                           {OpType::ReduceScatter, 16 * kMiB, 2},
                           {OpType::AllGather, 8 * kMiB, 2},
                           {OpType::AllReduce, 2 * kMiB, 4},
                           {OpType::AllGather, 1 * kMiB, 8}}),
              ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(limits_exit(nullptr, false,
                          {{OpType::AllReduce, 16 * kMiB + 16, 2},
                           {OpType::ReduceScatter, 16 * kMiB + 16, 2},
                           {OpType::AllGather, 8 * kMiB + 16, 2},
                           {OpType::AllReduce, 2 * kMiB + 16, 4},
                           {OpType::AllGather, 1 * kMiB + 16, 8},
                           {OpType::Broadcast, 4096, 2}}),
              ::testing::ExitedWithCode(0), "");
}

TEST_F(GpuSettings, FastPathLimitSetOnceForEveryOperationOrOff) {
  EXPECT_EXIT(limits_exit("2097152", true, {{OpType::AllReduce, 2 * kMiB, 2}, {OpType::AllGather, 2 * kMiB, 2},
                                            {OpType::AllReduce, 1 * kMiB, 4}}),
              ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(limits_exit("2097152", false, {{OpType::AllReduce, 2 * kMiB + 16, 2},
                                             {OpType::ReduceScatter, 4 * kMiB, 2},
                                             {OpType::AllReduce, 1 * kMiB + 16, 4}}),
              ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(limits_exit("0", false, {{OpType::AllReduce, 16, 2}, {OpType::AllGather, 16, 2}}),
              ::testing::ExitedWithCode(0), "");
  // Never past the staging buffers, whatever is asked.
  EXPECT_EXIT(limits_exit("1073741824", false, {{OpType::AllReduce, 32 * kMiB, 2}}), ::testing::ExitedWithCode(0),
              "");
}

}  // namespace
}  // namespace smddp::client::gpu
