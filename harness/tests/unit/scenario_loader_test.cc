#include <gtest/gtest.h>

#include "common/error.h"
#include "dmp/behaviour_profile.h"
#include "run/data_generator.h"
#include "scenario/scenario.h"

#include <ATen/ATen.h>

namespace dmpcheck::scenario {
namespace {

const char* kMinimal = R"(version: 1
name: minimal
world_size: 2
tables:
  - {name: t0, rows: 10, dim: 4, features: [f0]}
  - name: t1
    rows: 20
    dim: 4
    features: [f1]
    pooling: mean
    sharding: {types: [data_parallel]}
)";

std::string error_of(const std::string& text) {
  try {
    load_scenario_text(text, "s.yaml");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidScenario) << e.what();
    return e.what();
  }
  return "no error";
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(ScenarioLoader, ReadsAMinimalScenarioWithDefaults) {
  const Scenario s = load_scenario_text(kMinimal, "s.yaml");
  ASSERT_EQ(s.runs.size(), 1u);
  const RunSpec& run = s.runs[0];
  EXPECT_EQ(run.name, "default");
  EXPECT_EQ(run.world_size, 2);
  EXPECT_EQ(run.profile.name, "current");
  ASSERT_EQ(run.model.tables.size(), 2u);
  EXPECT_EQ(run.model.tables[1].pooling, dmp::PoolingType::kMean);
  EXPECT_EQ(run.constraints.at("t1").sharding_types.front(), dmp::ShardingType::kDataParallel);
  EXPECT_EQ(run.sparse_optimizer.eps, 1e-8);
  EXPECT_EQ(run.expect.replicas, ReplicaExpectation::kEqual);
}

TEST(ScenarioLoader, MatrixExpandsInOrderAndPicksTheFirstMatchingExpectation) {
  const std::string text = std::string(kMinimal) + R"(matrix:
  init.mode: [seeded, unseeded]
  profile: [torchrec-0.6, current]
expect:
  - when: {init.mode: unseeded, profile: torchrec-0.6}
    replicas: diverge
    diverged: [t1]
  - replicas: equal
)";
  const Scenario s = load_scenario_text(text, "s.yaml");
  ASSERT_EQ(s.runs.size(), 4u);
  EXPECT_EQ(s.runs[0].name, "init.mode=seeded profile=torchrec-0.6");
  EXPECT_EQ(s.runs[0].slug, "seeded_torchrec-0.6");
  EXPECT_EQ(s.runs[2].init.mode, InitMode::kUnseeded);
  EXPECT_EQ(s.runs[2].profile.name, "torchrec-0.6");
  EXPECT_FALSE(s.runs[2].profile.broadcast_data_parallel_tables_at_init);
  EXPECT_EQ(s.runs[2].expect.replicas, ReplicaExpectation::kDiverge);
  EXPECT_EQ(s.runs[3].expect.replicas, ReplicaExpectation::kEqual);
}

TEST(ScenarioLoader, ImpossibleValuesNameFileLineFieldAndExpectation) {
  const std::string message = error_of(replace(kMinimal, "rows: 20", "rows: 0"));
  EXPECT_NE(message.find("s.yaml:7: field 'tables[1].rows': expected an integer in [1, "), std::string::npos)
      << message;
  EXPECT_NE(message.find("got '0'"), std::string::npos) << message;
}

TEST(ScenarioLoader, WorldSizeBelowOneIsRejected) {
  const std::string message = error_of(replace(kMinimal, "world_size: 2", "world_size: 0"));
  EXPECT_NE(message.find("s.yaml:3: field 'world_size': expected an integer in [1, 64], got '0'"), std::string::npos)
      << message;
}

TEST(ScenarioLoader, WrongTypeIsRejected) {
  const std::string message = error_of(replace(kMinimal, "dim: 4\n    features", "dim: [4]\n    features"));
  EXPECT_NE(message.find("s.yaml:8: field 'tables[1].dim': expected an integer"), std::string::npos) << message;
  EXPECT_NE(message.find("got a list"), std::string::npos) << message;
}

TEST(ScenarioLoader, UnknownKeySuggestsTheClosestOne) {
  const std::string message = error_of(replace(kMinimal, "pooling: mean", "poolin: mean"));
  EXPECT_NE(message.find("s.yaml:10: field 'tables[1].poolin': unknown key (did you mean 'pooling'?)"),
            std::string::npos)
      << message;
}

TEST(ScenarioLoader, AFeatureNoTableReadsIsRejected) {
  const std::string message = error_of(std::string(kMinimal) + "data:\n  features:\n    f9: {ids_per_bag: 2}\n");
  EXPECT_NE(message.find("s.yaml:14: field 'data.features.f9': no table reads feature 'f9'"), std::string::npos)
      << message;
}

TEST(ScenarioLoader, UnknownProfileListsTheKnownOnes) {
  const std::string message = error_of(std::string(kMinimal) + "profile: torchrec-9\n");
  EXPECT_NE(message.find("field 'profile': expected one of torchrec-0.6, torchrec-0.8, torchrec-1.9, current"),
            std::string::npos)
      << message;
}

TEST(ScenarioLoader, AProfileIsANamedOneWithSwitchesTurnedAndAMatrixAxis) {
  const Scenario s = load_scenario_text(std::string(kMinimal) +
                                            "matrix:\n  profile:\n    - torchrec-0.6\n"
                                            "    - {base: torchrec-0.6, broadcast_data_parallel_tables_at_init: true, "
                                            "ddp_first_bucket_cap_bytes: 4096}\n",
                                        "s.yaml");
  ASSERT_EQ(s.runs.size(), 2u);
  EXPECT_EQ(s.runs[0].profile.name, "torchrec-0.6");
  EXPECT_FALSE(s.runs[0].profile.broadcast_data_parallel_tables_at_init);
  const auto& turned = s.runs[1].profile;
  EXPECT_EQ(turned.name, "torchrec-0.6+broadcast_data_parallel_tables_at_init=true+ddp_first_bucket_cap_bytes=4096");
  EXPECT_TRUE(turned.broadcast_data_parallel_tables_at_init);
  EXPECT_EQ(turned.ddp_first_bucket_cap_bytes, 4096);
  EXPECT_TRUE(turned.data_parallel_tables_use_dense_optimizer);  // the rest is the base's
  EXPECT_EQ(dmp::behaviour_switch_values(turned).at("ddp_first_bucket_cap_bytes"), "4096");
  EXPECT_EQ(s.runs[1].name,
            "profile={base: torchrec-0.6, broadcast_data_parallel_tables_at_init: true, ddp_first_bucket_cap_bytes: "
            "4096}");

  EXPECT_NE(
      error_of(std::string(kMinimal) + "profile: {base: current, plan_on_every_rnak: true}\n")
          .find("s.yaml:12: field 'profile.plan_on_every_rnak': unknown key (did you mean 'plan_on_every_rank'?)"),
      std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "profile: {base: current, plan_on_every_rank: 3}\n")
                .find("field 'profile.plan_on_every_rank': expected true or false, got '3'"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "profile: {plan_on_every_rank: true}\n").find("'profile.base'"),
            std::string::npos);
  // Whole bytes are read as whole numbers: exact above 2^53, and a fraction is refused.
  dmp::BehaviourProfile exact = *dmp::find_behaviour_profile("current");
  EXPECT_FALSE(dmp::set_behaviour_switch(exact, "ddp_first_bucket_cap_bytes", "9007199254740993"));
  EXPECT_EQ(exact.ddp_first_bucket_cap_bytes, int64_t{9007199254740993});
  EXPECT_EQ(dmp::set_behaviour_switch(exact, "ddp_first_bucket_cap_bytes", "1.5"),
            "a whole number of bytes, 0 or more");
}

TEST(ScenarioLoader, ConstraintRankOutsideTheWorldIsRejected) {
  const std::string message =
      error_of(replace(kMinimal, "sharding: {types: [data_parallel]}", "sharding: {types: [table_wise], ranks: [2]}"));
  EXPECT_NE(message.find("field 'tables[1].sharding.ranks[0]': expected an integer in [0, 1]"), std::string::npos)
      << message;
}

TEST(ScenarioLoader, DivergeNeedsKnownTables) {
  const std::string message = error_of(std::string(kMinimal) + "expect:\n  - replicas: diverge\n    diverged: [t7]\n");
  EXPECT_NE(message.find("s.yaml:14: field 'expect[0].diverged[0]': 't7' is neither a table"), std::string::npos)
      << message;
}

TEST(ScenarioLoader, MatrixKeyMustBeARunField) {
  const std::string message = error_of(std::string(kMinimal) + "matrix:\n  name: [a, b]\n");
  EXPECT_NE(message.find("s.yaml:13: field 'matrix.name': a matrix varies a run field"), std::string::npos) << message;
}

TEST(ScenarioLoader, InvalidYamlReportsTheLine) {
  const std::string message = error_of("version: 1\nname: [unclosed\n");
  EXPECT_NE(message.find("s.yaml:"), std::string::npos) << message;
  EXPECT_NE(message.find("not valid YAML"), std::string::npos) << message;
}

TEST(ScenarioLoader, MissingFileIsAnError) {
  try {
    load_scenario_file("/nonexistent/scenario.yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/scenario.yaml: cannot open"), std::string::npos);
  }
}

TEST(ScenarioLoader, TheSeedScenarioIsValid) {
  const Scenario s =
      load_scenario_file(DMPCHECK_SOURCE_DIR "/scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml");
  // The reference under two profiles x two init modes, and two real releases x two init modes
  // (a release cell has no profile: it appears once).
  ASSERT_EQ(s.runs.size(), 8u);
  int on_releases = 0;
  for (const auto& r : s.runs) on_releases += r.on_torchrec() ? 1 : 0;
  EXPECT_EQ(on_releases, 4);
  EXPECT_EQ(s.runs[1].system, "torchrec==0.6.0");
  EXPECT_EQ(s.runs[1].torchrec_version(), "0.6.0");
  EXPECT_EQ(s.runs[1].name, "init.mode=seeded system=torchrec==0.6.0");
  EXPECT_EQ(s.runs[0].name, "init.mode=seeded profile=torchrec-0.6");
  ASSERT_TRUE(s.reproduces.has_value());
  EXPECT_EQ(s.reproduces->bug_profile, "torchrec-0.6");
}

}  // namespace
}  // namespace dmpcheck::scenario

namespace dmpcheck::scenario {
namespace {

TEST(ScenarioLoaderSystem, AReleaseCellDropsTheProfileAxisAndIsNamedBySystem) {
  const std::string text =
      std::string(kMinimal) +
      "matrix:\n  profile: [torchrec-0.6, current]\n  system: [reference, torchrec==1.9.2]\n"
      "expect:\n  - when: {system: torchrec==1.9.2}\n    reference: {profile: current, rtol: 0, atol: 0}\n"
      "  - replicas: equal\n";
  const Scenario s = load_scenario_text(text, "s.yaml");
  ASSERT_EQ(s.runs.size(), 3u);  // two reference cells, one release cell
  EXPECT_EQ(s.runs[0].name, "profile=torchrec-0.6");
  EXPECT_EQ(s.runs[1].name, "system=torchrec==1.9.2");
  EXPECT_EQ(s.runs[1].slug, "torchrec__1.9.2");
  EXPECT_TRUE(s.runs[1].on_torchrec());
  ASSERT_TRUE(s.runs[1].expect.reference.has_value());
  EXPECT_EQ(s.runs[1].expect.reference_profile, "current");
  EXPECT_EQ(s.runs[1].expect.reference->rtol, 0.0);
  EXPECT_FALSE(s.runs[0].expect.reference.has_value());
}

TEST(ScenarioLoaderSystem, WhatAReleaseCellCannotRunIsRefusedAtLoad) {
  EXPECT_NE(error_of(std::string(kMinimal) + "system: torchrec-1.9.2\n")
                .find("field 'system': expected 'reference' or a TorchRec release as 'torchrec==X.Y.Z'"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "system: torchrec==1.9.2\nbackend: nccl\n")
                .find("field 'backend': not available on torchrec==1.9.2 (TorchRec cells run on CPU with Gloo)"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "system: torchrec==1.9.2\nexpect:\n  - global_model: true\n")
                .find("the unsharded-model check runs on the reference only"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "expect:\n  - reference: true\n")
                .find("compares a TorchRec release with the reference"),
            std::string::npos);
}

TEST(ScenarioLoaderSystem, ReleasesSaidToShowABugNeedACell) {
  const std::string reproduces =
      "reproduces:\n  url: u\n  bug_profile: torchrec-0.6\n  fix_profile: current\n  releases:\n    torchrec==0.6.0: "
      "bug\n";
  EXPECT_NE(error_of(std::string(kMinimal) + reproduces)
                .find("field 'reproduces.releases.torchrec==0.6.0': says 'bug' but no run of the scenario runs on "
                      "torchrec==0.6.0"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + replace(reproduces, ": bug", ": maybe"))
                .find("expected bug, fixed, absent, or 'not runnable: <why>'"),
            std::string::npos);
  const Scenario s =
      load_scenario_text(std::string(kMinimal) + replace(reproduces, ": bug", ": 'not runnable: resume'"), "s.yaml");
  ASSERT_EQ(s.reproduces->releases.size(), 1u);
  EXPECT_EQ(s.reproduces->releases[0].second, "not runnable: resume");
  // With the release in the matrix it loads.
  EXPECT_NO_THROW(load_scenario_text(
      std::string(kMinimal) + reproduces + "matrix:\n  system: [reference, torchrec==0.6.0]\n", "s.yaml"));
  // Confirmed on a release, not modelled: no profiles, a release that shows it.
  const std::string release_only =
      "reproduces:\n  url: u\n  releases:\n    torchrec==0.6.0: bug\n    torchrec==1.9.2: fixed\n";
  const Scenario confirmed = load_scenario_text(
      std::string(kMinimal) + release_only + "matrix:\n  system: [torchrec==0.6.0, torchrec==1.9.2]\n", "s.yaml");
  EXPECT_TRUE(confirmed.reproduces->bug_profile.empty());
  // Neither: nothing says where it shows.
  EXPECT_NE(error_of(std::string(kMinimal) + "reproduces:\n  url: u\n").find("say where the bug shows"),
            std::string::npos);
  // One profile without the other.
  EXPECT_NE(
      error_of(std::string(kMinimal) + "reproduces:\n  url: u\n  bug_profile: torchrec-0.6\n").find("fix_profile"),
      std::string::npos);
}

}  // namespace
}  // namespace dmpcheck::scenario

#include "run/preflight.h"

namespace dmpcheck::scenario {
namespace {

TEST(ScenarioLoaderErrors, EveryErrorOfTheFileIsReportedAtOnce) {
  const std::string text =
      "version: 1\nname: bad\nworld_size: 0\nsteps: -1\ntables:\n  - {name: t, rows: 0, dim: 4, features: [f]}\n"
      "optimizers: {sparse: {type: adamw}}\n";
  const std::string e = error_of(text);
  EXPECT_NE(e.find("s.yaml: 4 errors:"), std::string::npos) << e;
  EXPECT_NE(e.find("s.yaml:3: field 'world_size'"), std::string::npos) << e;
  EXPECT_NE(e.find("s.yaml:4: field 'steps'"), std::string::npos) << e;
  EXPECT_NE(e.find("s.yaml:6: field 'tables[0].rows'"), std::string::npos) << e;
  EXPECT_NE(e.find("s.yaml:7: field 'optimizers.sparse.type'"), std::string::npos) << e;
  // One error alone reads as before.
  EXPECT_EQ(error_of(std::string(kMinimal) + "steps: -1\n").rfind("s.yaml:", 0), 0u);
}

TEST(Preflight, APlanThatFailsIsRefusedBeforeAnyRankStarts) {
  const Scenario s = load_scenario_text(
      "version: 1\nname: cw\ntopology: {memory_per_rank: 100}\ntables:\n"
      "  - {name: t, rows: 10, dim: 10, features: [f], sharding: {types: [column_wise], column_shards: 2}}\n",
      "cw.yaml");
  try {
    run::preflight(s, int64_t{1} << 40);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidScenario);
    EXPECT_NE(
        std::string(e.what()).find("run 'default': the plan fails: table 't' (10 x 10) fits nowhere: column_wise would "
                                   "put 400 bytes on rank 0 (limit 100)"),
        std::string::npos)
        << e.what();
  }
}

TEST(Preflight, AModelOverTheHostsMemoryIsRefusedWithTheNumbers) {
  const Scenario s = load_scenario_text(
      "version: 1\nname: big\nworld_size: 2\ntables:\n  - {name: t, rows: 1048576, dim: 64, features: [f], sharding: "
      "{types: [data_parallel]}}\noptimizers: {sparse: {type: adagrad}}\n",
      "big.yaml");
  // Per rank: shards + state 512 MiB, the full draw 256 MiB, the gradient buffer 256 MiB.
  const run::RunMemory m = run::estimate_run_memory(s.runs[0]);
  EXPECT_EQ(m.ranks_on_host, 2);
  EXPECT_GT(m.host_bytes, int64_t{2} << 30);
  EXPECT_NO_THROW(run::preflight(s, int64_t{16} << 30));
  try {
    run::preflight(s, int64_t{1} << 30);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("its 2 rank(s) on this host would hold about 2.0 GiB"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("but this host has 1.0 GiB available"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dmpcheck::scenario

namespace dmpcheck::scenario {
namespace {

TEST(ScenarioLoaderSystem, WeightedMeanPoolingRunsOnAReleaseNotOnTheReference) {
  const std::string table = "tables:\n  - {name: t, rows: 8, dim: 4, features: [f], pooling: mean, weighted: true}\n";
  EXPECT_NO_THROW(load_scenario_text("version: 1\nname: w\nsystem: torchrec==1.9.2\n" + table, "w.yaml"));
  EXPECT_NE(error_of("version: 1\nname: w\n" + table)
                .find("weighted features with mean pooling are not modelled by the "
                      "reference DMP (TorchRec accepts them); use sum"),
            std::string::npos);
}

const char* kInline = R"(version: 1
name: inline
world_size: 2
batch_size: 2
steps: 1
tables:
  - {name: t0, rows: 10, dim: 4, features: [f0]}
  - {name: t1, rows: 20, dim: 4, features: [f1]}
data:
  batches:
    - - {f0: [[1, 2], [3]], f1: {ids: [19], lengths: [0, 1]}}
      - {f0: [[], [9, 9, 9]]}
)";

TEST(ScenarioLoader, InlineBatchesBecomeTheGlobalBatchInRankOrder) {
  const Scenario s = load_scenario_text(kInline, "s.yaml");
  const dmp::KeyedJaggedTensor batch = run::make_global_batch(s.runs.at(0), 0);
  EXPECT_EQ(batch.keys(), (std::vector<std::string>{"f0", "f1"}));
  EXPECT_EQ(batch.stride(), 4);
  EXPECT_TRUE(batch.lengths().equal(at::tensor({2, 1, 0, 3, 0, 1, 0, 0}, at::kLong)));
  EXPECT_TRUE(batch.values().equal(at::tensor({1, 2, 3, 9, 9, 9, 19}, at::kLong)));
  EXPECT_FALSE(batch.weights().has_value());
}

TEST(ScenarioLoader, InlineBatchesAreCheckedAgainstTheRun) {
  EXPECT_NE(error_of(replace(kInline, "[[1, 2], [3]]", "[[1, 2], [3], [4]]"))
                .find("s.yaml:11: field 'data.batches[0][0].f0': has 3 bags; each rank's batch has batch_size = 2"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kInline, "[9, 9, 9]", "[9, 10, 9]"))
                .find("field 'data.batches[0][1].f0[1][1]': expected an integer in [0, 9], got '10'"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kInline, "lengths: [0, 1]", "lengths: [1, 1]"))
                .find("'data.batches[0][0].f1.lengths': add up to 2 but there are 1 ids"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kInline, "steps: 1", "steps: 2"))
                .find("'data.batches': gives 1 step(s) but the run trains 2 steps"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kInline, "world_size: 2", "world_size: 3"))
                .find("'data.batches[0]': expected a list of 3 ranks' batches"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kInline, "{f0: [[], [9, 9, 9]]}", "{f2: [[], []]}"))
                .find("no table reads feature 'f2'; features: f0, f1"),
            std::string::npos);
  EXPECT_NE(
      error_of(replace(kInline, "ids: [19]", "ids: [19], weights: [2.0]")).find("table 't1', which is not weighted"),
      std::string::npos);
  EXPECT_NE(error_of(replace(kInline, "data:\n", "data:\n  seed: 3\n"))
                .find("'data.seed': configures generated batches; this run replays data.batches"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kInline, "data:\n  batches:", "data:\n  from: /nonexistent/batches\n  unused:"))
                .find("unknown key"),
            std::string::npos);
  const std::string no_dir = error_of(replace(kInline,
                                              "data:\n  batches:\n    - - {f0: [[1, 2], [3]], f1: {ids: [19], lengths: "
                                              "[0, 1]}}\n      - {f0: [[], [9, 9, 9]]}\n",
                                              "data: {from: no-such-dir}\n"));
  EXPECT_NE(no_dir.find("field 'data.from': no-such-dir is not a directory (expected one holding batch0.pt"),
            std::string::npos)
      << no_dir;
}

TEST(ScenarioLoader, InlineWeightsOfAWeightedTableAreKept) {
  std::string text = replace(kInline, "features: [f0]}", "features: [f0], weighted: true}");
  text = replace(text, "features: [f1]}", "features: [f1], weighted: true}");
  text = replace(text, "ids: [19], lengths: [0, 1]", "ids: [19], lengths: [0, 1], weights: [0.25]");
  const dmp::KeyedJaggedTensor batch = run::make_global_batch(load_scenario_text(text, "s.yaml").runs.at(0), 0);
  ASSERT_TRUE(batch.weights().has_value());
  EXPECT_TRUE(batch.weights()->equal(at::tensor({1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 0.25f})));
}

TEST(ScenarioLoader, TheTorchrecAxesApplyToReleaseCellsOnly) {
  const Scenario s = load_scenario_text(std::string(kMinimal) + R"(matrix:
  system: [reference, torchrec==1.9.2]
  torchrec.sharder: [stock, extended]
)",
                                        "s.yaml");
  std::vector<std::string> names;
  for (const auto& r : s.runs) names.push_back(r.name + "|" + r.torchrec_sharder);
  EXPECT_EQ(names, (std::vector<std::string>{"default|stock", "system=torchrec==1.9.2 torchrec.sharder=stock|stock",
                                             "system=torchrec==1.9.2 torchrec.sharder=extended|extended"}));
  EXPECT_NE(error_of(std::string(kMinimal) + "torchrec: {sharder: patched}\n")
                .find("field 'torchrec.sharder': expected one of extended, stock"),
            std::string::npos);
}

TEST(ScenarioLoader, InitLoadAndInitialStateNeedInitFrom) {
  EXPECT_NE(error_of(std::string(kMinimal) + "init: {load: before_wrap}\n")
                .find("field 'init.load': says when init.from's weights are loaded; give init.from"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "expect:\n  - {initial_state: from}\n")
                .find("field 'expect[0].initial_state': compares the initial state with init.from; run 'default' has "
                      "no init.from"),
            std::string::npos);
  const Scenario s = load_scenario_text(
      std::string(kMinimal) + "init: {from: /w.pt, load: before_wrap}\nexpect:\n  - {initial_state: not_from}\n",
      "s.yaml");
  EXPECT_TRUE(s.runs.at(0).init.load_before_wrap);
  EXPECT_EQ(s.runs.at(0).expect.initial_state, std::optional<bool>(false));
}

}  // namespace
TEST(ScenarioLoader, AnEmbeddingBagModuleIsOneTableReadingOneFeature) {
  // Two tables: refused at the key, with its line.
  std::string message = error_of(std::string(kMinimal) + "torchrec: {module: embedding_bag}\n");
  EXPECT_NE(
      message.find("s.yaml:12: field 'torchrec.module': 'embedding_bag' is one torch.nn.EmbeddingBag: the scenario "
                   "must have one table reading one feature"),
      std::string::npos)
      << message;
  const std::string one = "version: 1\nname: bag\ntables:\n  - {name: bag, rows: 8, dim: 4, features: [f]}\n";
  message = error_of(one + "torchrec: {module: embedding_bag, sharder: extended}\n");
  EXPECT_NE(
      message.find("field 'torchrec.sharder': an nn.EmbeddingBag is sharded by TorchRec's own EmbeddingBagSharder"),
      std::string::npos)
      << message;
  const Scenario s = load_scenario_text(one + "torchrec: {module: embedding_bag}\n", "s.yaml");
  EXPECT_EQ(s.runs.at(0).torchrec_module, "embedding_bag");
  EXPECT_EQ(s.runs.at(0).torchrec_sharder, "stock");
}

TEST(ScenarioLoader, AnExpectedErrorIsTypedByItsFailureKind) {
  std::string message = error_of(std::string(kMinimal) + "expect:\n  - error: \"not supported\"\n");
  EXPECT_NE(
      message.find("s.yaml:13: field 'expect[0].error': expected a mapping {kind: <failure kind>, message: <text the "
                   "message contains>}"),
      std::string::npos)
      << message;
  message = error_of(std::string(kMinimal) + "expect:\n  - error: {kind: oops}\n");
  EXPECT_NE(message.find("field 'expect[0].error.kind'"), std::string::npos) << message;
  EXPECT_NE(message.find("torchrec"), std::string::npos) << message;  // the kinds it may be
  const Scenario s = load_scenario_text(
      std::string(kMinimal) + "expect:\n  - error: {kind: communication, message: plan}\n", "s.yaml");
  const auto& expected = *s.runs.at(0).expect.error;
  EXPECT_EQ(expected.kind, FailureKind::kCommunication);
  EXPECT_TRUE(expected.matches(FailureKind::kCommunication, "rank 1 holds a different sharding plan"));
  EXPECT_FALSE(expected.matches(FailureKind::kInternal, "rank 1 holds a different sharding plan"));  // the kind decides
  EXPECT_FALSE(expected.matches(FailureKind::kCommunication, "connection reset"));
  EXPECT_EQ(s.runs.at(0).expect.describe(), "the run fails with an error of kind communication containing 'plan'");
}

}  // namespace dmpcheck::scenario
