#include "run/reference_cell.h"

#include <nlohmann/json.hpp>

#include "comm/backends.h"
#include "report/json.h"
#include "run/launcher.h"
#include "run/rank_run.h"
#include "run/worker.h"

namespace dmpcheck::run {

check::RunResult run_reference_cell(const scenario::Scenario& scenario, size_t index, const ScenarioRunOptions& options,
                                    const std::optional<ReferenceHalf>& half) {
  const scenario::RunSpec& spec = scenario.runs.at(index);
  std::optional<std::string> reason = comm::backend_unavailable_reason(spec.backend, spec.ranks_per_host());
  if (!reason) {
    // Said plainly, as a skip: the release cells of the same scenario still run.
    if (const auto why = scenario::reference_cannot_model(spec))
      reason = *why + " (run it on a release: system: torchrec==X.Y.Z)";
  }
  if (reason) {
    check::RunResult skipped = result_header(scenario, spec);
    skipped.verdict = check::Verdict::kSkipped;
    skipped.skip_reason = *reason;
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
  task.run_index = static_cast<int64_t>(index);
  task.overrides = scenario.overrides;
  task.checkpoint_dir = options.checkpoint_dir;
  task.dump_batches_dir = options.dump_batches_dir;
  task.reference_half = half;
  set_cell_budget_and_echo(spec, options, "", request);
  const LaunchOutcome launched = launch(request);

  check::RunResult result = launched.ok && launched.result
                                ? nlohmann::json::parse(*launched.result).get<check::RunResult>()
                                : failed_result(scenario, spec, launched);
  result.timings.total_s = launched.seconds;
  result.stray_processes = launched.strays;
  if (!spec.torchrec_hooks.empty() && !half) {
    result.system.notes.push_back("torchrec.hooks run on release cells only: this reference cell called none");
  }
  return result;
}

}  // namespace dmpcheck::run
