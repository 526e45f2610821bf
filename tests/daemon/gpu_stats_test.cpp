// The daemon's sum of what the ranks' GPUs ran (rank-side execution), read from the counters
// each rank keeps in its segment slot.
#include <gtest/gtest.h>

#include <unistd.h>

#include <string>

#include "daemon/gpu_stats.hpp"
#include "ipc/segment.hpp"

namespace smddp::daemon {
namespace {

using ipc::OpType;

ipc::Segment make_segment(int ranks) {
  ipc::SegmentSpec spec;
  spec.job_id = "t-gpustats-" + std::to_string(::getpid());
  spec.local_world_size = ranks;
  spec.world_size = ranks;
  spec.arena_bytes = 1 << 20;
  return ipc::Segment::create(spec);
}

void count(ipc::Segment& seg, int rank, OpType op, std::uint64_t kernels, std::uint64_t copies) {
  auto& s = seg.slot(rank);
  s.gpu_ops[static_cast<int>(op)].fetch_add(1);
  s.gpu_kernels[static_cast<int>(op)].fetch_add(kernels);
  s.gpu_copies.fetch_add(copies);
}

TEST(RankGpuStats, NothingRanGivesZeros) {
  auto seg = make_segment(2);
  const auto s = rank_gpu_stats(seg);
  EXPECT_EQ(s.ops, 0u);
  EXPECT_EQ(s.kernels, 0u);
  EXPECT_EQ(s.copies, 0u);
  EXPECT_TRUE(s.ops_by_op.empty());
}

TEST(RankGpuStats, SumsEveryRankByOperation) {
  auto seg = make_segment(3);
  for (int r = 0; r < 3; ++r) {
    count(seg, r, OpType::AllReduce, 1, 1);  // two-shot: a kernel and a copy
    count(seg, r, OpType::AllGather, 0, 2);  // copy engines only
    count(seg, r, OpType::AllGather, 0, 2);
  }
  const auto s = rank_gpu_stats(seg);
  EXPECT_EQ(s.ops, 9u);
  EXPECT_EQ(s.kernels, 3u);
  EXPECT_EQ(s.copies, 15u);
  EXPECT_EQ(s.ops_by_op.at("allreduce"), 3u);
  EXPECT_EQ(s.ops_by_op.at("allgather"), 6u);
  EXPECT_EQ(s.kernels_by_op.at("allreduce"), 3u);
  EXPECT_EQ(s.kernels_by_op.at("allgather"), 0u);  // what operators check for the SDP path
  EXPECT_EQ(s.ops_by_op.count("broadcast"), 0u);
}

}  // namespace
}  // namespace smddp::daemon
