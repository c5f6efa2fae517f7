// dmpcheck explore's space: the same seed draws the same configurations, every drawn one loads as
// a scenario, and the minimiser reduces a known failure to what it needs and nothing more.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "explore/space.h"
#include "scenario/scenario.h"

namespace dmpcheck::explore {
namespace {

TEST(ExploreSpace, TheSameSeedDrawsTheSameConfigurationsAndAnotherSeedOthers) {
  std::vector<std::string> first, again, other;
  for (uint64_t i = 0; i < 50; ++i) {
    first.push_back(scenario_yaml(draw(7, i), "x", "torchrec==1.9.2"));
    again.push_back(scenario_yaml(draw(7, i), "x", "torchrec==1.9.2"));
    other.push_back(scenario_yaml(draw(8, i), "x", "torchrec==1.9.2"));
  }
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
  // Not one configuration over and over: the draws differ among themselves.
  EXPECT_GT(std::set<std::string>(first.begin(), first.end()).size(), 45u);
}

TEST(ExploreSpace, EveryDrawnConfigurationLoadsAsAScenarioAndTheSpaceIsCovered) {
  std::set<std::string> covered;
  for (uint64_t i = 0; i < 400; ++i) {
    const Config c = draw(3, i);
    const std::string yaml = scenario_yaml(c, "drawn", "torchrec==1.9.2");
    try {
      const auto s = scenario::load_scenario_text(yaml, "drawn");
      ASSERT_EQ(s.runs.size(), 1u);
      EXPECT_EQ(s.runs[0].world_size, c.world_size);
      EXPECT_EQ(s.runs[0].model.tables.size(), c.tables.size());
      EXPECT_EQ(s.runs[0].torchrec_epochs, c.epochs);
      EXPECT_TRUE(!c.weight_decay || c.sparse == "rowwise_adagrad") << i;  // as drawn, not only as written
    } catch (const std::exception& e) {
      FAIL() << "configuration " << i << " does not load: " << e.what() << "\n" << yaml;
    }
    for (const auto& a : axis_values(c)) covered.insert(a);
  }
  for (const char* value : {"sharding=data_parallel",
                            "sharding=table_wise",
                            "sharding=row_wise",
                            "sharding=column_wise",
                            "sharding=table_row_wise",
                            "pooling=sum",
                            "pooling=mean",
                            "pooling=none",
                            "world_size=1",
                            "world_size=4",
                            "sparse=rowwise_adagrad",
                            "weight_decay=true",
                            "weighted=true",
                            "variable_batch=true",
                            "shared_feature=true",
                            "loop=train_pipeline_sparse_dist",
                            "dense=adam",
                            "data_type=fp16",
                            "epochs=3",
                            "eval_batches=1"}) {
    EXPECT_TRUE(covered.count(value)) << value;
  }
}

TEST(ExploreMinimiser, AKnownFailureIsReducedToWhatItNeeds) {
  // The failure: a row_wise mean table beside rowwise_adagrad with weight decay (and nothing else).
  auto fails = [](const Config& c) {
    const bool table = std::any_of(c.tables.begin(), c.tables.end(),
                                   [](const TableDraw& t) { return t.sharding == "row_wise" && t.pooling == "mean"; });
    return table && c.sparse == "rowwise_adagrad" && c.weight_decay;
  };
  Config big;
  big.world_size = 4;
  big.steps = 3;
  big.batch_size = 8;
  big.max_ids_per_bag = 6;
  big.sparse = "rowwise_adagrad";
  big.weight_decay = true;
  big.dense = "adam";
  big.loop = "train_pipeline_sparse_dist";
  big.tables = {TableDraw{100, 8, "sum", "data_parallel", false, true},
                TableDraw{40, 8, "mean", "row_wise", false, false},
                TableDraw{16, 4, "none", "column_wise", false, false}};
  ASSERT_TRUE(fails(big));
  int tries = 0;
  const Config small = minimise(big, fails, 500, &tries);
  EXPECT_TRUE(fails(small));
  EXPECT_EQ(traits(small), (std::vector<std::string>{"sparse rowwise_adagrad", "table row_wise mean", "weight decay"}));
  ASSERT_EQ(small.tables.size(), 1u);
  EXPECT_EQ(small.tables[0].rows, 8);
  EXPECT_EQ(small.world_size, 1);
  EXPECT_EQ(small.steps, 1);
  EXPECT_LT(tries, 100);
  // Out of tries: it stops there, with what it has (still failing).
  const Config partial = minimise(big, fails, 3, &tries);
  EXPECT_EQ(tries, 3);
  EXPECT_TRUE(fails(partial));
}

}  // namespace
}  // namespace dmpcheck::explore
