// Ranks started by hand with the variables torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), as an external launcher would: rank 0 hosts the store, both run the seed matrix.
#include <filesystem>

#include <gtest/gtest.h>

#include "multiproc/multiproc_util.h"

namespace dmpcheck {
namespace {

class ExternalLauncher : public testing::MultiProcessTest {};

TEST_F(ExternalLauncher, RanksStartedFromTorchrunVariablesRunTheSeedMatrix) {
  const std::string scenario = DMPCHECK_SOURCE_DIR "/scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml";
  const auto statuses =
      run_ranks("rank", 2, {DMPCHECK_CLI_PATH, "worker", scenario, "--out", path("reports")},
                [](int rank, int port) -> std::vector<std::string> {
                  const std::string r = std::to_string(rank);
                  return {"RANK=" + r,          "WORLD_SIZE=2",          "LOCAL_RANK=" + r,
                          "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)};
                });
  const std::string log0 = testing::read_file(path("rank0.log"));
  EXPECT_EQ(statuses, (std::vector<int>{0, 0})) << log0 << testing::read_file(path("rank1.log"));
  size_t verdicts = 0;
  for (size_t at = log0.find("VERDICT"); at != std::string::npos; at = log0.find("VERDICT", at + 1)) ++verdicts;
  EXPECT_EQ(verdicts, 4u) << log0;
  EXPECT_TRUE(testing::contains(log0, "[init.mode=unseeded profile=torchrec-0.6]: PASS (bug reproduced as expected)"));
  EXPECT_TRUE(
      std::filesystem::exists(path("reports/torchrec-1739-dp-tables-not-broadcast/unseeded_torchrec-1.9.json")));
}

}  // namespace
}  // namespace dmpcheck
