#include "dmp/planner.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dmpcheck::dmp {
namespace {

EmbeddingBagConfig table(const std::string& name, int64_t rows) { return {name, rows, 4, {name + "_f"}, PoolingType::kSum}; }

TEST(Planner, TableWiseBalancesBytesLargestFirstWithLowestRankTies) {
  PlannerInput in;
  in.world_size = 2;
  in.tables = {table("a", 10), table("b", 30), table("c", 20), table("d", 10)};
  const ShardingPlan plan = plan_sharding(in);
  // b (30) -> rank 0; c (20) -> rank 1; a (10) -> rank 1 (20 < 30); d (10) -> tie 30/30 -> rank 0.
  EXPECT_EQ(plan.of("b").ranks, std::vector<int>{0});
  EXPECT_EQ(plan.of("c").ranks, std::vector<int>{1});
  EXPECT_EQ(plan.of("a").ranks, std::vector<int>{1});
  EXPECT_EQ(plan.of("d").ranks, std::vector<int>{0});
  EXPECT_EQ(plan.describe(), plan_sharding(in).describe());
}

TEST(Planner, ConstraintsPickTypeAndRanks) {
  PlannerInput in;
  in.world_size = 3;
  in.tables = {table("a", 10), table("b", 10)};
  in.constraints["a"].sharding_types = {ShardingType::kDataParallel};
  in.constraints["b"].ranks = {2};
  const ShardingPlan plan = plan_sharding(in);
  EXPECT_EQ(plan.of("a").type, ShardingType::kDataParallel);
  EXPECT_EQ(plan.of("a").ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(plan.of("b").ranks, std::vector<int>{2});
}

TEST(Planner, OptimizerStateCountsInTheBalance) {
  PlannerInput in;
  in.world_size = 1;
  in.tables = {table("a", 10)};
  in.optimizer_state_factor = 1.0;
  EXPECT_EQ(plan_sharding(in).of("a").bytes_per_rank, 2 * 10 * 4 * 4);
}

TEST(Planner, RankOutsideTheWorldNamesTheTable) {
  PlannerInput in;
  in.world_size = 2;
  in.tables = {table("a", 10)};
  in.constraints["a"].ranks = {5};
  try {
    plan_sharding(in);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("table 'a': constraint rank 5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dmpcheck::dmp
