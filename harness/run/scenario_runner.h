// Runs every run of a scenario through the launcher, one process set per run, writes
// reports/<scenario>/<run>.json and prints each run's table and verdict.  The CLI, the tests
// and (later) the Python module all call this.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "check/run_result.h"
#include "run/handover.h"
#include "scenario/scenario.h"

namespace dmpcheck::run {

struct ScenarioRunOptions {
  std::string worker_executable;  // the dmpcheck binary (ranks run `<it> worker`)
  std::string out_dir = "reports";
  bool write_reports = true;
  bool echo_rank_output = true;    // "[rank N] ..." lines as they come
  std::ostream* out = nullptr;     // tables and verdicts; nullptr: quiet
  bool print_tables = true;        // false: each run's verdict line alone on `out`
  std::optional<double> budget_s;  // per run; default max(600, 10 x timeout_s)
  std::string checkpoint_dir;      // ranks save sharded checkpoints under <dir>/<scenario>/<run>/
  std::string dump_batches_dir;    // rank 0 dumps the global batches under <dir>/<scenario>/<run>/
  // Internal (side-by-side TorchRec cells): run the cell on the reference whatever its system,
  // as handover.h's ReferenceHalf says.
  std::optional<ReferenceHalf> reference_half;
  // Exec a fresh worker binary per rank instead of forking ranks from this warm process
  // (launcher.h says when a fork is made).
  bool exec_ranks = false;
  // ECMAScript regex searched in "<scenario> [<run>]" (as suite --filter); empty: every run.
  std::string filter;
};

struct ScenarioOutcome {
  std::vector<check::RunResult> results;
  // 0 every expectation held, 1 one did not, 3 a rank failed or timed out.
  int exit_code = 0;
};

ScenarioOutcome run_scenario(const scenario::Scenario& scenario, const ScenarioRunOptions& options);

// One run of a scenario: launch its ranks, collect (or make, on failure) its RunResult, write
// its JSON report when options.write_reports.  Thread-safe; prints nothing itself unless
// options.echo_rank_output and options.out are set.
check::RunResult run_cell(const scenario::Scenario& scenario, size_t run_index, const ScenarioRunOptions& options);

// Writes `result`'s JSON report under options.out_dir when options.write_reports.  A report that
// cannot be written (a full disk) is kept in result.report_error, not thrown: the verdict is still
// printed, and the command exits 2.
void write_cell_report(const scenario::Scenario& scenario, const ScenarioRunOptions& options, check::RunResult& result);

struct LaunchOutcome;
struct LaunchRequest;
// What every launch of a cell shares: its budget (options.budget_s, else max(600, 10 x timeout_s))
// and, when options echo rank output, each line as "[<prefix>rank N] ..." on options.out.
void set_cell_budget_and_echo(const scenario::RunSpec& spec, const ScenarioRunOptions& options,
                              const std::string& prefix, LaunchRequest& request);

// The RunResult of a launch that did not produce one: its failure, or the expected error.
check::RunResult failed_result(const scenario::Scenario& scenario, const scenario::RunSpec& spec,
                               const LaunchOutcome& launched);

}  // namespace dmpcheck::run
