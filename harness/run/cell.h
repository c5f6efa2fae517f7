// A cell is one run of a scenario on one system.  Each kind of system has a kind of cell: the
// reference cell (run/reference_cell.h) runs the scenario on dmpcheck's own DistributedModelParallel,
// the release cell (release/release_cell.h) on a TorchRec release, commit or interpreter.  Every kind
// fills the same few hooks (CellKind, as each of nccl-tests' collectives fills the same functions),
// and suite/cells.h runs each cell with the first kind that takes it.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "check/run_result.h"
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
  // Exec a fresh worker binary per rank instead of forking ranks from this warm process
  // (launcher.h says when a fork is made).
  bool exec_ranks = false;
  // ECMAScript regex searched in "<scenario> [<run>]" (as suite --filter); empty: every run.
  std::string filter;
};

class CellKind {
 public:
  virtual ~CellKind() = default;
  // "reference", "release": how this kind is named.
  virtual const char* name() const = 0;
  // Whether this kind runs `spec`.
  virtual bool takes(const scenario::RunSpec& spec) const = 0;
  // Before any cell of a command runs, with the cells this kind takes among them, in the order they
  // will run: a mistake of the command line is said here, once (Error), and what can start in the
  // background starts.
  virtual void before_cells(const std::vector<const scenario::RunSpec*>& /*specs*/,
                            const ScenarioRunOptions& /*options*/) const {}
  // Runs cell `index` of `scenario`: its verdict, or the failure that stopped it, in its RunResult.
  // It writes no report (the caller does, once).  Throws for a mistake of the scenario or the
  // environment that no cell of this kind could run with.
  virtual check::RunResult run(const scenario::Scenario& scenario, size_t index,
                               const ScenarioRunOptions& options) const = 0;
};

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
