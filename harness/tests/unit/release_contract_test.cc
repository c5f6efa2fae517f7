// The launcher's side of the release contract (run/release_contract.h): every document in
// fixtures/contract/ is what these structs write, field for field, and reads back strictly.  The
// rank program's side (torchrec_sut/tests/test_contract.py) holds contract.py to the same files.
#include <filesystem>
#include <functional>
#include <map>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "common/outcome.h"
#include "report/json.h"
#include "run/release_contract.h"
#include "run/tensor_exchange.h"
#include "test_util.h"

namespace dmpcheck::run::contract {
namespace {

using dmpcheck::testing::throws_with;

nlohmann::json fixture(const std::string& name) { return read_json(DMPCHECK_SOURCE_DIR "/fixtures/contract/" + name); }

// The exchange's names as fixtures/contract/layout.json lists them (contract.py makes the same).
TEST(ReleaseContract, TheExchangesNamesAreTheLayoutFixtures) {
  const std::map<std::string, std::function<std::string(const std::vector<int>&)>> calls{
      {"phase_init", [](const std::vector<int>&) { return phase_init(); }},
      {"phase_after", [](const std::vector<int>& a) { return phase_after(a.at(0)); }},
      {"phase_outputs", [](const std::vector<int>& a) { return phase_outputs(a.at(0)); }},
      {"phase_redrawn", [](const std::vector<int>& a) { return phase_redrawn(a.at(0)); }},
      {"phase_user_weights", [](const std::vector<int>&) { return phase_user_weights(); }},
      {"batch_file", [](const std::vector<int>& a) { return batch_file(a.at(0), a.at(1)); }}};
  const auto names = fixture("layout.json").at("names");
  ASSERT_FALSE(names.empty());
  for (const auto& entry : names) {
    const auto call = calls.find(entry.at("call").get<std::string>());
    ASSERT_NE(call, calls.end()) << entry.dump();
    EXPECT_EQ(call->second(entry.at("args").get<std::vector<int>>()), entry.at("name").get<std::string>())
        << entry.dump();
  }
}

// Why a run stopped, one table both sides read (fixtures/contract/failure_kinds.json): the
// report's names are the fixture's, and each kind a release's rank program writes in its
// error.json is read as itself, not as the launcher's fallback.
TEST(ReleaseContract, FailureKindsAreTheFixturesTable) {
  const auto table = fixture("failure_kinds.json");
  std::vector<std::string> names;
  for (auto name : failure_kind_names()) names.emplace_back(name);
  EXPECT_EQ(names, table.at("kinds").get<std::vector<std::string>>());
  for (const auto& said : table.at("rank_program").get<std::vector<std::string>>()) {
    const auto kind = parse_failure_kind(said);
    ASSERT_TRUE(kind.has_value()) << said;
    EXPECT_EQ(failure_kind_name(*kind), said);
  }
}

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
  EXPECT_TRUE(round_trip(WarmSpawn{}, "warm_spawn.json"));
  EXPECT_TRUE(round_trip(WarmMessage{}, "warm_message.json"));
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

// Integer state (a managed-collision module's sorted raw ids: int64 max marks an empty slot, ids
// beyond 2^24) crosses the exchange exact, beside float32 weights, and is put together from each
// rank's rows as int64.
TEST(ReleaseContract, IntegerPiecesCrossTheExchangeExactly) {
  const std::string dir = ::testing::TempDir() + "/dmpcheck_exchange_int64";
  std::filesystem::remove_all(dir);
  const int64_t empty = std::numeric_limits<int64_t>::max();
  const at::Tensor ids0 = at::tensor({int64_t{3}, (int64_t{1} << 40) + 1}, at::kLong);
  const at::Tensor ids1 = at::tensor({(int64_t{1} << 24) + 1, empty}, at::kLong);
  const at::Tensor weight = at::tensor({0.1f, 0.2f});
  write_exchange_phase(dir + "/rank0", "step1",
                       {{"mc.t0.mch_sorted_raw_ids", "row_wise", false, {4}, 0, 0, ids0},
                        {"dense.0.bias", "dense", true, {2}, 0, 0, weight}});
  write_exchange_phase(dir + "/rank1", "step1", {{"mc.t0.mch_sorted_raw_ids", "row_wise", false, {4}, 2, 0, ids1}});
  const auto rank0 = read_exchange_phase(dir + "/rank0", "step1");
  const auto manifest = read_document_file<Phase>(dir + "/rank0/step1.json");
  EXPECT_EQ(manifest.tensors.at(0).dtype, "int64");
  EXPECT_EQ(manifest.tensors.at(1).dtype, "float32");
  const auto full = assemble_full({rank0, read_exchange_phase(dir + "/rank1", "step1")});
  const at::Tensor ids = full.at("mc.t0.mch_sorted_raw_ids");
  ASSERT_EQ(ids.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(ids, at::cat({ids0, ids1})));
  EXPECT_EQ(ids[3].item<int64_t>(), empty);
  EXPECT_TRUE(at::equal(full.at("dense.0.bias"), weight));
  // A type the exchange does not hold is named, not read as float.
  nlohmann::json doc = read_json(dir + "/rank1/step1.json");
  doc["tensors"][0]["dtype"] = "int32";
  report::write_text_file_atomically(dir + "/rank1/step1.json", doc.dump());
  EXPECT_TRUE(throws_with(ErrorKind::kRankFailed, "'mc.t0.mch_sorted_raw_ids' has dtype 'int32'",
                          [&] { read_exchange_phase(dir + "/rank1", "step1"); }));
}

// Issue 46 item 3: a manifest's offsets and sizes cannot make the reader wrap, read before the
// buffer or allocate without bound; each is a rank failure naming the manifest and the tensor.
TEST(ReleaseContract, AManifestThatRunsPastItsBytesIsRefusedWithoutWrapping) {
  const std::string dir = ::testing::TempDir() + "/dmpcheck_exchange_bounds";
  std::filesystem::remove_all(dir);
  write_exchange_phase(dir, "init", {{"t0", "row_wise", false, {4}, 0, 0, at::ones({2})}});
  const nlohmann::json good = read_json(dir + "/init.json");
  const auto refused = [&](const char* field, const nlohmann::json& value, const std::string& says) {
    nlohmann::json doc = good;
    doc["tensors"][0][field] = value;
    report::write_text_file_atomically(dir + "/init.json", doc.dump());
    return throws_with(ErrorKind::kRankFailed, says, [&] { assemble_full({read_exchange_phase(dir, "init")}); });
  };
  EXPECT_TRUE(refused("offset", std::numeric_limits<uint64_t>::max() - 3, "runs past the 8 bytes"));
  EXPECT_TRUE(refused("offset", 4, "runs past the 8 bytes"));
  EXPECT_TRUE(refused("sizes", {-2}, "a negative size"));
  EXPECT_TRUE(refused("sizes", {int64_t{1} << 40, int64_t{1} << 40}, "over 2^31 elements"));
  EXPECT_TRUE(refused("full_sizes", {int64_t{1} << 62}, "over 2^31 elements"));
  EXPECT_TRUE(refused("row_offset", -2, "negative offset"));
  EXPECT_TRUE(refused("row_offset", 3, "runs past [4]"));
  report::write_text_file_atomically(dir + "/init.json", good.dump());
  EXPECT_EQ(read_exchange_phase(dir, "init").at(0).tensor.numel(), 2);
}

}  // namespace
}  // namespace dmpcheck::run::contract
