#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "report/console.h"
#include "report/json.h"
#include "report/suite_reports.h"

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
  EXPECT_NE(render_junit(suite).find(needle), std::string::npos);
  EXPECT_NE(render_markdown(suite).find(needle), std::string::npos);
  EXPECT_NE(render_verdict_line(suite.results[0]).find(needle), std::string::npos);
  const std::string html = render_html(suite, "");
  EXPECT_NE(html.find("id=\"broadcast-cost\""), std::string::npos);
  EXPECT_NE(html.find("apt-get install libjs-chart.js"), std::string::npos);  // no Chart.js given: says how
  EXPECT_NE(html.find("ebc.embedding_bags.small_table_1.weight"), std::string::npos);  // the divergence table
}

TEST(Reports, JunitEscapesMarkup) {
  SuiteSummary suite;
  check::RunResult r;
  r.scenario = "a<b";
  r.run = "x&y";
  r.verdict = "fail";
  r.expectation.failures = {"\"quoted\" <tag>"};
  suite.results = {r};
  const std::string xml = render_junit(suite);
  EXPECT_NE(xml.find("name=\"a&lt;b\""), std::string::npos);
  EXPECT_NE(xml.find("&quot;quoted&quot; &lt;tag&gt;"), std::string::npos);
  EXPECT_EQ(xml.find("<tag>"), std::string::npos);
}

}  // namespace
}  // namespace dmpcheck::report
