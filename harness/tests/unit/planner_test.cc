#include "dmp/planner.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dmpcheck::dmp {
namespace {

EmbeddingBagConfig table(const std::string& name, int64_t rows, int64_t dim = 4) {
  return {name, rows, dim, {name + "_f"}, PoolingType::kSum};
}

PlannerInput input(int world, std::vector<EmbeddingBagConfig> tables, int local = 0) {
  PlannerInput in;
  in.topology = {world, local > 0 ? local : world, 0};
  in.tables = std::move(tables);
  return in;
}

std::vector<int64_t> rows_of(const TablePlan& t) {
  std::vector<int64_t> rows;
  for (const auto& s : t.shards) rows.push_back(s.rows);
  return rows;
}

std::string error_of(const PlannerInput& in) {
  try {
    plan_sharding(in);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidScenario);
    return e.what();
  }
  return "no error";
}

TEST(Planner, TableWiseBalancesBytesLargestFirstWithLowestRankTies) {
  const PlannerInput in = input(2, {table("a", 10), table("b", 30), table("c", 20), table("d", 10)});
  const ShardingPlan plan = plan_sharding(in);
  // b (30) -> rank 0; c (20) -> rank 1; a (10) -> rank 1 (20 < 30); d (10) -> tie 30/30 -> rank 0.
  EXPECT_EQ(plan.of("b").ranks(), std::vector<int>{0});
  EXPECT_EQ(plan.of("c").ranks(), std::vector<int>{1});
  EXPECT_EQ(plan.of("a").ranks(), std::vector<int>{1});
  EXPECT_EQ(plan.of("d").ranks(), std::vector<int>{0});
  EXPECT_EQ(plan.serialize(), plan_sharding(in).serialize());
  EXPECT_EQ(ShardingPlan::deserialize(plan.serialize()).serialize(), plan.serialize());
}

TEST(Planner, ConstraintsPickTypeAndRanks) {
  PlannerInput in = input(3, {table("a", 10), table("b", 10)});
  in.constraints["a"].sharding_types = {ShardingType::kDataParallel};
  in.constraints["b"].ranks = {2};
  const ShardingPlan plan = plan_sharding(in);
  EXPECT_EQ(plan.of("a").type, ShardingType::kDataParallel);
  EXPECT_EQ(plan.of("a").ranks(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(plan.of("b").ranks(), std::vector<int>{2});
}

TEST(Planner, RowWiseBlocksAreCeilOfRowsOverRanks) {
  PlannerInput in = input(4, {table("ten", 10), table("five", 5)});
  in.constraints["ten"].sharding_types = {ShardingType::kRowWise};
  in.constraints["five"].sharding_types = {ShardingType::kRowWise};
  const ShardingPlan plan = plan_sharding(in);
  EXPECT_EQ(rows_of(plan.of("ten")), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(rows_of(plan.of("five")), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(plan.of("five").shards[3].row_offset, 5);
}

TEST(Planner, ColumnWiseSplitsTheDimAndPlacesShardsOnDistinctRanks) {
  PlannerInput in = input(2, {table("t", 8, 12)});
  in.constraints["t"].sharding_types = {ShardingType::kColumnWise};
  in.constraints["t"].column_shards = 3;
  const ShardingPlan plan = plan_sharding(in);
  ASSERT_EQ(plan.of("t").shards.size(), 3u);
  EXPECT_EQ(plan.of("t").shards[1].col_offset, 4);
  EXPECT_EQ(plan.of("t").shards[0].rank, 0);
  EXPECT_EQ(plan.of("t").shards[1].rank, 1);
}

TEST(Planner, ColumnWiseUndivisibleDimSaysWhichCountsWork) {
  PlannerInput in = input(2, {table("t", 8, 10)});
  in.constraints["t"].sharding_types = {ShardingType::kColumnWise};
  in.constraints["t"].column_shards = 3;
  EXPECT_NE(error_of(in).find("table 't': dim 10 cannot be split into 3 column shards; shard counts that divide it: 1, 2, 5, 10"),
            std::string::npos)
      << error_of(in);
}

TEST(Planner, ColumnWiseDefaultFollowsTorchRec) {
  PlannerInput in = input(4, {table("small", 8, 64), table("wide", 8, 512)});
  in.constraints["small"].sharding_types = {ShardingType::kColumnWise};
  in.constraints["wide"].sharding_types = {ShardingType::kColumnWise};
  const ShardingPlan plan = plan_sharding(in);
  EXPECT_EQ(plan.of("small").shards.size(), 1u);  // dims up to 128 stay whole
  EXPECT_EQ(plan.of("wide").shards.size(), 4u);   // 4 x 128
}

TEST(Planner, TableRowWiseStaysInsideOneHost) {
  PlannerInput in = input(4, {table("big", 40), table("t", 10)}, /*local=*/2);
  in.constraints["big"].sharding_types = {ShardingType::kTableRowWise};
  in.constraints["t"].sharding_types = {ShardingType::kTableRowWise};
  const ShardingPlan plan = plan_sharding(in);
  EXPECT_EQ(plan.of("big").ranks(), (std::vector<int>{0, 1}));  // host 0
  EXPECT_EQ(rows_of(plan.of("big")), (std::vector<int64_t>{20, 20}));
  EXPECT_EQ(plan.of("t").ranks(), (std::vector<int>{2, 3}));  // host 1 holds less
}

TEST(Planner, OptimizerStateCountsInTheBalance) {
  PlannerInput in = input(1, {table("a", 10)});
  in.state_bytes = [](int64_t rows, int64_t cols) { return rows * cols * 4; };
  EXPECT_EQ(plan_sharding(in).of("a").shards[0].bytes, 2 * 10 * 4 * 4);
}

TEST(Planner, MemoryLimitFallsBackToTheNextTypeThenNamesTheTable) {
  PlannerInput in = input(2, {table("a", 100)});  // 1600 bytes
  in.topology.memory_per_rank = 1000;
  in.constraints["a"].sharding_types = {ShardingType::kTableWise, ShardingType::kRowWise};
  EXPECT_EQ(plan_sharding(in).of("a").type, ShardingType::kRowWise);  // 800 per rank fits
  in.constraints["a"].sharding_types = {ShardingType::kTableWise, ShardingType::kDataParallel};
  const std::string message = error_of(in);
  EXPECT_NE(message.find("table 'a' (100 x 4) fits nowhere: table_wise would put 1600 bytes on rank 0 (limit 1000)"),
            std::string::npos)
      << message;
}

TEST(Planner, RankOutsideTheWorldNamesTheTable) {
  PlannerInput in = input(2, {table("a", 10)});
  in.constraints["a"].ranks = {5};
  EXPECT_NE(error_of(in).find("table 'a': constraint rank 5"), std::string::npos);
}

}  // namespace
}  // namespace dmpcheck::dmp
