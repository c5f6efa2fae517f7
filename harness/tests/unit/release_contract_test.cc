// The launcher's side of the release contract (run/release_contract.h): every document in
// fixtures/contract/ is what these structs write, field for field, and reads back strictly.  The
// rank program's side (torchrec_sut/tests/test_contract.py) holds contract.py to the same files.
#include <gtest/gtest.h>

#include "common/error.h"
#include "run/release_contract.h"
#include "test_util.h"

namespace dmpcheck::run::contract {
namespace {

using dmpcheck::testing::throws_with;

nlohmann::json fixture(const std::string& name) { return read_json(DMPCHECK_SOURCE_DIR "/fixtures/contract/" + name); }

// Read strictly into its struct and written back, every document is itself: each side's struct
// has exactly the fixture's fields (test_contract.py holds contract.py to the same files).
TEST(ReleaseContract, EveryDocumentReadsIntoItsStructAndWritesBackIdentical) {
  auto round_trip = [](auto type, const std::string& name) {
    return nlohmann::json(read_document<decltype(type)>(fixture(name), name)) == fixture(name);
  };
  EXPECT_TRUE(round_trip(RunSpec{}, "run_spec.json"));
  EXPECT_TRUE(round_trip(RunMeta{}, "run_meta.json"));
  EXPECT_TRUE(round_trip(PlanAnswer{}, "plan_answer.json"));
  EXPECT_TRUE(round_trip(ProbeAnswer{}, "probe_answer.json"));
  EXPECT_TRUE(round_trip(Phase{}, "phase.json"));
  EXPECT_TRUE(round_trip(Batch{}, "batch.json"));
  EXPECT_TRUE(round_trip(RankError{}, "rank_error.json"));
  // The values land where the launcher and the rank program read them.
  const auto spec = read_document<RunSpec>(fixture("run_spec.json"), "spec");
  EXPECT_EQ(spec.seeds, (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(spec.local_world_size, 1);
  EXPECT_EQ(spec.memory_per_rank, 3145728);
  EXPECT_EQ(spec.is_weighted, "false");
  EXPECT_EQ(spec.sparse_optimizer.weight_decay_mode, "decoupled");
  EXPECT_EQ(spec.tables.at(1).constraints.column_shards, 2);
  const auto meta = read_document<RunMeta>(fixture("run_meta.json"), "meta");
  EXPECT_EQ(meta.plan.at(1).shards.at(1).rows, -1);
  EXPECT_EQ(meta.timings.train_s, 0.125);
  EXPECT_EQ(meta.versions.torchrec_source, "/root/.cache/dmpcheck/torchrec/commits/cc482f8a/torchrec");
  EXPECT_EQ(read_document<ProbeAnswer>(fixture("probe_answer.json"), "probe").python, "3.11.2");
}

TEST(ReleaseContract, AnUnknownOrMissingFieldAtAnyDepthIsARankFailureNamingIt) {
  auto fails = [](const nlohmann::json& doc, const std::string& needle) {
    return throws_with(ErrorKind::kRankFailed, needle, [&] { read_document<RunMeta>(doc, "out/meta.json"); });
  };
  nlohmann::json doc = fixture("run_meta.json");
  doc["inverse_indices"] = nullptr;
  EXPECT_TRUE(fails(doc, "out/meta.json: not a valid contract document: unknown field 'inverse_indices'"));
  doc = fixture("run_meta.json");
  doc["plan"][1]["shards"][0]["bytes"] = 4;
  EXPECT_TRUE(fails(doc, "unknown field 'plan[1].shards[0].bytes'"));
  doc = fixture("run_meta.json");
  doc["timings"].erase("train_s");
  EXPECT_TRUE(fails(doc, "missing field 'timings.train_s'"));
  doc = fixture("run_meta.json");
  doc["losses"] = "none";
  EXPECT_TRUE(fails(doc, "out/meta.json: not a valid contract document"));
}

TEST(ReleaseContract, AnotherSchemaVersionIsRefusedByName) {
  nlohmann::json doc = fixture("run_spec.json");
  doc["schema_version"] = kSchemaVersion + 1;
  EXPECT_TRUE(throws_with(ErrorKind::kRankFailed,
                          fmt::format("schema_version {}, this dmpcheck reads {}", kSchemaVersion + 1, kSchemaVersion),
                          [&] { read_document<RunSpec>(doc, "spec.json"); }));
  doc.erase("schema_version");
  EXPECT_TRUE(throws_with(ErrorKind::kRankFailed, "no whole-number 'schema_version'",
                          [&] { read_document<RunSpec>(doc, "spec.json"); }));
}

}  // namespace
}  // namespace dmpcheck::run::contract
