// How a cell run on another release is judged (suite/behaviour.h): against the expectations the
// scenario writes for each release it names.  Results are made here; nothing is launched.
#include <gtest/gtest.h>

#include "scenario/scenario.h"
#include "suite/behaviour.h"
#include "test_util.h"

namespace dmpcheck::run {
namespace {

using dmpcheck::testing::contains;

// A report that shows as a divergence on 0.6.0 and is fixed on 1.9.2, with a cell (seeded) that
// cannot tell them apart, and a reference profile that models it.
constexpr const char* kScenario = R"(version: 1
name: behaviour-test
reproduces:
  url: https://example.invalid/1
  bug_profile: torchrec-0.6
  fix_profile: current
  releases:
    torchrec==0.6.0: bug
    torchrec==1.9.2: fixed
world_size: 2
steps: 1
init: {mode: unseeded, seed: 3}
tables:
  - {name: t, rows: 8, dim: 4, features: [f], sharding: {types: [data_parallel]}}
optimizers:
  sparse: {type: sgd, lr: 0.1}
  dense: {type: sgd, lr: 0.1}
matrix:
  system: [reference, torchrec==0.6.0, torchrec==1.9.2]
  profile: [torchrec-0.6, current]
  init.mode: [seeded, unseeded]
expect:
  - when: {init.mode: seeded}
    replicas: equal
  - when: {system: torchrec==0.6.0}
    replicas: diverge
    diverged: [t]
  - when: {profile: torchrec-0.6}
    replicas: diverge
    diverged: [t]
  - replicas: equal
)";

check::RunResult with_replicas(bool equal) {
  check::RunResult r;
  r.verdict = check::Verdict::kPass;
  for (scenario::Phase phase : {scenario::Phase::kInit, scenario::Phase::kFinal}) {
    check::TensorCheck c;
    c.name = "ebc.embedding_bags.t.weight";
    c.sharding = "data_parallel";
    c.phase = phase;
    c.equal = equal;
    c.numel = 32;
    r.replicas.push_back(c);
  }
  return r;
}

class BehaviourTest : public ::testing::Test {
 protected:
  const scenario::Scenario original_ = scenario::load_scenario_text(kScenario, "behaviour.yaml");
  const scenario::Scenario replaced_ =
      scenario::load_scenario_text(kScenario, "behaviour.yaml", {{"system", "torchrec==0.7.0"}});
  const std::vector<CellOnSystem> cells_ = cells_on_system(original_, replaced_);
  const CellOnSystem& cell(const std::string& label) {
    for (const auto& c : cells_)
      if (c.label == label) return c;
    ADD_FAILURE() << "no cell " << label;
    return cells_.front();
  }
};

TEST_F(BehaviourTest, EachDistinctCellIsNamedByTheReleasesTheScenarioNames) {
  ASSERT_EQ(cells_.size(), 2u);
  const CellOnSystem& unseeded = cell("init.mode=unseeded");
  // The releases named, not the reference profiles: they judge only where no release is named.
  ASSERT_EQ(unseeded.named.size(), 2u);
  EXPECT_EQ(unseeded.named[0].system, "torchrec==0.6.0");
  EXPECT_EQ(unseeded.named[0].status, "bug");
  EXPECT_EQ(unseeded.named[1].status, "fixed");
  // The run executed is the one written for the newest release named.
  EXPECT_TRUE(contains(replaced_.runs[unseeded.run].name, "torchrec==1.9.2")) << replaced_.runs[unseeded.run].name;
}

TEST_F(BehaviourTest, AResultIsTheBehaviourWhoseExpectationsItMeets) {
  const CellOnSystem& unseeded = cell("init.mode=unseeded");
  const Behaviour bug = behaviour_of(unseeded, with_replicas(false));
  EXPECT_EQ(bug.key, "bug");
  EXPECT_TRUE(contains(bug.text, "replicas DIVERGE")) << bug.text;
  EXPECT_TRUE(contains(bug.text, "as torchrec==0.6.0: bug")) << bug.text;
  EXPECT_EQ(behaviour_of(unseeded, with_replicas(true)).key, "fixed");
  // A cell every release named expects to work: a control, it decides nothing; failing it is news.
  EXPECT_TRUE(cell("init.mode=seeded").control);
  EXPECT_EQ(behaviour_of(cell("init.mode=seeded"), with_replicas(true)).key, "control");
  EXPECT_EQ(behaviour_of(cell("init.mode=seeded"), with_replicas(false)).key.rfind("other", 0), 0u);
}

TEST_F(BehaviourTest, AnErrorNoReleaseExpectsIsTheReleasesOwnAndSkipsAreNotBehaviours) {
  check::RunResult failed;
  failed.verdict = check::Verdict::kError;
  failed.failure = check::RankFailure{1, FailureKind::kTorchRec, "exited with status 1", "RuntimeError: boom", {}};
  const Behaviour b = behaviour_of(cell("init.mode=unseeded"), failed);
  EXPECT_TRUE(b.failed);
  EXPECT_EQ(b.key.rfind("other: error", 0), 0u) << b.key;
  EXPECT_TRUE(contains(b.text, "as none of the behaviours named")) << b.text;
  check::RunResult skipped;
  skipped.verdict = check::Verdict::kSkipped;
  skipped.skip_reason = "torchrec 0.7.0 is not installed";
  const Behaviour s = behaviour_of(cell("init.mode=unseeded"), skipped);
  EXPECT_TRUE(s.skipped);
  EXPECT_EQ(s.key, "skipped");
}

TEST_F(BehaviourTest, WhereTheNewestCellMeetsNothingEachNamedReleasesOwnCellIsTried) {
  const CellOnSystem& unseeded = cell("init.mode=unseeded");
  std::vector<size_t> ran;
  const Behaviour b = judge_cell(unseeded, [&](size_t run) {
    ran.push_back(run);
    if (run == unseeded.run) {  // 1.9.2's cell: a comparison this release cannot make
      check::RunResult failed;
      failed.verdict = check::Verdict::kError;
      failed.failure = check::RankFailure{0, FailureKind::kTorchRec, "exited with status 1", "RuntimeError: x", {}};
      return failed;
    }
    return with_replicas(false);  // 0.6.0's own cell shows the bug
  });
  ASSERT_EQ(ran.size(), 2u);
  EXPECT_EQ(b.key, "bug");
  EXPECT_TRUE(contains(b.text, "run as its own cell")) << b.text;
  // Where the first run meets a named behaviour, nothing more runs.
  ran.clear();
  EXPECT_EQ(judge_cell(unseeded,
                       [&](size_t run) {
                         ran.push_back(run);
                         return with_replicas(true);
                       })
                .key,
            "fixed");
  EXPECT_EQ(ran.size(), 1u);
}

TEST(Behaviour, ABehaviourIsJudgedOnlyOnARunThatMadeItsComparison) {
  // 0.7.0 is held against the reference under the bug's profile, 1.9.2 under `current`: a run of
  // 1.9.2's cell that matches `current` says nothing about the bug's profile.
  const std::string text = R"(version: 1
name: profiles
reproduces:
  url: https://example.invalid/2
  releases:
    torchrec==0.7.0: bug
    torchrec==1.9.2: fixed
world_size: 2
tables:
  - {name: t, rows: 8, dim: 4, features: [f], sharding: {types: [table_wise]}}
matrix:
  system: [torchrec==0.7.0, torchrec==1.9.2]
expect:
  - when: {system: torchrec==0.7.0}
    reference: {profile: "torchrec#2362", rtol: 1.0e-5, atol: 1.0e-6}
  - reference: {profile: current, rtol: 1.0e-5, atol: 1.0e-6}
)";
  const auto original = scenario::load_scenario_text(text, "p.yaml");
  const auto replaced = scenario::load_scenario_text(text, "p.yaml", {{"system", "torchrec==0.8.0"}});
  const auto cells = cells_on_system(original, replaced);
  ASSERT_EQ(cells.size(), 1u);
  EXPECT_FALSE(cells[0].control);
  check::RunResult matched = with_replicas(true);
  matched.reference_compared = true;
  const Behaviour b = behaviour_of(cells[0], matched);
  EXPECT_EQ(b.key, "fixed") << b.text;
}

TEST(Behaviour, WhereNoReleaseNamedHasTheBugWorkingIsTheBehaviourNotAControl) {
  const std::string text = R"(version: 1
name: absent
reproduces:
  url: https://example.invalid/3
  bug_profile: torchrec-0.6
  fix_profile: current
  releases:
    torchrec==0.6.0: absent
    torchrec==1.9.2: absent
world_size: 2
tables:
  - {name: t, rows: 8, dim: 4, features: [f], sharding: {types: [table_wise]}}
matrix:
  system: [torchrec==0.6.0, torchrec==1.9.2]
expect:
  - replicas: equal
)";
  const auto cells = cells_on_system(scenario::load_scenario_text(text, "a.yaml"),
                                     scenario::load_scenario_text(text, "a.yaml", {{"system", "torchrec==1.0.0"}}));
  ASSERT_EQ(cells.size(), 1u);
  EXPECT_FALSE(cells[0].control);
  EXPECT_EQ(behaviour_of(cells[0], with_replicas(true)).key, "absent");
}

TEST(Behaviour, AScenarioThatNamesNoReleaseJudgesByItsReleaseCells) {
  const std::string text = R"(version: 1
name: modelled-only
world_size: 2
tables:
  - {name: t, rows: 8, dim: 4, features: [f], sharding: {types: [table_wise]}}
matrix:
  system: [reference, torchrec==1.9.2]
expect:
  - replicas: equal
)";
  const auto original = scenario::load_scenario_text(text, "m.yaml");
  const auto replaced = scenario::load_scenario_text(text, "m.yaml", {{"system", "torchrec==1.0.0"}});
  const auto cells = cells_on_system(original, replaced);
  ASSERT_EQ(cells.size(), 1u);
  EXPECT_FALSE(cells[0].control);
  EXPECT_EQ(behaviour_of(cells[0], with_replicas(true)).key, "as written");
  EXPECT_EQ(behaviour_of(cells[0], with_replicas(false)).key.rfind("other: replicas DIVERGE", 0), 0u);
}

}  // namespace
}  // namespace dmpcheck::run

namespace dmpcheck::run {
namespace {

// A script that fails on the bug's release: its failing run is what the bug's expectation judges,
// not an error, when a bisection asks each named release's expectation of one run.
TEST(Behaviour, AFailingScriptIsJudgedByTheExpectationsThatSpeakOfItsExit) {
  check::RunResult r;
  r.environment.world_size = 1;
  r.script_ranks = {{0, "exited with status 1", 1, false, "", {"matches: False"}}};
  r.failure = check::RankFailure{0, FailureKind::kRankFailed, "exited with status 1", "BUG", {}};
  scenario::Expectation bug;
  bug.script.exit_status = 1;
  bug.script.output = {{"contains", "matches: False", {}}};
  scenario::Expectation fixed;
  fixed.script.output = {{"contains", "matches: True", {}}};
  std::string why;
  EXPECT_TRUE(meets(bug, r, &why)) << why;
  EXPECT_FALSE(meets(fixed, r, &why));
  EXPECT_EQ(why, "rank 0 exited with status 1, and no exit, exception or hang expects a failing script");
  r.failure->kind = FailureKind::kInterrupted;  // stopped by the user: an error whatever is expected
  EXPECT_FALSE(meets(bug, r, &why));
}

TEST(Behaviour, WhatTheEnvironmentLacksIsToldApartFromWhatTheCodeDoes) {
  auto failed = [](check::FailureKind kind, const std::string& message) {
    check::RunResult r;
    r.failure = check::RankFailure{0, kind, "exited with status 3", message, {}};
    return r;
  };
  using check::FailureKind;
  // torchrec 0102122b over 1.1.0's environment, as the rank program says it.
  EXPECT_TRUE(environment_explains(
      failed(FailureKind::kTorchRec, "AttributeError: 'SplitTableBatchedEmbeddingBagsCodegen' object has no attribute "
                                     "'get_learning_rate' (an attribute of fbgemm_gpu's fbgemm_gpu.split_table_batched_"
                                     "embeddings_ops_training.SplitTableBatchedEmbeddingBagsCodegen, which this "
                                     "environment's fbgemm-gpu lacks)")));
  EXPECT_TRUE(environment_explains(failed(FailureKind::kTorchRec,
                                          "RuntimeError: Could not find schema for "
                                          "fbgemm::split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper.")));
  EXPECT_TRUE(environment_explains(failed(FailureKind::kImport, "No module named 'torchrec.x'")));
  // What the code does: an error of its own, a divergence, a pass.
  EXPECT_FALSE(environment_explains(
      failed(FailureKind::kTorchRec, "RuntimeError: split_with_sizes expects split_sizes to sum exactly to 8")));
  EXPECT_FALSE(
      environment_explains(failed(FailureKind::kTorchRec, "AttributeError: 'KJT' object has no attribute 'x'")));
  EXPECT_FALSE(environment_explains(check::RunResult{}));
}

}  // namespace
}  // namespace dmpcheck::run
