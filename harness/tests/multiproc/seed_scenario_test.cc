// The seed bug (TorchRec #1739) end to end, through the launcher and real rank processes: only
// unseeded + torchrec-0.6 diverges, on all four data-parallel tables, at init and after the
// step; the fix profiles keep every replica equal.
#include <algorithm>
#include <set>

#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "multiproc/multiproc_util.h"

namespace dmpcheck {
namespace {

const char* kSeed = DMPCHECK_SOURCE_DIR "/scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml";

void expect_seed_verdicts(const run::ScenarioOutcome& outcome, int world_size) {
  ASSERT_EQ(outcome.results.size(), 4u);
  EXPECT_EQ(outcome.exit_code, 0);
  for (const auto& r : outcome.results) {
    SCOPED_TRACE(r.run);
    EXPECT_EQ(r.verdict, dmpcheck::check::Verdict::kPass)
        << (r.failure ? r.failure->message : fmt::format("{}", fmt::join(r.expectation.failures, "; ")));
    EXPECT_EQ(r.environment.world_size, world_size);
    std::set<std::string> diverged;
    for (const auto& c : r.replicas) {
      if (!c.equal) {
        diverged.insert(c.name + "@" + scenario::phase_name(c.phase));
        // Every rank but 0 drew its own tables.
        EXPECT_EQ(c.differing_ranks.size(), static_cast<size_t>(world_size - 1));
      }
    }
    const bool bug = r.init_mode == "unseeded" && r.profile == "torchrec-0.6";
    if (bug) {
      EXPECT_EQ(diverged.size(), 8u);  // four tables, at init and at final
      for (const char* t : {"large_table_0", "large_table_1", "small_table_0", "small_table_1"}) {
        EXPECT_TRUE(diverged.count(fmt::format("ebc.embedding_bags.{}.weight@init", t)));
        EXPECT_TRUE(diverged.count(fmt::format("ebc.embedding_bags.{}.weight@final", t)));
      }
    } else {
      EXPECT_TRUE(diverged.empty());
    }
    EXPECT_EQ(r.init_broadcast.performed, r.profile == "torchrec-1.9");
    if (r.init_broadcast.performed) { EXPECT_EQ(r.init_broadcast.bytes, (2 * 4096 + 2 * 1024) * 64 * 4); }
  }
}

class SeedScenario : public testing::MultiProcessTest {};

TEST_F(SeedScenario, TwoRanks) { expect_seed_verdicts(run_reference(scenario::load_scenario_file(kSeed)), 2); }

TEST_F(SeedScenario, ThreeRanks) {
  const std::string text = testing::replace_once(testing::read_file(kSeed), "world_size: 2", "world_size: 3");
  expect_seed_verdicts(run_reference(scenario::load_scenario_text(text, kSeed)), 3);
}

TEST_F(SeedScenario, AWrongExpectationFailsWithExitCodeOne) {
  // Claim the bug shows under the fix profile too: the harness must say that it does not.
  const std::string text = testing::replace_once(
      testing::read_file(kSeed), "when: {init.mode: unseeded, system: reference, profile: torchrec-0.6}",
      "when: {init.mode: unseeded, system: reference}");
  const auto outcome = run_reference(scenario::load_scenario_text(text, kSeed));
  EXPECT_EQ(outcome.exit_code, 1);
  ASSERT_EQ(outcome.results.size(), 4u);
  const auto& fixed = outcome.results[3];  // unseeded + current
  EXPECT_EQ(fixed.verdict, dmpcheck::check::Verdict::kFail);
  ASSERT_FALSE(fixed.expectation.failures.empty());
  EXPECT_TRUE(
      testing::contains(fixed.expectation.failures[0], "was expected to diverge at init but is equal on every rank"));
}

// A scenario turns one switch of a named profile: 0.6 with the #1739 fix alone keeps every
// replica equal where 0.6 itself does not, and each run's result records the switches it ran.
TEST_F(SeedScenario, ASwitchTurnedInTheScenarioChangesTheRunAndIsRecorded) {
  const auto outcome = run_reference(scenario::load_scenario_text(R"(version: 1
name: switched
world_size: 2
steps: 1
batch_size: 4
init: {mode: unseeded, seed: 1}
tables:
  - {name: dp, rows: 16, dim: 4, features: [f0], sharding: {types: [data_parallel]}}
matrix:
  profile: [torchrec-0.6, {base: torchrec-0.6, broadcast_data_parallel_tables_at_init: true}]
)",
                                                                  "switched.yaml"));
  ASSERT_EQ(outcome.results.size(), 2u);
  for (const auto& r : outcome.results) {
    const bool fixed = r.switches.at("broadcast_data_parallel_tables_at_init") == "true";
    EXPECT_EQ(fixed, r.profile == "torchrec-0.6+broadcast_data_parallel_tables_at_init=true") << r.profile;
    EXPECT_EQ(r.switches.at("data_parallel_tables_use_dense_optimizer"), "true");  // the base's
    const auto init = std::find_if(r.replicas.begin(), r.replicas.end(), [](const check::TensorCheck& c) {
      return c.name == "ebc.embedding_bags.dp.weight" && c.phase == scenario::Phase::kInit;
    });
    ASSERT_NE(init, r.replicas.end()) << r.profile;
    EXPECT_EQ(init->equal, fixed) << r.profile;
  }
}

}  // namespace
}  // namespace dmpcheck
