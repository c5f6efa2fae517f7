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

class Regressions : public ::testing::TestWithParam<std::string> {};

TEST_P(Regressions, ReproduceTheBugAndShowTheFix) {
  const auto s = scenario::load_scenario_file(std::string(DMPCHECK_SOURCE_DIR "/scenarios/regressions/") + GetParam() + ".yaml");
  // The reference's cells; the library's real-release cells run in torchrec_sut/tests.
  const auto outcome = testing::run_reference_cells_quietly(s);
  ASSERT_GE(outcome.results.size(), 2u);
  for (const auto& r : outcome.results) {
    SCOPED_TRACE(r.run);
    EXPECT_EQ(r.verdict, "pass") << (r.failure ? r.failure->message : fmt::format("{}", fmt::join(r.expectation.failures, "; ")));
  }
  if (s.reproduces && !s.reproduces->bug_profile.empty()) {
    // Both profiles the file names are among its runs.
    bool bug = false, fix = false;
    for (const auto& r : outcome.results) {
      bug = bug || r.profile == s.reproduces->bug_profile;
      fix = fix || r.profile == s.reproduces->fix_profile;
    }
    EXPECT_TRUE(bug && fix);
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
