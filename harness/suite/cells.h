// The kinds of cell, and the one place a cell is given to its kind: every command that runs cells
// (run, suite, bisect, releases, fidelity, the Python module) runs them through run_cell.
#pragma once

#include <regex>
#include <string>
#include <vector>

#include "run/cell.h"

namespace dmpcheck::run {

// Every kind of cell, in the order they are asked whether they take a cell.  A new kind is its own
// files and one line in this list (cells.cc).
const std::vector<const CellKind*>& cell_kinds();
// The kind that runs `spec`; Error(kInternal) when none takes it.
const CellKind& kind_of(const scenario::RunSpec& spec);

// Each kind's before_cells with the cells it takes among `specs` (those a command is about to run,
// in order).
void before_cells(const std::vector<const scenario::RunSpec*>& specs, const ScenarioRunOptions& options);

// One cell, by its kind; its JSON report written when options.write_reports.  Thread-safe; prints
// nothing itself unless options.echo_rank_output and options.out are set.
check::RunResult run_cell(const scenario::Scenario& scenario, size_t run_index, const ScenarioRunOptions& options);

// `filter` (`--filter`, searched in "<scenario> [<run>]") as an ECMAScript regular expression;
// Error(kInvalidInput) where it is not one.
std::regex filter_regex(const std::string& filter);

struct ScenarioOutcome {
  std::vector<check::RunResult> results;
  // 0 every expectation held, 1 one did not, 3 a rank failed or timed out.
  int exit_code = 0;
};

// Every cell of a scenario that options.filter selects, one after the other, each run's table and
// verdict printed on options.out.
ScenarioOutcome run_scenario(const scenario::Scenario& scenario, const ScenarioRunOptions& options);

}  // namespace dmpcheck::run
