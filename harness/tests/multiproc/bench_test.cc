// `dmpcheck bench` end to end: the sweep over collectives, sizes, backends and world sizes 1 to
// 4 through the real launcher; its JSON has the documented columns and no wrong element; NCCL
// is skipped with its reason where no GPU is present; the scenario benchmark times every method.
#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "comm/backends.h"
#include "multiproc_util.h"

namespace dmpcheck {
namespace {

class BenchCommand : public testing::MultiProcessTest {};

TEST_F(BenchCommand, SweepsEveryCollectiveAtWorldSizes1To4WithNoWrongElement) {
  const std::string json_path = path("bench.json");
  const int code = cli("out", {"bench", "--collective", "all", "-b", "1K", "-e", "64K", "-f", "8", "-g", "1,2,3,4",
                               "--backend", "gloo,nccl", "-w", "1", "-n", "3", "--json", json_path});
  const std::string printed = testing::read_file(path("out.log"));
  ASSERT_EQ(code, 0) << printed;
  EXPECT_TRUE(testing::contains(printed, "#wrong over every row: 0 (OK)"));

  const auto j = nlohmann::json::parse(testing::read_file(json_path));
  EXPECT_EQ(j.at("tool"), "dmpcheck bench");
  EXPECT_EQ(j.at("units").at("algbw_gbps"), "1e9 bytes/s");
  const auto& groups = j.at("groups");
  ASSERT_EQ(groups.size(), 8u);  // gloo then nccl, each at 1..4 ranks
  for (const auto& g : groups) {
    if (g.at("backend") == "nccl" && g.at("skipped").get<bool>()) {
      EXPECT_FALSE(g.at("skip_reason").get<std::string>().empty());
      EXPECT_TRUE(testing::contains(printed, "# skipped: " + g.at("skip_reason").get<std::string>()));
      continue;
    }
    EXPECT_EQ(g.at("error"), "") << g.dump();
    const int world = g.at("world_size");
    ASSERT_EQ(g.at("rows").size(), 5u * 3u) << "five collectives at 1K, 8K and 64K bytes";
    for (const auto& row : g.at("rows")) {
      for (const char* column : {"collective", "size_bytes", "count", "type", "redop", "root", "time_us", "algbw_gbps",
                                 "busbw_gbps", "wrong", "device_time_us"}) {
        EXPECT_TRUE(row.contains(column)) << column << " missing in " << row.dump();
      }
      for (const char* stat : {"mean", "min", "p50", "p99", "max"})
        EXPECT_TRUE(row.at("time_us").contains(stat)) << stat;
      EXPECT_EQ(row.at("wrong"), 0) << row.dump();
      const std::string collective = row.at("collective");
      const double factor = collective == "all_reduce"  ? 2.0 * (world - 1) / world
                            : collective == "broadcast" ? 1.0
                                                        : (world - 1.0) / world;
      EXPECT_NEAR(row.at("busbw_gbps").get<double>(), row.at("algbw_gbps").get<double>() * factor, 1e-9);
      if (collective != "broadcast" && collective != "all_reduce") {
        EXPECT_EQ(row.at("count").get<int64_t>() % world, 0) << "whole chunks per rank";
      }
    }
  }
}

TEST_F(BenchCommand, BadInputIsRefusedWithWhatWasExpected) {
  EXPECT_EQ(cli("a", {"bench", "--collective", "gather"}), 2);
  EXPECT_TRUE(testing::contains(testing::read_file(path("a.log")), "unknown collective 'gather'"));
  EXPECT_EQ(cli("b", {"bench", "-b", "1X"}), 2);
  EXPECT_TRUE(testing::contains(testing::read_file(path("b.log")), "unknown suffix 'X'"));
  EXPECT_EQ(cli("c", {"bench", "-b", "1M", "-e", "1K"}), 2);
}

TEST_F(BenchCommand, AScenarioBenchmarkTimesEveryWayOfBroadcastingItsReplicatedParameters) {
  const int code = cli("out", {"bench", "--scenario", DMPCHECK_SOURCE_DIR "/benchmarks/dp-256-small-tables.yaml", "-w",
                               "0", "-n", "2", "--json", path("s.json")});
  const std::string printed = testing::read_file(path("out.log"));
  ASSERT_EQ(code, 0) << printed;
  const auto j = nlohmann::json::parse(testing::read_file(path("s.json")));
  EXPECT_EQ(j.at("runs").at(0).at("backend"), "gloo");  // the run's own
  const auto& probe = j.at("runs").at(0).at("probe");
  EXPECT_EQ(probe.at("tensors"), 258);  // 256 tables, the dense layer's weight and bias
  EXPECT_EQ(probe.at("bytes").get<int64_t>(), 256 * 64 * 64 * 4 + (256 * 64 + 1) * 4);
  std::vector<std::string> methods;
  for (const auto& m : probe.at("methods")) methods.push_back(m.at("method"));
  EXPECT_EQ(methods, (std::vector<std::string>{"per_tensor", "coalesced", "coalesced", "coalesced", "framework",
                                               "framework", "framework", "raw"}));
  EXPECT_EQ(probe.at("methods").at(0).at("collectives"), 258);
  EXPECT_TRUE(testing::contains(printed, "ratio coalesced 25 MiB"));
}

TEST_F(BenchCommand, EveryRunThatBroadcastsCarriesTheProbeAndTheOthersDoNot) {
  const auto s = scenario::load_scenario_file(std::string(DMPCHECK_SOURCE_DIR) +
                                              "/scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml");
  const auto outcome = run_reference(s);
  ASSERT_EQ(outcome.results.size(), 4u);
  for (const auto& r : outcome.results) {
    EXPECT_EQ(r.broadcast_probe.performed, r.init_broadcast.performed) << r.run;
    if (!r.broadcast_probe.performed) continue;
    EXPECT_EQ(r.broadcast_probe.backend, "gloo");
    EXPECT_EQ(r.broadcast_probe.methods.size(), 8u);
    EXPECT_GT(r.broadcast_probe.methods.front().end_to_end.mean_s, 0.0);
  }
}

TEST_F(BenchCommand, AnNcclScenarioIsSkippedWithTheReasonWhereNcclCannotRun) {
  const auto reason = comm::backend_unavailable_reason(comm::Backend::kNccl, 2);
  if (!reason) GTEST_SKIP() << "NCCL can run two ranks here";
  std::string text = testing::read_file(std::string(DMPCHECK_SOURCE_DIR) + "/scenarios/examples/table_wise.yaml");
  text = testing::replace_once(text, "world_size: 2", "world_size: 2\nbackend: nccl");
  const auto outcome = run_all(scenario::load_scenario_text(text, "nccl.yaml"));
  ASSERT_FALSE(outcome.results.empty());
  for (const auto& r : outcome.results) {
    EXPECT_EQ(r.verdict, dmpcheck::check::Verdict::kSkipped);
    EXPECT_EQ(r.skip_reason, *reason);
  }
  EXPECT_EQ(outcome.exit_code, 0);
}

}  // namespace
}  // namespace dmpcheck
