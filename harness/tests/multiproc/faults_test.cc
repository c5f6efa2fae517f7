// Fault injection through scenarios: each kind of rank failure is caught, named, and fast; a
// single element that differs by one ulp on one rank is caught by the replica check.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "multiproc/multiproc_util.h"

namespace dmpcheck {
namespace {

const char* kBase = R"(version: 1
name: faults
world_size: 2
steps: 2
batch_size: 4
timeout_s: 3
broadcast_probe: false  # keeps the collective sequence numbers below fixed
init: {mode: unseeded, seed: 1}
data: {seed: 1, ids_per_bag: [1, 3]}
tables:
  - {name: dp, rows: 16, dim: 4, features: [f0], sharding: {types: [data_parallel]}}
  - {name: tw, rows: 16, dim: 4, features: [f1], sharding: {types: [table_wise]}}
faults:
  - FAULT
EXPECT)";

class Faults : public testing::MultiProcessTest {
 protected:
  check::RunResult run_with(const std::string& fault, const std::string& expect = "") {
    std::string text = testing::replace_once(kBase, "FAULT", fault);
    text = testing::replace_once(text, "EXPECT", expect);
    const auto outcome = run_all(scenario::load_scenario_text(text, "faults.yaml"));
    EXPECT_EQ(outcome.results.size(), 1u);
    return outcome.results.at(0);
  }
};

TEST_F(Faults, ASegfaultIsNamedWithItsSignal) {
  const auto r = run_with("{kind: crash, rank: 1, step: 1}");
  ASSERT_TRUE(r.failure.has_value());
  EXPECT_EQ(r.verdict, dmpcheck::check::Verdict::kError);
  EXPECT_EQ(r.failure->rank, 1);
  EXPECT_EQ(r.failure->cause, "killed by signal 11 (SIGSEGV)");
  EXPECT_TRUE(testing::contains(fmt::format("{}", fmt::join(r.failure->last_lines, "\n")),
                                "injecting fault 'crash' at step 1"));
}

TEST_F(Faults, AnAbortAndAKillAreNamed) {
  EXPECT_EQ(run_with("{kind: abort, rank: 0, step: 0}").failure->cause, "killed by signal 6 (SIGABRT)");
  EXPECT_EQ(run_with("{kind: kill, rank: 1, step: 2}").failure->cause, "killed by signal 9 (SIGKILL)");
}

TEST_F(Faults, AnExitStatusAndAnExceptionAreNamed) {
  const auto exited = run_with("{kind: exit, rank: 1, step: 1, exit_code: 42}");
  EXPECT_EQ(exited.failure->rank, 1);
  EXPECT_EQ(exited.failure->cause, "exited with status 42");
  const auto thrown = run_with("{kind: throw, rank: 0, step: 1}");
  EXPECT_EQ(thrown.failure->rank, 0);
  EXPECT_EQ(thrown.failure->kind, dmpcheck::check::FailureKind::kInjected);
  EXPECT_TRUE(testing::contains(thrown.failure->message, "injected fault: rank 0 throws at step 1"));
}

TEST_F(Faults, AHangBecomesATimeoutThatNamesTheCollective) {
  const auto r = run_with("{kind: hang, rank: 1, step: 1}");
  ASSERT_TRUE(r.failure.has_value());
  EXPECT_EQ(r.failure->rank, 0);  // the rank left waiting
  EXPECT_EQ(r.failure->kind, dmpcheck::check::FailureKind::kTimeout) << r.failure->message;
  EXPECT_TRUE(testing::contains(r.failure->message, "gloo"));
  EXPECT_TRUE(testing::contains(r.failure->message, "failed after up to 3000 ms"));
}

TEST_F(Faults, OneUlpOnOneElementOfOneReplicaIsCaught) {
  const auto r = run_with("{kind: corrupt, rank: 1, step: 1, tensor: ebc.embedding_bags.dp.weight}",
                          "expect:\n  - replicas: diverge\n    diverged: [dp]\n    at: [final]\n");
  EXPECT_EQ(r.verdict, dmpcheck::check::Verdict::kPass) << fmt::format("{}", fmt::join(r.expectation.failures, "; "));
  for (const auto& c : r.replicas) {
    if (c.name != "ebc.embedding_bags.dp.weight" || c.phase != scenario::Phase::kFinal) continue;
    EXPECT_FALSE(c.equal);
    EXPECT_EQ(c.elements_differing, 1);
    EXPECT_EQ(c.differing_ranks, std::vector<int>{1});
    EXPECT_GT(c.max_abs_diff, 0.0);
    EXPECT_LT(c.max_abs_diff, 1e-7);
  }
}

TEST_F(Faults, ANanInAParameterStopsTheRunNamingTensorAndStep) {
  const auto r = run_with("{kind: nan, rank: 0, step: 1, tensor: ebc.embedding_bags.tw.weight}");
  ASSERT_TRUE(r.failure.has_value());
  EXPECT_TRUE(testing::contains(r.failure->message,
                                "step 1: ebc.embedding_bags.tw.weight (table_wise) holds nan at element 0"));
}

TEST_F(Faults, FingerprintModeNamesBothRanksCollectivesOnADesync) {
  const auto r = run_with("{kind: desync, rank: 1, step: 1}\nfingerprint: true");
  ASSERT_TRUE(r.failure.has_value());
  EXPECT_TRUE(testing::contains(r.failure->message, "collective mismatch: rank"));
  // Rank 1's extra all_reduce of three floats, whatever its sequence number.
  EXPECT_TRUE(testing::contains(r.failure->message, "all_reduce #"));
  EXPECT_TRUE(testing::contains(r.failure->message, " (Float [3])"));
  EXPECT_EQ(r.failure->kind,
            dmpcheck::check::FailureKind::kCommunication);  // caught by the fingerprint, not by the 3 s timeout
}

}  // namespace
}  // namespace dmpcheck
