#include <gtest/gtest.h>

#include "common/error.h"
#include "dmp/behaviour_profile.h"
#include "run/data_generator.h"
#include "run/preflight.h"
#include "scenario/scenario.h"
#include "test_util.h"

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

// For EXPECT_TRUE: loading `text` fails with an error that holds every one of `needles`.
template <typename... Needles>
::testing::AssertionResult fails_with(const std::string& text, const Needles&... needles) {
  const std::string message = error_of(text);
  if ((... && (message.find(needles) != std::string::npos))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << message;
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
  EXPECT_TRUE(fails_with(replace(kMinimal, "rows: 20", "rows: 0"),
                         "s.yaml:7: field 'tables[1].rows': expected an integer in [1, ", "got '0'"));
}

TEST(ScenarioLoader, SequenceTablesMayShareAFeatureButNotWithAPooledTable) {
  const std::string text =
      "version: 1\nname: seq\ntables:\n"
      "  - {name: a, rows: 10, dim: 4, features: [f], pooling: none}\n"
      "  - {name: b, rows: 12, dim: 4, features: [f, g], pooling: none, sharding: {types: [column_wise]}}\n";
  EXPECT_EQ(load_scenario_text(text, "seq.yaml").runs[0].model.tables.size(), 2u);
  EXPECT_TRUE(fails_with(text + "  - {name: c, rows: 8, dim: 4, features: [g]}\n",
                         "s.yaml:5: field 'tables[1].features': feature 'g' of sequence table 'b' is read by the "
                         "pooled table 'c' too"));
}

TEST(ScenarioLoader, APersistentIteratorNeedsASecondPass) {
  const std::string text = "version: 1\nname: p\nsystem: torchrec==1.9.2\nsteps: 2\ntables:\n"
                           "  - {name: a, rows: 10, dim: 4, features: [f]}\n"
                           "torchrec: {loop: train_pipeline_sparse_dist, data_iterator: persistent";
  EXPECT_TRUE(fails_with(text + "}\n", "s.yaml:7: field 'torchrec.data_iterator'", "this run has one pass"));
  EXPECT_EQ(load_scenario_text(text + ", epochs: 2}\n", "p.yaml").runs[0].torchrec_data_iterator, "persistent");
  EXPECT_EQ(load_scenario_text(text + ", eval_batches: 1}\n", "p.yaml").runs[0].torchrec_epochs, 1);
}

TEST(ScenarioLoader, WorldSizeBelowOneIsRejected) {
  EXPECT_TRUE(fails_with(replace(kMinimal, "world_size: 2", "world_size: 0"),
                         "s.yaml:3: field 'world_size': expected an integer in [1, 64], got '0'"));
}

TEST(ScenarioLoader, WrongTypeIsRejected) {
  EXPECT_TRUE(fails_with(replace(kMinimal, "dim: 4\n    features", "dim: [4]\n    features"),
                         "s.yaml:8: field 'tables[1].dim': expected an integer", "got a list"));
}

TEST(ScenarioLoader, UnknownKeySuggestsTheClosestOne) {
  EXPECT_TRUE(fails_with(replace(kMinimal, "pooling: mean", "poolin: mean"),
                         "s.yaml:10: field 'tables[1].poolin': unknown key (did you mean 'pooling'?)"));
}

TEST(ScenarioLoader, AFeatureNoTableReadsIsRejected) {
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "data:\n  features:\n    f9: {ids_per_bag: 2}\n",
                         "s.yaml:14: field 'data.features.f9': no table reads feature 'f9'"));
}

TEST(ScenarioLoader, UnknownProfileListsTheKnownOnes) {
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "profile: torchrec-9\n",
                         "field 'profile': expected one of torchrec-0.6, torchrec-0.8, torchrec-1.9, current"));
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

  EXPECT_TRUE(
      fails_with(std::string(kMinimal) + "profile: {base: current, plan_on_every_rnak: true}\n",
                 "s.yaml:12: field 'profile.plan_on_every_rnak': unknown key (did you mean 'plan_on_every_rank'?)"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "profile: {base: current, plan_on_every_rank: 3}\n",
                         "field 'profile.plan_on_every_rank': expected true or false, got '3'"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "profile: {plan_on_every_rank: true}\n", "'profile.base'"));
  // Whole bytes are read as whole numbers: exact above 2^53, and a fraction is refused.
  dmp::BehaviourProfile exact = *dmp::find_behaviour_profile("current");
  EXPECT_FALSE(dmp::set_behaviour_switch(exact, "ddp_first_bucket_cap_bytes", "9007199254740993"));
  EXPECT_EQ(exact.ddp_first_bucket_cap_bytes, int64_t{9007199254740993});
  EXPECT_EQ(dmp::set_behaviour_switch(exact, "ddp_first_bucket_cap_bytes", "1.5"),
            "a whole number of bytes, 0 or more");
}

TEST(ScenarioLoader, ConstraintRankOutsideTheWorldIsRejected) {
  EXPECT_TRUE(
      fails_with(replace(kMinimal, "sharding: {types: [data_parallel]}", "sharding: {types: [table_wise], ranks: [2]}"),
                 "field 'tables[1].sharding.ranks[0]': expected an integer in [0, 1]"));
}

TEST(ScenarioLoader, DivergeNeedsKnownTables) {
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "expect:\n  - replicas: diverge\n    diverged: [t7]\n",
                         "s.yaml:14: field 'expect[0].diverged[0]': 't7' is neither a table"));
}

TEST(ScenarioLoader, ADivergenceIsJudgedAtInitOrFinalNotAfterAStep) {
  const std::string diverge = std::string(kMinimal) + "expect:\n  - replicas: diverge\n    diverged: [t1]\n    at: ";
  EXPECT_TRUE(fails_with(diverge + "[init, step]\n",
                         "field 'expect[0].at[1]': a divergence is judged at init or final (each step's is in the "
                         "report's table)"));
  EXPECT_TRUE(fails_with(diverge + "[init, later]\n", "expect[0].at[1]"));
  const auto s = load_scenario_text(diverge + "[final]\n", "s.yaml");
  EXPECT_EQ(s.runs.at(0).expect.at, std::vector<Phase>{Phase::kFinal});
}

TEST(ScenarioLoader, QuantizedTablesAreJudgedOnReleases) {
  const std::string tables =
      "version: 1\nname: q\ntables:\n  - {name: t0, rows: 10, dim: 4, features: [f0], quant: int4}\n"
      "  - {name: t1, rows: 10, dim: 4, features: [f1], pooling: mean, quant: fp16}\n";
  const auto s = load_scenario_text(tables + "system: torchrec==0.7.0\nexpect:\n  - quantized: true\n"
                                             "    quantized_sharded: {rtol: 0, atol: 0}\n",
                                    "s.yaml");
  const RunSpec& run = s.runs.at(0);
  EXPECT_EQ(run.quant.at("t0"), QuantType::kInt4);
  EXPECT_EQ(run.quant.at("t1"), QuantType::kFp16);
  ASSERT_TRUE(run.expect.quantized.has_value());
  EXPECT_TRUE(run.expect.quantized->match);
  ASSERT_TRUE(run.expect.quantized_sharded.has_value());
  EXPECT_EQ(run.expect.quantized_sharded->atol, 0.0);
  // The bound is computed from each row, not given; the reference does not quantize.
  EXPECT_TRUE(fails_with(tables + "system: torchrec==0.7.0\nexpect:\n  - quantized: {atol: 0.1}\n",
                         "expect[0].quantized': is judged within the bound each row's quantization allows"));
  EXPECT_TRUE(fails_with(tables + "expect:\n  - quantized: true\n",
                         "runs on the reference, which does not model quantized lookups yet"));
  EXPECT_TRUE(fails_with("version: 1\nname: q\nsystem: torchrec==0.7.0\ntables:\n"
                         "  - {name: t0, rows: 10, dim: 4, features: [f0], quant: int8}\n"
                         "  - {name: t1, rows: 10, dim: 4, features: [f1]}\nexpect:\n  - quantized: true\n",
                         "t1 of run 'default' has no 'quant' (int8, int4, int2 or fp16)"));
  EXPECT_TRUE(
      fails_with("version: 1\nname: q\ntables:\n  - {name: t0, rows: 10, dim: 4, features: [f0], quant: int3}\n",
                 "s.yaml:4", "tables[0].quant"));
  // Sequence tables quantize too (a quant EmbeddingCollection); every table of the model needs a type.
  const std::string seq = "version: 1\nname: q\nsystem: torchrec==1.9.2\ntables:\n"
                          "  - {name: s0, rows: 10, dim: 4, features: [g0], pooling: none, quant: int8}\n";
  const auto with_ec = load_scenario_text(seq + "expect:\n  - quantized: true\n", "s.yaml");
  EXPECT_EQ(with_ec.runs.at(0).quant.at("s0"), QuantType::kInt8);
  EXPECT_TRUE(fails_with(seq + "  - {name: s1, rows: 10, dim: 4, features: [g1], pooling: none}\n"
                               "expect:\n  - quantized: true\n",
                         "s1 of run 'default' has no 'quant'"));
  EXPECT_TRUE(fails_with(seq + "data: {features: {g0: {stride_per_rank: [2, 3]}}}\nworld_size: 2\n"
                               "expect:\n  - quantized: true\n",
                         "quantizes sequence tables on a plain batch"));
}

TEST(ScenarioLoader, ManagedCollisionTablesTakeRawIdsAndRunOnReleases) {
  const std::string head = "version: 1\nname: mc\nsystem: torchrec==1.9.2\ntables:\n";
  const std::string t0 =
      "  - {name: t0, rows: 10, dim: 4, features: [f0], managed_collision: {input_hash_size: 1000}}\n";
  const auto s = load_scenario_text(head + t0 +
                                        "  - {name: t1, rows: 10, dim: 4, features: [f1], managed_collision: "
                                        "{input_hash_size: 50, eviction: lfu, interval: 3}}\n",
                                    "s.yaml");
  const RunSpec& run = s.runs.at(0);
  EXPECT_EQ(run.managed_collision.at("t0").input_hash_size, 1000);
  EXPECT_EQ(run.managed_collision.at("t0").eviction, McEviction::kDistanceLfu);
  EXPECT_EQ(run.managed_collision.at("t1").eviction, McEviction::kLfu);
  EXPECT_EQ(run.managed_collision.at("t1").interval, 3);
  // Raw ids range over the hash space, not the rows.
  EXPECT_EQ(run.id_range(run.model.tables[0]), 1000);
  const at::Tensor ids = run::make_global_batch(run, 0).values_of(0);
  EXPECT_GE(ids.max().item<int64_t>(), 10) << "no id drawn above the table's rows";
  EXPECT_LT(ids.max().item<int64_t>(), 1000);
  EXPECT_TRUE(fails_with(head + t0 + "  - {name: t1, rows: 10, dim: 4, features: [f1]}\n",
                         "needs it on every table of the collection, and t1 has none"));
  EXPECT_TRUE(
      fails_with(head + "  - {name: t0, rows: 10, dim: 4, features: [f0], managed_collision: {eviction: lru}}\n",
                 "tables[0].managed_collision", "input_hash_size"));
  EXPECT_TRUE(fails_with(head + "  - {name: t0, rows: 10, dim: 4, features: [f0], managed_collision: "
                                "{input_hash_size: 9, eviction: fifo}}\n",
                         "tables[0].managed_collision.eviction"));
  // What replaced the MCH module: hash_zch, whose eviction is its own.
  const auto hash_zch = load_scenario_text(
      head + "  - {name: t0, rows: 10, dim: 4, features: [f0], managed_collision: {module: hash_zch, "
             "input_hash_size: 99}}\n",
      "s.yaml");
  EXPECT_EQ(hash_zch.runs.at(0).managed_collision.at("t0").module, McModule::kHashZch);
  EXPECT_EQ(run.managed_collision.at("t0").module, McModule::kMch);
  EXPECT_TRUE(fails_with(head + "  - {name: t0, rows: 10, dim: 4, features: [f0], managed_collision: "
                                "{module: hash_zch, input_hash_size: 9, interval: 2}}\n",
                         "tables[0].managed_collision.interval", "hash_zch evicts by its own configuration"));
  EXPECT_TRUE(fails_with(head + "  - {name: t0, rows: 10, dim: 4, features: [f0], managed_collision: "
                                "{module: zch, input_hash_size: 9}}\n",
                         "tables[0].managed_collision.module"));
  // Sequence tables behind managed collision (a ManagedCollisionEmbeddingCollection): all of the
  // collection's or none, whatever the pooled ones have.
  const std::string seq = "  - {name: s0, rows: 8, dim: 4, features: [g0], pooling: none, managed_collision: "
                          "{input_hash_size: 64}}\n";
  const auto with_ec = load_scenario_text(head + t0 + seq, "s.yaml");
  EXPECT_EQ(with_ec.runs.at(0).managed_collision.at("s0").input_hash_size, 64);
  EXPECT_NO_THROW(load_scenario_text(head + seq + "  - {name: t1, rows: 10, dim: 4, features: [f1]}\n", "s.yaml"));
  EXPECT_TRUE(fails_with(head + seq + "  - {name: s1, rows: 8, dim: 4, features: [g1], pooling: none}\n",
                         "puts some sequence tables behind managed collision; a ManagedCollisionEmbeddingCollection "
                         "needs it on every table of the collection, and s1 has none"));
  // The reference does not model it: its cell is skipped saying so.
  const auto on_reference = load_scenario_text("version: 1\nname: mc\ntables:\n" + t0, "s.yaml");
  const auto why = reference_cannot_model(on_reference.runs.at(0));
  ASSERT_TRUE(why.has_value());
  EXPECT_TRUE(testing::contains(*why, "does not model managed collision")) << *why;
}

TEST(ScenarioLoader, MatrixKeyMustBeARunField) {
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "matrix:\n  name: [a, b]\n",
                         "s.yaml:13: field 'matrix.name': a matrix varies a run field"));
}

TEST(ScenarioLoader, InvalidYamlReportsTheLine) {
  EXPECT_TRUE(fails_with("version: 1\nname: [unclosed\n", "s.yaml:", "not valid YAML"));
}

// Issue 46 item 2: the name is one plain path component, so nothing is written outside --out.
TEST(ScenarioLoader, ANameThatIsNotOnePlainPathComponentIsRefused) {
  const std::string rest(kMinimal + std::string(kMinimal).find("world_size"));
  for (const std::string& bad :
       std::vector<std::string>{"../../../x", "a/b", "..", ".hidden", std::string(101, 'n'), "caf\\xff", "a\\0b"}) {
    EXPECT_TRUE(
        fails_with("version: 1\nname: \"" + bad + "\"\n" + rest, "s.yaml:2: field 'name': expected at most 100"))
        << bad;
  }
  EXPECT_EQ(load_scenario_text("version: 1\nname: torchrec-1739_v1.2\n" + rest, "s.yaml").name, "torchrec-1739_v1.2");
}

// Issue 46 item 9: YAML's silent choices are refused with the line.
TEST(ScenarioLoader, ADuplicateKeyOrASecondDocumentIsRefusedWithItsLine) {
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "steps: 1\nmatrix:\n  steps: [1]\n  steps: [3]\n",
                         "s.yaml:15: field 'matrix.steps': 'steps' is given twice"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "world_size: 4\n", "s.yaml:12: field 'world_size'", "given twice"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "---\nversion: 1\n", "s.yaml:13: a second YAML document"));
}

// Issue 46 item 9: a `when` list once matched nothing, silently; on an axis of scalars it selects any
// of its values.
TEST(ScenarioLoader, AWhenListSelectsAnyOfItsValues) {
  const auto s =
      load_scenario_text(std::string(kMinimal) + "matrix:\n  steps: [1, 2, 3]\nexpect:\n  - when: {steps: [1, 3]}\n"
                                                 "    replicas: diverge\n    diverged: [t0]\n  - replicas: equal\n",
                         "s.yaml");
  ASSERT_EQ(s.runs.size(), 3u);
  EXPECT_EQ(s.runs[0].expect.replicas, ReplicaExpectation::kDiverge);
  EXPECT_EQ(s.runs[1].expect.replicas, ReplicaExpectation::kEqual);
  EXPECT_EQ(s.runs[2].expect.replicas, ReplicaExpectation::kDiverge);
}

TEST(ScenarioLoader, AWhenValueThatSelectsNoCellIsRefused) {
  const std::string steps = std::string(kMinimal) + "matrix:\n  steps: [1, 2]\n";
  EXPECT_TRUE(fails_with(steps + "expect:\n  - when: {steps: 3}\n    replicas: diverge\n  - replicas: equal\n",
                         "field 'expect[0].when.steps': '3' selects no cell: matrix.steps has 1, 2"));
  EXPECT_TRUE(fails_with(steps + "expect:\n  - when: {steps: [1, 4]}\n    replicas: diverge\n  - replicas: equal\n",
                         "'4' selects no cell"));
  // A release the system axis lacks, likewise.
  EXPECT_TRUE(fails_with(std::string(kMinimal) +
                             "matrix:\n  system: [reference, torchrec==1.9.2]\nexpect:\n"
                             "  - when: {system: torchrec==0.6.0}\n    replicas: diverge\n  - replicas: equal\n",
                         "'torchrec==0.6.0' selects no cell: matrix.system has"));
}

TEST(ScenarioLoader, ATimeoutTooShortToRunAndAnIndexPastAnyListAreRefused) {
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "timeout_s: 1e-300\n", "field 'timeout_s'", "> 0.01"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "matrix:\n  tables.99999999999999999999999.rows: [4, 5]\n",
                         "tables.99999999999999999999999.rows"));
}

// `zip`: paths that advance together, one cell per entry, crossing the other axes as one axis.
TEST(ScenarioLoader, ZippedPathsAdvanceTogetherAndCrossTheOtherAxes) {
  const auto s =
      load_scenario_text(std::string(kMinimal) + "matrix:\n  init.mode: [seeded, unseeded]\n  zip:\n"
                                                 "    - {world_size: 2, batch_size: 8}\n"
                                                 "    - {batch_size: 4, world_size: 4}\n"
                                                 "expect:\n  - when: {world_size: 4}\n    replicas: diverge\n"
                                                 "    diverged: [t1]\n  - replicas: equal\n",
                         "s.yaml");
  ASSERT_EQ(s.runs.size(), 4u);  // 2 x 2, not 2 x 2 x 2
  EXPECT_EQ(s.runs[0].name, "init.mode=seeded world_size=2 batch_size=8");
  EXPECT_EQ(s.runs[1].name, "init.mode=seeded world_size=4 batch_size=4");
  EXPECT_EQ(s.runs[1].world_size, 4);
  EXPECT_EQ(s.runs[1].batch_size, 4);
  EXPECT_EQ(s.runs[1].expect.replicas, ReplicaExpectation::kDiverge);
  EXPECT_EQ(s.runs[2].expect.replicas, ReplicaExpectation::kEqual);
  EXPECT_EQ(s.runs[3].name, "init.mode=unseeded world_size=4 batch_size=4");
  // Entries that set other paths, a path varied twice, and an entry that is not a mapping.
  EXPECT_TRUE(testing::contains(
      error_of(std::string(kMinimal) + "matrix:\n  zip:\n    - {world_size: 2, batch_size: 8}\n"
                                       "    - {world_size: 4, steps: 2}\n"),
      "s.yaml:15: field 'matrix.zip[1].steps': is not set by matrix.zip[0] (world_size, batch_size)"));
  EXPECT_TRUE(
      testing::contains(error_of(std::string(kMinimal) + "matrix:\n  zip:\n    - {world_size: 2, batch_size: 8}\n"
                                                         "    - {world_size: 4}\n"),
                        "field 'matrix.zip[1]': sets 1 of the 2 paths matrix.zip[0] sets (world_size, batch_size)"));
  EXPECT_TRUE(testing::contains(
      error_of(std::string(kMinimal) + "matrix:\n  world_size: [2, 4]\n  zip:\n    - {world_size: 2}\n"),
      "is varied twice"));
  EXPECT_TRUE(testing::contains(error_of(std::string(kMinimal) + "matrix:\n  zip: [2, 4]\n"),
                                "field 'matrix.zip[0]': expected a mapping of paths to values"));
  EXPECT_TRUE(testing::contains(error_of(std::string(kMinimal) + "matrix:\n  zip:\n    - {nonsense: 2}\n"),
                                "field 'matrix.zip[0].nonsense': a matrix varies a run field"));
}

// A release said to show a bug must be told apart from one said to be fixed (a bug entry on cells
// that expect what the fixed release's do was accepted): some cell must expect another outcome.
TEST(ScenarioLoader, ABugSaidOfAReleaseMustBeToldApartFromTheFixedOne) {
  const std::string head = std::string(kMinimal) +
                           "reproduces:\n  url: https://github.com/pytorch/torchrec/issues/1739\n"
                           "  releases: {torchrec==0.6.0: bug, torchrec==1.9.2: fixed}\n"
                           "matrix:\n  system: [torchrec==0.6.0, torchrec==1.9.2]\n  steps: [1, 2]\n";
  EXPECT_TRUE(testing::contains(error_of(head + "expect:\n  - replicas: equal\n"),
                                "field 'reproduces.releases.torchrec==0.6.0': says 'bug', and 'fixed' of "
                                "torchrec==1.9.2, but every cell expects the same of both (replicas equal)"));
  // Either release may hold the expectation that differs, in one cell of the two: told apart.
  for (const std::string release : {"torchrec==0.6.0", "torchrec==1.9.2"}) {
    EXPECT_NO_THROW(load_scenario_text(head + "expect:\n  - when: {system: " + release +
                                           ", steps: 2}\n    error: {kind: torchrec, message: No plan}\n"
                                           "  - replicas: equal\n",
                                       "s.yaml"))
        << release;
  }
}

// A cell's report file: never "..", never hidden, never too long, one per cell.
TEST(ScenarioLoader, EveryCellHasItsOwnPlainReportFileName) {
  const std::string long_value = "1." + std::string(130, '0');
  const auto s =
      load_scenario_text(std::string(kMinimal) + "matrix:\n  timeout_s: [.5, " + long_value + "]\n", "s.yaml");
  ASSERT_EQ(s.runs.size(), 2u);
  EXPECT_EQ(s.runs[0].slug, "_.5");
  EXPECT_EQ(s.runs[1].slug.size(), 120u);
  EXPECT_EQ(s.runs[1].slug.rfind(long_value.substr(0, 103) + "_", 0), 0u) << s.runs[1].slug;
}

TEST(ScenarioLoader, MissingFileIsAnError) {
  EXPECT_TRUE(testing::throws_with("/nonexistent/scenario.yaml: cannot open",
                                   [] { load_scenario_file("/nonexistent/scenario.yaml"); }));
}

TEST(ScenarioLoader, TheSeedScenarioIsValid) {
  const Scenario s =
      load_scenario_file(DMPCHECK_SOURCE_DIR "/scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml");
  // The reference under two profiles x two init modes, and six real releases (0.3.1 to 0.6.0, and
  // 1.9.2) x two init modes (a release cell has no profile: it appears once).
  ASSERT_EQ(s.runs.size(), 16u);
  int on_releases = 0;
  for (const auto& r : s.runs) on_releases += r.on_torchrec() ? 1 : 0;
  EXPECT_EQ(on_releases, 12);
  EXPECT_EQ(s.runs[5].system.name(), "torchrec==0.6.0");
  EXPECT_EQ(s.runs[5].system.version, "0.6.0");
  EXPECT_EQ(s.runs[5].name, "init.mode=seeded system=torchrec==0.6.0");
  EXPECT_EQ(s.runs[0].name, "init.mode=seeded profile=torchrec-0.6");
  ASSERT_TRUE(s.reproduces.has_value());
  EXPECT_EQ(s.reproduces->bug_profile, "torchrec-0.6");
}

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

// `expect.reference.profile` takes switches as the top-level `profile` does (it was refused there).
TEST(ScenarioLoaderSystem, TheReferencesProfileTakesSwitchesAsTheTopLevelOneDoes) {
  const std::string head = std::string(kMinimal) + "system: torchrec==1.9.2\nexpect:\n  - reference: ";
  const Scenario s = load_scenario_text(
      head + "{profile: {base: torchrec-0.6, plan_on_every_rank: true}, rtol: 0, atol: 0}\n", "s.yaml");
  const Expectation& e = s.runs.at(0).expect;
  EXPECT_EQ(e.reference_profile, "torchrec-0.6");
  ASSERT_EQ(e.reference_switches.size(), 1u);
  EXPECT_EQ(e.reference_switches[0], std::make_pair(std::string("plan_on_every_rank"), std::string("true")));
  EXPECT_TRUE(testing::contains(e.describe(), "under profile torchrec-0.6+plan_on_every_rank=true")) << e.describe();
  EXPECT_TRUE(testing::contains(error_of(head + "{profile: {base: torchrec-0.6, no_such_switch: true}}\n"),
                                "expect[0].reference.profile"));
  EXPECT_TRUE(testing::contains(error_of(head + "{profile: {plan_on_every_rank: true}}\n"),
                                "field 'expect[0].reference.profile.base': is required"));
}

TEST(ScenarioLoaderSystem, TheTrainingLoopOfAReleaseCellAndWhatItMustDo) {
  const Scenario s =
      load_scenario_text(std::string(kMinimal) + "steps: 4\nsystem: torchrec==1.9.2\n"
                                                 "torchrec: {loop: train_pipeline_sparse_dist, epochs: 2}\n"
                                                 "expect:\n  - loop: {batches: 2, next_after_exhausted: 0}\n",
                         "s.yaml");
  EXPECT_EQ(s.runs.at(0).torchrec_loop, "train_pipeline_sparse_dist");
  EXPECT_EQ(s.runs[0].torchrec_epochs, 2);
  EXPECT_EQ(s.runs[0].expect.loop_batches, 2);
  EXPECT_EQ(s.runs[0].expect.next_after_exhausted, 0);
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "steps: 3\nsystem: torchrec==1.9.2\ntorchrec: {epochs: 2}\n",
                         "2 epochs cannot split steps: 3 into equal passes"));
  EXPECT_TRUE(
      fails_with(std::string(kMinimal) + "steps: 2\nsystem: torchrec==1.9.2\ntorchrec: {batches_per_rank: [2]}\n",
                 "torchrec.batches_per_rank", "expected one per rank (2)"));
  EXPECT_TRUE(
      fails_with(std::string(kMinimal) + "steps: 2\nsystem: torchrec==1.9.2\ntorchrec: {batches_per_rank: [3, 1]}\n",
                 "each at most the 2 batch(es) of an epoch"));
  const Scenario eval = load_scenario_text(std::string(kMinimal) + "steps: 4\nsystem: torchrec==1.9.2\n"
                                                                   "torchrec: {epochs: 2, eval_batches: [2, 1]}\n"
                                                                   "expect:\n  - loop: {eval_batches: 2}\n",
                                           "s.yaml");
  EXPECT_EQ(eval.runs.at(0).torchrec_eval_batches, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(eval.runs[0].expect.loop_eval_batches, 2);
  EXPECT_EQ(load_scenario_text(
                std::string(kMinimal) + "steps: 2\nsystem: torchrec==1.9.2\ntorchrec: {eval_batches: 1}\n", "s.yaml")
                .runs.at(0)
                .torchrec_eval_batches,
            (std::vector<int64_t>{1}));
  EXPECT_TRUE(
      fails_with(std::string(kMinimal) + "steps: 2\nsystem: torchrec==1.9.2\ntorchrec: {eval_batches: [1, 1, 1]}\n",
                 "torchrec.eval_batches", "expected one, or one per rank (2)"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "steps: 2\nsystem: torchrec==1.9.2\ntorchrec: {eval_batches: 3}\n",
                         "each at most the 2 batch(es) of an epoch"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "expect:\n  - loop: {eval_batches: 1}\n",
                         "counts what a release's training loop asked of its data"));
  const Scenario persistent =
      load_scenario_text(std::string(kMinimal) + "steps: 4\nsystem: torchrec==1.9.2\n"
                                                 "torchrec: {epochs: 2, data_iterator: persistent}\n"
                                                 "expect:\n  - loop: {batches: [2, 0]}\n",
                         "s.yaml");
  EXPECT_EQ(persistent.runs.at(0).torchrec_data_iterator, "persistent");
  EXPECT_EQ(persistent.runs[0].expect.loop_batches_per_epoch, (std::vector<int64_t>{2, 0}));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "steps: 4\nsystem: torchrec==1.9.2\ntorchrec: {epochs: 2}\n"
                                                 "expect:\n  - loop: {batches: [2, 2, 0]}\n",
                         "loop.batches", "expected one per epoch (2)"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "system: torchrec==1.9.2\nexpect:\n  - loop: {eval_batches: 1}\n",
                         "loop.eval_batches", "has none"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "torchrec: {data_iterator: shared}\n", "torchrec.data_iterator",
                         "persistent"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "expect:\n  - loop: {batches: [1]}\n",
                         "counts what a release's training loop asked of its data"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "torchrec: {loop: pipelined}\n", "torchrec.loop",
                         "train_pipeline_sparse_dist"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "expect:\n  - loop: {batches: 1}\n",
                         "counts what a release's training loop asked of its data"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "system: torchrec==1.9.2\nexpect:\n  - loop: {batch: 1}\n",
                         "loop.batch", "batches"));
}

TEST(ScenarioLoaderSystem, AReleaseResumesOnAnotherWorldSizeAndIsHeldAgainstTheUninterruptedRun) {
  const std::string release = std::string(kMinimal) + "steps: 3\nsystem: torchrec==1.9.2\n";
  const Scenario s =
      load_scenario_text(release + "resume: {after_step: 1, world_size: 4, sharding: {t1: {types: [row_wise]}}}\n"
                                   "expect:\n  - resumed: {match: false, rtol: 0, atol: 1e-7}\n",
                         "s.yaml");
  ASSERT_TRUE(s.runs.at(0).resume.has_value());
  EXPECT_EQ(s.runs[0].resume->world_size, 4);
  EXPECT_EQ(s.runs[0].resume->after_step, 1);
  ASSERT_TRUE(s.runs[0].expect.resumed.has_value());
  EXPECT_FALSE(s.runs[0].expect.resumed->match);
  EXPECT_EQ(s.runs[0].expect.resumed->atol, 1e-7);
  // Without world_size a release resumes on the run's own ranks.
  EXPECT_EQ(load_scenario_text(release + "resume: {after_step: 2}\n", "s.yaml").runs.at(0).resume->world_size, 2);
  EXPECT_TRUE(fails_with(release + "resume: {after_step: 1, world_size: 3}\n", "resume.world_size",
                         "3 ranks cannot split the global batch of 16 (batch_size 8 x world_size 2) evenly"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "steps: 3\nresume: {after_step: 1, world_size: 4}\n",
                         "resume.world_size", "the reference resumes on its own 2 ranks"));
  EXPECT_TRUE(fails_with(release + "torchrec: {epochs: 3}\nresume: {after_step: 1}\n", "resume",
                         "in the plain loop of one epoch"));
  EXPECT_TRUE(fails_with(release + "expect:\n  - resumed: true\n", "resumed", "has no resume"));
  EXPECT_TRUE(fails_with(release + "resume: {after_step: 1, sharding: {t0: {types: [table_wise], ranks: [1]}}}\n",
                         "resume.sharding pins table 't0' to ranks"));
  EXPECT_TRUE(
      fails_with(release + "resume: {after_step: 1}\nexpect:\n  - loop: {batches: 3}\n", "counts the loop of one run"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "steps: 3\nresume: {after_step: 1}\nexpect:\n  - resumed: true\n",
                         "resumed", "its resume is judged by global_model"));
}

TEST(ScenarioLoaderSystem, AReleaseCellIsHeldAgainstItsOwnUnshardedModel) {
  // global_model on a release cell: the release's own modules, unsharded (it used to be refused).
  const Scenario s = load_scenario_text(
      std::string(kMinimal) + "system: torchrec==1.9.2\nexpect:\n  - global_model: {rtol: 1e-6, atol: 0}\n"
                              "    outputs: {rtol: 0, atol: 1e-7}\n",
      "s.yaml");
  ASSERT_TRUE(s.runs.at(0).on_torchrec());
  ASSERT_TRUE(s.runs[0].expect.global_model.has_value());
  EXPECT_EQ(s.runs[0].expect.global_model->rtol, 1e-6);
  ASSERT_TRUE(s.runs[0].expect.outputs.has_value());
  EXPECT_EQ(s.runs[0].expect.outputs->atol, 1e-7);
}

TEST(ScenarioLoaderSystem, WhatAReleaseCellCannotRunIsRefusedAtLoad) {
  // A shard pinned to ranks: TorchRec's ParameterConstraints cannot say it (the cell used to run,
  // the pin dropped with a note, and its expectation still passed).
  EXPECT_TRUE(fails_with(replace(std::string(kMinimal), "sharding: {types: [data_parallel]}",
                                 "sharding: {types: [table_wise], ranks: [1]}") +
                             "system: torchrec==1.9.2\n",
                         "table 't1' pins its shards to ranks, and TorchRec's ParameterConstraints has no field"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "system: torchrec==1.9\n", "field 'system': expected"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "system: torchrec==1..9.2\n", "field 'system': expected"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "system: torchrec-1.9.2\n",
                         "field 'system': expected 'reference', a TorchRec release as 'torchrec==X.Y.Z'"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "system: torchrec==1.9.2\nbackend: nccl\n",
                         "field 'backend': not available on torchrec==1.9.2 (TorchRec cells run on CPU with Gloo)"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "expect:\n  - reference: true\n",
                         "compares a TorchRec release with the reference"));
}

// A set of pins is a release with some packages pinned otherwise (a version skew, TorchRec #3099):
// written as pip takes requirements, read back in one order whatever order it was written in,
// names compared as pip compares them, and a different set is a different system.
TEST(ScenarioLoaderSystem, ASetOfPinsIsAReleaseWithItsPackagesNamedInOneOrder) {
  const auto skew = System::parse("torchrec==1.2.0 torch==2.6.0  FBGEMM_gpu.cpu==1.1.0");
  ASSERT_TRUE(skew.has_value());
  EXPECT_TRUE(skew->is_release());
  EXPECT_EQ(skew->version, "1.2.0");
  const std::vector<std::pair<std::string, std::string>> pins = {{"fbgemm-gpu-cpu", "1.1.0"}, {"torch", "2.6.0"}};
  EXPECT_EQ(skew->pins, pins);
  EXPECT_EQ(skew->name(), "torchrec==1.2.0 fbgemm-gpu-cpu==1.1.0 torch==2.6.0");
  EXPECT_EQ(*System::parse(skew->name()), *skew);
  EXPECT_NE(*skew, *System::parse("torchrec==1.2.0"));
  EXPECT_EQ(System::parse("torchrec==0.5.0 python==3.10")->pins.front().first, "python");
  for (const char* bad : {"torchrec==1.2.0 fbgemm", "torchrec==1.2.0 ==1.1.0",
                          "torchrec==1.2.0 torch==", "torchrec==1.2.0 torchrec==1.3.0",
                          "torchrec==1.2.0 torch==2.6 torch==2.7", "torchrec==1.2.0 torch>=2.6",
                          "torchrec==1.2.0 python==3.x", "torchrec==1.2.0 a/b==1", "torchrec==1.2.0 torch==2.6;rm"}) {
    EXPECT_FALSE(System::parse(bad).has_value()) << bad;
  }
  const Scenario s = load_scenario_text(
      std::string(kMinimal) + "matrix:\n  system: [\"torchrec==1.2.0 fbgemm-gpu-cpu==1.1.0\", torchrec==1.2.0]\n",
      "s.yaml");
  ASSERT_EQ(s.runs.size(), 2u);
  EXPECT_EQ(s.runs[0].system.name(), "torchrec==1.2.0 fbgemm-gpu-cpu==1.1.0");
  EXPECT_TRUE(s.runs[1].system.pins.empty());
}

// The user's interpreter and a TorchRec commit are systems like a release: one text form each,
// read back to the same value, and every release rule applies to them (they run the same program).
TEST(ScenarioLoaderSystem, AnInterpreterAndACommitAreSystemsWithTheReleasesRules) {
  const auto python = System::parse("python:/opt/venv/bin/python");
  ASSERT_TRUE(python.has_value());
  EXPECT_EQ(python->kind, System::Kind::kPython);
  EXPECT_EQ(python->version, "/opt/venv/bin/python");
  EXPECT_EQ(python->name(), "python:/opt/venv/bin/python");
  const auto commit = System::parse("torchrec@cc482f8~1");
  ASSERT_TRUE(commit.has_value());
  EXPECT_EQ(commit->kind, System::Kind::kCommit);
  EXPECT_EQ(commit->version, "cc482f8~1");
  EXPECT_TRUE(commit->over.empty());
  const auto over = System::parse("torchrec@release/v0.7.0 over 0.7.0");
  ASSERT_TRUE(over.has_value());
  EXPECT_EQ(over->version, "release/v0.7.0");
  EXPECT_EQ(over->over, "0.7.0");
  EXPECT_EQ(over->name(), "torchrec@release/v0.7.0 over 0.7.0");
  EXPECT_NE(*over, *System::parse("torchrec@release/v0.7.0"));
  for (const char* bad : {"python:", "torchrec@", "torchrec@-p", "torchrec@a..b", "torchrec@a b",
                          "torchrec@cc482f8 over 0.7", "torchrec@cc482f8 over "}) {
    EXPECT_FALSE(System::parse(bad).has_value()) << bad;
  }
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "system: torchrec@cc482f8 over 0.7\n",
                         "field 'system': expected 'reference', a TorchRec release as 'torchrec==X.Y.Z'"));
  const Scenario s = load_scenario_text(
      std::string(kMinimal) + "matrix:\n  system: [\"python:/opt/venv/bin/python\", torchrec@cc482f8]\n", "s.yaml");
  ASSERT_EQ(s.runs.size(), 2u);
  EXPECT_TRUE(s.runs[0].on_torchrec());
  EXPECT_TRUE(s.runs[1].on_torchrec());
  EXPECT_EQ(s.runs[1].name, "system=torchrec@cc482f8");
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "system: torchrec@cc482f8\nbackend: nccl\n",
                         "field 'backend': not available on torchrec@cc482f8 (TorchRec cells run on CPU with Gloo)"));
  // The EBC's is_weighted flag is the release's; the reference applies a weighted table's weights.
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "torchrec: {is_weighted: false}\n",
                         "field 'torchrec.is_weighted': is TorchRec's EmbeddingBagCollection flag"));
  EXPECT_EQ(
      load_scenario_text(std::string(kMinimal) + "system: torchrec==1.9.2\ntorchrec: {is_weighted: false}\n", "s.yaml")
          .runs[0]
          .torchrec_is_weighted,
      std::optional<bool>(false));
  // A report whose change lies between two releases is confirmed at commits.
  EXPECT_TRUE(fails_with(
      std::string(kMinimal) + "reproduces: {url: u, releases: {torchrec@c589d380: bug}}\nsystem: torchrec==1.9.2\n",
      "says 'bug' but no run of the scenario runs on torchrec@c589d380"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "reproduces: {url: u, releases: {\"python:/x\": bug}}\n",
                         "a release key as 'torchrec==X.Y.Z' or a commit as 'torchrec@<rev>'"));
}

TEST(ScenarioLoaderSystem, ReleasesSaidToShowABugNeedACell) {
  const std::string reproduces =
      "reproduces:\n  url: u\n  bug_profile: torchrec-0.6\n  fix_profile: current\n  releases:\n    torchrec==0.6.0: "
      "bug\n";
  EXPECT_TRUE(fails_with(std::string(kMinimal) + reproduces,
                         "field 'reproduces.releases.torchrec==0.6.0': says 'bug' but no run of the scenario runs on "
                         "torchrec==0.6.0"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + replace(reproduces, ": bug", ": maybe"),
                         "expected bug, fixed, absent, 'not runnable: <why>' or 'not reproduced: <why>'"));
  // Tried and not reproducible, with why: recorded without a cell, as 'not runnable' is.
  EXPECT_EQ(load_scenario_text(
                std::string(kMinimal) + replace(reproduces, ": bug", ": 'not reproduced: the CPU kernel pools alike'"),
                "s.yaml")
                .reproduces->releases[0]
                .second,
            "not reproduced: the CPU kernel pools alike");
  const Scenario s =
      load_scenario_text(std::string(kMinimal) + replace(reproduces, ": bug", ": 'not runnable: resume'"), "s.yaml");
  ASSERT_EQ(s.reproduces->releases.size(), 1u);
  EXPECT_EQ(s.reproduces->releases[0].second, "not runnable: resume");
  // With the release in the matrix, and an expectation of the bug there, it loads.
  const std::string bug_there =
      "expect:\n  - when: {system: torchrec==0.6.0}\n    replicas: diverge\n    diverged: [t1]\n"
      "  - replicas: equal\n";
  EXPECT_NO_THROW(load_scenario_text(
      std::string(kMinimal) + reproduces + "matrix:\n  system: [reference, torchrec==0.6.0]\n" + bug_there, "s.yaml"));
  // Confirmed on a release, not modelled: no profiles, a release that shows it.
  const std::string release_only =
      "reproduces:\n  url: u\n  releases:\n    torchrec==0.6.0: bug\n    torchrec==1.9.2: fixed\n";
  const Scenario confirmed = load_scenario_text(
      std::string(kMinimal) + release_only + "matrix:\n  system: [torchrec==0.6.0, torchrec==1.9.2]\n" + bug_there,
      "s.yaml");
  EXPECT_TRUE(confirmed.reproduces->bug_profile.empty());
  // Neither: nothing says where it shows.
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "reproduces:\n  url: u\n", "say where the bug shows"));
  // One profile without the other.
  EXPECT_TRUE(
      fails_with(std::string(kMinimal) + "reproduces:\n  url: u\n  bug_profile: torchrec-0.6\n", "fix_profile"));
}

TEST(ScenarioLoaderErrors, EveryErrorOfTheFileIsReportedAtOnce) {
  const std::string text =
      "version: 1\nname: bad\nworld_size: 0\nsteps: -1\ntables:\n  - {name: t, rows: 0, dim: 4, features: [f]}\n"
      "optimizers: {sparse: {type: adamw}}\n";
  EXPECT_TRUE(fails_with(text, "s.yaml: 4 errors:", "s.yaml:3: field 'world_size'", "s.yaml:4: field 'steps'",
                         "s.yaml:6: field 'tables[0].rows'", "s.yaml:7: field 'optimizers.sparse.type'"));
  // One error alone reads as before.
  EXPECT_EQ(error_of(std::string(kMinimal) + "steps: -1\n").rfind("s.yaml:", 0), 0u);
}

TEST(Preflight, APlanThatFailsIsRefusedBeforeAnyRankStarts) {
  const Scenario s = load_scenario_text(
      "version: 1\nname: cw\ntopology: {memory_per_rank: 100}\ntables:\n"
      "  - {name: t, rows: 10, dim: 10, features: [f], sharding: {types: [column_wise], column_shards: 2}}\n",
      "cw.yaml");
  EXPECT_TRUE(testing::throws_with(ErrorKind::kInvalidScenario,
                                   "run 'default': the plan fails: table 't' (10 x 10) fits nowhere: column_wise would "
                                   "put 400 bytes on rank 0 (limit 100)",
                                   [&] { run::preflight(s, int64_t{1} << 40); }));
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
  EXPECT_TRUE(testing::throws_with("its 2 rank(s) on this host would hold about 2.0 GiB",
                                   [&] { run::preflight(s, int64_t{1} << 30); }));
  EXPECT_TRUE(
      testing::throws_with("but this host has 1.0 GiB available", [&] { run::preflight(s, int64_t{1} << 30); }));
}

TEST(ScenarioLoaderSystem, WeightedMeanPoolingRunsOnAReleaseNotOnTheReference) {
  const std::string table = "tables:\n  - {name: t, rows: 8, dim: 4, features: [f], pooling: mean, weighted: true}\n";
  EXPECT_NO_THROW(load_scenario_text("version: 1\nname: w\nsystem: torchrec==1.9.2\n" + table, "w.yaml"));
  EXPECT_TRUE(fails_with("version: 1\nname: w\n" + table, "weighted features with mean pooling are not modelled by the "
                                                          "reference DMP (TorchRec accepts them); use sum"));
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
  EXPECT_TRUE(fails_with(replace(kInline, "[[1, 2], [3]]", "[[1, 2], [3], [4]]"),
                         "s.yaml:11: field 'data.batches[0][0].f0': has 3 bags; each rank's batch has batch_size = 2"));
  EXPECT_TRUE(fails_with(replace(kInline, "[9, 9, 9]", "[9, 10, 9]"),
                         "field 'data.batches[0][1].f0[1][1]': expected an integer in [0, 9], got '10'"));
  EXPECT_TRUE(fails_with(replace(kInline, "lengths: [0, 1]", "lengths: [1, 1]"),
                         "'data.batches[0][0].f1.lengths': add up to 2 but there are 1 ids"));
  EXPECT_TRUE(fails_with(replace(kInline, "steps: 1", "steps: 2"),
                         "'data.batches': gives 1 step(s) but the run trains 2 steps"));
  EXPECT_TRUE(fails_with(replace(kInline, "world_size: 2", "world_size: 3"),
                         "'data.batches[0]': expected a list of 3 ranks' batches"));
  EXPECT_TRUE(fails_with(replace(kInline, "{f0: [[], [9, 9, 9]]}", "{f2: [[], []]}"),
                         "no table reads feature 'f2'; features: f0, f1"));
  EXPECT_TRUE(
      fails_with(replace(kInline, "ids: [19]", "ids: [19], weights: [2.0]"), "table 't1', which is not weighted"));
  EXPECT_TRUE(fails_with(replace(kInline, "data:\n", "data:\n  seed: 3\n"),
                         "'data.seed': configures generated batches; this run replays data.batches"));
  EXPECT_TRUE(fails_with(replace(kInline, "data:\n  batches:", "data:\n  from: /nonexistent/batches\n  unused:"),
                         "unknown key"));
  EXPECT_TRUE(fails_with(replace(kInline,
                                 "data:\n  batches:\n    - - {f0: [[1, 2], [3]], f1: {ids: [19], lengths: "
                                 "[0, 1]}}\n      - {f0: [[], [9, 9, 9]]}\n",
                                 "data: {from: no-such-dir}\n"),
                         "field 'data.from': no-such-dir is not a directory (expected one holding batch0.pt"));
}

TEST(ScenarioLoader, InlineWeightsOfAWeightedTableAreKept) {
  std::string text = replace(kInline, "features: [f0]}", "features: [f0], weighted: true}");
  text = replace(text, "features: [f1]}", "features: [f1], weighted: true}");
  text = replace(text, "ids: [19], lengths: [0, 1]", "ids: [19], lengths: [0, 1], weights: [0.25]");
  const dmp::KeyedJaggedTensor batch = run::make_global_batch(load_scenario_text(text, "s.yaml").runs.at(0), 0);
  ASSERT_TRUE(batch.weights().has_value());
  EXPECT_TRUE(batch.weights()->equal(at::tensor({1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 0.25f})));
}

TEST(ScenarioLoader, InlineVariableBatchesExpandThroughTheirInverseIndices) {
  // Rank 0 holds two distinct bags of f1, its batch of 3 reads [b1, b0, b1]; rank 1 one bag.
  const std::string text = R"(version: 1
name: vbe
world_size: 2
batch_size: 3
steps: 1
tables:
  - {name: t0, rows: 10, dim: 4, features: [f0]}
  - {name: t1, rows: 20, dim: 4, features: [f1]}
data:
  batches:
    - - {f0: [[1], [2], [3]], f1: {ids: [4, 5, 6], lengths: [1, 2], inverse_indices: [1, 0, 1]}}
      - {f1: {ids: [7], lengths: [1], inverse_indices: [0, 0, 0]}}
)";
  const RunSpec run = load_scenario_text(text, "s.yaml").runs.at(0);
  ASSERT_TRUE(run.data.variable_batch());
  const dmp::KeyedJaggedTensor batch = run::make_global_batch(run, 0);
  EXPECT_TRUE(batch.lengths().equal(at::tensor({1, 1, 1, 0, 0, 0, 2, 1, 2, 1, 1, 1}, at::kLong)));
  EXPECT_TRUE(batch.values().equal(at::tensor({1, 2, 3, 5, 6, 4, 5, 6, 7, 7, 7}, at::kLong)));
  const run::VariableBatch r0 = run::variable_batch(run, 0, 0), r1 = run::variable_batch(run, 0, 1);
  EXPECT_EQ(r0.stride_per_key, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(r0.inverse_indices, (std::vector<int64_t>{0, 1, 2, 1, 0, 1}));
  EXPECT_EQ(r1.stride_per_key, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(r1.inverse_indices, (std::vector<int64_t>{0, 1, 2, 0, 0, 0}));
  // Issue 46 item 11: rank 0's f0 has no inverse_indices yet goes as a variable batch: said.
  EXPECT_EQ(run.data.variable_batch_note().value_or(""),
            "data.batches: step 1 rank 0 feature f1 has inverse_indices, so every step and feature goes to the release "
            "as a variable batch; the 1 of 3 (step, rank, feature) entries without them go as one distinct bag per "
            "bag (inverse indices 0..n-1)");

  EXPECT_TRUE(fails_with(replace(text, "inverse_indices: [1, 0, 1]", "inverse_indices: [1, 1, 1]"),
                         "'data.batches[0][0].f1.inverse_indices': never names bag 0 of lengths"));
  EXPECT_TRUE(fails_with(replace(text, "inverse_indices: [1, 0, 1]", "inverse_indices: [1, 0, 2]"),
                         "'data.batches[0][0].f1.inverse_indices[2]': expected an integer in [0, 1], got '2'"));
  EXPECT_TRUE(fails_with(replace(text, "inverse_indices: [1, 0, 1]", "inverse_indices: [1, 0]"),
                         "expected a list of batch_size = 3 bag indices, each in [0, 2)"));
  EXPECT_TRUE(
      fails_with(replace(text, "steps: 1", "steps: 1\ntorchrec: {module: embedding_bag}\nsystem: torchrec==1.9.2"),
                 "a plain nn.EmbeddingBag takes no inverse indices"));
}

TEST(ScenarioLoader, GeneratedVariableBatchesHoldTheirDistinctBagsPerRank) {
  const std::string text = std::string(kMinimal) + R"(batch_size: 5
data:
  seed: 5
  ids_per_bag: [0, 3]
  features: {f0: {stride_per_rank: [2, 4]}}
)";
  const RunSpec run = load_scenario_text(text, "s.yaml").runs.at(0);
  ASSERT_TRUE(run.data.variable_batch());
  for (int step = 0; step < 3; ++step) {
    const dmp::KeyedJaggedTensor global = run::make_global_batch(run, step);
    for (int rank = 0; rank < run.world_size; ++rank) {
      const dmp::KeyedJaggedTensor local = run::local_batch(run, global, rank);
      const run::VariableBatch vbe = run::variable_batch(run, step, rank);
      const int64_t stride = rank == 0 ? 2 : 4;
      ASSERT_EQ(vbe.stride_per_key, (std::vector<int64_t>{stride, 5}));  // f1 has no variable batch
      ASSERT_EQ(vbe.inverse_indices.size(), 10u);
      for (int64_t i = 0; i < 5; ++i) ASSERT_EQ(vbe.inverse_indices[static_cast<size_t>(5 + i)], i);
      const at::Tensor lengths = local.lengths();
      const at::Tensor offsets = at::cat({at::zeros({1}, at::kLong), lengths.cumsum(0)});
      for (int64_t i = 0; i < 5; ++i) {
        const int64_t j = vbe.inverse_indices[static_cast<size_t>(i)];
        ASSERT_TRUE(i < stride ? j == i : (j >= 0 && j < stride)) << "bag " << i << " names " << j;
        // Bag i of the batch is the distinct bag j: the same ids.
        const at::Tensor bag = local.values().slice(0, offsets[i].item<int64_t>(), offsets[i + 1].item<int64_t>());
        const at::Tensor distinct = local.values().slice(0, offsets[j].item<int64_t>(), offsets[j + 1].item<int64_t>());
        ASSERT_TRUE(bag.equal(distinct)) << "step " << step << " rank " << rank << " bag " << i;
      }
    }
  }
  EXPECT_TRUE(fails_with(replace(text, "[2, 4]", "[2, 6]"),
                         "'data.features.f0.stride_per_rank[1]': expected an integer in [1, 5], got '6'"));
  EXPECT_TRUE(fails_with(replace(text, "[2, 4]", "[2, 4, 1]"), "expected one count, or one per rank (2)"));
}

// A list's counts read before a bad one are what the run's later checks see, so the report names
// what those checks find in them too (and no follow-on error an empty list would draw).
TEST(ScenarioLoaderSystem, AListsCountsBeforeABadOneReachTheChecksAfterIt) {
  const std::string release = std::string(kMinimal) + "steps: 2\nsystem: torchrec==1.9.2\n";
  EXPECT_TRUE(fails_with(release + "torchrec: {batches_per_rank: [2, x]}\n", "torchrec.batches_per_rank[1]",
                         "has 1 count(s) up to 2; expected one per rank (2)"));
  const std::string persistent = error_of(release + "torchrec: {eval_batches: [1, x], data_iterator: persistent}\n");
  EXPECT_TRUE(testing::contains(persistent, "torchrec.eval_batches[1]")) << persistent;
  EXPECT_FALSE(testing::contains(persistent, "persistent re-arms one iterator")) << persistent;
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
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "torchrec: {sharder: patched}\n",
                         "field 'torchrec.sharder': expected one of extended, stock"));
}

TEST(ScenarioLoader, InitLoadAndInitialStateNeedInitFrom) {
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "init: {load: before_wrap}\n",
                         "field 'init.load': says when init.from's weights are loaded; give init.from"));
  EXPECT_TRUE(
      fails_with(std::string(kMinimal) + "expect:\n  - {initial_state: from}\n",
                 "field 'expect[0].initial_state': compares the initial state with init.from; run 'default' has "
                 "no init.from"));
  // validate says a missing init.from, not the first rank that opens it.
  EXPECT_TRUE(
      fails_with(std::string(kMinimal) + "init: {from: /no/such/w.pt}\n", "field 'init.from': no file /no/such/w.pt"));
  const Scenario s = load_scenario_text(
      std::string(kMinimal) + "init: {from: /dev/null, load: before_wrap}\nexpect:\n  - {initial_state: not_from}\n",
      "s.yaml");
  EXPECT_TRUE(s.runs.at(0).init.load_before_wrap);
  EXPECT_EQ(s.runs.at(0).expect.initial_state, std::optional<bool>(false));
}

}  // namespace
TEST(ScenarioLoader, AnEmbeddingBagModuleIsOneTableReadingOneFeature) {
  // Two tables: refused at the key, with its line.
  EXPECT_TRUE(
      fails_with(std::string(kMinimal) + "torchrec: {module: embedding_bag}\n",
                 "s.yaml:12: field 'torchrec.module': 'embedding_bag' is one torch.nn.EmbeddingBag: the scenario "
                 "must have one table reading one feature"));
  const std::string one = "version: 1\nname: bag\ntables:\n  - {name: bag, rows: 8, dim: 4, features: [f]}\n";
  EXPECT_TRUE(
      fails_with(one + "torchrec: {module: embedding_bag, sharder: extended}\n",
                 "field 'torchrec.sharder': an nn.EmbeddingBag is sharded by TorchRec's own EmbeddingBagSharder"));
  const Scenario s = load_scenario_text(one + "torchrec: {module: embedding_bag}\n", "s.yaml");
  EXPECT_EQ(s.runs.at(0).torchrec_module, "embedding_bag");
  EXPECT_EQ(s.runs.at(0).torchrec_sharder, "stock");
}

TEST(ScenarioLoader, AnExpectedErrorIsTypedByItsFailureKind) {
  EXPECT_TRUE(
      fails_with(std::string(kMinimal) + "expect:\n  - error: \"not supported\"\n",
                 "s.yaml:13: field 'expect[0].error': expected a mapping {kind: <failure kind>, message: <text the "
                 "message contains>}"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "expect:\n  - error: {kind: oops}\n", "field 'expect[0].error.kind'",
                         "torchrec"));  // the kinds it may be
  const Scenario s = load_scenario_text(
      std::string(kMinimal) + "expect:\n  - error: {kind: communication, message: plan}\n", "s.yaml");
  const auto& expected = *s.runs.at(0).expect.error;
  EXPECT_EQ(expected.kinds, std::vector<FailureKind>{FailureKind::kCommunication});
  EXPECT_TRUE(expected.matches(FailureKind::kCommunication, "rank 1 holds a different sharding plan"));
  EXPECT_FALSE(expected.matches(FailureKind::kInternal, "rank 1 holds a different sharding plan"));  // the kind decides
  EXPECT_FALSE(expected.matches(FailureKind::kCommunication, "connection reset"));
  // Several kinds: a release that dies of heap corruption in some runs and raises in others.
  const Scenario several =
      load_scenario_text(std::string(kMinimal) + "expect:\n  - error: {kind: [crashed, torchrec]}\n", "s.yaml");
  const auto& either = *several.runs.at(0).expect.error;
  EXPECT_TRUE(either.matches(FailureKind::kCrashed, "killed by signal 6"));
  EXPECT_TRUE(either.matches(FailureKind::kTorchRec, "Split sizes doesn't match"));
  EXPECT_FALSE(either.matches(FailureKind::kTimeout, ""));
  EXPECT_EQ(either.describe(), "an error of kind crashed or torchrec");
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "expect:\n  - error: {kind: [crashed, oops]}\n",
                         "field 'expect[0].error.kind[1]'", "torchrec"));
  EXPECT_TRUE(fails_with(std::string(kMinimal) + "expect:\n  - error: {kind: []}\n", "field 'expect[0].error.kind'",
                         "non-empty list"));
  EXPECT_EQ(s.runs.at(0).expect.describe(), "the run fails with an error of kind communication containing 'plan'");
}

}  // namespace dmpcheck::scenario
