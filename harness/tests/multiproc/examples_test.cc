// Every example scenario (one per sharding type, each run with every fused optimizer at 2 and 4
// ranks, rows not divisible by the world size, weighted features, empty bags, mean pooling
// across row shards, a rank that receives no ids) must meet its expectations, which compare
// every tensor with the unsharded model after each of 3 steps.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "multiproc/multiproc_util.h"

namespace dmpcheck {
namespace {

class Examples : public testing::MultiProcessTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(Examples, MeetTheirExpectations) {
  const std::string path = std::string(DMPCHECK_SOURCE_DIR "/scenarios/examples/") + GetParam() + ".yaml";
  const auto outcome = run_all(scenario::load_scenario_file(path));
  ASSERT_FALSE(outcome.results.empty());
  for (const auto& r : outcome.results) {
    SCOPED_TRACE(r.run);
    EXPECT_EQ(r.verdict, dmpcheck::check::Verdict::kPass)
        << (r.failure ? r.failure->message : fmt::format("{}", fmt::join(r.expectation.failures, "; ")));
    EXPECT_TRUE(r.global_model_checked);
    EXPECT_EQ(r.losses.size(), 3u);
  }
  EXPECT_EQ(outcome.exit_code, 0);
}

INSTANTIATE_TEST_SUITE_P(EveryShardingType, Examples,
                         ::testing::Values("data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise",
                                           "mixed", "shared_feature"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace dmpcheck
