#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "report/console.h"
#include "report/json.h"
#include "report/suite_reports.h"
#include "test_util.h"

namespace dmpcheck::report {
namespace {

nlohmann::json fixture(const std::string& name) {
  std::ifstream in(std::string(DMPCHECK_SOURCE_DIR "/fixtures/reports/suite/seed/") + name);
  return nlohmann::json::parse(in);
}

TEST(Reports, RunResultJsonRoundTripsExactly) {
  for (const char* name : {"seeded_current.json", "unseeded_current.json", "unseeded_torchrec-0.6.json"}) {
    const nlohmann::json original = fixture(name);
    const check::RunResult parsed = original.get<check::RunResult>();
    EXPECT_EQ(nlohmann::json(parsed), original) << name;
  }
}

TEST(Reports, EveryReportNamesTheFailingTensors) {
  SuiteSummary suite;
  suite.results = {fixture("unseeded_current.json").get<check::RunResult>(),
                   fixture("unseeded_torchrec-0.6.json").get<check::RunResult>()};
  const std::string needle = "ebc.embedding_bags.large_table_0.weight was expected to diverge at init";
  EXPECT_TRUE(testing::contains(render_junit(suite), needle));
  EXPECT_TRUE(testing::contains(render_markdown(suite), needle));
  EXPECT_TRUE(testing::contains(render_verdict_line(suite.results[0]), needle));
  const std::string html = render_html(suite, "");
  EXPECT_TRUE(testing::contains(html, "id=\"broadcast-cost\""));
  EXPECT_TRUE(testing::contains(html, "apt-get install libjs-chart.js"));           // no Chart.js given: says how
  EXPECT_TRUE(testing::contains(html, "ebc.embedding_bags.small_table_1.weight"));  // the divergence table
}

TEST(Reports, AScriptCellThatAuditedNoReplicatedTensorSaysWhatTheAuditSaw) {
  check::RunResult r;
  r.scenario = "s";
  r.run = "default";
  r.verdict = check::Verdict::kPass;
  r.script_ranks = {{0, "exited 0", 0, false, "", {}}};
  // No phase recorded: it cannot say whether the script built a DistributedModelParallel.
  EXPECT_TRUE(testing::contains(render_verdict_line(r), "the audit recorded no phase"));
  EXPECT_FALSE(testing::contains(render_verdict_line(r), "the script built no DistributedModelParallel"));
  // Wraps recorded whose models hold only sharded tables: said as such, not as "no model".
  r.audit_phases = {"wrap 1 (after DistributedModelParallel.__init__): 0 equal, 0 diverge"};
  EXPECT_TRUE(testing::contains(render_verdict_line(r), "the audit recorded 1 phase(s), none holding a replicated "
                                                        "tensor: only sharded tables"));
}

TEST(Reports, JunitEscapesMarkup) {
  SuiteSummary suite;
  check::RunResult r;
  r.scenario = "a<b";
  r.run = "x&y";
  r.verdict = check::Verdict::kFail;
  r.expectation.failures = {"\"quoted\" <tag>"};
  suite.results = {r};
  const std::string xml = render_junit(suite);
  EXPECT_TRUE(testing::contains(xml, "name=\"a&lt;b\""));
  EXPECT_TRUE(testing::contains(xml, "&quot;quoted&quot; &lt;tag&gt;"));
  EXPECT_EQ(xml.find("<tag>"), std::string::npos);
}

}  // namespace
}  // namespace dmpcheck::report

// One policy from outcome to exit status (docs/errors.md), and the names reports carry.
TEST(Errors, CheckEqPrintsBothOperands) {
  const std::vector<int64_t> held = {2, 4}, expected = {3, 4};
  try {
    DMP_CHECK_EQ(held, expected, dmpcheck::ErrorKind::kInvalidInput, "the piece of '{}' does not fit", "t0");
    ADD_FAILURE() << "no error";
  } catch (const dmpcheck::Error& e) {
    EXPECT_EQ(e.kind(), dmpcheck::ErrorKind::kInvalidInput);
    EXPECT_EQ(std::string(e.what()), "the piece of 't0' does not fit: held is [2, 4], expected is [3, 4]");
  }
  EXPECT_NO_THROW(DMP_CHECK_EQ(held.size(), expected.size(), dmpcheck::ErrorKind::kInternal, "never"));
}

TEST(Outcomes, OneExitStatusPolicyAndStableNames) {
  using dmpcheck::check::exit_status;
  using dmpcheck::check::FailureKind;
  using dmpcheck::check::Verdict;
  EXPECT_EQ(exit_status(Verdict::kPass, std::nullopt), 0);
  EXPECT_EQ(exit_status(Verdict::kSkipped, std::nullopt), 0);
  EXPECT_EQ(exit_status(Verdict::kFail, std::nullopt), 1);
  EXPECT_EQ(exit_status(Verdict::kError, FailureKind::kInvalidScenario), 2);
  for (FailureKind k : {FailureKind::kInvalidInput, FailureKind::kCommunication, FailureKind::kTimeout,
                        FailureKind::kRankFailed, FailureKind::kInternal, FailureKind::kCrashed, FailureKind::kTorchRec,
                        FailureKind::kUnsupported, FailureKind::kImport}) {
    EXPECT_EQ(exit_status(Verdict::kError, k), 3) << dmpcheck::check::failure_kind_name(k);
  }
  EXPECT_EQ(exit_status(Verdict::kError, FailureKind::kInterrupted), 130);
  // An error that stops a command outside any run's verdict: bad input 2, everything else 3 (a
  // rank_failed raised by a release cell exited 2 before this policy was one function).
  EXPECT_EQ(exit_status(dmpcheck::ErrorKind::kInvalidScenario), 2);
  EXPECT_EQ(exit_status(dmpcheck::ErrorKind::kInvalidInput), 2);
  for (auto k : {dmpcheck::ErrorKind::kRankFailed, dmpcheck::ErrorKind::kCommunication, dmpcheck::ErrorKind::kTimeout,
                 dmpcheck::ErrorKind::kInternal, dmpcheck::ErrorKind::kInjected}) {
    EXPECT_EQ(exit_status(k), 3);
  }
  // A failed expectation on a run whose error was expected is a pass: the verdict decides.
  EXPECT_EQ(exit_status(Verdict::kPass, FailureKind::kTorchRec), 0);

  std::vector<dmpcheck::check::RunResult> results(3);
  results[0].verdict = Verdict::kPass;
  results[1].verdict = Verdict::kFail;
  results[2].verdict = Verdict::kSkipped;
  EXPECT_EQ(exit_status(results), 1);
  results[2].verdict = Verdict::kError;
  results[2].failure = dmpcheck::check::RankFailure{1, FailureKind::kCrashed, "killed by signal 9", "", {}};
  EXPECT_EQ(exit_status(results), 3);

  // Every kind reads back from its own name; a name from a newer rank program is a rank failure.
  for (auto name : dmpcheck::check::failure_kind_names()) {
    ASSERT_TRUE(dmpcheck::check::parse_failure_kind(name).has_value()) << name;
    EXPECT_EQ(dmpcheck::check::failure_kind_name(*dmpcheck::check::parse_failure_kind(name)), name);
  }
  nlohmann::json j = results[2];
  EXPECT_EQ(j.at("verdict"), "error");
  EXPECT_EQ(j.at("failure").at("kind"), "crashed");
  j["failure"]["kind"] = "something_new";
  EXPECT_EQ(j.get<dmpcheck::check::RunResult>().failure->kind, FailureKind::kRankFailed);
  j["verdict"] = "passed";
  EXPECT_THROW(j.get<dmpcheck::check::RunResult>(), dmpcheck::Error);
}
