#include "run/cell.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "common/error.h"
#include "report/json.h"
#include "run/launcher.h"
#include "run/rank_run.h"

namespace dmpcheck::run {

void set_cell_budget_and_echo(const scenario::RunSpec& spec, const ScenarioRunOptions& options,
                              const std::string& prefix, LaunchRequest& request) {
  const double budget = options.budget_s.value_or(std::max(600.0, 10.0 * spec.timeout_s));
  request.budget = std::chrono::milliseconds(static_cast<int64_t>(budget * 1000.0));
  static std::mutex out_mutex;  // cells may run on several threads (suite --jobs)
  if (options.echo_rank_output && options.out) {
    // The console is bounded as the report is: 256 KiB of each rank's lines, then one line saying so.
    constexpr size_t kMostEchoed = 256 * 1024;
    std::ostream* out = options.out;
    auto echoed = std::make_shared<std::map<int, size_t>>();
    request.on_line = [out, prefix, echoed](int rank, const std::string& line) {
      std::lock_guard<std::mutex> lock(out_mutex);
      size_t& bytes = (*echoed)[rank];
      if (bytes > kMostEchoed) return;
      bytes += line.size() + 1;
      if (bytes > kMostEchoed) {
        *out << "[" << prefix << "rank " << rank << "] [dmpcheck: this rank printed over " << kMostEchoed / 1024
             << " KiB; the rest is not echoed]\n"
             << std::flush;
        return;
      }
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

void write_cell_report(const scenario::Scenario& scenario, const ScenarioRunOptions& options,
                       check::RunResult& result) {
  if (!options.write_reports) return;
  try {
    report::write_json_file(result, fmt::format("{}/{}/{}.json", options.out_dir, scenario.name, result.slug));
  } catch (const Error& e) {
    result.report_error = fmt::format("the report of this run was not written: {}", e.what());
  }
}

}  // namespace dmpcheck::run
