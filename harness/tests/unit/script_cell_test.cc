// Script cells apart from running one: what the loader takes and refuses, and how each rank's exit,
// output and exception are judged (check/script_checks.h).  Running scripts on real releases is
// torchrec_sut/tests/test_script_cell.py's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "check/expectations.h"
#include "check/hook_values.h"
#include "check/script_checks.h"
#include "common/error.h"
#include "scenario/scenario.h"

namespace dmpcheck::scenario {
namespace {

namespace fs = std::filesystem;

// A folder holding repro.py, and a scenario file's label beside it.
class ScriptScenario : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dmpcheck-script-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / "repro.py") << "print('hello')\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  Scenario load(const std::string& text) { return load_scenario_text(text, (dir_ / "s.yaml").string()); }
  std::string error_of(const std::string& text) {
    try {
      load(text);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidScenario) << e.what();
      return e.what();
    }
    return "no error";
  }
  fs::path dir_;
};

const char* kScript = R"(version: 1
name: repro
script: {path: repro.py, args: [--steps, "2"], env: {MY_FLAG: "1"}}
world_size: 3
matrix:
  system: [torchrec==0.6.0, torchrec==1.9.2]
expect:
  - when: {system: torchrec==0.6.0}
    replicas: diverge
    diverged: [t1]
    exit: {status: nonzero, rank: 1}
    output: [{contains: "False", rank: 0}, {lacks: Traceback}, {matches: "world_size: \\d"}]
    exception: {type: RuntimeError, message: "not broadcast"}
  - hang: true
)";

TEST_F(ScriptScenario, AScriptCellReadsItsPathArgumentsEnvironmentAndExpectations) {
  const Scenario s = load(kScript);
  ASSERT_EQ(s.runs.size(), 2u);
  const RunSpec& run = s.runs[0];
  ASSERT_TRUE(run.script.has_value());
  EXPECT_EQ(run.script->path, (dir_ / "repro.py").string());
  EXPECT_EQ(run.script->args, (std::vector<std::string>{"--steps", "2"}));
  EXPECT_EQ(run.script->env.at("MY_FLAG"), "1");
  EXPECT_TRUE(run.script->audit);
  EXPECT_EQ(run.world_size, 3);
  EXPECT_EQ(run.timeout_s, 300.0);                                   // a script's first import of a release takes long
  EXPECT_EQ(run.expect.diverged, (std::vector<std::string>{"t1"}));  // no table declares it: a tensor's name part
  const auto& e = run.expect.script;
  EXPECT_EQ(e.exit_status, ScriptExpectation::kNonzero);
  EXPECT_EQ(e.exit_rank, 1);
  ASSERT_EQ(e.output.size(), 3u);
  EXPECT_EQ(e.output[0].test, "contains");
  EXPECT_EQ(e.output[0].rank, 0);
  EXPECT_EQ(e.output[2].test, "matches");
  ASSERT_TRUE(e.exception.has_value());
  EXPECT_EQ(e.exception->type, "RuntimeError");
  EXPECT_TRUE(s.runs[1].expect.script.hang);
  EXPECT_TRUE(s.runs[1].expect.script.judges_failure());
}

TEST_F(ScriptScenario, WhatAScriptCellCannotTakeIsRefusedWithItsLine) {
  const std::string base = "version: 1\nname: repro\nsystem: torchrec==1.9.2\n";
  auto fails_with = [&](const std::string& text, const std::string& needle) {
    const std::string message = error_of(text);
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  };
  fails_with(base + "script: missing.py\n", "s.yaml:4: field 'script.path': no script file");
  // A missing script is one error, not one more at each tensor or exit it is expected to show.
  const std::string missing =
      error_of(base + "script: missing.py\nexpect:\n  - replicas: diverge\n    diverged: [large_table_0]\n"
                      "    exit: 1\n");
  EXPECT_NE(missing.find("no script file"), std::string::npos) << missing;
  EXPECT_EQ(missing.find("field 'expect"), std::string::npos) << missing;
  fails_with(base + "script: repro.py\ntables:\n  - {name: t, rows: 4, dim: 2, features: [f]}\n",
             "s.yaml:5: field 'tables': describes a model dmpcheck builds");
  fails_with("version: 1\nname: repro\nscript: repro.py\n", "field 'system': a script cell runs Python under TorchRec");
  fails_with(base + "script: {path: repro.py, env: {RANK: '3'}}\n", "field 'script.env.RANK': is set by dmpcheck");
  fails_with(base + "script: repro.py\nexpect:\n  - global_model: true\n",
             "field 'expect[0].global_model': is not judged on a script cell");
  fails_with(base + "script: repro.py\nexpect:\n  - exit: {status: 0, rank: 5}\n", "rank 5 of run 'default'");
  fails_with(base + "script: repro.py\nexpect:\n  - output: [{matches: '('}]\n", "not a regular expression");
  fails_with(base + "script: repro.py\nexpect:\n  - output: [{contains: a, lacks: b}]\n",
             "give one of contains, lacks, matches");
  fails_with(base + "script: repro.py\nexpect:\n  - hang: true\n    exit: 0\n", "a hung rank has no exit status");
  fails_with(base + "script: repro.py\nexpect:\n  - exit: sometimes\n", "field 'expect[0].exit'");
  // What execve would cut (a NUL) or refuse (E2BIG: over 128 KiB in one string), named where it is written.
  fails_with(base + "script: {path: repro.py, env: {MY_FLAG: \"a\\0b\"}}\n",
             "s.yaml:4: field 'script.env.MY_FLAG': holds a NUL character");
  fails_with(base + "script: {path: repro.py, env: {\"MY\\0FLAG\": x}}\n",
             "field 'script.env': a variable's name holds a NUL character");
  fails_with(base + "script: {path: repro.py, args: [a, " + std::string(3 << 20, 'x') + "]}\n",
             "field 'script.args[1]': is 3145728 bytes; Linux's execve takes at most 131071");
  fails_with(base + "script: {path: repro.py, env: {BIG: " + std::string(200000, 'x') + "}}\n",
             "field 'script.env.BIG': is 200004 bytes");
  // ... and a scenario cell cannot take what judges a script.
  fails_with("version: 1\nname: s\ntables:\n  - {name: t, rows: 4, dim: 2, features: [f]}\nexpect:\n  - exit: 0\n",
             "field 'expect[0].exit': judges a script cell; run 'default' has no 'script'");
}

TEST_F(ScriptScenario, HooksAreAReleaseCellsAndObservedValuesAreJudgedOnlyWhereHooksRun) {
  std::ofstream(dir_ / "hooks.py") << "def hook_after_wrap(ctx):\n    return {'n': 1}\n";
  const std::string base =
      "version: 1\nname: h\ntables:\n  - {name: t, rows: 4, dim: 4, features: [f]}\nmatrix:\n  system: [reference, "
      "torchrec==1.9.2]\n";
  const Scenario s = load(base + "torchrec: {hooks: hooks.py}\nexpect:\n  - when: {system: torchrec==1.9.2}\n"
                                 "    observed: {n: 1, flag: yes}\n  - replicas: equal\n");
  ASSERT_EQ(s.runs.size(), 2u);
  EXPECT_EQ(s.runs[1].torchrec_hooks, (dir_ / "hooks.py").string());
  EXPECT_EQ(s.runs[1].expect.observed, (std::vector<std::pair<std::string, std::string>>{{"n", "1"}, {"flag", "yes"}}));
  auto fails_with = [&](const std::string& text, const std::string& needle) {
    const std::string message = error_of(text);
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  };
  fails_with(base + "torchrec: {hooks: nothere.py}\n", "s.yaml:7: field 'torchrec.hooks': no hook file");
  fails_with(base + "torchrec: {hooks: hooks.py}\nexpect:\n  - observed: {n: 1}\n",
             "field 'expect[0].observed': judges what a release cell's hooks return; run 'default' runs on the "
             "reference");
  fails_with(base + "expect:\n  - when: {system: torchrec==1.9.2}\n    observed: {n: 1}\n  - replicas: equal\n",
             "has no torchrec.hooks");
  fails_with(base + "torchrec: {hooks: hooks.py}\nexpect:\n  - observed: {n: [1]}\n",
             "field 'expect[0].observed.n': expected a boolean, a number or a string");
}

}  // namespace
}  // namespace dmpcheck::scenario

namespace dmpcheck::check {
namespace {

TEST(ScriptChecks, TheLastTracebacksExceptionIsTheOneNamed) {
  EXPECT_FALSE(last_traceback_exception({"hello", "Traceback is a word"}).has_value());
  const std::vector<std::string> chained = {"Traceback (most recent call last):",
                                            "  File \"a.py\", line 1, in <module>",
                                            "KeyError: 'x'",
                                            "",
                                            "During handling of the above exception, another exception occurred:",
                                            "",
                                            "Traceback (most recent call last):",
                                            "  File \"a.py\", line 3, in <module>",
                                            "    raise RuntimeError(\"boom\")",
                                            "torch.distributed.DistBackendError: boom: not broadcast",
                                            "after"};
  EXPECT_EQ(last_traceback_exception(chained), "torch.distributed.DistBackendError: boom: not broadcast");
  EXPECT_EQ(last_traceback_exception({"[rank1]: Traceback (most recent call last):", "[rank1]:   File \"a.py\"",
                                      "[rank1]: ValueError: a bad batch"}),
            "ValueError: a bad batch");
  EXPECT_TRUE(exception_matches("torch.distributed.DistBackendError: boom", "DistBackendError", "boom"));
  EXPECT_TRUE(exception_matches("torch.distributed.DistBackendError: boom", "torch.distributed.DistBackendError", ""));
  EXPECT_FALSE(exception_matches("torch.distributed.DistBackendError: boom", "BackendError", ""));
  EXPECT_FALSE(exception_matches("RuntimeError: boom", "RuntimeError", "bang"));
  EXPECT_TRUE(exception_matches("KeyboardInterrupt", "KeyboardInterrupt", ""));
}

TEST(ScriptChecks, ADivergedNameIsATensorOrTheTailOfItsName) {
  EXPECT_TRUE(names_tensor("large_table_0", "ebc.embedding_bags.large_table_0.weight"));
  EXPECT_TRUE(names_tensor("embedding_bags.large_table_0.weight", "ebc.embedding_bags.large_table_0.weight"));
  EXPECT_FALSE(names_tensor("table_0", "ebc.embedding_bags.large_table_0.weight"));
  EXPECT_FALSE(names_tensor("large_table_0", "optimizer0/ebc.embedding_bags.large_table_0.weight/exp_avg"));
}

RunResult two_ranks() {
  RunResult r;
  r.script_ranks = {{0, "exited 0", 0, false, "", {"world_size: 2", "ebc.t1.weight False"}},
                    {1, "exited with status 3", 3, false, "RuntimeError: not broadcast", {"Traceback ..."}}};
  r.replicas = {{"ebc.embedding_bags.t1.weight", "audited", scenario::Phase::kInit, false, 0.0, 0, 0, {1}},
                {"ebc.embedding_bags.t1.weight", "audited", scenario::Phase::kFinal, false, 0.0, 0, 0, {1}},
                {"linear.weight", "audited", scenario::Phase::kInit, true, 0.0, 0, 0, {}}};
  return r;
}

TEST(ScriptChecks, EachPartOfAScriptsExpectationIsJudgedOnTheRanksItNames) {
  scenario::Expectation e;
  e.replicas = scenario::ReplicaExpectation::kDiverge;
  e.diverged = {"t1"};
  e.script.exit_status = scenario::ScriptExpectation::kNonzero;
  e.script.exit_rank = 1;
  e.script.output = {{"contains", "False", 0}, {"lacks", "Traceback", 0}, {"matches", "world_size: \\d", {}}};
  e.script.exception = scenario::ScriptExpectation::Exception{"RuntimeError", "broadcast", 1};
  const RunResult r = two_ranks();
  ExpectationResult held = evaluate_expectation(e, r);
  EXPECT_TRUE(held.held) << fmt::format("{}", fmt::join(held.failures, "\n"));

  scenario::Expectation wrong = e;
  wrong.diverged = {"t2"};
  wrong.script.exit_status = 0;
  wrong.script.exit_rank.reset();
  wrong.script.output = {{"lacks", "Traceback", {}}, {"contains", "True", {}}};
  wrong.script.exception = scenario::ScriptExpectation::Exception{"ValueError", "", {}};
  wrong.script.hang = true;
  const auto failures = evaluate_expectation(wrong, r).failures;
  const std::string all = fmt::format("{}", fmt::join(failures, "\n"));
  for (const char* needle :
       {"t2 was expected to diverge, but no audited tensor has that name",
        "ebc.embedding_bags.t1.weight differs at init", "rank 1 exited with status 3, expected exit 0",
        "rank 1's output contains 'Traceback', expected it lacking", "any rank's output does not contain 'True'",
        "expected any rank to raise ValueError; seen rank 0: no traceback; rank 1: RuntimeError: not broadcast",
        "expected a rank to hang past timeout_s"}) {
    EXPECT_NE(all.find(needle), std::string::npos) << needle << "\n--\n" << all;
  }
}

TEST(ScriptChecks, ExitAnyHoldsForEveryStatusAndSignalButNotForAStoppedRank) {
  scenario::Expectation e;
  e.replicas = scenario::ReplicaExpectation::kDiverge;
  e.diverged = {"t1"};
  e.script.exit_status = scenario::ScriptExpectation::kAny;
  RunResult r = two_ranks();  // rank 0 exited 0, rank 1 with status 3
  EXPECT_TRUE(evaluate_expectation(e, r).held);
  r.script_ranks[0].exit_status = -1;  // aborted at interpreter exit, after printing everything
  r.script_ranks[0].ended = "killed by signal 6 (SIGABRT)";
  EXPECT_TRUE(evaluate_expectation(e, r).held);
  r.script_ranks[1].stopped = true;
  r.script_ranks[1].ended = "was still running when dmpcheck stopped the ranks";
  const auto failures = evaluate_expectation(e, r).failures;
  ASSERT_FALSE(failures.empty());
  EXPECT_EQ(failures[0], "rank 1 was still running when dmpcheck stopped the ranks, expected it to end by itself");
}

TEST(ScriptChecks, ObservedValuesAreEveryRanksLastOneComparedAsTheirKindSays) {
  const std::vector<Observation> seen = {
      {0, "after_step", 1, "loss", "number", "0.5"},  {0, "after_step", 2, "loss", "number", "0.25"},
      {1, "after_step", 2, "loss", "number", "0.25"}, {0, "after_wrap", 0, "leaf", "bool", "false"},
      {1, "after_wrap", 0, "leaf", "bool", "true"},   {0, "at_end", 2, "dtype", "string", "torch.bfloat16"}};
  std::vector<std::string> failures;
  judge_observed({{"loss", "2.5e-1"}, {"leaf", "No"}, {"dtype", "torch.bfloat16"}}, seen, 2, failures);
  ASSERT_EQ(failures.size(), 2u) << fmt::format("{}", fmt::join(failures, "\n"));
  EXPECT_EQ(failures[0], "leaf is true on rank 1 (after_wrap 0), expected No");
  EXPECT_EQ(failures[1], "no hook returned dtype on rank 1");
  failures.clear();
  judge_observed({{"loss", "0.5"}, {"leaf", "maybe"}}, seen, 1, failures);
  EXPECT_EQ(failures, (std::vector<std::string>{"loss is 0.25 on rank 0 (after_step 2), expected 0.5",
                                                "leaf is false on rank 0 (after_wrap 0), expected maybe"}));
}

// The unsharded oracle's values (kUnshardedRank) are shown against the ranks' of the same hook and
// step, and never judged by `expect: observed`.
TEST(HookValues, TheOraclesValueIsComparedWithTheRanksOfTheSameHookAndStep) {
  const std::vector<Observation> seen = {{0, "build_model", 0, "kind", "string", "FPEBC"},
                                         {1, "build_model", 0, "kind", "string", "FPEBC"},
                                         {kUnshardedRank, "build_model", 0, "kind", "string", "FPEBC"},
                                         {0, "batch", 1, "rows", "number", "4"},
                                         {1, "batch", 1, "rows", "number", "5"},
                                         {kUnshardedRank, "batch", 1, "rows", "number", "4"},
                                         {0, "at_end", 2, "only", "bool", "true"},
                                         {kUnshardedRank, "build_model", 0, "oracle_only", "number", "1"},
                                         {0, "build_model", 0, "n", "number", "4"},
                                         {1, "build_model", 0, "n", "number", "4.0"},
                                         {kUnshardedRank, "build_model", 0, "n", "number", "4e0"}};
  EXPECT_EQ(describe_hook_value("kind", seen),
            "   hook value kind (build_model): rank 0 FPEBC, rank 1 FPEBC (ranks agree); the unsharded model's "
            "hook_build_model (build_model) agrees\n");
  EXPECT_EQ(describe_hook_value("rows", seen),
            "   hook value rows (batch, step 1): rank 0 4, rank 1 5 (ranks DIFFER); the unsharded model's hook_batch "
            "(batch, step 1) returned 4: it DIFFERS from rank(s) 1\n");
  EXPECT_EQ(describe_hook_value("n", seen),  // numbers compared as numbers
            "   hook value n (build_model): rank 0 4, rank 1 4.0 (ranks agree); the unsharded model's "
            "hook_build_model (build_model) agrees\n");
  EXPECT_EQ(describe_hook_value("only", seen), "   hook value only (at_end, step 2): rank 0 true\n");
  EXPECT_EQ(describe_hook_value("oracle_only", seen),
            "   hook value oracle_only: on no rank; the unsharded model's hook_build_model (build_model) returned 1\n");
  std::vector<std::string> failures;
  judge_observed({{"kind", "FPEBC"}, {"oracle_only", "1"}}, seen, 2, failures);
  EXPECT_EQ(failures, (std::vector<std::string>{"no hook returned oracle_only on rank 0",
                                                "no hook returned oracle_only on rank 1"}));
}

TEST(ScriptChecks, APhaseARankDidNotRecordFailsEqualityWhereEveryRankExited0) {
  RunResult r = two_ranks();
  r.script_ranks[1].exit_status = 0;
  r.replicas.clear();
  r.audit_gaps = {"phase exit: not recorded on rank(s) 1"};
  scenario::Expectation e;
  const auto failures = evaluate_expectation(e, r).failures;
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0], "the audit's phase exit: not recorded on rank(s) 1");
  r.script_ranks[1].exit_status = 3;  // its failure says why; expected here
  e.script.exit_status = scenario::ScriptExpectation::kNonzero;
  e.script.exit_rank = 1;
  EXPECT_TRUE(evaluate_expectation(e, r).held);
}

}  // namespace
}  // namespace dmpcheck::check
