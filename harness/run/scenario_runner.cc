#include "run/scenario_runner.h"

#include <algorithm>
#include <iostream>
#include <mutex>
#include <regex>

#include <nlohmann/json.hpp>

#include "comm/backends.h"
#include "common/error.h"
#include "report/console.h"
#include "report/json.h"
#include "run/launcher.h"
#include "run/rank_run.h"
#include "run/torchrec_cell.h"
#include "run/torchrec_systems.h"
#include "run/warm_interpreter.h"
#include "run/worker.h"

namespace dmpcheck::run {

void set_cell_budget_and_echo(const scenario::RunSpec& spec, const ScenarioRunOptions& options,
                              const std::string& prefix, LaunchRequest& request) {
  const double budget = options.budget_s.value_or(std::max(600.0, 10.0 * spec.timeout_s));
  request.budget = std::chrono::milliseconds(static_cast<int64_t>(budget * 1000.0));
  static std::mutex out_mutex;  // cells may run on several threads (suite --jobs)
  if (options.echo_rank_output && options.out) {
    std::ostream* out = options.out;
    request.on_line = [out, prefix](int rank, const std::string& line) {
      std::lock_guard<std::mutex> lock(out_mutex);
      *out << "[" << prefix << "rank " << rank << "] " << line << "\n" << std::flush;
    };
  }
}

check::RunResult failed_result(const scenario::Scenario& scenario, const scenario::RunSpec& spec,
                               const LaunchOutcome& launched) {
  check::RunResult result = result_header(scenario, spec);
  result.verdict = check::Verdict::kError;
  if (launched.failure) {
    result.failure = launched.failure;
    // A failure the scenario predicts is the expected outcome, not an error.
    if (spec.expect.error && spec.expect.error->matches(launched.failure->kind, launched.failure->message)) {
      result.verdict = check::Verdict::kPass;
      result.expectation.held = true;
    } else if (spec.expect.error) {
      result.verdict = check::Verdict::kFail;
      result.expectation.failures.push_back(fmt::format("expected {}, got a {} error: {}",
                                                        spec.expect.error->describe(), launched.failure->kind,
                                                        launched.failure->message));
    }
  } else {
    result.failure =
        check::RankFailure{0, check::FailureKind::kInternal, "exited with status 0 without a result", "", {}};
  }
  return result;
}

check::RunResult run_cell(const scenario::Scenario& scenario, size_t i, const ScenarioRunOptions& options) {
  const scenario::RunSpec& spec = scenario.runs.at(i);
  if (spec.on_torchrec() && !options.reference_half) return run_torchrec_cell(scenario, i, options);
  const int local_world_size = spec.ranks_per_host();
  std::optional<std::string> reason = comm::backend_unavailable_reason(spec.backend, local_world_size);
  if (!reason) {
    // Said plainly, as a skip: the release cells of the same scenario still run.
    if (const auto why = scenario::reference_cannot_model(spec))
      reason = *why + " (run it on a release: system: torchrec==X.Y.Z)";
  }
  if (reason) {
    check::RunResult skipped = result_header(scenario, spec);
    skipped.verdict = check::Verdict::kSkipped;
    skipped.skip_reason = *reason;
    write_cell_report(scenario, options, skipped);
    return skipped;
  }
  LaunchRequest request;
  request.executable = options.worker_executable;
  request.arguments = {"worker"};
  request.in_process = [] { return worker_main(WorkerOptions{}); };
  request.exec_ranks = options.exec_ranks;
  request.world_size = spec.world_size;
  request.local_world_size = spec.local_world_size;
  request.threads_per_rank = threads_per_rank(spec, available_cores());
  RankTask& task = request.task;
  task.scenario_text = scenario.source_text;
  task.scenario_file = scenario.file;
  task.run_index = static_cast<int64_t>(i);
  task.overrides = scenario.overrides;
  task.checkpoint_dir = options.checkpoint_dir;
  task.dump_batches_dir = options.dump_batches_dir;
  task.reference_half = options.reference_half;
  set_cell_budget_and_echo(spec, options, "", request);
  const LaunchOutcome launched = launch(request);

  check::RunResult result = launched.ok && launched.result
                                ? nlohmann::json::parse(*launched.result).get<check::RunResult>()
                                : failed_result(scenario, spec, launched);
  result.timings.total_s = launched.seconds;
  write_cell_report(scenario, options, result);
  return result;
}

void write_cell_report(const scenario::Scenario& scenario, const ScenarioRunOptions& options,
                       check::RunResult& result) {
  if (!options.write_reports) return;
  try {
    report::write_json_file(result, fmt::format("{}/{}/{}.json", options.out_dir, scenario.name, result.slug));
  } catch (const Error& e) {
    result.report_error = fmt::format("the report of this run was not written: {}", e.what());
  }
}

ScenarioOutcome run_scenario(const scenario::Scenario& scenario, const ScenarioRunOptions& options) {
  ScenarioOutcome outcome;
  std::optional<std::regex> filter;
  if (!options.filter.empty()) {
    try {
      filter.emplace(options.filter, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw_error(ErrorKind::kInvalidInput,
                  fmt::format("--filter '{}' is not a regular expression: {}", options.filter, e.what()));
    }
  }
  auto selected = [&](const scenario::RunSpec& spec) {
    return !filter || std::regex_search(fmt::format("{} [{}]", scenario.name, spec.name), *filter);
  };
  // The releases' interpreters import in the background while the cells before theirs run.
  std::vector<scenario::System> systems;
  for (const auto& spec : scenario.runs) {
    if (selected(spec)) systems.push_back(spec.system);
  }
  require_torchrec_repository_for(systems);
  prestart_release_interpreters(systems, options.exec_ranks);
  for (size_t i = 0; i < scenario.runs.size() && !interrupt_requested(); ++i) {
    const scenario::RunSpec& spec = scenario.runs[i];
    if (!selected(spec)) continue;
    WarmInterpreter::pump();
    if (options.out) {
      *options.out << fmt::format("-- run {}/{}: {} [{}] on {} ranks\n", i + 1, scenario.runs.size(), scenario.name,
                                  spec.name, spec.world_size)
                   << std::flush;
    }
    check::RunResult result = run_cell(scenario, i, options);
    if (options.out) {
      *options.out << (options.print_tables ? report::render_run_table(result) : std::string())
                   << report::render_verdict_line(result) << "\n"
                   << std::flush;
    }
    if (!result.report_error.empty()) std::cerr << "dmpcheck: " << result.report_error << "\n";
    outcome.results.push_back(result);
  }
  outcome.exit_code = check::exit_status(outcome.results);
  return outcome;
}

}  // namespace dmpcheck::run
