// The regression library: every scenario under scenarios/regressions/ reproduces its bug under
// the bug profile and shows the fix under the fix profile; both halves are expectations.
#include <filesystem>

#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "multiproc/multiproc_util.h"

namespace dmpcheck {
namespace {

std::vector<std::string> regression_files() {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(DMPCHECK_SOURCE_DIR "/scenarios/regressions")) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path().stem().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

class Regressions : public testing::MultiProcessTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(Regressions, ReproduceTheBugAndShowTheFix) {
  const auto s =
      scenario::load_scenario_file(std::string(DMPCHECK_SOURCE_DIR "/scenarios/regressions/") + GetParam() + ".yaml");
  // The reference's cells; the library's real-release cells run in torchrec_sut/tests.
  const auto outcome = run_reference(s);
  // The bug's profile and the fix's; a report confirmed on releases only, without a profile that
  // models it, has the reference's cell of what the user asked for.
  const bool profiled = s.reproduces && !s.reproduces->bug_profile.empty();
  // A report the reference cannot express at all (a checkpoint resumed on another world size) is
  // its release cells alone; they run in torchrec_sut/tests, and one release shows the bug.
  if (!s.runs.empty() && std::all_of(s.runs.begin(), s.runs.end(), [](const auto& r) { return r.on_torchrec(); })) {
    EXPECT_TRUE(outcome.results.empty());
    ASSERT_TRUE(s.reproduces.has_value());
    EXPECT_TRUE(std::any_of(s.reproduces->releases.begin(), s.reproduces->releases.end(),
                            [](const auto& kv) { return kv.second == "bug"; }));
    return;
  }
  ASSERT_GE(outcome.results.size(), profiled ? 2u : 1u);
  int passed = 0;
  for (const auto& r : outcome.results) {
    SCOPED_TRACE(r.run);
    // A cell of what the reference does not model (a bf16 table) is skipped saying so; its
    // release cells run in torchrec_sut/tests.
    if (r.verdict == check::Verdict::kSkipped && r.skip_reason.rfind("the reference DMP models fp32 tables", 0) == 0)
      continue;
    EXPECT_EQ(r.verdict, dmpcheck::check::Verdict::kPass)
        << (r.failure ? r.failure->message : fmt::format("{}", fmt::join(r.expectation.failures, "; ")));
    ++passed;
  }
  EXPECT_GE(passed, 1);
  if (profiled) {
    // Both profiles the file names are among its runs.
    bool bug = false, fix = false;
    for (const auto& r : outcome.results) {
      bug = bug || r.profile == s.reproduces->bug_profile;
      fix = fix || r.profile == s.reproduces->fix_profile;
    }
    EXPECT_TRUE(bug && fix);
  }
}

// #2362 is a bug of the forward: the pooled embedding is wrong before any update, so with
// `outputs:` it shows at step 0 even in a run of zero steps, and the fix agrees there.
class RegressionOutputs : public testing::MultiProcessTest {};

TEST_F(RegressionOutputs, TheRowWiseMeanBugShowsInThePooledEmbeddingAtStepZero) {
  for (const char* steps : {"2", "0"}) {
    SCOPED_TRACE(std::string("steps: ") + steps);
    const auto s = scenario::load_scenario_file(
        DMPCHECK_SOURCE_DIR "/scenarios/regressions/torchrec-2362-row-wise-mean-local-length.yaml", {{"steps", steps}});
    const auto outcome = run_reference(s);
    ASSERT_EQ(outcome.results.size(), 2u);
    for (const auto& r : outcome.results) {
      SCOPED_TRACE(r.profile);
      auto find = [&](const std::string& name) {
        auto it =
            std::find_if(r.global_model.begin(), r.global_model.end(), [&](const auto& g) { return g.name == name; });
        EXPECT_NE(it, r.global_model.end()) << name;
        return it == r.global_model.end() ? check::GlobalModelCheck{} : *it;
      };
      const auto pooled = find("pooled_embeddings.f_mean");
      const auto output = find("model_output");
      if (r.profile == "torchrec#2362") {
        EXPECT_FALSE(pooled.within_tolerance);
        EXPECT_EQ(pooled.step, 0);
        EXPECT_GT(pooled.max_abs_diff, 1e-3);
        EXPECT_FALSE(output.within_tolerance);
      } else {
        EXPECT_TRUE(pooled.within_tolerance) << pooled.max_abs_diff;
        EXPECT_TRUE(output.within_tolerance) << output.max_abs_diff;
      }
      EXPECT_EQ(pooled.numel, 16 * 8);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Library, Regressions, ::testing::ValuesIn(regression_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace dmpcheck
