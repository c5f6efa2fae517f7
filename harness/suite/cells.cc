#include "suite/cells.h"

#include <algorithm>
#include <iostream>
#include <regex>

#include "common/error.h"
#include "release/release_cell.h"
#include "release/script_cell.h"
#include "release/torchrec_systems.h"
#include "report/console.h"
#include "run/launcher.h"
#include "run/reference_cell.h"
#include "run/warm_interpreter.h"

namespace dmpcheck::run {

const std::vector<const CellKind*>& cell_kinds() {
  static const ScriptCellKind script;
  static const ReleaseCellKind release;
  static const ReferenceCellKind reference;
  static const std::vector<const CellKind*> kinds{&script, &release, &reference};
  return kinds;
}

const CellKind& kind_of(const scenario::RunSpec& spec) {
  for (const CellKind* kind : cell_kinds()) {
    if (kind->takes(spec)) return *kind;
  }
  throw_error(ErrorKind::kInternal, fmt::format("no kind of cell runs [{}] on {}", spec.name, spec.system.name()));
}

void before_cells(const std::vector<const scenario::RunSpec*>& specs, const ScenarioRunOptions& options) {
  for (const CellKind* kind : cell_kinds()) {
    std::vector<const scenario::RunSpec*> taken;
    for (const auto* spec : specs) {
      if (&kind_of(*spec) == kind) taken.push_back(spec);
    }
    if (!taken.empty()) kind->before_cells(taken, options);
  }
}

check::RunResult run_cell(const scenario::Scenario& scenario, size_t i, const ScenarioRunOptions& options) {
  check::RunResult result = kind_of(scenario.runs.at(i)).run(scenario, i, options);
  write_cell_report(scenario, options, result);
  return result;
}

std::regex filter_regex(const std::string& filter) {
  try {
    return std::regex(filter, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {  // bad input, exit 2
    throw_error(ErrorKind::kInvalidInput,
                fmt::format("--filter '{}' is not a regular expression: {}", filter, e.what()));
  }
}

ScenarioOutcome run_scenario(const scenario::Scenario& scenario, const ScenarioRunOptions& options) {
  ScenarioOutcome outcome;
  std::optional<std::regex> filter;
  if (!options.filter.empty()) filter = filter_regex(options.filter);
  auto selected = [&](const scenario::RunSpec& spec) {
    return !filter || std::regex_search(fmt::format("{} [{}]", scenario.name, spec.name), *filter);
  };
  std::vector<const scenario::RunSpec*> specs;
  for (const auto& spec : scenario.runs) {
    if (selected(spec)) specs.push_back(&spec);
  }
  before_cells(specs, options);
  // The releases not installed here: their cells are skipped as ever (each report says why), and
  // said once, after the others, with the one command that installs them all.
  std::vector<std::string> missing;
  size_t missing_cells = 0;
  for (size_t i = 0; i < scenario.runs.size() && !interrupt_requested(); ++i) {
    const scenario::RunSpec& spec = scenario.runs[i];
    if (!selected(spec)) continue;
    WarmInterpreter::pump();
    const auto release = release_not_installed(spec.system);
    if (options.out && !release) {
      *options.out << fmt::format("-- run {}/{}: {} [{}] on {} ranks\n", i + 1, scenario.runs.size(), scenario.name,
                                  spec.name, spec.world_size)
                   << std::flush;
    }
    check::RunResult result = run_cell(scenario, i, options);
    if (release && result.verdict == check::Verdict::kSkipped) {
      if (std::find(missing.begin(), missing.end(), *release) == missing.end()) missing.push_back(*release);
      ++missing_cells;
    } else if (options.out) {
      *options.out << (options.print_tables ? report::render_run_table(result) : std::string())
                   << report::render_verdict_line(result) << "\n"
                   << std::flush;
    }
    if (!result.report_error.empty()) std::cerr << "dmpcheck: " << result.report_error << "\n";
    outcome.results.push_back(result);
  }
  if (options.out && !missing.empty()) {
    *options.out
        << fmt::format(
               "dmpcheck: {} cell(s) of {} skipped: torchrec {} not installed here (bash ci/torchrec-env.sh {})\n",
               missing_cells, scenario.name, fmt::join(missing, ", "), fmt::join(missing, " "))
        << std::flush;
  }
  outcome.exit_code = check::exit_status(outcome.results);
  return outcome;
}

}  // namespace dmpcheck::run
