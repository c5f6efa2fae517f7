// `dmpcheck suite`: every matrix cell of every scenario under the given paths, with progress,
// a filter, parallel runs, and the four report kinds in reports/<timestamp>/.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "check/run_result.h"

namespace dmpcheck::run {

struct SuiteOptions {
  std::vector<std::string> paths;  // scenario files or directories (searched for *.yaml)
  std::string filter;              // ECMAScript regex searched in "<scenario> [<run>]"; empty: all
  int jobs = 1;                    // runs at once (also bounded by ranks <= max(cores, world size))
  std::string out_root = "reports";
  std::string worker_executable;
  std::optional<double> budget_s;
  std::ostream* out = nullptr;  // progress lines
  bool exec_ranks = false;      // exec a worker per rank instead of forking (launcher.h)
};

struct SuiteOutcome {
  std::string report_dir;  // reports/<timestamp>/
  std::vector<check::RunResult> results;
  double seconds = 0.0;
  int exit_code = 0;  // 0 all held, 1 an expectation failed, 2 an invalid scenario, 3 a rank failed
};

SuiteOutcome run_suite(const SuiteOptions& options);

// Writes junit.xml, summary.md and report.html into `directory` from `results`.
void write_suite_reports(const std::string& directory, const std::string& title, const std::string& started_at,
                         double seconds, const std::vector<check::RunResult>& results);
// Renders the reports again from the run JSON files under `directory` (a suite's report folder).
// Returns how many runs were read.
size_t rerender_reports(const std::string& directory);

// The scenario files under `paths`, sorted; Error(kInvalidInput) for a path that is neither.
std::vector<std::string> collect_scenario_files(const std::vector<std::string>& paths);

}  // namespace dmpcheck::run
