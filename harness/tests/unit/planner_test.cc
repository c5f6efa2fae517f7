#include "dmp/planner.h"

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "test_util.h"

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

TEST(Planner, TableWiseBalancesTimeLargestFirstWithLowestRankTies) {
  const PlannerInput in = input(2, {table("a", 10), table("b", 30), table("c", 20), table("d", 10)});
  const ShardingPlan plan = plan_sharding(in);
  // Equal dims take equal time: b (largest) -> rank 0, c -> rank 1, then a and d in model order
  // (equal storage) -> rank 0, rank 1.
  EXPECT_EQ(plan.of("b").ranks(), std::vector<int>{0});
  EXPECT_EQ(plan.of("c").ranks(), std::vector<int>{1});
  EXPECT_EQ(plan.of("a").ranks(), std::vector<int>{0});
  EXPECT_EQ(plan.of("d").ranks(), std::vector<int>{1});
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

TEST(Planner, ColumnWidthsAreTorchRecs) {
  // min_partition = dim / column_shards, rounded up to a multiple of 4 that divides dim.
  EXPECT_EQ(torchrec_column_width(12, 3), 4);
  EXPECT_EQ(torchrec_column_width(12, 2), 12);  // 6 is no multiple of 4: one shard
  EXPECT_EQ(torchrec_column_width(16, 8), 4);   // four shards of 4, not eight of 2
  EXPECT_EQ(torchrec_column_width(8, 4), 4);
  EXPECT_EQ(torchrec_column_width(10, 3), 10);
  EXPECT_EQ(torchrec_column_width(520, 0), 260);  // default min_partition 128
  PlannerInput in = input(2, {table("t", 8, 12)});
  in.constraints["t"].sharding_types = {ShardingType::kColumnWise};
  in.constraints["t"].column_shards = 3;
  const ShardingPlan plan = plan_sharding(in);
  ASSERT_EQ(plan.of("t").shards.size(), 3u);
  EXPECT_EQ(plan.of("t").shards[1].col_offset, 4);
  // Shards go to the least-loaded rank one by one and may share one: 0, 1, then 0 again.
  EXPECT_EQ(plan.of("t").shards[0].rank, 0);
  EXPECT_EQ(plan.of("t").shards[1].rank, 1);
  EXPECT_EQ(plan.of("t").shards[2].rank, 0);
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
  EXPECT_TRUE(testing::contains(
      message, "table 'a' (100 x 4) fits nowhere: table_wise would put 1600 bytes on rank 0 (limit 1000)"));
}

TEST(Planner, RankOutsideTheWorldNamesTheTable) {
  PlannerInput in = input(2, {table("a", 10)});
  in.constraints["a"].ranks = {5};
  EXPECT_TRUE(testing::contains(error_of(in), "table 'a': constraint rank 5"));
}

// The plans real TorchRec releases make on CPU for 450 table sets (world sizes 2-4, every
// sharding type, optimizers, weighted features, fp16/bf16), as their own planner printed them:
// fixtures/torchrec-plans/, regenerated by `python -m dmpcheck_torchrec.plan_corpus` under each
// release's Python.  dmpcheck's planner must place every shard where they do.
void expect_torchrec_plans(const std::string& release, bool counts_optimizer_state) {
  std::ifstream configs_in(DMPCHECK_SOURCE_DIR "/fixtures/torchrec-plans/configs.json");
  std::ifstream plans_in(std::string(DMPCHECK_SOURCE_DIR "/fixtures/torchrec-plans/plans-") + release + ".json");
  ASSERT_TRUE(configs_in.good() && plans_in.good());
  const auto configs = nlohmann::json::parse(configs_in);
  const auto measured = nlohmann::json::parse(plans_in);
  ASSERT_EQ(measured.at("torchrec"), release);
  int agree = 0;
  for (const auto& c : configs) {
    PlannerInput in;
    const int world = c.at("world");
    in.topology = {world, c.value("lws", world), 0};
    const std::string opt = c.value("opt", "sgd");
    for (const auto& t : c.at("tables")) {
      EmbeddingBagConfig table{t.at("name"),
                               t.at("rows"),
                               t.at("dim"),
                               {"f_" + t.at("name").get<std::string>()},
                               t.value("pooling", "sum") == "mean" ? PoolingType::kMean : PoolingType::kSum};
      table.weighted = c.value("weighted", false);
      table.data_type = *value_in(dmp::kDataTypeNames, t.value("data_type", "fp32"));
      ShardingConstraints& k = in.constraints[table.name];
      for (const auto& type : t.at("types")) k.sharding_types.push_back(*parse_sharding_type(type));
      k.column_shards = t.value("column_shards", 0);
      in.tables.push_back(table);
    }
    if (counts_optimizer_state) {
      in.state_multiplier = [opt](const EmbeddingBagConfig& t) {
        return opt == "adagrad" ? 1.0 : opt == "adam" ? 2.0 : opt == "rowwise_adagrad" ? 1.0 / t.embedding_dim : 0.0;
      };
    }
    const ShardingPlan plan = plan_sharding(in);
    bool same = true;
    for (const auto& [name, shards] : measured.at("plans").at(c.at("id").get<std::string>()).items()) {
      const TablePlan& ours = plan.of(name);
      std::vector<std::vector<int64_t>> mine;
      for (const auto& s : ours.shards) {
        if (ours.type == ShardingType::kDataParallel) {
          mine.push_back({s.rank, 0, -1, 0, -1});
        } else {
          mine.push_back({s.rank, s.row_offset, s.rows, s.col_offset, s.cols});
        }
      }
      const auto theirs = shards.get<std::vector<std::vector<int64_t>>>();
      if (mine != theirs) {
        same = false;
        ADD_FAILURE() << "torchrec " << release << ", " << c.at("id") << ", table " << name << ": TorchRec placed "
                      << shards.dump() << ", dmpcheck " << nlohmann::json(mine).dump();
      }
    }
    agree += same ? 1 : 0;
  }
  EXPECT_EQ(agree, static_cast<int>(configs.size()));
}

TEST(Planner, PlacesEveryShardWhereTorchRec192Does) { expect_torchrec_plans("1.9.2", /*counts_optimizer_state=*/true); }
TEST(Planner, PlacesEveryShardWhereTorchRec060Does) {
  expect_torchrec_plans("0.6.0", /*counts_optimizer_state=*/false);
}

}  // namespace
}  // namespace dmpcheck::dmp
